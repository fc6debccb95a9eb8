// KvCacheManager against the content-tracking FakeEngine: long random operation sequences with
// fixed seeds over real model shapes (bundled configs, small pools) and hand-built configs. Every
// step verifies that what each group reads is exactly what the request wrote or a request with the
// same prefix wrote, so a wrong share, eviction, copy or rollback fails the test.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <hkv/manager/kv_cache_manager.h>
#include <hkv/plan/plan.h>
#include <hkv/spec/config_loader.h>

#include "../pool/scrambled_rank.h"
#include "fake_engine.h"

namespace hkv {
namespace {

using testing::EngineRequest;
using testing::FakeEngine;

// ---- Model shapes ---------------------------------------------------------------------------

// A bundled model's plan as a manager config. Windows and chunks longer than `max_span` are
// shortened to it (a "-like" model), so that they matter within max_model_len. Pool sizes are
// set by SizePools.
std::optional<ManagerConfig> FromModel(const std::string& dir, int32_t max_span = 0,
                                       int64_t checkpoint_interval = 0) {
  Result<ModelSpec> spec = LoadModelConfig(std::filesystem::path(HKV_MODELS_DIR) / dir);
  if (!spec.ok()) {
    ADD_FAILURE() << spec.status().ToString();
    return std::nullopt;
  }
  if (max_span > 0) {
    for (LayerSpec& l : spec->layers) {
      if (l.kind == LayerKind::kSlidingWindow) l.window = std::min(l.window, max_span);
      if (l.kind == LayerKind::kChunkedLocal) l.chunk = std::min(l.chunk, max_span);
    }
  }
  PlanOptions options;
  options.max_model_len = 2048;
  // Fixed pools, which SizePools resizes; the shapes marked two_level share slabs (TwoLevel).
  options.strategy = PageStrategy::kMultiClass;
  Result<Plan> plan = MakePlan(*spec, options);
  if (!plan.ok()) {
    ADD_FAILURE() << dir << ": " << plan.status().ToString();
    return std::nullopt;
  }
  Result<ManagerConfig> config = ManagerConfig::FromPlan(*plan);
  if (!config.ok()) {
    ADD_FAILURE() << dir << ": " << config.status().ToString();
    return std::nullopt;
  }
  ManagerConfig c = std::move(config).value();
  c.max_model_len = 2048;
  c.max_encoder_tokens = std::min<int64_t>(c.max_encoder_tokens, 200);
  c.checkpoint_interval = checkpoint_interval;
  return c;
}

GroupConfig Group(TokenRuleKind kind, int32_t block_tokens, int32_t pool, int32_t span = 0,
                  int32_t sinks = 0) {
  GroupConfig g;
  g.rule = {kind, span, sinks};
  g.block_tokens = kind == TokenRuleKind::kState ? 0 : block_tokens;
  g.pool = pool;
  return g;
}

ManagerConfig HandBuilt(int32_t num_pools, std::vector<GroupConfig> groups,
                        int64_t max_model_len = 1024) {
  ManagerConfig c;
  c.pool_blocks.assign(static_cast<size_t>(num_pools), 2000);
  c.groups = std::move(groups);
  c.max_model_len = max_model_len;
  for (const GroupConfig& g : c.groups)
    if (g.is_encoder()) c.max_encoder_tokens = 200;
  return c;
}

using TK = TokenRuleKind;

struct DriveOptions {
  int32_t ops = 8000;
  int32_t max_live = 6;
  int64_t max_prompt = 400;
  int64_t max_chunk = 160;
  int64_t max_output = 120;
  double pressure = 1.2;   // largest requests that fit at once (SizePools)
  bool two_level = false;  // pools draw from shared slabs (TwoLevel) instead of fixed sizes
};

// Sizes every pool so that about `requests` requests of the largest size fit at once: enough
// for progress, few enough that admissions, forks and drafts run the pools dry regularly.
void SizePools(ManagerConfig& c, const DriveOptions& o, double requests) {
  const int64_t tokens = std::min(c.max_model_len, o.max_prompt + o.max_output + 8);
  std::vector<double> need(c.pool_blocks.size(), 0.0);
  for (const GroupConfig& g : c.groups) {
    // A state group holds the live state, a rolling one, checkpoints and a step's snapshots.
    const int64_t blocks =
        g.is_state() ? 12 : g.rule.BlocksHeld(tokens, c.max_encoder_tokens, g.block_tokens) + 2;
    need[static_cast<size_t>(g.pool)] += static_cast<double>(blocks) * requests;
  }
  for (size_t p = 0; p < need.size(); ++p)
    c.pool_blocks[p] = 1 + static_cast<int32_t>(need[p]);
}

// Turns sized pools into two-level memory of the same total: state pools get one page per
// slab (a state page is the large one), token pools 8, or 3 for a second token pool, so memory
// moves between classes whenever their demand shifts.
void TwoLevel(ManagerConfig& c) {
  std::vector<int32_t> per(c.pool_blocks.size(), 0);
  int32_t token_pools = 0;
  for (const GroupConfig& g : c.groups) {
    int32_t& pp = per[static_cast<size_t>(g.pool)];
    if (g.is_state()) {
      pp = 1;
    } else if (pp == 0) {
      pp = token_pools++ == 0 ? 8 : 3;
    }
  }
  int64_t slabs = 0;
  for (size_t p = 0; p < per.size(); ++p)
    slabs += (c.pool_blocks[p] - 1 + per[p] - 1) / per[p];
  c.arena.num_slabs = slabs;
  c.arena.pages_per_slab = per;
  for (size_t p = 0; p < per.size(); ++p)
    c.pool_blocks[p] = static_cast<int32_t>(slabs * per[p] + 1);
}

std::optional<ManagerConfig> Ranked(std::optional<ManagerConfig> c) {
  if (c) c->eviction_rank = std::make_shared<testing::ScrambledRank>();
  return c;
}

// Publishing at Allocate (a batched engine's step is hittable before it runs).
std::optional<ManagerConfig> PublishingAtAllocate(std::optional<ManagerConfig> c) {
  if (c) c->publish_at_allocate = true;
  return c;
}

struct ShapeCase {
  std::string name;
  std::function<std::optional<ManagerConfig>()> make;
  DriveOptions drive;
};

std::vector<ShapeCase> Shapes() {
  std::vector<ShapeCase> s;
  s.push_back({"Llama31_8B_full", [] { return FromModel("meta-llama--Llama-3.1-8B"); }, {}});
  s.push_back(
      {"DeepSeekV2Lite_mla", [] { return FromModel("deepseek-ai--DeepSeek-V2-Lite"); }, {}});
  s.push_back({"Gemma2_window128_like", [] { return FromModel("google--gemma-2-9b", 128); }, {}});
  s.push_back({"Gemma3_window1024",
               [] { return FromModel("google--gemma-3-4b-it"); },
               {.ops = 4000, .max_live = 4, .max_prompt = 1300, .max_chunk = 400}});
  s.push_back({"Gemma3n_window512_x4",
               [] { return FromModel("google--gemma-3n-E4B-it"); },
               {.ops = 5000, .max_live = 4, .max_prompt = 800, .max_chunk = 300, .pressure = 1.0}});
  s.push_back({"GptOss20B_window128", [] { return FromModel("openai--gpt-oss-20b"); }, {}});
  s.push_back({"Ministral8B_window256_like",
               [] { return FromModel("mistralai--Ministral-8B-Instruct-2410", 256); },
               {}});
  s.push_back({"Llama4Scout_chunk256_like",
               [] { return FromModel("meta-llama--Llama-4-Scout-17B-16E-Instruct", 256); },
               {}});
  s.push_back({"Jamba_state", [] { return FromModel("ai21labs--Jamba-v0.1"); }, {}});
  s.push_back(
      {"Bamba_state_ckpt128", [] { return FromModel("ibm-ai-platform--Bamba-9B", 0, 128); }, {}});
  // Without retention's demotions the fake engine checks the state pool's free-list order too.
  s.push_back({"Bamba_state_ckpt128_lru",
               [] {
                 std::optional<ManagerConfig> c = FromModel("ibm-ai-platform--Bamba-9B", 0, 128);
                 if (c) c->demote_superseded_checkpoints = false;
                 return c;
               },
               {}});
  s.push_back({"Qwen3Next_deltanet_ckpt64",
               [] { return FromModel("Qwen--Qwen3-Next-80B-A3B-Instruct", 0, 64); },
               {}});
  s.push_back({"Llama32Vision_cross",
               [] { return FromModel("meta-llama--Llama-3.2-11B-Vision"); },
               {.max_live = 5, .pressure = 1.0}});
  s.push_back({"Hand_full16_window48at32",
               [] {
                 return std::optional(
                     HandBuilt(2, {Group(TK::kAll, 16, 0), Group(TK::kWindow, 32, 1, 48)}));
               },
               {}});
  s.push_back({"Hand_sinks_state_ckpt64",
               [] {
                 ManagerConfig c =
                     HandBuilt(2, {Group(TK::kAll, 16, 0), Group(TK::kWindow, 16, 0, 64, 4),
                                   Group(TK::kState, 0, 1)});
                 c.checkpoint_interval = 64;
                 return std::optional(c);
               },
               {}});
  s.push_back(
      {"Hand_chunk64_sharedpool",
       [] {
         return std::optional(HandBuilt(1, {Group(TK::kChunk, 16, 0, 64), Group(TK::kAll, 16, 0)}));
       },
       {}});
  s.push_back({"Hand_state_only_ckpt32",
               [] {
                 ManagerConfig c = HandBuilt(1, {Group(TK::kState, 0, 0)});
                 c.checkpoint_interval = 32;
                 return std::optional(c);
               },
               {}});
  s.push_back(
      {"Hand_encoder8_full16",
       [] {
         return std::optional(HandBuilt(2, {Group(TK::kAll, 16, 0), Group(TK::kEncoder, 8, 1)}));
       },
       {}});
  s.push_back({"Hand_kitchen_sink_droplast",
               [] {
                 ManagerConfig c =
                     HandBuilt(3, {Group(TK::kAll, 16, 0), Group(TK::kWindow, 16, 0, 24, 2),
                                   Group(TK::kChunk, 16, 1, 48), Group(TK::kState, 0, 2),
                                   Group(TK::kEncoder, 16, 1)});
                 c.checkpoint_interval = 48;
                 c.drop_last_hit_block = true;
                 return std::optional(c);
               },
               {.pressure = 1.6}});
  s.push_back(
      {"Jamba_two_level", [] { return FromModel("ai21labs--Jamba-v0.1"); }, {.two_level = true}});
  s.push_back({"Qwen3Next_two_level_ckpt64",
               [] { return FromModel("Qwen--Qwen3-Next-80B-A3B-Instruct", 0, 64); },
               {.two_level = true}});
  s.push_back({"Hand_kitchen_sink_two_level",
               [] {
                 ManagerConfig c =
                     HandBuilt(3, {Group(TK::kAll, 16, 0), Group(TK::kWindow, 16, 0, 24, 2),
                                   Group(TK::kChunk, 16, 1, 48), Group(TK::kState, 0, 2),
                                   Group(TK::kEncoder, 16, 1)});
                 c.checkpoint_interval = 48;
                 return std::optional(c);
               },
               {.pressure = 1.6, .two_level = true}});
  s.push_back({"Gemma2_window128_like_ranked",
               [] { return Ranked(FromModel("google--gemma-2-9b", 128)); },
               {}});
  s.push_back({"Jamba_two_level_ranked",
               [] { return Ranked(FromModel("ai21labs--Jamba-v0.1")); },
               {.two_level = true}});
  s.push_back({"Hand_kitchen_sink_two_level_ranked",
               [] {
                 ManagerConfig c =
                     HandBuilt(3, {Group(TK::kAll, 16, 0), Group(TK::kWindow, 16, 0, 24, 2),
                                   Group(TK::kChunk, 16, 1, 48), Group(TK::kState, 0, 2),
                                   Group(TK::kEncoder, 16, 1)});
                 c.checkpoint_interval = 48;
                 return Ranked(c);
               },
               {.pressure = 1.6, .two_level = true}});
  s.push_back(
      {"Hand_no_prefix_cache_no_events",
       [] {
         ManagerConfig c = HandBuilt(1, {Group(TK::kAll, 16, 0), Group(TK::kWindow, 16, 0, 32)});
         c.enable_prefix_caching = false;
         c.record_events = false;
         return std::optional(c);
       },
       {}});
  s.push_back({"Llama31_8B_full_publish_at_allocate",
               [] { return PublishingAtAllocate(FromModel("meta-llama--Llama-3.1-8B")); },
               {}});
  s.push_back({"Gemma2_window128_like_publish_at_allocate",
               [] { return PublishingAtAllocate(FromModel("google--gemma-2-9b", 128)); },
               {}});
  s.push_back({"Llama4Scout_chunk256_like_publish_at_allocate",
               [] {
                 return PublishingAtAllocate(
                     FromModel("meta-llama--Llama-4-Scout-17B-16E-Instruct", 256));
               },
               {}});
  s.push_back({"Hand_full16_window48at32_publish_at_allocate",
               [] {
                 return PublishingAtAllocate(std::optional(
                     HandBuilt(2, {Group(TK::kAll, 16, 0), Group(TK::kWindow, 32, 1, 48)})));
               },
               {}});
  // With recurrent groups the flag changes nothing (a hit needs a state): still exact.
  s.push_back({"Jamba_state_publish_at_allocate",
               [] { return PublishingAtAllocate(FromModel("ai21labs--Jamba-v0.1")); },
               {}});
  return s;
}

// ---- Driver ---------------------------------------------------------------------------------

// Plays a random mix of engine behaviour against one manager: admissions with shared prefixes,
// chunked prefill, decode with drafts and partial acceptance, forks, truncation, preemption by
// recompute, frees, cache resets, and calls that must be refused.
class Driver {
 public:
  Driver(KvCacheManager& manager, uint64_t seed, DriveOptions o)
      : cfg_(manager.config()), o_(o), rng_(seed), eng_(manager, EngineOptionsFor(seed)) {
    for (const GroupConfig& g : cfg_.groups)
      has_encoder_ = has_encoder_ || g.is_encoder();
    for (int b = 0; b < 4; ++b) {
      std::vector<int32_t> base;
      for (int64_t i = 0; i < o_.max_prompt; ++i)
        base.push_back(Token());
      bases_.push_back(std::move(base));
    }
  }

