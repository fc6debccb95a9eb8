// FakeEngine: drives a KvCacheManager the way an inference engine does and checks, with fake
// memory, that every step reads exactly what a correct cache holds.
//
// The model is kept small so that it can be trusted:
// - Memory is one uint64 per KV slot (block * block_tokens + offset) of a token group and one per
//   block of a state group. Never-written memory holds kPoison.
// - The KV of decoder position p is a digest of everything that shapes it in a real model: adapter,
//   cache salt, encoder input (cross-attention models), the multimodal items over the prompt and
//   tokens [0, p]. The state after p tokens is a digest of the same inputs over [0, p), and 0 for
//   p == 0 (the zero state, which the manager expresses as read == the null block). Encoder KV at
//   encoder position e is a digest of (encoder input, adapter, salt, e).
// - A step is: Allocate, then (at Run, for every open step in the order they were allocated, like
//   one batched forward pass) apply the copies, write the encoder if asked, verify the state each
//   step reads, write the steps' KV, verify every position each group's rule needs before each
//   step, then write the snapshots and states. KV is written before it is read, as a forward pass
//   writes a layer's KV for the whole batch before its attention reads any (what lets a request
//   hit blocks another computes in the same batch, ManagerConfig::publish_at_allocate); a state
//   is read before any is written, as no recurrent layer can read a state the same pass makes.
// So any block the manager shares, reuses, evicts, copies or rolls back wrongly ends up read with
// a digest other than the one the reading request expects.
//
// Every manager call goes through a wrapper that knows, from the engine's own mirror of each
// request, whether the call must succeed, must fail or may do either (the contract leaves it
// open). After every call it checks CheckInvariants(), the mirror against NumTokens/NumComputed/
// Step, and the event stream against Usage().num_cached; after every failed call, that nothing
// changed (usage, free-list order, events, requests). Violations go to a handler (the fuzzer
// traps) and are kept with the last operations for the report.
//
// Calls that an engine could not make coherently (appending tokens while a step is open, appending
// a token other than a computed draft, truncating while a step is open or into a multimodal item)
// are refused by the engine itself: it returns kFailedPrecondition starting with "engine:" and
// does not call the manager.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <hkv/manager/kv_cache_manager.h>
#include <hkv/manager/manager_probe.h>

namespace hkv::testing {

inline constexpr uint64_t kPoison = 0xDEADBEEFDEADBEEFull;  // memory nobody wrote
inline constexpr uint64_t kZeroState = 0;                   // the state after 0 tokens

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// Order-sensitive: Mix(Mix(h, a), b) != Mix(Mix(h, b), a) for all practical purposes.
inline uint64_t Mix(uint64_t h, uint64_t v) {
  return SplitMix64(h ^ SplitMix64(v ^ 0x632BE59BD9B4E019ull));
}
inline uint64_t DigestString(std::string_view s) {
  uint64_t h = Mix(0x5A17, s.size());
  for (char c : s)
    h = Mix(h, static_cast<unsigned char>(c));
  return h;
}

inline uint64_t DigestTokens(std::span<const int32_t> tokens) {
  uint64_t h = Mix(0x70C, tokens.size());
  for (int32_t t : tokens)
    h = Mix(h, static_cast<uint32_t>(t));
  return h;
}

// An owning RequestSpec.
struct EngineRequest {
  RequestId id = 0;
  std::vector<int32_t> prompt;
  uint64_t adapter_id = 0;
  std::string cache_salt;
  std::vector<PromptItem> items;
  int64_t encoder_tokens = 0;
  BlockHash encoder_input;
  Retention retention = Retention::kNormal;

  RequestSpec View() const {
    RequestSpec s;
    s.id = id;
    s.prompt = prompt;
    s.adapter_id = adapter_id;
    s.cache_salt = cache_salt;
    s.items = items;
    s.encoder_tokens = encoder_tokens;
    s.encoder_input = encoder_input;
    s.retention = retention;
    return s;
  }
  int64_t items_end() const {
    int64_t end = 0;
    for (const PromptItem& it : items)
      end = std::max(end, it.position + it.length);
    return end;
  }
};

struct EngineOptions {
  uint64_t seed = 1;
  int32_t vocab = 1000;      // drafts are drawn from [0, vocab)
  int32_t audit_every = 16;  // audit every live request after this many calls (0: never)
  size_t log_size = 40;      // operations kept for the report
};

class FakeEngine {
 public:
  using ViolationHandler = std::function<void(const std::string&)>;

  explicit FakeEngine(KvCacheManager& manager, EngineOptions options = {},
                      ViolationHandler on_violation = {})
      : m_(manager),
        cfg_(manager.config()),
        opt_(options),
        rng_(options.seed),
        on_violation_(std::move(on_violation)) {
    mem_.resize(cfg_.pool_blocks.size());
    for (const GroupConfig& g : cfg_.groups) {
      has_encoder_ = has_encoder_ || g.is_encoder();
      has_state_ = has_state_ || g.is_state();
      if (g.rule.kind == TokenRuleKind::kWindow || g.rule.kind == TokenRuleKind::kChunk)
        only_full_ = false;
      if (g.pool >= 0 && g.pool < static_cast<int32_t>(mem_.size()))
        mem_[static_cast<size_t>(g.pool)].width =
            std::max(mem_[static_cast<size_t>(g.pool)].width, g.is_state() ? 1 : g.block_tokens);
    }
    only_full_ = only_full_ && !has_state_;
    for (size_t p = 0; p < mem_.size(); ++p) {
      mem_[p].data.assign(static_cast<size_t>(cfg_.pool_blocks[p]) * mem_[p].width, kPoison);
      mem_[p].who.assign(mem_[p].data.size(), Writer{});
      identity_.emplace_back(static_cast<size_t>(cfg_.pool_blocks[p]), 0);
    }
    ExpectClean("create");
  }

  // ---- Manager calls ------------------------------------------------------------------------

  Status Add(const EngineRequest& r) {
    Expect e = Expect::kOk;
    if (seqs_.count(r.id) || r.prompt.empty() ||
        static_cast<int64_t>(r.prompt.size()) > cfg_.max_model_len || r.encoder_tokens < 0 ||
        r.encoder_tokens > cfg_.max_encoder_tokens || has_encoder_ != (r.encoder_tokens > 0))
      e = Expect::kFail;
    for (const PromptItem& it : r.items) {
      if (it.position < 0 || it.length < 0 ||
          it.position + it.length > static_cast<int64_t>(r.prompt.size()))
        e = Expect::kFail;
      else if (it.length == 0 && e == Expect::kOk)
        e = Expect::kEither;
    }
    if (e == Expect::kOk && !ItemsOrdered(r.items)) e = Expect::kEither;
    Before before = Snap();
    const Status s = m_.AddRequest(r.View());
    std::string items;
    for (const PromptItem& it : r.items)
      items += " [" + std::to_string(it.position) + ", " + std::to_string(it.position + it.length) +
               ")#" + std::to_string(it.content.lo);
    Log("add " + Id(r.id) + " prompt " + std::to_string(r.prompt.size()) + " (digest " +
            std::to_string(DigestTokens(r.prompt) % 10000) + ") adapter " +
            std::to_string(r.adapter_id) + " salt '" + r.cache_salt + "' items" +
            (items.empty() ? " none" : items) + " encoder " + std::to_string(r.encoder_tokens) +
            "#" + std::to_string(r.encoder_input.lo),
        s);
    if (After("AddRequest", s, e, before)) {
      Seq q;
      q.spec = r;
      q.tokens = r.prompt;
      q.known = static_cast<int64_t>(r.prompt.size());
      q.removed_at_add = removed_events_;
      q.resets_at_add = resets_;
      InitDigests(q);
      seqs_.emplace(r.id, std::move(q));
    }
    Settle();
    return s;
  }

