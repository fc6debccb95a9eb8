#include <algorithm>
#include <climits>
#include <limits>

#include <fmt/format.h>

#include <hkv/common/byte_size.h>
#include <hkv/manager/allocator_mode.h>
#include <hkv/plan/plan.h>

namespace hkv {
namespace {

Result<int32_t> PoolBlocks(int64_t memory_bytes, int64_t block_bytes, std::string_view mode) {
  const int64_t blocks = std::min<int64_t>(memory_bytes / block_bytes, INT32_MAX);
  if (blocks < 2) {
    return Status::ResourceExhausted(
        fmt::format("{}: memory {} holds {} blocks of {}; the pool needs at least 2 (one is the "
                    "null block)",
                    mode, FormatBytes(memory_bytes), blocks, FormatBytes(block_bytes)));
  }
  return static_cast<int32_t>(blocks);
}

ManagerConfig BaseConfig(const ModelSpec& model, const PlanOptions& o) {
  ManagerConfig c;
  c.max_model_len = o.max_model_len;
  if (model.has_cross_attention()) {
    c.max_encoder_tokens =
        std::max<int64_t>(o.encoder_tokens == -1 ? model.max_encoder_tokens : o.encoder_tokens, 1);
  }
  c.record_events = false;
  c.enable_prefix_caching = true;
  return c;
}

Result<Allocator> MakeUniform(const ModelSpec& model, const PlanOptions& o,
                              int64_t uniform_bytes_per_token) {
  if (uniform_bytes_per_token <= 0) {
    return Status::InvalidArgument(fmt::format(
        "uniform: {} has no attention layer, so there is no per-token page to charge every layer",
        model.source));
  }
  Allocator a;
  a.mode = AllocatorMode::kUniform;
  a.config = BaseConfig(model, o);
  a.block_tokens = o.block_tokens;
  const int64_t block_bytes = int64_t{o.block_tokens} * uniform_bytes_per_token;
  HKV_ASSIGN_OR_RETURN(const int32_t blocks, PoolBlocks(o.memory_bytes, block_bytes, "uniform"));
  a.config.pool_blocks = {blocks};
  a.config.groups = {GroupConfig{TokenRule{TokenRuleKind::kAll, 0, 0}, o.block_tokens, 0}};
  // Encoder tokens, too, get a slot in every layer (their own block table, as engines kept a
  // cross-attention block table beside the decoder's).
  const bool cross = model.has_cross_attention();
  if (cross) {
    a.config.groups.push_back(
        GroupConfig{TokenRule{TokenRuleKind::kEncoder, 0, 0}, o.block_tokens, 0});
  }
  // Per-token blocks cannot restore a recurrence: a pre-hybrid engine turns prefix caching off
  // for such models (a hit would skip the recurrent layers' state).
  const bool recurrent = std::any_of(model.layers.begin(), model.layers.end(),
                                     [](const LayerSpec& l) { return l.owns_state(); });
  a.config.enable_prefix_caching = !recurrent;
  a.pool_block_bytes = {block_bytes};
  a.summary = fmt::format("{}, {}-token blocks of {}, {} blocks{}",
                          cross ? "2 groups (every layer full attention, encoder tokens in every "
                                  "layer)"
                                : "1 group (every layer full attention)",
                          o.block_tokens, FormatBytes(block_bytes), blocks,
                          recurrent ? ", prefix caching off (recurrent layers)" : "");
  return a;
}

// One bucket of layers with identical specs, as vLLM groups them.
struct Bucket {
  TokenRule rule;
  int64_t layer_bytes = 0;  // per token (attention) or per state
  int32_t block_tokens = 0;
  std::vector<int32_t> layers;
};

// Layers with the same rule, per-token (or per-state) bytes and block size share a bucket; an
// attention layer's block grows until its page is the common one.
Status FillBuckets(const ModelSpec& model, int64_t block, int64_t page,
                   std::vector<Bucket>& buckets) {
  for (size_t i = 0; i < model.layers.size(); ++i) {
    const LayerSpec& l = model.layers[i];
    if (!l.owns_kv() && !l.owns_state()) continue;
    Bucket b;
    b.rule = TokenRuleOf(l);
    if (l.owns_kv()) {
      const int64_t layer_page = block * l.kv_bytes_per_token();
      if (page % layer_page != 0) {
        return Status::InvalidArgument(fmt::format(
            "padded: model layer {} has a {}-byte page that does not divide the {}-byte page of "
            "the largest layer, so no block size gives them one page size",
            l.layer, layer_page, page));
      }
      b.layer_bytes = l.kv_bytes_per_token();
      b.block_tokens = static_cast<int32_t>(block * (page / layer_page));
    } else {
      b.layer_bytes = l.state_bytes();
    }
    auto it = std::find_if(buckets.begin(), buckets.end(), [&](const Bucket& x) {
      return x.rule == b.rule && x.layer_bytes == b.layer_bytes && x.block_tokens == b.block_tokens;
    });
    if (it == buckets.end()) it = buckets.insert(buckets.end(), b);
    it->layers.push_back(static_cast<int32_t>(i));
  }
  return Status::Ok();
}

Result<Allocator> MakePadded(const ModelSpec& model, const PlanOptions& o) {
  // Attention block growth so that one attention page holds a recurrent state.
  int64_t attn_1tok = 0, state_page = 0;
  for (const LayerSpec& l : model.layers) {
    if (l.owns_kv()) attn_1tok = std::max(attn_1tok, l.kv_bytes_per_token());
    if (l.owns_state()) state_page = std::max(state_page, l.state_bytes());
  }
  int64_t block = o.block_tokens;
  if (attn_1tok > 0 && state_page > 0) {
    block = std::max(block, o.block_tokens * CeilDiv(state_page, o.block_tokens * attn_1tok));
  }
  if (block > o.max_model_len) {
    // vLLM still runs, but no prefix can ever fill a block; say so rather than pretend.
    return Status::InvalidArgument(fmt::format(
        "padded: the attention block grows to {} tokens to hold a {} recurrent state, beyond "
        "max_model_len {}",
        block, FormatBytes(state_page), o.max_model_len));
  }
  // One page size: the largest layer page; smaller attention pages get larger blocks.
  int64_t page = 0;
  for (const LayerSpec& l : model.layers) {
    if (l.owns_kv()) page = std::max(page, block * l.kv_bytes_per_token());
    if (l.owns_state()) page = std::max(page, l.state_bytes());
  }
  std::vector<Bucket> buckets;
  HKV_RETURN_IF_ERROR(FillBuckets(model, block, page, buckets));
  if (buckets.empty()) {
    return Status::InvalidArgument(
        fmt::format("padded: {} has no layer that keeps a cache", model.source));
  }
  size_t small = SIZE_MAX, large = 0;
  for (const Bucket& b : buckets) {
    small = std::min(small, b.layers.size());
    large = std::max(large, b.layers.size());
  }
  const size_t group_layers = 2 * large < 3 * small ? large : small;
  Allocator a;
  a.mode = AllocatorMode::kPadded;
  a.config = BaseConfig(model, o);
  a.block_tokens = static_cast<int32_t>(block);
  a.state_page_bytes = state_page > 0 ? page : 0;
  int64_t padding = 0;
  for (const Bucket& b : buckets) {
    const size_t n = (b.layers.size() + group_layers - 1) / group_layers;
    padding += static_cast<int64_t>(n * group_layers - b.layers.size());
    for (size_t k = 0; k < n; ++k)
      a.config.groups.push_back(GroupConfig{b.rule, b.rule.keeps_tokens() ? b.block_tokens : 0, 0});
  }
  const int64_t block_bytes = static_cast<int64_t>(group_layers) * page;
  HKV_ASSIGN_OR_RETURN(const int32_t blocks, PoolBlocks(o.memory_bytes, block_bytes, "padded"));
  a.config.pool_blocks = {blocks};
  a.config.state_align_tokens = static_cast<int32_t>(block);
  a.config.coherent_eviction = false;  // vLLM frees group by group
  a.pool_block_bytes = {block_bytes};
  a.summary = fmt::format(
      "{} groups of {} layer slots ({} padding), {}-token attention blocks, one pool of {} "
      "blocks of {}",
      a.config.groups.size(), group_layers, padding, block, blocks, FormatBytes(block_bytes));
  return a;
}

Result<Allocator> MakeHybridKV(const Plan& plan) {
  Allocator a;
  a.mode = AllocatorMode::kHybridKV;
  HKV_ASSIGN_OR_RETURN(a.config, ManagerConfig::FromPlan(plan));
  a.config.record_events = false;
  for (const KvGroup& g : plan.groups) {
    if (g.is_state()) {
      a.state_page_bytes = g.page_bytes;
    } else {
      a.block_tokens = std::max(a.block_tokens, g.block_tokens);
    }
  }
  std::string pools;
  for (const PageClass& c : plan.page_classes) {
    a.pool_block_bytes.push_back(c.page_bytes);
    if (plan.arena.enabled()) {
      pools += fmt::format("{}{} x {}", pools.empty() ? "" : ", ", c.pages_per_slab,
                           FormatBytes(c.page_bytes));
    } else {
      pools += fmt::format("{}{} x {}", pools.empty() ? "" : ", ", c.num_pages,
                           FormatBytes(c.page_bytes));
    }
  }
  if (plan.arena.enabled()) {
    a.slab_bytes = plan.arena.slab_bytes;
    a.summary = fmt::format(
        "{} groups, {}-token attention blocks, {} shared slabs of {}: a slab "
        "is one of {}",
        plan.groups.size(), a.block_tokens, plan.arena.num_slabs, FormatBytes(a.slab_bytes), pools);
  } else {
    a.summary = fmt::format("{} groups, {}-token attention blocks, pools: {}", plan.groups.size(),
                            a.block_tokens, pools);
  }
  return a;
}

}  // namespace

std::vector<int64_t> Allocator::BlocksPerSequence(int64_t tokens, int64_t encoder_tokens) const {
  tokens = std::max<int64_t>(tokens, 0);
  encoder_tokens = std::max<int64_t>(encoder_tokens, 0);
  std::vector<int64_t> need(config.pool_blocks.size(), 0);
  for (const GroupConfig& g : config.groups) {
    need[static_cast<size_t>(g.pool)] +=
        g.rule.BlocksHeld(tokens, encoder_tokens, std::max(g.block_tokens, 1));
  }
  return need;
}

int64_t Allocator::BytesPerSequence(int64_t tokens, int64_t encoder_tokens) const {
  const std::vector<int64_t> need = BlocksPerSequence(tokens, encoder_tokens);
  int64_t bytes = 0;
  for (size_t p = 0; p < need.size(); ++p) {
    // With shared slabs a block costs its share of a slab, unused slab tail included.
    bytes += config.arena.enabled() && slab_bytes > 0
                 ? need[p] * slab_bytes / config.arena.pages_per_slab[p]
                 : need[p] * pool_block_bytes[p];
  }
  return bytes;
}

int64_t Allocator::MaxSequences(int64_t tokens, int64_t encoder_tokens) const {
  const std::vector<int64_t> need = BlocksPerSequence(tokens, encoder_tokens);
  constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max();
  if (!config.arena.enabled()) {
    int64_t best = kUnbounded;
    for (size_t p = 0; p < need.size(); ++p) {
      if (need[p] > 0) best = std::min(best, (int64_t{config.pool_blocks[p]} - 1) / need[p]);
    }
    return best;
  }
  // Slabs are shared: n sequences take ceil(n * need_p / pages_per_slab_p) slabs for pool p,
  // which grows with n. n is at most what the slabs hold when one pool has them all.
  const auto slabs_for = [&](int64_t n) {
    int64_t slabs = 0;
    for (size_t p = 0; p < need.size(); ++p)
      slabs += CeilDiv(n * need[p], config.arena.pages_per_slab[p]);
    return slabs;
  };
  int64_t lo = 0, hi = kUnbounded;
  for (size_t p = 0; p < need.size(); ++p) {
    if (need[p] > 0) {
      hi = std::min(hi, config.arena.num_slabs * config.arena.pages_per_slab[p] / need[p]);
    }
  }
  if (hi == kUnbounded) return kUnbounded;
  while (lo < hi) {  // lo fits; nothing above hi does
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (slabs_for(mid) <= config.arena.num_slabs) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

double Allocator::Waste(const ModelSpec& model, int64_t tokens, int64_t encoder_tokens) const {
  const int64_t bytes = BytesPerSequence(tokens, encoder_tokens);
  if (bytes <= 0) return 0.0;
  return static_cast<double>(bytes - IdealBytes(model, tokens, encoder_tokens)) /
         static_cast<double>(bytes);
}

std::string_view AllocatorModeName(AllocatorMode mode) {
  switch (mode) {
    case AllocatorMode::kUniform:
      return "uniform";
    case AllocatorMode::kPadded:
      return "padded";
    case AllocatorMode::kHybridKV:
      return "hybridkv";
  }
  return "?";
}

Result<AllocatorMode> ParseAllocatorMode(std::string_view text) {
  for (AllocatorMode m : kAllAllocatorModes) {
    if (text == AllocatorModeName(m)) return m;
  }
  return Status::InvalidArgument(
      fmt::format("allocator '{}': expected uniform, padded or hybridkv", text));
}

namespace {

Result<Allocator> MakeAllocatorUnchecked(const ModelSpec& model, AllocatorMode mode,
                                         const PlanOptions& o);

}  // namespace

Result<Allocator> MakeAllocator(const ModelSpec& model, AllocatorMode mode,
                                const PlanOptions& options) {
  PlanOptions o = options;
  if (o.max_model_len == 0) {
    if (model.max_position_embeddings <= 0) {
      return Status::InvalidArgument(
          fmt::format("allocator: max_model_len is 0 and {} gives no max_position_embeddings: "
                      "pass max_model_len",
                      model.source));
    }
    o.max_model_len = model.max_position_embeddings;
  }
  const auto at_least_one = [](std::string_view what, int64_t v) {
    return Status::InvalidArgument(fmt::format("allocator: {} {}: expected at least 1", what, v));
  };
  if (o.block_tokens < 1) return at_least_one("block_tokens", o.block_tokens);
  if (o.memory_bytes < 1) return at_least_one("memory", o.memory_bytes);
  if (o.max_model_len < 1) return at_least_one("max_model_len", o.max_model_len);
  if (o.seq_tokens < 0 || o.seq_tokens > o.max_model_len) {
    return Status::InvalidArgument(
        fmt::format("allocator: seq_tokens {}: expected 0 to max_model_len ({})", o.seq_tokens,
                    o.max_model_len));
  }
  HKV_ASSIGN_OR_RETURN(Allocator a, MakeAllocatorUnchecked(model, mode, o));
  // Every mode serves with checkpoints admitted by expected reuse and under pressure keeps fewer
  // rolling states; uniform and hybridkv keep shared prefixes longer (allocator_mode.h).
  a.config.prompt_checkpoints = false;
  a.config.rolling_stride_after_give_back = a.config.AlignUp(kRollingStrideAfterGiveBack);
  // padded evicts as vLLM does (group by group, least recently freed first), so it keeps no
  // shared prefix longer.
  a.config.branch_bonus = mode == AllocatorMode::kPadded ? 0.0 : kBranchBonus;
  a.config.thrash_guard = mode != AllocatorMode::kPadded;
  a.config.admission_headroom_steps = mode == AllocatorMode::kPadded ? 0 : kAdmissionHeadroomSteps;
  int64_t blocks = 0;
  for (const int32_t b : a.config.pool_blocks)
    blocks += b - 1;
  if (blocks > kMaxAllocatorBlocks) {
    return Status::InvalidArgument(
        fmt::format("allocator: memory {} makes more blocks than the {} a manager may have (their "
                    "metadata would not fit in memory)",
                    FormatBytes(o.memory_bytes), kMaxAllocatorBlocks));
  }
  return a;
}

namespace {

Result<Allocator> MakeAllocatorUnchecked(const ModelSpec& model, AllocatorMode mode,
                                         const PlanOptions& o) {
  HKV_RETURN_IF_ERROR(model.Validate());
  if (o.encoder_tokens < -1) {
    return Status::InvalidArgument(
        fmt::format("allocator: encoder_tokens {}: expected -1 (the model's largest encoder "
                    "input), 0 or a positive count",
                    o.encoder_tokens));
  }
  if (o.encoder_tokens > 0 && !model.has_cross_attention()) {
    return Status::InvalidArgument(
        fmt::format("allocator: encoder_tokens {}: {} has no cross attention; expected -1 or 0",
                    o.encoder_tokens, model.source));
  }
  switch (mode) {
    case AllocatorMode::kUniform:
      return MakeUniform(model, o, UniformBytesPerToken(model));
    case AllocatorMode::kPadded:
      return MakePadded(model, o);
    case AllocatorMode::kHybridKV: {
      Result<Plan> plan = MakePlan(model, o);
      if (!plan.ok()) {
        return Status(plan.status().code(), fmt::format("hybridkv: {}", plan.status().message()));
      }
      return MakeHybridKV(*plan);
    }
  }
  return Status::InvalidArgument("allocator: unknown mode");
}

}  // namespace

}  // namespace hkv