  FakeEngine& engine() { return eng_; }
  bool failed() const { return eng_.failed(); }
  std::string Report() const { return eng_.Report(); }
  int64_t hit_checks() const { return hit_checks_; }
  bool has_encoder() const { return has_encoder_; }

  void Run() {
    for (int32_t i = 0; i < o_.ops && !failed(); ++i)
      Op();
    // Drain: every request ends; then the prefix cache can be reset.
    for (RequestId id : eng_.Ids()) {
      if (failed()) return;
      (void)eng_.Free(id);
    }
    if (!failed()) (void)eng_.ResetPrefixCache();
  }

  // Admits a request, looks it up, prefills it in chunks, decodes a few tokens, then frees it.
  void RunToCompletion(const EngineRequest& r, int64_t decode_tokens) {
    if (!eng_.Add(r).ok()) return;
    (void)eng_.Lookup(r.id);
    target_[r.id] = static_cast<int64_t>(r.prompt.size()) + decode_tokens;
    while (!failed() && eng_.Find(r.id) != nullptr) {
      if (!Schedule(r.id, /*may_preempt=*/false)) {
        if (eng_.Find(r.id) != nullptr)
          eng_.ReportViolation("engine: could not schedule request " + std::to_string(r.id) +
                               " alone in large pools");
        return;
      }
      Complete(r.id);
    }
  }