  Result<PrefixHit> Lookup(RequestId id) {
    Seq* q = FindMut(id);
    const Expect e = (q == nullptr || q->allocated) ? Expect::kFail : Expect::kOk;
    Before before = Snap();
    Result<PrefixHit> r = m_.Lookup(id);
    Log("lookup " + Id(id) +
            (r.ok() ? " -> " + std::to_string(r->tokens) + (r->encoder ? " +encoder" : "") : ""),
        r.ok() ? Status::Ok() : r.status());
    // Lookup never mutates, so even a successful one must leave everything as it was.
    if (r.ok()) CheckUnchanged("Lookup", before);
    if (!After("Lookup", r.ok() ? Status::Ok() : r.status(), e, before, /*mutating=*/false)) {
      Settle();
      return r;
    }
    const int32_t align = cfg_.align_tokens();
    if (r->tokens < 0 || r->tokens % align != 0 || r->tokens > std::max<int64_t>(0, q->known - 1))
      Violation("Lookup(" + Id(id) + ") hit " + std::to_string(r->tokens) +
                " is not a multiple of align_tokens " + std::to_string(align) +
                " in [0, known - 1 = " + std::to_string(q->known - 1) + "]");
    if (r->encoder && q->spec.encoder_tokens == 0)
      Violation("Lookup(" + Id(id) + ") reports an encoder hit for a request without encoder");
    if (!cfg_.enable_prefix_caching && (r->tokens != 0 || r->encoder))
      Violation("Lookup(" + Id(id) + ") hits with prefix caching disabled");
    counters_.hits += r->tokens > 0;
    counters_.hit_tokens += r->tokens;
    counters_.encoder_hits += r->encoder;
    q->looked_up = true;
    q->hit = *r;
    q->hit_epoch = epoch_;
    Settle();
    return r;
  }

  // Allocates the next step of n tokens, passing the looked-up hit on the first call (or none).
  Status Allocate(RequestId id, int64_t n, int64_t lookahead = 0) {
    Seq* q = FindMut(id);
    PrefixHit hit;
    if (q != nullptr && !q->allocated && q->looked_up) hit = q->hit;
    return AllocateWithHit(id, n, hit, lookahead);
  }

  // Same, with any hit (a fuzzer may forge or replay one).
  Status AllocateWithHit(RequestId id, int64_t n, const PrefixHit& hit, int64_t lookahead) {
    Seq* q = FindMut(id);
    const bool hit_given = hit.tokens != 0 || hit.encoder;
    Expect e = Expect::kOk;
    std::vector<StatusCode> allowed = {StatusCode::kResourceExhausted};
    int64_t begin = 0;
    if (q == nullptr || q->step || n < 0 || lookahead < 0) {
      e = Expect::kFail;
    } else {
      begin = q->allocated ? q->computed : hit.tokens;
      if (q->allocated && hit_given) e = Expect::kFail;
      if (begin < 0 || n > cfg_.max_model_len || lookahead > cfg_.max_model_len ||
          begin + n + lookahead > cfg_.max_model_len)
        e = Expect::kFail;
      if (e == Expect::kOk && !q->allocated && hit_given) {
        const bool same =
            q->looked_up && hit.tokens == q->hit.tokens && hit.encoder == q->hit.encoder;
        if (!same)
          e = Expect::kEither;  // forged: content verification decides
        else if (q->hit_epoch != epoch_)
          allowed.push_back(StatusCode::kFailedPrecondition);
      }
      if (e == Expect::kOk && n == 0) e = Expect::kEither;
      // Truncate(id, 0) may leave an unstarted request with no tokens; the contract is silent.
      if (e == Expect::kOk && !q->allocated && q->known == 0) e = Expect::kEither;
    }
    Before before = Snap();
    const Status s = m_.Allocate(id, n, hit, lookahead);
    Log("allocate " + Id(id) + " n " + std::to_string(n) + " hit " + std::to_string(hit.tokens) +
            (hit.encoder ? "+enc" : "") + " lookahead " + std::to_string(lookahead),
        s);
    if (s.code() == StatusCode::kResourceExhausted) {
      ++allocations_failed_;
      ++counters_.exhausted;
    }
    if (After("Allocate", s, e, before, true, allowed)) {
      q->allocated = true;
      q->computed = begin;
      CaptureStep(*q, begin, n, lookahead, hit);
    }
    Settle();
    return s;
  }

  // Executes every open step that has not run yet, as one batched forward pass.
  void Run() {
    std::vector<Seq*> batch;
    for (RequestId id : pending_) {
      Seq* q = FindMut(id);
      if (q != nullptr && q->step && !q->step->executed) batch.push_back(q);
    }
    pending_.clear();
    for (Seq* q : batch)
      RecheckTables(*q);
    for (Seq* q : batch)
      for (const BlockCopy& c : q->step->copies)
        CopyBlock(c);
    for (Seq* q : batch)
      if (q->step->run_encoder) WriteEncoder(*q);
    for (Seq* q : batch)
      VerifyStates(*q);
    for (Seq* q : batch)
      WriteTokens(*q);
    for (Seq* q : batch)
      VerifyTokens(*q, q->step->begin, q->step->tables, "step");
    for (Seq* q : batch)
      WriteStates(*q);
    for (Seq* q : batch) {
      q->step->executed = true;
      ++counters_.steps;
      counters_.copies += static_cast<int64_t>(q->step->copies.size());
      for (const StateCapture& sc : q->step->states)
        counters_.snapshots += static_cast<int64_t>(sc.snapshots.size());
    }
  }

  // Positions the open step may be committed at: any in [begin, end] without recurrent state;
  // with it, the ends of the step and the positions every state group snapshots (the manager
  // refuses others).
  std::vector<int64_t> CommitPoints(RequestId id) const {
    std::vector<int64_t> out;
    const Seq* q = Find(id);
    if (q == nullptr || !q->step) return out;
    const OpenStep& st = *q->step;
    for (int64_t c = st.begin; c <= st.end; ++c) {
      bool ok = true;
      for (const StateCapture& sc : st.states) {
        if (!sc.is_state || c == st.begin || c == st.end) continue;
        ok = ok && std::any_of(sc.snapshots.begin(), sc.snapshots.end(),
                               [c](const StateSnapshot& s) { return s.position == c; });
      }
      if (ok) out.push_back(c);
    }
    return out;
  }

  Status Commit(RequestId id, int64_t computed) {
    Seq* q = FindMut(id);
    if (q != nullptr && q->step && !q->step->executed) Run();
    Expect e = (q == nullptr || !q->step || computed < q->step->begin || computed > q->step->end)
                   ? Expect::kFail
                   : Expect::kOk;
    // Recurrent state exists only at the commit points; elsewhere a manager may refuse.
    if (e == Expect::kOk) {
      const std::vector<int64_t> points = CommitPoints(id);
      if (std::find(points.begin(), points.end(), computed) == points.end()) e = Expect::kEither;
    }
    // A state written in place no longer holds the state after `begin`: a manager may refuse to
    // land there (if it accepts, the next step's read shows whether it kept that state).
    if (e == Expect::kOk && computed == q->step->begin && computed < q->step->end) {
      for (const StateCapture& sc : q->step->states)
        if (sc.is_state && sc.read != 0 && sc.read == sc.write) e = Expect::kEither;
    }
    // Blocks the step published at Allocate that another request hit cannot be taken back.
    if (e == Expect::kOk && cfg_.publish_at_allocate && computed < q->step->end)
      e = Expect::kEither;
    Before before = Snap();
    const Status s = m_.Commit(id, computed);
    Log("commit " + Id(id) + " " + std::to_string(computed), s);
    if (After("Commit", s, e, before)) {
      ++counters_.commits;
      if (computed < q->step->end) ++counters_.partial_commits;
      q->computed = computed;
      q->step.reset();
      CheckReleaseOrder("Commit", before, q->spec.retention);
      Audit(*q);
    }
    Settle();
    return s;
  }

  // Appends tokens. Tokens at positions already computed (accepted drafts) must be the drafts.
  Status Append(RequestId id, std::span<const int32_t> tokens) {
    Seq* q = FindMut(id);
    if (q != nullptr && q->step) return Refuse("append while a step is open");
    if (q != nullptr) {
      for (size_t i = 0; i < tokens.size(); ++i) {
        const int64_t p = q->known + static_cast<int64_t>(i);
        if (p < q->computed && q->tokens[static_cast<size_t>(p)] != tokens[i])
          return Refuse("append of a token other than the computed draft at " + std::to_string(p));
      }
    }
    Expect e = Expect::kOk;
    if (q == nullptr || q->known + static_cast<int64_t>(tokens.size()) > cfg_.max_model_len)
      e = Expect::kFail;
    else if (tokens.empty())
      e = Expect::kEither;
    Before before = Snap();
    const Status s = m_.AppendTokens(id, tokens);
    Log("append " + Id(id) + " " + std::to_string(tokens.size()) + " tokens", s);
    if (After("AppendTokens", s, e, before)) {
      for (size_t i = 0; i < tokens.size(); ++i)
        SetToken(*q, q->known + static_cast<int64_t>(i), tokens[i]);
      q->known += static_cast<int64_t>(tokens.size());
      q->looked_up = false;  // a hit was for other tokens: look up again
    }
    Settle();
    return s;
  }

  Status Fork(RequestId parent, RequestId child) {
    Seq* p = FindMut(parent);
    const Expect e = (p == nullptr || p->step || seqs_.count(child) || parent == child)
                         ? Expect::kFail
                         : Expect::kOk;
    Before before = Snap();
    const Status s = m_.Fork(parent, child);
    Log("fork " + Id(parent) + " -> " + Id(child), s);
    if (After("Fork", s, e, before)) {
      ++counters_.forks;
      Seq c = *p;
      c.spec.id = child;
      c.looked_up = false;
      c.hit = {};
      // removed_at_add / resets_at_add stay the parent's: the child's blocks are as old.
      Audit(seqs_.emplace(child, std::move(c)).first->second);
    }
    Settle();
    return s;
  }

  Result<TruncateResult> Truncate(RequestId id, int64_t n) {
    Seq* q = FindMut(id);
    if (q != nullptr && q->step) return Refuse("truncate while a step is open");
    if (q != nullptr && n >= 0 && n < q->spec.items_end())
      return Refuse("truncate into a multimodal item");
    Expect e = Expect::kOk;
    if (q == nullptr || n < 0)
      e = Expect::kFail;
    else if (n == 0 || n > std::max(q->known, q->computed))  // the contract leaves these open
      e = Expect::kEither;
    Before before = Snap();
    Result<TruncateResult> r = m_.Truncate(id, n);
    const Status s = r.ok() ? Status::Ok() : r.status();
    Log("truncate " + Id(id) + " " + std::to_string(n) +
            (r.ok() ? " -> tokens " + std::to_string(r->tokens) + " computed " +
                          std::to_string(r->computed) + " recompute " + std::to_string(r->recompute)
                    : ""),
        s);
    if (!After("Truncate", s, e, before)) {
      Settle();
      return r;
    }
    const int64_t old_known = q->known, old_computed = q->computed;
    const std::string what = "Truncate(" + Id(id) + ", " + std::to_string(n) + ") from tokens " +
                             std::to_string(old_known) + " computed " +
                             std::to_string(old_computed);
    if (r->tokens != std::min(n, old_known))
      Violation(what + ": tokens " + std::to_string(r->tokens) + ", expected min(n, tokens)");
    if (r->computed < 0 || r->computed > std::min(n, old_computed))
      Violation(what + ": computed " + std::to_string(r->computed) +
                " outside [0, min(n, computed)]");
    // Nothing at or after n is dropped from a request that had not computed past n; and without
    // windows, chunks or recurrent state every kept position stays valid.
    if ((n >= old_computed || only_full_) && r->computed != std::min(n, old_computed))
      Violation(what + ": computed " + std::to_string(r->computed) + ", expected " +
                std::to_string(std::min(n, old_computed)));
    const int64_t lo = std::max<int64_t>(0, std::min(old_computed, r->tokens) - r->computed);
    const int64_t hi = std::max<int64_t>(0, r->tokens - r->computed);
    if (r->recompute < lo || r->recompute > hi)
      Violation(what + ": recompute " + std::to_string(r->recompute) + " outside [" +
                std::to_string(lo) + ", " + std::to_string(hi) + "]");
    recomputed_ += r->recompute;
    ++counters_.truncates;
    counters_.rollbacks += r->computed < std::min(n, old_computed);
    q->known = r->tokens;
    q->computed = r->computed;
    q->looked_up = false;  // a hit was for other tokens: look up again
    ResizeTokens(*q, std::max(q->known, q->computed));
    Audit(*q);
    Settle();
    return r;
  }

  Status Free(RequestId id) {
    Expect e = Find(id) == nullptr ? Expect::kFail : Expect::kOk;
    // Nor can an open step's, by freeing the request before it commits.
    if (e == Expect::kOk && cfg_.publish_at_allocate && Find(id)->step) e = Expect::kEither;
    Before before = Snap();
    const Status s = m_.Free(id);
    Log("free " + Id(id), s);
    if (After("Free", s, e, before)) {
      CheckReleaseOrder("Free", before, Find(id)->spec.retention, cfg_.coherent_eviction);
      seqs_.erase(id);
      pending_.erase(std::remove(pending_.begin(), pending_.end(), id), pending_.end());
    }
    Settle();
    return s;
  }

  Status ResetPrefixCache() {
    Expect e = seqs_.empty() ? Expect::kOk : Expect::kEither;
    for (const auto& [id, q] : seqs_)  // any of these holds at least one block
      if (q.computed > 0 || q.step || (q.allocated && q.spec.encoder_tokens > 0)) e = Expect::kFail;
    Before before = Snap();
    const Status s = m_.ResetPrefixCache();
    Log("reset prefix cache", s);
    if (After("ResetPrefixCache", s, e, before)) {
      ++resets_;
      for (size_t p = 0; p < mem_.size(); ++p)
        if (m_.Usage(static_cast<int32_t>(p)).num_cached != 0)
          Violation("ResetPrefixCache left cached blocks in pool " + std::to_string(p));
    }
    Settle();
    return s;
  }

  // Compaction between steps: refused while any step is open; otherwise the engine copies every
  // moved page (all its slots) to its new page and poisons the old one, so a reference the
  // manager failed to rewrite reads poison. A no-op without two-level memory.
  Result<CompactionResult> Compact(int64_t max_slabs_per_class) {
    return CheckedCompact(std::to_string(max_slabs_per_class), max_slabs_per_class < 1,
                          [&] { return m_.Compact(max_slabs_per_class); });
  }
  // The same with a limit per class (0 leaves a class alone), as a driver following
  // CompactionDue calls it.
  Result<CompactionResult> Compact(std::span<const int64_t> max_slabs_per_class) {
    std::string limits;
    bool bad = max_slabs_per_class.size() != cfg_.pool_blocks.size();
    for (int64_t l : max_slabs_per_class) {
      limits += (limits.empty() ? "" : "/") + std::to_string(l);
      bad = bad || l < 0;
    }
    return CheckedCompact(limits, bad, [&] { return m_.Compact(max_slabs_per_class); });
  }
  // Compaction on behalf of one class (KvCacheManager::CompactFor), as CompactionDue may ask.
  Result<CompactionResult> CompactFor(int32_t pool, std::span<const int64_t> max_slabs_per_class) {
    std::string limits = "for " + std::to_string(pool) + ":";
    bool bad = max_slabs_per_class.size() != cfg_.pool_blocks.size() || pool < 0 ||
               static_cast<size_t>(pool) >= cfg_.pool_blocks.size();
    for (int64_t l : max_slabs_per_class) {
      limits += " " + std::to_string(l);
      bad = bad || l < 0;
    }
    return CheckedCompact(limits, bad, [&] { return m_.CompactFor(pool, max_slabs_per_class); });
  }

 private:
  template <typename Call>
  Result<CompactionResult> CheckedCompact(const std::string& limits, bool bad_limits, Call call) {
    bool open = false;
    for (const auto& [id, q] : seqs_)
      open = open || q.step.has_value();
    const Expect e = open || bad_limits ? Expect::kFail : Expect::kOk;
    Before before = Snap();
    const int64_t moved_before = moved_events_;
    Result<CompactionResult> r = call();
    const Status s = r.ok() ? Status::Ok() : r.status();
    Log("compact " + limits +
            (r.ok() ? " -> " + std::to_string(r->moves.size()) + " moves, " +
                          std::to_string(r->slabs.size()) + " slabs"
                    : ""),
        s);
    if (!After("Compact", s, e, before, cfg_.arena.enabled())) {
      Settle();
      return r;
    }
    if (r->moves.empty() != r->slabs.empty())
      Violation("Compact moved " + std::to_string(r->moves.size()) + " pages out of " +
                std::to_string(r->slabs.size()) + " slabs");
    if (r->slabs.empty()) CheckUnchanged("Compact that emptied no slab", before);
    int64_t identities_moved = 0;
    for (const PageMove& mv : r->moves) {
      if (mv.pool < 0 || mv.pool >= static_cast<int32_t>(mem_.size()) || mv.src <= 0 ||
          mv.dst <= 0 || mv.src == mv.dst ||
          mv.src >= cfg_.pool_blocks[static_cast<size_t>(mv.pool)] ||
          mv.dst >= cfg_.pool_blocks[static_cast<size_t>(mv.pool)]) {
        Violation("Compact returned a bad move " + std::to_string(mv.src) + " -> " +
                  std::to_string(mv.dst) + " of pool " + std::to_string(mv.pool));
        continue;
      }
      PoolMem& pm = mem_[static_cast<size_t>(mv.pool)];
      const auto width = static_cast<size_t>(pm.width);
      const size_t from = static_cast<size_t>(mv.src) * width;
      const size_t to = static_cast<size_t>(mv.dst) * width;
      for (size_t o = 0; o < width; ++o) {
        pm.data[to + o] = pm.data[from + o];
        pm.who[to + o] = pm.who[from + o];
        pm.data[from + o] = kPoison;
        pm.who[from + o] = Writer{};
      }
      if (cfg_.record_events)
        identities_moved += identity_[static_cast<size_t>(mv.pool)][static_cast<size_t>(mv.dst)];
    }
    // An identity that moved with its page is not an eviction (removed src, stored dst):
    // ApplyEvents counts it as a move.
    if (moved_events_ - moved_before < identities_moved)
      Violation("Compact moved " + std::to_string(identities_moved) +
                " identities with fewer removed and stored events");
    counters_.compactions += r->slabs.empty() ? 0 : 1;
    counters_.pages_moved += static_cast<int64_t>(r->moves.size());
    counters_.slabs_compacted += static_cast<int64_t>(r->slabs.size());
    AuditAll();
    Settle();
    return r;
  }