  std::vector<int32_t> RandomTokens(int64_t n) {
    std::vector<int32_t> out;
    for (int64_t i = 0; i < n; ++i)
      out.push_back(Token());
    return out;
  }

  EngineRequest NewRequest() {
    EngineRequest r;
    r.id = next_id_++;
    if (!recent_.empty() && Chance(0.3)) {
      r = recent_[Index(recent_.size())];
      r.id = next_id_ - 1;
      return r;
    }
    const std::vector<int32_t>& base = bases_[Index(bases_.size())];
    const int64_t len = Uniform(1, o_.max_prompt);
    r.prompt.assign(base.begin(), base.begin() + len);
    if (Chance(0.3))
      for (int64_t i = Uniform(0, 30);
           i > 0 && static_cast<int64_t>(r.prompt.size()) < o_.max_prompt; --i)
        r.prompt.push_back(Token());
    if (Chance(0.1)) r.adapter_id = static_cast<uint64_t>(Uniform(1, 2));
    if (Chance(0.1)) r.cache_salt = Chance(0.5) ? "tenant-a" : "tenant-b";
    if (Chance(0.15) && r.prompt.size() > 2) {
      PromptItem it;
      it.position = Uniform(0, static_cast<int64_t>(r.prompt.size()) - 2);
      it.length =
          Uniform(1, std::min<int64_t>(40, static_cast<int64_t>(r.prompt.size()) - it.position));
      // An item's data decides its length, so equal digests come with equal lengths.
      it.content = {static_cast<uint64_t>(Uniform(1, 2)), static_cast<uint64_t>(it.length)};
      for (int64_t p = it.position; p < it.position + it.length; ++p)
        r.prompt[static_cast<size_t>(p)] = 9;  // placeholder tokens: only the item data differs
      r.items.push_back(it);
    }
    if (has_encoder_) {
      const int64_t sizes[] = {33, 64, 100, 150};
      r.encoder_tokens = std::min(sizes[Index(4)], cfg_.max_encoder_tokens);
      r.encoder_input = {static_cast<uint64_t>(Uniform(1, 3)), 5};
    }
    if (Chance(0.1)) r.retention = Retention::kLow;
    recent_.push_back(r);
    if (recent_.size() > 8) recent_.erase(recent_.begin());
    return r;
  }