 public:
  // ---- Engine-side views ----------------------------------------------------------------

  struct StateCapture {
    bool is_state = false;
    int32_t read = 0;
    int32_t write = 0;
    std::vector<StateSnapshot> snapshots;
  };
  struct OpenStep {
    int64_t begin = 0, end = 0, reserved_end = 0;
    bool run_encoder = false;
    bool executed = false;
    std::vector<BlockCopy> copies;
    std::vector<std::vector<int32_t>> tables;       // per group; empty for state groups
    std::vector<std::vector<int64_t>> write_slots;  // per group: slots of [begin, end)
    std::vector<StateCapture> states;               // per group
  };
  struct Seq {
    EngineRequest spec;
    std::vector<int32_t> tokens;  // known tokens, then drafts the engine chose
    std::vector<uint64_t> chain;  // chain[p]: digest of positions [0, p); a valid prefix only
    uint64_t encoder_seed = 0;
    int64_t known = 0;
    int64_t computed = 0;
    bool allocated = false;
    bool looked_up = false;
    PrefixHit hit;
    uint64_t hit_epoch = 0;
    int64_t removed_at_add = 0;
    int64_t resets_at_add = 0;
    std::optional<OpenStep> step;
    // Per token group: the block table as the engine rebuilt it from TakeTableDelta alone.
    std::vector<std::vector<int32_t>> mirror;
  };

  const Seq* Find(RequestId id) const {
    auto it = seqs_.find(id);
    return it == seqs_.end() ? nullptr : &it->second;
  }
  std::vector<RequestId> Ids() const {
    std::vector<RequestId> ids;
    for (const auto& [id, q] : seqs_)
      ids.push_back(id);
    return ids;
  }
  size_t size() const { return seqs_.size(); }
  const ManagerConfig& config() const { return cfg_; }
  int32_t DraftToken() { return static_cast<int32_t>(rng_() % static_cast<uint64_t>(opt_.vocab)); }
  // Evictions (identities removed) and resets seen so far, to tell whether a hit may have shrunk.
  int64_t removed_events() const { return removed_events_; }
  int64_t resets() const { return resets_; }
  bool only_full_attention() const { return only_full_; }

  // What a run exercised, so that tests can insist that it did.
  struct Counters {
    int64_t steps = 0, commits = 0, partial_commits = 0, copies = 0, snapshots = 0;
    int64_t hits = 0, hit_tokens = 0, encoder_hits = 0, exhausted = 0, refused = 0;
    int64_t forks = 0, truncates = 0, rollbacks = 0;  // rollbacks: Truncate kept less than n
    int64_t compactions = 0, pages_moved = 0, slabs_compacted = 0;  // Compacts that moved pages
  };
  const Counters& counters() const { return counters_; }
  std::string DescribeCounters() const {
    const Counters& c = counters_;
    return "steps " + std::to_string(c.steps) + ", commits " + std::to_string(c.commits) +
           " (partial " + std::to_string(c.partial_commits) + "), copies " +
           std::to_string(c.copies) + ", snapshots " + std::to_string(c.snapshots) + ", hits " +
           std::to_string(c.hits) + " (" + std::to_string(c.hit_tokens) + " tokens, encoder " +
           std::to_string(c.encoder_hits) + "), exhausted " + std::to_string(c.exhausted) +
           ", refused calls " + std::to_string(c.refused) + ", forks " + std::to_string(c.forks) +
           ", truncates " + std::to_string(c.truncates) + " (rolled back " +
           std::to_string(c.rollbacks) + "), evictions " + std::to_string(removed_events_) +
           ", compactions " + std::to_string(c.compactions) + " (" + std::to_string(c.pages_moved) +
           " pages moved, " + std::to_string(c.slabs_compacted) + " slabs returned)";
  }

  bool failed() const { return !violations_.empty(); }
  const std::vector<std::string>& violations() const { return violations_; }
  // The first violation and the operations that led to it.
  std::string Report() const {
    std::string out = violations_.empty() ? "no violation" : violations_.front();
    if (violations_.size() > 1)
      out += "\n(" + std::to_string(violations_.size() - 1) + " more violations)";
    out += "\nlast operations:";
    for (const std::string& l : first_failure_log_.empty() ? log_ : first_failure_log_)
      out += "\n  " + l;
    return out;
  }

  // Verifies every position a request's next step would read (not the recurrent state, which is
  // only visible during a step).
  void AuditAll() {
    for (auto& [id, q] : seqs_)
      Audit(q);
  }

  // Records a violation found by the caller (a driver's own expectation), with the same report.
  void ReportViolation(const std::string& what) { Violation(what); }

  // Overwrites the KV slot of position `pos` of a request's group (self-tests of the checker).
  void CorruptSlot(RequestId id, int32_t group, int64_t pos) {
    Result<std::span<const int32_t>> t = m_.BlockTable(id, group);
    const int32_t bt = cfg_.groups[static_cast<size_t>(group)].block_tokens;
    if (!t.ok() || pos / bt >= static_cast<int64_t>(t->size())) return;
    const int32_t block = (*t)[static_cast<size_t>(pos / bt)];
    const auto offset = static_cast<int32_t>(pos % bt);
    Write(group, block, offset, Read(group, block, offset) ^ 1, {id, pos, 't'});
  }
  // Overwrites the state an open step reads (self-tests of the checker).
  void CorruptState(RequestId id) {
    Seq* q = FindMut(id);
    if (q == nullptr || !q->step) return;
    for (size_t gi = 0; gi < q->step->states.size(); ++gi)
      if (q->step->states[gi].is_state && q->step->states[gi].read != 0) {
        const auto g = static_cast<int32_t>(gi);
        const int32_t b = q->step->states[gi].read;
        Write(g, b, 0, Read(g, b, 0) ^ 1, {id, q->step->begin, 's'});
      }
  }

 private:
  enum class Expect { kOk, kFail, kEither };

  // Who last wrote a cell, for violation reports.
  struct Writer {
    RequestId id = 0;
    int64_t position = -1;
    char kind = '-';  // 't' token KV, 'e' encoder KV, 's' state, '-' nobody
  };
  struct PoolMem {
    int32_t width = 1;  // slots per block: the largest block_tokens of the pool's groups
    std::vector<uint64_t> data;
    std::vector<Writer> who;
  };
  struct Before {
    std::vector<std::tuple<int32_t, int32_t, int32_t>> usage;
    std::vector<std::vector<int32_t>> free_lists;
    std::vector<std::vector<uint8_t>> identity;  // identity_ before the call
    int32_t num_requests = 0;
  };

  // ---- Content ------------------------------------------------------------------------------

  void InitDigests(Seq& q) {
    uint64_t h = Mix(0xC0FFEE, q.spec.adapter_id);
    h = Mix(h, DigestString(q.spec.cache_salt));
    if (q.spec.encoder_tokens > 0) {
      h = Mix(Mix(h, q.spec.encoder_input.lo), q.spec.encoder_input.hi);
    }
    q.chain.assign(1, h);
    uint64_t e = Mix(0xE4C0DE, q.spec.encoder_input.lo);
    e = Mix(Mix(e, q.spec.encoder_input.hi), q.spec.adapter_id);
    q.encoder_seed = Mix(e, DigestString(q.spec.cache_salt));
  }
  // What position i contributes: its token, and the item data it is a placeholder for.
  static uint64_t PositionKey(const Seq& q, int64_t i) {
    uint64_t key = static_cast<uint32_t>(q.tokens[static_cast<size_t>(i)]);
    for (const PromptItem& it : q.spec.items)
      if (i >= it.position && i < it.position + it.length)
        key ^= Mix(Mix(it.content.lo, it.content.hi), static_cast<uint64_t>(i - it.position)) |
               (uint64_t{1} << 63);
    return key;
  }
  // Digest of positions [0, p).
  uint64_t Prefix(Seq& q, int64_t p) {
    if (p > static_cast<int64_t>(q.tokens.size())) {
      Violation("engine: digest past the tokens of request " + Id(q.spec.id));
      return kPoison;
    }
    while (static_cast<int64_t>(q.chain.size()) <= p) {
      const int64_t i = static_cast<int64_t>(q.chain.size()) - 1;
      q.chain.push_back(Mix(q.chain.back(), PositionKey(q, i)));
    }
    return q.chain[static_cast<size_t>(p)];
  }
  uint64_t TokenContent(Seq& q, int64_t p) { return Prefix(q, p + 1); }
  uint64_t StateContent(Seq& q, int64_t p) {
    return p == 0 ? kZeroState : Mix(Prefix(q, p), 0x57A7E);
  }
  static uint64_t EncoderContent(const Seq& q, int64_t e) {
    return Mix(q.encoder_seed, static_cast<uint64_t>(e));
  }
  void SetToken(Seq& q, int64_t p, int32_t token) {
    if (p >= static_cast<int64_t>(q.tokens.size())) ResizeTokens(q, p + 1);
    if (q.tokens[static_cast<size_t>(p)] != token) {
      q.tokens[static_cast<size_t>(p)] = token;
      q.chain.resize(std::min(q.chain.size(), static_cast<size_t>(p) + 1));
    }
  }
  static void ResizeTokens(Seq& q, int64_t n) {
    q.tokens.resize(static_cast<size_t>(n), 0);
    q.chain.resize(std::min(q.chain.size(), static_cast<size_t>(n) + 1));
  }

  // ---- Memory -------------------------------------------------------------------------------

  // The cell of (block, offset) in a group's pool; null (after reporting) for the null block or
  // an id out of range.
  PoolMem* Cell(int32_t group, int32_t block, int32_t offset, size_t& index) {
    const GroupConfig& g = cfg_.groups[static_cast<size_t>(group)];
    PoolMem& pm = mem_[static_cast<size_t>(g.pool)];
    if (block <= 0 || block >= cfg_.pool_blocks[static_cast<size_t>(g.pool)] || offset < 0 ||
        offset >= pm.width) {
      Violation("engine: access to block " + std::to_string(block) + " offset " +
                std::to_string(offset) + " of group " + std::to_string(group) +
                " (null or out of range)");
      return nullptr;
    }
    index =
        static_cast<size_t>(block) * static_cast<size_t>(pm.width) + static_cast<size_t>(offset);
    return &pm;
  }
  uint64_t Read(int32_t group, int32_t block, int32_t offset) {
    size_t i = 0;
    PoolMem* pm = Cell(group, block, offset, i);
    return pm == nullptr ? kPoison : pm->data[i];
  }
  void Write(int32_t group, int32_t block, int32_t offset, uint64_t value, Writer w) {
    size_t i = 0;
    PoolMem* pm = Cell(group, block, offset, i);
    if (pm == nullptr) return;
    pm->data[i] = value;
    pm->who[i] = w;
  }
  std::string WhoWrote(int32_t group, int32_t block, int32_t offset) {
    size_t i = 0;
    PoolMem* pm = Cell(group, block, offset, i);
    if (pm == nullptr) return "";
    const Writer& w = pm->who[i];
    const char* what = w.kind == 't'   ? "position "
                       : w.kind == 'e' ? "encoder position "
                                       : "state after ";
    return w.kind == '-' ? "never written"
                         : "last written by request " + Id(w.id) + " for its " + what +
                               std::to_string(w.position);
  }
  void CopyBlock(const BlockCopy& c) {
    const GroupConfig& g = cfg_.groups[static_cast<size_t>(c.group)];
    const int32_t width = mem_[static_cast<size_t>(g.pool)].width;
    for (int32_t o = 0; o < width; ++o) {
      size_t si = 0, di = 0;
      PoolMem* src = Cell(c.group, c.src, o, si);
      PoolMem* dst = Cell(c.group, c.dst, o, di);
      if (src == nullptr || dst == nullptr) return;
      dst->data[di] = src->data[si];
      dst->who[di] = src->who[si];
    }
  }

  // ---- Steps --------------------------------------------------------------------------------

  void CaptureStep(Seq& q, int64_t begin, int64_t n, int64_t lookahead, const PrefixHit& hit) {
    const std::string who = "request " + Id(q.spec.id);
    Result<StepInfo> info = m_.Step(q.spec.id);
    if (!info.ok()) {
      Violation("Step(" + Id(q.spec.id) + ") failed after Allocate: " + info.status().ToString());
      return;
    }
    OpenStep st;
    st.begin = info->begin;
    st.end = info->end;
    st.reserved_end = info->reserved_end;
    st.run_encoder = info->run_encoder;
    st.copies.assign(info->copies.begin(), info->copies.end());
    if (st.begin != begin || st.end != begin + n || st.reserved_end < st.end + lookahead ||
        st.reserved_end > cfg_.max_model_len)
      Violation("Step(" + Id(q.spec.id) + ") is [" + std::to_string(st.begin) + ", " +
                std::to_string(st.end) + ") reserved to " + std::to_string(st.reserved_end) +
                ", expected [" + std::to_string(begin) + ", " + std::to_string(begin + n) +
                ") reserved to at least " + std::to_string(begin + n + lookahead));
    if (st.run_encoder && q.spec.encoder_tokens == 0)
      Violation("Step(" + Id(q.spec.id) + ") runs the encoder of a request without one");
    if (hit.encoder && st.run_encoder)
      Violation("Step(" + Id(q.spec.id) + ") runs the encoder after an encoder hit");
    for (const BlockCopy& c : st.copies) {
      if (c.group < 0 || c.group >= static_cast<int32_t>(cfg_.groups.size()) || c.src == c.dst) {
        Violation("Step(" + Id(q.spec.id) + ") has a bad copy in group " + std::to_string(c.group));
        st.copies.clear();
        break;
      }
    }
    // Drafts: positions past the known tokens that the engine has not chosen yet.
    ResizeTokens(q, std::max(q.known, st.begin));
    for (int64_t p = static_cast<int64_t>(q.tokens.size()); p < st.end; ++p)
      SetToken(q, p, DraftToken());

    const size_t ng = cfg_.groups.size();
    st.tables.resize(ng);
    st.write_slots.resize(ng);
    st.states.resize(ng);
    for (size_t gi = 0; gi < ng; ++gi) {
      const GroupConfig& g = cfg_.groups[gi];
      const int32_t group = static_cast<int32_t>(gi);
      const std::string gname = who + " group " + std::to_string(gi);
      if (g.is_state()) {
        Result<StateStep> ss = m_.State(q.spec.id, group);
        if (!ss.ok()) {
          Violation("State(" + gname + ") failed: " + ss.status().ToString());
          continue;
        }
        StateCapture& sc = st.states[gi];
        sc.is_state = true;
        sc.read = ss->read;
        sc.write = ss->write;
        sc.snapshots.assign(ss->snapshots.begin(), ss->snapshots.end());
        int64_t last = st.begin - 1;
        for (const StateSnapshot& s : sc.snapshots) {
          if (s.position < st.begin || s.position > st.end || s.position <= last || s.slot <= 0)
            Violation("State(" + gname + ") snapshot at " + std::to_string(s.position) + " slot " +
                      std::to_string(s.slot) + " is out of order or outside [" +
                      std::to_string(st.begin) + ", " + std::to_string(st.end) + "]");
          last = s.position;
        }
        if (sc.write <= 0) Violation("State(" + gname + ") writes to the null block");
        continue;
      }
      if (!g.rule.keeps_tokens()) continue;
      Result<std::span<const int32_t>> t = m_.BlockTable(q.spec.id, group);
      if (!t.ok()) {
        Violation("BlockTable(" + gname + ") failed: " + t.status().ToString());
        continue;
      }
      st.tables[gi].assign(t->begin(), t->end());
      CheckDelta(q, group, *t);
      if (g.is_encoder()) {
        const int64_t need = (q.spec.encoder_tokens + g.block_tokens - 1) / g.block_tokens;
        if (static_cast<int64_t>(st.tables[gi].size()) < need)
          Violation("BlockTable(" + gname + ") has " + std::to_string(st.tables[gi].size()) +
                    " encoder blocks, expected " + std::to_string(need));
        continue;
      }
      std::vector<int64_t>& slots = st.write_slots[gi];
      const Status sm = m_.SlotMapping(q.spec.id, group, st.begin, st.end, slots);
      if (!sm.ok() || static_cast<int64_t>(slots.size()) != st.end - st.begin) {
        Violation("SlotMapping(" + gname + ", " + std::to_string(st.begin) + ", " +
                  std::to_string(st.end) + ") failed: " + sm.ToString());
        slots.clear();
        continue;
      }
      for (int64_t p = st.begin; p < st.end; ++p) {
        const int64_t slot = slots[static_cast<size_t>(p - st.begin)];
        const int64_t idx = p / g.block_tokens;
        const int64_t via_table =
            idx < static_cast<int64_t>(st.tables[gi].size())
                ? int64_t{st.tables[gi][static_cast<size_t>(idx)]} * g.block_tokens +
                      p % g.block_tokens
                : -1;
        if (slot != via_table || slot < g.block_tokens) {
          Violation("SlotMapping(" + gname + ") gives slot " + std::to_string(slot) +
                    " for position " + std::to_string(p) + ", the block table " +
                    std::to_string(via_table) + " (null block or mismatch)");
          slots.clear();
          break;
        }
      }
      std::vector<int64_t> ahead;
      const Status sa = m_.SlotMapping(q.spec.id, group, st.end, st.reserved_end, ahead);
      if (!sa.ok())
        Violation("SlotMapping(" + gname + ") of the lookahead [" + std::to_string(st.end) + ", " +
                  std::to_string(st.reserved_end) + ") failed: " + sa.ToString());
    }
    q.step = std::move(st);
    pending_.push_back(q.spec.id);
  }