 private:
  using Seq = FakeEngine::Seq;

  void Op() {
    const double x = Real();
    const size_t live = eng_.size();
    if (live == 0 && Chance(0.2)) {
      (void)eng_.ResetPrefixCache();
    } else if (x < 0.16 && live < static_cast<size_t>(o_.max_live)) {
      Admit();
    } else if (x < 0.60) {
      if (live > 0) Advance(RandomLive());
    } else if (x < 0.68) {
      Batch();
    } else if (x < 0.72) {
      LeaveOpen();
    } else if (x < 0.76) {
      ForkOne();
    } else if (x < 0.80) {
      TruncateOne();
    } else if (x < 0.81) {
      if (live > 0) End(RandomLive());  // aborted, or a stop token
    } else if (x < 0.84) {
      RepeatAndCheckHit();
    } else if (x < 0.87) {
      Invalid();
    } else if (x < 0.872) {
      for (RequestId id : eng_.Ids())
        End(id);
    } else if (o_.two_level && x < 0.89) {
      // Between steps, as an engine would (refused while another step is left open); the fake
      // engine copies every moved page and poisons where it was.
      (void)eng_.Compact(Chance(0.5) ? Uniform(1, 2) : 1000);
    } else {
      if (live > 0) Advance(RandomLive());
    }
  }