  // An engine that keeps tables on its side applies only the deltas: rebuilt that way, a table
  // must hold every entry the manager's table holds (released entries are never read again).
  void CheckDelta(Seq& q, int32_t group, std::span<const int32_t> table) {
    const auto gi = static_cast<size_t>(group);
    if (q.mirror.size() <= gi) q.mirror.resize(cfg_.groups.size());
    std::vector<int32_t>& mirror = q.mirror[gi];
    Result<TableDelta> d = m_.TakeTableDelta(q.spec.id, group);
    if (!d.ok()) {
      Violation("TakeTableDelta(group " + std::to_string(group) +
                ") failed: " + d.status().ToString());
      return;
    }
    if (d->from < 0 || d->from > d->size ||
        d->blocks.size() != static_cast<size_t>(d->size - d->from)) {
      Violation("TakeTableDelta(group " + std::to_string(group) + ") reports [" +
                std::to_string(d->from) + ", " + std::to_string(d->size) + ") with " +
                std::to_string(d->blocks.size()) + " blocks");
      return;
    }
    mirror.resize(static_cast<size_t>(d->size));
    std::copy(d->blocks.begin(), d->blocks.end(), mirror.begin() + d->from);
    if (mirror.size() != table.size()) {
      Violation("the table of request " + Id(q.spec.id) + " group " + std::to_string(group) +
                " rebuilt from deltas has " + std::to_string(mirror.size()) +
                " entries, the table " + std::to_string(table.size()));
      return;
    }
    for (size_t j = 0; j < table.size(); ++j) {
      if (table[j] != 0 && mirror[j] != table[j]) {
        Violation("the table of request " + Id(q.spec.id) + " group " + std::to_string(group) +
                  " rebuilt from deltas has block " + std::to_string(mirror[j]) + " at " +
                  std::to_string(j) + ", the table " + std::to_string(table[j]));
        mirror.assign(table.begin(), table.end());
        return;
      }
    }
  }

  // The tables of a request with an open step must not change under other requests' calls.
  void RecheckTables(Seq& q) {
    for (size_t gi = 0; gi < cfg_.groups.size(); ++gi) {
      const GroupConfig& g = cfg_.groups[gi];
      if (g.is_state() || !g.rule.keeps_tokens()) continue;
      Result<std::span<const int32_t>> t = m_.BlockTable(q.spec.id, static_cast<int32_t>(gi));
      if (!t.ok() ||
          !std::equal(t->begin(), t->end(), q.step->tables[gi].begin(), q.step->tables[gi].end()))
        Violation("the block table of request " + Id(q.spec.id) + " group " + std::to_string(gi) +
                  " changed while its step was open");
    }
  }

  void WriteEncoder(Seq& q) {
    for (size_t gi = 0; gi < cfg_.groups.size(); ++gi) {
      const GroupConfig& g = cfg_.groups[gi];
      if (!g.is_encoder()) continue;
      const std::vector<int32_t>& table = q.step->tables[gi];
      for (int64_t e = 0; e < q.spec.encoder_tokens; ++e) {
        const size_t idx = static_cast<size_t>(e / g.block_tokens);
        if (idx >= table.size()) break;  // reported at capture
        Write(static_cast<int32_t>(gi), table[idx], static_cast<int32_t>(e % g.block_tokens),
              EncoderContent(q, e), {q.spec.id, e, 'e'});
      }
    }
  }

  // Calls fn(p) for every position before q that a query at position q attends to.
  template <typename Fn>
  static void ForEachNeededBefore(const TokenRule& rule, int64_t q, Fn fn) {
    switch (rule.kind) {
      case TokenRuleKind::kAll:
        for (int64_t p = 0; p < q; ++p)
          fn(p);
        break;
      case TokenRuleKind::kWindow: {
        const int64_t lo = std::max<int64_t>(0, q - rule.span + 1);
        for (int64_t p = 0; p < std::min<int64_t>(rule.sinks, lo); ++p)
          fn(p);
        for (int64_t p = lo; p < q; ++p)
          fn(p);
        break;
      }
      case TokenRuleKind::kChunk:
        for (int64_t p = q / rule.span * rule.span; p < q; ++p)
          fn(p);
        break;
      default:
        break;
    }
  }

  // Checks what a request reads before `at` in every token group through `tables`.
  bool VerifyTokens(Seq& q, int64_t at, const std::vector<std::vector<int32_t>>& tables,
                    const char* when) {
    for (size_t gi = 0; gi < cfg_.groups.size(); ++gi) {
      const GroupConfig& g = cfg_.groups[gi];
      if (g.is_state() || !g.rule.keeps_tokens()) continue;
      const std::vector<int32_t>& table = tables[gi];
      const int32_t group = static_cast<int32_t>(gi);
      bool bad = false;
      auto check = [&](int64_t p, uint64_t want, const char* what) {
        if (bad) return;
        const size_t idx = static_cast<size_t>(p / g.block_tokens);
        const int32_t block = idx < table.size() ? table[idx] : 0;
        if (block == 0) {
          Violation(std::string(when) + ": request " + Id(q.spec.id) + " group " +
                    std::to_string(gi) + " (" + g.rule.Describe() + ") needs " + what + " " +
                    std::to_string(p) + " but its table has " +
                    (idx < table.size() ? "the null block" : "no entry") + " there (reading " +
                    std::to_string(at) + ")");
          bad = true;
          return;
        }
        const auto offset = static_cast<int32_t>(p % g.block_tokens);
        const uint64_t got = Read(group, block, offset);
        if (got != want) {
          Violation(std::string(when) + ": request " + Id(q.spec.id) + " group " +
                    std::to_string(gi) + " (" + g.rule.Describe() + ") " + what + " " +
                    std::to_string(p) + " in block " + std::to_string(block) + " holds " +
                    (got == kPoison ? "never-written memory" : "the wrong content") +
                    " (reading at " + std::to_string(at) + "; " + WhoWrote(group, block, offset) +
                    ")");
          bad = true;
        }
      };
      if (g.is_encoder()) {
        for (int64_t e = 0; e < q.spec.encoder_tokens && !bad; ++e)
          check(e, EncoderContent(q, e), "encoder position");
      } else {
        ForEachNeededBefore(g.rule, at, [&](int64_t p) {
          if (!bad) check(p, TokenContent(q, p), "position");
        });
      }
      if (bad) return false;
    }
    return true;
  }

  void VerifyStates(Seq& q) {
    OpenStep& st = *q.step;
    for (size_t gi = 0; gi < st.states.size(); ++gi) {
      const StateCapture& sc = st.states[gi];
      if (!sc.is_state) continue;
      if (sc.read == 0) {
        if (st.begin != 0)
          Violation("step: request " + Id(q.spec.id) + " state group " + std::to_string(gi) +
                    " reads the zero state at position " + std::to_string(st.begin));
        continue;
      }
      const uint64_t got = Read(static_cast<int32_t>(gi), sc.read, 0);
      if (got != StateContent(q, st.begin))
        Violation("step: request " + Id(q.spec.id) + " state group " + std::to_string(gi) +
                  " reads block " + std::to_string(sc.read) + " holding " +
                  (got == kPoison ? "never-written memory" : "the wrong state") +
                  " for the state after " + std::to_string(st.begin) + " tokens (" +
                  WhoWrote(static_cast<int32_t>(gi), sc.read, 0) + ")");
    }
  }

  void WriteStates(Seq& q) {
    OpenStep& st = *q.step;
    for (size_t gi = 0; gi < cfg_.groups.size(); ++gi) {
      const int32_t group = static_cast<int32_t>(gi);
      const StateCapture& sc = st.states[gi];
      if (!sc.is_state) continue;
      for (const StateSnapshot& s : sc.snapshots)
        Write(group, s.slot, 0, StateContent(q, s.position), {q.spec.id, s.position, 's'});
      Write(group, sc.write, 0, StateContent(q, st.end), {q.spec.id, st.end, 's'});
    }
  }

  void WriteTokens(Seq& q) {
    OpenStep& st = *q.step;
    for (size_t gi = 0; gi < cfg_.groups.size(); ++gi) {
      const int32_t group = static_cast<int32_t>(gi);
      if (st.states[gi].is_state) continue;
      const int32_t bt = cfg_.groups[gi].block_tokens;
      const std::vector<int64_t>& slots = st.write_slots[gi];
      for (size_t i = 0; i < slots.size(); ++i) {
        const int64_t p = st.begin + static_cast<int64_t>(i);
        Write(group, static_cast<int32_t>(slots[i] / bt), static_cast<int32_t>(slots[i] % bt),
              TokenContent(q, p), {q.spec.id, p, 't'});
      }
    }
  }

  // Reads what the next step of a request without an open step (or with one that ran) would
  // read, through the manager's current tables.
  void Audit(Seq& q) {
    if (q.step && !q.step->executed) return;  // its copies have not run yet
    std::vector<std::vector<int32_t>> tables(cfg_.groups.size());
    for (size_t gi = 0; gi < cfg_.groups.size(); ++gi) {
      const GroupConfig& g = cfg_.groups[gi];
      if (g.is_state() || !g.rule.keeps_tokens()) continue;
      if (g.is_encoder() && !q.allocated) continue;
      if (!g.is_encoder() && q.computed == 0) continue;
      Result<std::span<const int32_t>> t = m_.BlockTable(q.spec.id, static_cast<int32_t>(gi));
      if (!t.ok()) {
        Violation("BlockTable(request " + Id(q.spec.id) + ", group " + std::to_string(gi) +
                  ") failed: " + t.status().ToString());
        return;
      }
      tables[gi].assign(t->begin(), t->end());
    }
    const int64_t at = q.step ? q.step->begin : q.computed;
    if (!q.allocated) return;
    VerifyTokens(q, at, tables, "audit");
  }

  // ---- Call bookkeeping -----------------------------------------------------------------------

  // Blocks that calls only release go to the free list's head when they have no prefix identity
  // (or the request has low retention) and to its tail otherwise; what was free stays in order,
  // except that Free with coherent eviction may take cached free blocks (the window blocks a short
  // request released earlier, in a pool shared with full attention) out of the list and release
  // them again with the rest.
  bool CheckpointsDemotable(int32_t pool) const {
    if (!cfg_.demote_superseded_checkpoints || !cfg_.enable_prefix_caching) return false;
    bool state = false;
    for (const GroupConfig& g : cfg_.groups) {
      if (g.pool != pool) continue;
      if (!g.is_state()) return false;
      state = true;
    }
    return state;
  }

  void CheckReleaseOrder(const char* call, const Before& before, Retention retention,
                         bool requeue_allowed = false) {
    if (!cfg_.record_events) return;  // identities are known from the events only
    // A caller's eviction rank queues released blocks by rank, not at the ends this model
    // replays; block_pool_rank_test checks that order exactly, and data checks still apply.
    if (cfg_.eviction_rank != nullptr) return;
    // Likewise shared prefixes (ManagerConfig::branch_bonus) queue behind blocks freed after
    // them; block_pool_share_test checks that order.
    if (cfg_.branch_bonus > 0) return;
    for (size_t p = 0; p < before.free_lists.size(); ++p) {
      // Checkpoint retention moves cached states to the head, by rules this model does not
      // replay; checkpoint_retention_test checks them exactly, and data checks still apply.
      if (CheckpointsDemotable(static_cast<int32_t>(p))) continue;
      const std::vector<int32_t> now = ManagerProbe::FreeListOrder(m_, static_cast<int32_t>(p));
      // A free cached block whose key a block published in this call took over (BlockPool::
      // Publish) is worth nothing now and joins the head: it is checked as a block released
      // without identity, not as part of the old run.
      std::vector<int32_t> old;
      for (const int32_t b : before.free_lists[p]) {
        const auto i = static_cast<size_t>(b);
        const bool taken_over = before.identity[p][i] != 0 && identity_[p][i] == 0 &&
                                std::find(now.begin(), now.end(), b) != now.end();
        if (!taken_over) old.push_back(b);
      }
      const std::string where = std::string(call) + " in pool " + std::to_string(p);
      const auto pool = static_cast<int32_t>(p);
      const auto cached = [&](int32_t b) { return identity_[p][static_cast<size_t>(b)] != 0; };
      const auto to_tail = [&](int32_t b) { return cached(b) && retention == Retention::kNormal; };
      // What precedes [mid, tail) was put at the head, what follows at the tail; "" if right.
      const auto misplaced = [&](size_t mid, size_t tail) -> std::string {
        for (size_t i = 0; i < now.size(); ++i) {
          if (i == mid) i = tail;
          if (i == now.size()) break;
          const int32_t b = now[i];
          const bool at_head = i < mid;
          if (at_head == to_tail(b)) {
            return where + " released block " + std::to_string(b) +
                   (cached(b) ? " (cached)" : " (not cached)") + " to the free list's " +
                   (at_head ? "head" : "tail") + " (pool " + std::to_string(pool) + ")";
          }
        }
        return "";
      };
      // The old list, less the blocks Free may requeue, must survive as one run [mid, tail).
      // Which blocks were requeued is not observable, so every reading is tried: the run starts
      // at old[first] (old[0, first) requeued), or the run is empty.
      const size_t split =
          static_cast<size_t>(std::find_if(now.begin(), now.end(), to_tail) - now.begin());
      std::string why = old.empty() ? misplaced(split, split) : "";
      bool placed = old.empty() && why.empty();
      for (size_t first = 0; first < old.size() && !placed; ++first) {
        if (first > 0 && !(requeue_allowed && cached(old[first - 1]))) break;
        size_t mid = now.size();
        for (size_t i = 0; i < now.size(); ++i) {
          if (now[i] == old[first]) mid = i;
        }
        if (mid == now.size()) break;
        size_t tail = mid;
        bool run = true;
        for (size_t k = first; k < old.size() && run; ++k) {
          if (tail < now.size() && now[tail] == old[k]) {
            ++tail;
          } else {
            run = requeue_allowed && cached(old[k]);
          }
        }
        if (!run) continue;
        const std::string w = misplaced(mid, tail);
        if (w.empty()) placed = true;
        if (why.empty()) why = w;
      }
      if (!placed && requeue_allowed && !old.empty() &&
          std::all_of(old.begin(), old.end(), cached) && misplaced(split, split).empty()) {
        placed = true;
      }
      if (!placed)
        Violation(why.empty() ? where + " reordered blocks that were already free" : why);
    }
  }

  Before Snap() const {
    Before b;
    for (size_t p = 0; p < cfg_.pool_blocks.size(); ++p) {
      const PoolUsage u = m_.Usage(static_cast<int32_t>(p));
      b.usage.emplace_back(u.num_blocks, u.num_free, u.num_cached);
      b.free_lists.push_back(ManagerProbe::FreeListOrder(m_, static_cast<int32_t>(p)));
    }
    b.identity = identity_;
    b.num_requests = m_.num_requests();
    return b;
  }
  void CheckUnchanged(const char* call, const Before& before) {
    const Before now = Snap();
    for (size_t p = 0; p < now.usage.size(); ++p) {
      if (now.usage[p] != before.usage[p])
        Violation(std::string(call) + " changed the usage of pool " + std::to_string(p));
      if (now.free_lists[p] != before.free_lists[p])
        Violation(std::string(call) + " changed the free-list order of pool " + std::to_string(p));
    }
    if (now.num_requests != before.num_requests)
      Violation(std::string(call) + " changed the number of requests");
  }