  void Admit() {
    EngineRequest r;
    if (!waiting_.empty()) {
      r = waiting_.front();
      waiting_.erase(waiting_.begin());
      r.id = next_id_++;
    } else {
      r = NewRequest();
    }
    if (!eng_.Add(r).ok()) return;
    target_[r.id] = static_cast<int64_t>(r.prompt.size()) + Uniform(1, o_.max_output);
    if (Chance(0.85)) (void)eng_.Lookup(r.id);
  }

  // Samples when everything known is computed (accepting computed drafts first, which a request
  // forked between its forward pass and sampling still has). Returns false when it ended.
  bool SampleIfNeeded(RequestId id) {
    const Seq* q = eng_.Find(id);
    if (q->computed < q->known) return true;
    Accept(id);
    q = eng_.Find(id);
    return q != nullptr && q->computed < q->known;
  }

  // Allocates the request's next step: the next prefill chunk, or the sampled token and some
  // drafts. Returns whether a step is open.
  bool Schedule(RequestId id, bool may_preempt = true) {
    const Seq* q = eng_.Find(id);
    if (q == nullptr) return false;
    if (q->step) return true;
    if (!SampleIfNeeded(id)) return false;
    const bool drafts = Chance(0.5);
    const int64_t chunk = Uniform(1, o_.max_chunk);
    const int64_t draft_count = Uniform(1, 4);
    const int64_t ahead = Chance(0.2) ? Uniform(1, 4) : 0;
    for (int attempt = 0; attempt < 4 && !failed(); ++attempt) {
      q = eng_.Find(id);
      if (q == nullptr) return false;
      const int64_t begin = q->allocated ? q->computed : (q->looked_up ? q->hit.tokens : 0);
      const int64_t left = q->known - begin;
      int64_t n = std::min(left, chunk);
      if (n == left && drafts) n += draft_count;
      n = std::min(n, cfg_.max_model_len - begin);
      const int64_t lookahead =
          std::max<int64_t>(0, std::min(ahead, cfg_.max_model_len - begin - n));
      if (n <= 0) {
        End(id);
        return false;
      }
      const Status s = eng_.Allocate(id, n, lookahead);
      if (s.ok()) return true;
      if (s.code() == StatusCode::kFailedPrecondition && !q->allocated) {
        (void)eng_.Lookup(id);  // the hit went stale: look again
        continue;
      }
      if (s.code() != StatusCode::kResourceExhausted) return false;
      if (!may_preempt) {
        // Directed runs give one request room; any other request must go.
        if (eng_.size() <= 1) return false;
        for (RequestId other : eng_.Ids())
          if (other != id) Preempt(other);
        continue;
      }
      if (Chance(0.4)) return false;  // wait for another request to finish
      const RequestId victim = RandomLive();
      Preempt(victim);
      if (victim == id) return false;
    }
    return false;
  }

  // Runs the request's open step (with every other open step), commits it at a point the
  // engine can stand behind, accepts some drafts and samples.
  void Complete(RequestId id) {
    const Seq* q = eng_.Find(id);
    if (q == nullptr || !q->step) return;
    eng_.Run();
    const std::vector<int64_t> points = eng_.CommitPoints(id);
    if (points.empty()) return;
    const int64_t c = Chance(0.7) ? points.back() : points[Index(points.size())];
    if (!eng_.Commit(id, c).ok()) return;
    // Parallel sampling forks after the forward pass, before sampling: the child shares the
    // computed drafts too.
    if (Chance(0.03)) Fork(id);
    Accept(id);
  }

  // Speculative decoding: of the drafts computed past the known tokens, accept a prefix, drop the
  // rest with Truncate, append the accepted ones and a sampled token.
  void Accept(RequestId id) {
    const Seq* q = eng_.Find(id);
    if (q == nullptr) return;
    const int64_t known = q->known, computed = q->computed;
    if (computed < known) return;
    int64_t accept = Uniform(0, computed - known);
    accept = std::min(accept, cfg_.max_model_len - 1 - known);
    if (accept < 0 || known >= target_[id]) {
      End(id);
      return;
    }
    std::vector<int32_t> tokens(q->tokens.begin() + known, q->tokens.begin() + known + accept);
    if (computed > known + accept) {
      if (!eng_.Truncate(id, known + accept).ok()) return;
    }
    tokens.push_back(Token());
    (void)eng_.Append(id, tokens);
  }

  void Advance(RequestId id) {
    if (Schedule(id)) Complete(id);
  }

  void Batch() {
    std::vector<RequestId> ids = eng_.Ids();
    std::shuffle(ids.begin(), ids.end(), rng_);
    ids.resize(std::min<size_t>(ids.size(), 3));
    std::vector<RequestId> open;
    for (RequestId id : ids)
      if (Schedule(id)) open.push_back(id);
    eng_.Run();
    for (RequestId id : open)
      Complete(id);
  }

  void LeaveOpen() {
    if (eng_.size() == 0) return;
    (void)Schedule(RandomLive());
  }