  // Checks the outcome of a call against the expectation; returns whether it succeeded.
  bool After(const char* call, const Status& s, Expect e, const Before& before,
             bool mutating = true, const std::vector<StatusCode>& allowed = {}) {
    const Status inv = m_.CheckInvariants();
    if (!inv.ok()) Violation(std::string("CheckInvariants after ") + call + ": " + inv.ToString());
    std::vector<ManagerEvent> events = m_.TakeEvents();
    if (!mutating && !events.empty())
      Violation(std::string(call) + " does not mutate but emitted events");
    if (!s.ok()) {
      ++counters_.refused;
      if (!events.empty())
        Violation(std::string(call) + " failed (" + s.ToString() + ") but emitted events");
      CheckUnchanged(call, before);
      if (e == Expect::kOk && std::find(allowed.begin(), allowed.end(), s.code()) == allowed.end())
        Violation(std::string(call) + " refused a valid call: " + s.ToString());
    } else if (e == Expect::kFail) {
      Violation(std::string(call) + " accepted an invalid call");
    }
    ApplyEvents(events);
    if (s.ok() && mutating) ++epoch_;
    const ManagerStats& st = m_.stats();
    if (st.allocations_failed != allocations_failed_)
      Violation("stats().allocations_failed is " + std::to_string(st.allocations_failed) +
                ", the engine saw " + std::to_string(allocations_failed_));
    // Truncate adds its own result once the engine has read it.
    if (st.recomputed_tokens != recomputed_ && !(s.ok() && std::string_view(call) == "Truncate"))
      Violation("stats().recomputed_tokens is " + std::to_string(st.recomputed_tokens) +
                ", Truncate results sum to " + std::to_string(recomputed_));
    // An invalid call the manager accepted is not mirrored: the violation is reported already.
    return s.ok() && e != Expect::kFail;
  }

  // After the engine has mirrored a call's outcome: compare the mirror with the manager and, now
  // and then, audit every request.
  void Settle() {
    CheckMirror();
    if (opt_.audit_every > 0 && ++calls_ % opt_.audit_every == 0) AuditAll();
  }

  // Cached identities as the event stream tells them must match Usage().num_cached.
  // A key removed and stored again within one call moved to another block (compaction, or a
  // published copy taking over a free block's key): a move, not an eviction.
  void ApplyEvents(const std::vector<ManagerEvent>& events) {
    if (!cfg_.record_events) return;
    std::vector<std::tuple<int32_t, int32_t, uint64_t, uint64_t>> removed_now;
    for (const ManagerEvent& ev : events) {
      if (ev.pool < 0 || ev.pool >= static_cast<int32_t>(cfg_.pool_blocks.size())) {
        Violation("event for pool " + std::to_string(ev.pool));
        continue;
      }
      const auto key = std::make_tuple(ev.pool, ev.group, ev.hash.lo, ev.hash.hi);
      switch (ev.kind) {
        case KvEvent::Kind::kStored:
          if (ev.block > 0 && ev.block < cfg_.pool_blocks[static_cast<size_t>(ev.pool)])
            identity_[static_cast<size_t>(ev.pool)][static_cast<size_t>(ev.block)] = 1;
          if (!cached_.emplace(key, ev.block).second)
            Violation("stored event for a key already cached (pool " + std::to_string(ev.pool) +
                      " group " + std::to_string(ev.group) + ")");
          if (auto it = std::find(removed_now.begin(), removed_now.end(), key);
              it != removed_now.end()) {
            removed_now.erase(it);
            --removed_events_;
            ++moved_events_;
          }
          break;
        case KvEvent::Kind::kRemoved: {
          auto it = cached_.find(key);
          if (it == cached_.end() || it->second != ev.block)
            Violation("removed event for a key not cached in block " + std::to_string(ev.block));
          else
            cached_.erase(it);
          if (ev.block > 0 && ev.block < cfg_.pool_blocks[static_cast<size_t>(ev.pool)])
            identity_[static_cast<size_t>(ev.pool)][static_cast<size_t>(ev.block)] = 0;
          ++removed_events_;
          removed_now.push_back(key);
          break;
        }
        case KvEvent::Kind::kCleared:
          std::fill(identity_[static_cast<size_t>(ev.pool)].begin(),
                    identity_[static_cast<size_t>(ev.pool)].end(), 0);
          for (auto it = cached_.begin(); it != cached_.end();)
            it = std::get<0>(it->first) == ev.pool ? cached_.erase(it) : std::next(it);
          break;
      }
    }
    for (size_t p = 0; p < cfg_.pool_blocks.size(); ++p) {
      int32_t n = 0;
      for (const auto& [key, block] : cached_)
        n += std::get<0>(key) == static_cast<int32_t>(p);
      const int32_t cached = m_.Usage(static_cast<int32_t>(p)).num_cached;
      if (n != cached)
        Violation("events account for " + std::to_string(n) + " cached blocks in pool " +
                  std::to_string(p) + ", Usage() says " + std::to_string(cached));
    }
  }

  void CheckMirror() {
    if (m_.num_requests() != static_cast<int32_t>(seqs_.size()))
      Violation("num_requests() is " + std::to_string(m_.num_requests()) + ", the engine has " +
                std::to_string(seqs_.size()));
    for (const auto& [id, q] : seqs_) {
      Result<int64_t> t = m_.NumTokens(id);
      Result<int64_t> c = m_.NumComputed(id);
      if (!m_.Contains(id) || !t.ok() || *t != q.known || !c.ok() || *c != q.computed) {
        Violation("request " + Id(id) + ": manager has tokens " +
                  (t.ok() ? std::to_string(*t) : "?") + " computed " +
                  (c.ok() ? std::to_string(*c) : "?") + ", the engine " + std::to_string(q.known) +
                  " / " + std::to_string(q.computed));
        return;
      }
      if (m_.Step(id).ok() != q.step.has_value())
        Violation("request " + Id(id) + ": Step() " +
                  (q.step ? "fails while a step is open" : "succeeds with no step open"));
    }
  }

  void ExpectClean(const char* when) {
    const Status inv = m_.CheckInvariants();
    if (!inv.ok()) Violation(std::string("CheckInvariants at ") + when + ": " + inv.ToString());
  }

  static bool ItemsOrdered(const std::vector<PromptItem>& items) {
    for (size_t i = 1; i < items.size(); ++i)
      if (items[i].position < items[i - 1].position + items[i - 1].length) return false;
    return true;
  }

  Status Refuse(const std::string& why) { return Status::FailedPrecondition("engine: " + why); }
  static std::string Id(RequestId id) { return std::to_string(id); }

  void Log(std::string line, const Status& s) {
    if (!s.ok()) line += "  => " + s.ToString();
    log_.push_back(std::move(line));
    while (log_.size() > opt_.log_size)
      log_.pop_front();
  }
  void Violation(const std::string& what) {
    if (violations_.empty()) first_failure_log_ = log_;
    if (violations_.size() < 100) violations_.push_back(what);
    if (on_violation_) on_violation_(what);
  }

  Seq* FindMut(RequestId id) {
    auto it = seqs_.find(id);
    return it == seqs_.end() ? nullptr : &it->second;
  }

  KvCacheManager& m_;
  const ManagerConfig cfg_;
  EngineOptions opt_;
  std::mt19937_64 rng_;
  ViolationHandler on_violation_;
  std::vector<PoolMem> mem_;
  bool has_encoder_ = false, has_state_ = false, only_full_ = true;
  std::map<RequestId, Seq> seqs_;
  std::vector<RequestId> pending_;  // open steps not run yet, in allocation order
  std::map<std::tuple<int32_t, int32_t, uint64_t, uint64_t>, int32_t> cached_;
  uint64_t epoch_ = 0;  // successful mutating calls
  int64_t calls_ = 0;
  int64_t allocations_failed_ = 0;
  int64_t recomputed_ = 0;
  int64_t removed_events_ = 0;  // evictions: removed keys not stored again in the same call
  int64_t moved_events_ = 0;
  int64_t resets_ = 0;
  Counters counters_;
  std::vector<std::vector<uint8_t>> identity_;  // per pool and block, from the events
  std::vector<std::string> violations_;
  std::deque<std::string> log_, first_failure_log_;
};

}  // namespace hkv::testing