  void ForkOne() {
    if (eng_.size() > 0) Fork(RandomLive());
  }

  void Fork(RequestId parent) {
    if (eng_.size() >= static_cast<size_t>(o_.max_live) + 2) return;
    const RequestId child = next_id_++;
    if (eng_.Fork(parent, child).ok())
      target_[child] = eng_.Find(child)->known + Uniform(1, o_.max_output);
  }

  void TruncateOne() {
    if (eng_.size() == 0) return;
    const RequestId id = RandomLive();
    const Seq* q = eng_.Find(id);
    if (q->step) return;
    const int64_t lo = std::max<int64_t>(1, q->spec.items_end());
    if (lo > q->known) return;
    (void)eng_.Truncate(id, Chance(0.9) ? Uniform(lo, q->known) : q->known + Uniform(0, 3));
  }

  void End(RequestId id) {
    if (eng_.Find(id) == nullptr) return;
    (void)eng_.Free(id);
    target_.erase(id);
  }

  // Preemption by recompute: the request ends and comes back later with everything it knew as
  // its prompt, which its own freed blocks may serve.
  void Preempt(RequestId id) {
    const Seq* q = eng_.Find(id);
    if (q == nullptr) return;
    EngineRequest r = q->spec;
    r.prompt.assign(q->tokens.begin(), q->tokens.begin() + q->known);
    End(id);
    if (!r.prompt.empty()) waiting_.push_back(std::move(r));
  }

  // A request whose prompt is fully computed ends; the same prompt comes straight back and must
  // find its whole aligned prefix cached, unless something was evicted since the first arrived.
  void RepeatAndCheckHit() {
    if (eng_.size() == 0) return;
    const RequestId id = RandomLive();
    const Seq* q = eng_.Find(id);
    const int64_t prompt = static_cast<int64_t>(q->spec.prompt.size());
    if (q->step || q->computed < prompt || q->known < prompt ||
        !std::equal(q->spec.prompt.begin(), q->spec.prompt.end(), q->tokens.begin()))
      return;
    const bool exact = cfg_.record_events && cfg_.enable_prefix_caching &&
                       !cfg_.drop_last_hit_block && q->removed_at_add == eng_.removed_events() &&
                       q->resets_at_add == eng_.resets();
    EngineRequest r = q->spec;
    r.id = next_id_++;
    End(id);
    if (!eng_.Add(r).ok()) return;
    target_[r.id] = prompt + Uniform(1, o_.max_output);
    Result<PrefixHit> hit = eng_.Lookup(r.id);
    if (!hit.ok()) return;
    const int64_t align = cfg_.align_tokens();
    const int64_t want = (prompt - 1) / align * align;
    if (exact && (hit->tokens != want || hit->encoder != (r.encoder_tokens > 0))) {
      eng_.ReportViolation("repeat of a freed request's prompt (" + std::to_string(prompt) +
                           " tokens, nothing evicted since) hits " + std::to_string(hit->tokens) +
                           (hit->encoder ? " +encoder" : "") + ", expected " +
                           std::to_string(want) + (r.encoder_tokens > 0 ? " +encoder" : ""));
    }
    if (!cfg_.enable_prefix_caching && (hit->tokens != 0 || hit->encoder))
      eng_.ReportViolation("hit with prefix caching disabled");
    ++hit_checks_;
  }

  // Calls that must be refused (the engine knows they are invalid and checks that nothing
  // changed).
  void Invalid() {
    const RequestId unknown = 1'000'000'000 + static_cast<RequestId>(Uniform(0, 9));
    const RequestId any = eng_.size() > 0 ? RandomLive() : unknown;
    const Seq* q = eng_.Find(any);
    switch (Uniform(0, 13)) {
      case 0:
        (void)eng_.Free(unknown);
        break;
      case 1:
        (void)eng_.Commit(any, q != nullptr && q->step ? q->step->end + 1 : 0);
        break;
      case 2:
        (void)eng_.Lookup(any);  // refused once allocated
        break;
      case 3:
        (void)eng_.Allocate(any, -1);
        break;
      case 4:
        (void)eng_.Allocate(any, cfg_.max_model_len + 1);
        break;
      case 5:
        if (eng_.size() > 0) (void)eng_.Fork(RandomLive(), RandomLive());
        break;
      case 6: {
        EngineRequest r = NewRequest();
        r.id = any;  // duplicate (or unknown when none is live: then valid)
        if (q != nullptr) (void)eng_.Add(r);
        break;
      }
      case 7: {
        EngineRequest r;
        r.id = next_id_++;
        if (Chance(0.5)) r.prompt.assign(static_cast<size_t>(cfg_.max_model_len + 1), 5);
        if (has_encoder_) r.encoder_tokens = Chance(0.5) ? 0 : cfg_.max_encoder_tokens + 1;
        (void)eng_.Add(r);
        break;
      }
      case 8:
        (void)eng_.Truncate(any, -1);
        break;
      case 9: {
        std::vector<int32_t> many(static_cast<size_t>(cfg_.max_model_len), 3);
        if (q != nullptr && !q->step) (void)eng_.Append(any, many);
        break;
      }
      case 10:
        (void)eng_.ResetPrefixCache();
        break;
      case 11:  // counts whose sums overflow
        (void)eng_.Allocate(any, std::numeric_limits<int64_t>::max());
        break;
      case 12:
        (void)eng_.Allocate(any, 1, std::numeric_limits<int64_t>::max());
        break;
      default:
        if (q != nullptr && q->step) (void)eng_.Allocate(any, 1);  // a second open step
        break;
    }
  }

  RequestId RandomLive() {
    const std::vector<RequestId> ids = eng_.Ids();
    return ids[Index(ids.size())];
  }
  bool Chance(double p) { return Real() < p; }
  double Real() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }
  int64_t Uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  int32_t Token() { return static_cast<int32_t>(Uniform(100, 30000)); }
  size_t Index(size_t n) { return static_cast<size_t>(Uniform(0, static_cast<int64_t>(n) - 1)); }

  static testing::EngineOptions EngineOptionsFor(uint64_t seed) {
    testing::EngineOptions e;
    e.seed = seed * 7919 + 1;
    return e;
  }

  const ManagerConfig cfg_;
  DriveOptions o_;
  std::mt19937_64 rng_;
  FakeEngine eng_;
  bool has_encoder_ = false;
  std::vector<std::vector<int32_t>> bases_;
  std::vector<EngineRequest> recent_, waiting_;
  std::map<RequestId, int64_t> target_;  // known tokens at which a request ends
  RequestId next_id_ = 1;
  int64_t hit_checks_ = 0;
};

// ---- Tests --------------------------------------------------------------------------------

void PrintTo(const ShapeCase& s, std::ostream* os) {
  *os << s.name;
}

class ManagerRandomTest : public ::testing::TestWithParam<ShapeCase> {
 protected:
  std::optional<KvCacheManager> Make(ManagerConfig config) {
    Result<KvCacheManager> m = KvCacheManager::Create(config);
    if (!m.ok()) {
      ADD_FAILURE() << "Create: " << m.status().ToString();
      return std::nullopt;
    }
    return std::move(m).value();
  }
};

TEST_P(ManagerRandomTest, RandomOperationsReadExactlyWhatWasWritten) {
  std::optional<ManagerConfig> config = GetParam().make();
  ASSERT_TRUE(config.has_value());
  const DriveOptions& o = GetParam().drive;
  SizePools(*config, o, o.pressure);
  if (o.two_level) TwoLevel(*config);
  bool state = false;
  for (const GroupConfig& g : config->groups)
    state = state || g.is_state();
  for (uint64_t seed : {1u, 2u, 3u}) {
    std::optional<KvCacheManager> m = Make(*config);
    ASSERT_TRUE(m.has_value());
    Driver d(*m, seed, o);
    d.Run();
    ASSERT_FALSE(d.failed()) << GetParam().name << " seed " << seed << ":\n" << d.Report();
    EXPECT_EQ(m->num_requests(), 0);
    // The run must have exercised what it is meant to: sharing, pressure, rollback. Thresholds
    // are about a third of the least seen over 25 seeds per shape.
    const FakeEngine::Counters& c = d.engine().counters();
    const std::string what = d.engine().DescribeCounters();
    RecordProperty("seed" + std::to_string(seed), what);
    EXPECT_GT(c.steps, o.ops / 5) << what;
    EXPECT_GT(c.partial_commits, o.ops / 50) << what;
    EXPECT_GT(c.exhausted, o.ops / 500) << what;
    EXPECT_GT(c.forks, o.ops / 100) << what;
    EXPECT_GT(c.truncates, o.ops / 30) << what;
    EXPECT_GT(c.refused, o.ops / 100) << what;
    bool tokens = false;
    for (const GroupConfig& g : config->groups)
      tokens = tokens || (g.rule.keeps_tokens() && !g.is_encoder());
    if (tokens) {
      EXPECT_GT(c.copies, 0) << what;  // copy-on-write of a shared or published block
    }
    EXPECT_GT(d.hit_checks(), 0) << what;
    if (config->enable_prefix_caching) {
      EXPECT_GT(c.hits, o.ops / 4000) << what;
      EXPECT_GT(d.engine().removed_events(), 0) << what;
      if (d.has_encoder()) {
        EXPECT_GT(c.encoder_hits, o.ops / 500) << what;
      }
    }
    if (state) {
      EXPECT_GT(c.snapshots, o.ops / 20) << what;
    }
    if (o.two_level) {
      EXPECT_GT(c.compactions, 0) << what;
      EXPECT_GT(c.pages_moved, 0) << what;
    }
  }
}

// With pools that never evict, a prompt that ran to the end and was freed comes back as a hit of
// its whole aligned prefix (the last token is always computed), in every group kind. With
// drop_last_hit_block the hit ends one unit early, or at the previous cached recurrent state.
TEST_P(ManagerRandomTest, FreedPromptComesBackAsItsWholeAlignedPrefix) {
  std::optional<ManagerConfig> config = GetParam().make();
  ASSERT_TRUE(config.has_value());
  SizePools(*config, {.max_prompt = 700}, 12);  // nothing is ever evicted
  if (GetParam().drive.two_level) TwoLevel(*config);
  std::optional<KvCacheManager> m = Make(*config);
  ASSERT_TRUE(m.has_value());
  Driver d(*m, 7, {.max_prompt = 700});
  bool has_state = false;
  for (const GroupConfig& g : config->groups)
    has_state = has_state || g.is_state();
  const int64_t align = config->align_tokens();
  for (int64_t len :
       {int64_t{1}, align - 1, align, align + 1, 3 * align, 5 * align + 7, int64_t{640}}) {
    if (len < 1 || len > 700) continue;
    EngineRequest r = d.NewRequest();
    r.prompt = d.RandomTokens(len);  // shares no prefix with earlier prompts
    r.items.clear();
    r.retention = Retention::kNormal;  // low retention would put its blocks first in line
    d.RunToCompletion(r, 5);
    ASSERT_FALSE(d.failed()) << d.Report();
    EngineRequest again = r;
    again.id = r.id + 100000;
    ASSERT_TRUE(d.engine().Add(again).ok());
    Result<PrefixHit> hit = d.engine().Lookup(again.id);
    ASSERT_TRUE(hit.ok());
    ASSERT_FALSE(d.failed()) << d.Report();
    // Publishing at Allocate, a commit short of the step withdraws what it published (a removed
    // event each) and publishes it again at a later commit; only evictions are ruled out.
    if (!config->publish_at_allocate) {
      ASSERT_EQ(d.engine().removed_events(), 0) << "the pools were meant never to evict";
    }
    const int64_t full = config->enable_prefix_caching ? (len - 1) / align * align : 0;
    if (!config->drop_last_hit_block) {
      EXPECT_EQ(hit->tokens, full) << "prompt of " << len << " tokens, align " << align << "\n"
                                   << d.Report();
    } else if (!has_state) {
      EXPECT_EQ(hit->tokens, std::max<int64_t>(0, full - align)) << "prompt of " << len;
    } else {
      EXPECT_TRUE(full == 0 ? hit->tokens == 0 : hit->tokens < full)
          << "prompt of " << len << ": hit " << hit->tokens << ", full hit " << full;
    }
    EXPECT_EQ(hit->encoder, config->enable_prefix_caching && r.encoder_tokens > 0);
    // Running the repeat verifies that what the hit serves is the right content.
    ASSERT_TRUE(d.engine().Free(again.id).ok());
    d.RunToCompletion(again, 3);
    ASSERT_FALSE(d.failed()) << d.Report();
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, ManagerRandomTest, ::testing::ValuesIn(Shapes()),
                         [](const ::testing::TestParamInfo<ShapeCase>& param) {
                           return param.param.name;
                         });

// The checker itself: a single flipped slot of a position the next step reads is reported.
TEST(FakeEngineTest, ReportsACorruptedSlot) {
  ManagerConfig c = HandBuilt(1, {Group(TK::kAll, 16, 0), Group(TK::kWindow, 16, 0, 32)});
  Result<KvCacheManager> m = KvCacheManager::Create(c);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  FakeEngine eng(*m);
  EngineRequest r;
  r.id = 1;
  for (int32_t i = 0; i < 100; ++i)
    r.prompt.push_back(1000 + i);
  ASSERT_TRUE(eng.Add(r).ok());
  ASSERT_TRUE(eng.Allocate(1, 100).ok());
  eng.Run();
  ASSERT_TRUE(eng.Commit(1, 100).ok());
  eng.AuditAll();
  ASSERT_FALSE(eng.failed()) << eng.Report();
  eng.CorruptSlot(1, 1, 90);  // inside the window of position 100
  eng.AuditAll();
  EXPECT_TRUE(eng.failed());
}

// ...and so is a state that is not the one the step starts from.
TEST(FakeEngineTest, ReportsAStaleState) {
  ManagerConfig c = HandBuilt(2, {Group(TK::kAll, 16, 0), Group(TK::kState, 0, 1)});
  Result<KvCacheManager> m = KvCacheManager::Create(c);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  FakeEngine eng(*m);
  EngineRequest r;
  r.id = 1;
  r.prompt.assign(40, 7);
  ASSERT_TRUE(eng.Add(r).ok());
  ASSERT_TRUE(eng.Allocate(1, 20).ok());
  eng.Run();
  ASSERT_TRUE(eng.Commit(1, 20).ok());
  ASSERT_TRUE(eng.Allocate(1, 20).ok());
  eng.CorruptState(1);
  eng.Run();
  EXPECT_TRUE(eng.failed());
}

}  // namespace
}  // namespace hkv
