#include <algorithm>
#include <climits>
#include <numeric>

#include <fmt/format.h>

#include <hkv/manager/manager_config.h>

#include "request_state.h"

namespace hkv {
namespace {

// Alignment beyond this is a misconfiguration (block sizes with a huge lcm), not a use case.
constexpr int64_t kMaxAlignTokens = int64_t{1} << 20;

int64_t AlignOf(const ManagerConfig& c) {
  int64_t lcm = 0;
  for (const GroupConfig& g : c.groups) {
    if (!manager_internal::IsDecoderTokens(g) || g.block_tokens <= 0) continue;
    lcm = lcm == 0 ? g.block_tokens : std::lcm(lcm, int64_t{g.block_tokens});
    if (lcm > kMaxAlignTokens) return lcm;
  }
  return lcm == 0 ? c.state_align_tokens : lcm;
}

}  // namespace

Result<ManagerConfig> ManagerConfig::FromPlan(const Plan& plan) {
  ManagerConfig c;
  for (const PageClass& pc : plan.page_classes) {
    c.pool_blocks.push_back(static_cast<int32_t>(std::min<int64_t>(pc.num_pages, INT32_MAX)));
  }
  if (plan.arena.enabled()) {
    // Two-level: block ids of pool p are 1 + slab * pages_per_slab + page.
    c.arena.num_slabs = plan.arena.num_slabs;
    for (size_t p = 0; p < plan.page_classes.size(); ++p) {
      c.arena.pages_per_slab.push_back(plan.page_classes[p].pages_per_slab);
      c.pool_blocks[p] = static_cast<int32_t>(plan.page_classes[p].num_pages + 1);
    }
  }
  for (const KvGroup& g : plan.groups) {
    c.groups.push_back(GroupConfig{g.rule, g.block_tokens, g.page_class});
  }
  c.max_model_len = plan.options.max_model_len;
  for (const KvGroup& g : plan.groups) {
    if (g.rule.kind == TokenRuleKind::kEncoder) {
      c.max_encoder_tokens = std::max<int64_t>(plan.options.encoder_tokens, 1);
    }
  }
  if (!plan.groups.empty()) {
    // With no token group (a pure recurrent model) checkpoints fall on the plan's block size.
    for (const KvGroup& g : plan.groups) {
      if (g.block_tokens > 0) c.state_align_tokens = g.block_tokens;
    }
  }
  HKV_RETURN_IF_ERROR(c.Validate());
  return c;
}

Status ManagerConfig::CheckMatches(const Plan& plan) const {
  if (groups.size() != plan.groups.size()) {
    return Status::InvalidArgument(fmt::format("manager config: {} groups; the plan has {}",
                                               groups.size(), plan.groups.size()));
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    const GroupConfig& c = groups[g];
    const KvGroup& k = plan.groups[g];
    if (!(c.rule == k.rule)) {
      return Status::InvalidArgument(
          fmt::format("manager config: group {} keeps tokens by another rule than the plan's", g));
    }
    if (c.block_tokens != k.block_tokens) {
      return Status::InvalidArgument(
          fmt::format("manager config: group {} has {}-token blocks; the plan's has {}", g,
                      c.block_tokens, k.block_tokens));
    }
    if (c.pool != k.page_class) {
      return Status::InvalidArgument(fmt::format(
          "manager config: group {} draws from pool {}; the plan puts it in page class {}", g,
          c.pool, k.page_class));
    }
  }
  if (pool_blocks.size() != plan.page_classes.size()) {
    return Status::InvalidArgument(
        fmt::format("manager config: {} pools; the plan has {} page "
                    "classes",
                    pool_blocks.size(), plan.page_classes.size()));
  }
  if (arena.enabled() != plan.arena.enabled()) {
    return Status::InvalidArgument(fmt::format(
        "manager config: {} shared slabs; the plan {}", arena.num_slabs,
        plan.arena.enabled() ? fmt::format("has {}", plan.arena.num_slabs) : "has none"));
  }
  if (arena.enabled() && arena.num_slabs > plan.arena.num_slabs) {
    return Status::InvalidArgument(fmt::format("manager config: {} shared slabs; the plan has {}",
                                               arena.num_slabs, plan.arena.num_slabs));
  }
  for (size_t p = 0; p < pool_blocks.size(); ++p) {
    const PageClass& pc = plan.page_classes[p];
    if (arena.enabled() &&
        (p >= arena.pages_per_slab.size() || arena.pages_per_slab[p] != pc.pages_per_slab)) {
      return Status::InvalidArgument(fmt::format(
          "manager config: pool {} is not carved {} pages per slab as the plan's class is", p,
          pc.pages_per_slab));
    }
    // Block ids index the class's pages; a two-level pool counts the null block on top.
    const int64_t capacity = arena.enabled() ? pc.num_pages + 1 : pc.num_pages;
    if (pool_blocks[p] > capacity) {
      return Status::InvalidArgument(
          fmt::format("manager config: pool {} has {} blocks; the plan's page class holds {}", p,
                      pool_blocks[p], capacity));
    }
  }
  return Status::Ok();
}

namespace {

// Pools and slabs: every pool has its null block and one more; with two-level memory every pool
// is carved from the same slabs.
Status ValidatePools(const ManagerConfig& c) {
  const std::vector<int32_t>& pool_blocks = c.pool_blocks;
  const ArenaConfig& arena = c.arena;
  if (pool_blocks.empty()) return Status::InvalidArgument("manager config: no pools");
  for (size_t p = 0; p < pool_blocks.size(); ++p) {
    if (pool_blocks[p] < 2) {
      return Status::InvalidArgument(fmt::format(
          "manager config: pool {} has {} blocks; it needs at least 2 (block 0 is the null block)",
          p, pool_blocks[p]));
    }
  }
  if (arena.num_slabs < 0) {
    return Status::InvalidArgument(
        fmt::format("manager config: arena.num_slabs {} is negative", arena.num_slabs));
  }
  if (arena.enabled()) {
    if (arena.pages_per_slab.size() != pool_blocks.size()) {
      return Status::InvalidArgument(
          fmt::format("manager config: arena.pages_per_slab has {} entries for {} pools",
                      arena.pages_per_slab.size(), pool_blocks.size()));
    }
    for (size_t p = 0; p < pool_blocks.size(); ++p) {
      const int32_t per = arena.pages_per_slab[p];
      if (per < 1) {
        return Status::InvalidArgument(
            fmt::format("manager config: arena.pages_per_slab[{}] = {}: expected >= 1", p, per));
      }
      if (arena.num_slabs * per + 1 != pool_blocks[p]) {
        return Status::InvalidArgument(fmt::format(
            "manager config: pool {} has {} blocks: expected num_slabs * pages_per_slab + 1 = {} "
            "({} slabs of {} pages)",
            p, pool_blocks[p], arena.num_slabs * per + 1, arena.num_slabs, per));
      }
    }
  }
  return Status::Ok();
}

Status ValidateGroup(const ManagerConfig& c, size_t i) {
  const GroupConfig& g = c.groups[i];
  const std::vector<int32_t>& pool_blocks = c.pool_blocks;
  if (g.pool < 0 || static_cast<size_t>(g.pool) >= pool_blocks.size()) {
    return Status::InvalidArgument(
        fmt::format("manager config: group {} uses pool {}, but there are {} pools", i, g.pool,
                    pool_blocks.size()));
  }
  switch (g.rule.kind) {
    case TokenRuleKind::kNothing:
      return Status::InvalidArgument(fmt::format(
          "manager config: group {} keeps nothing; layers that own no cache need no group", i));
    case TokenRuleKind::kState:
      if (g.block_tokens != 0) {
        return Status::InvalidArgument(fmt::format(
            "manager config: state group {} has block_tokens {}; a state block holds one "
            "state, so it must be 0",
            i, g.block_tokens));
      }
      break;
    case TokenRuleKind::kWindow:
    case TokenRuleKind::kChunk:
      if (g.rule.span < 1) {
        return Status::InvalidArgument(
            fmt::format("manager config: group {} has span {}; expected >= 1", i, g.rule.span));
      }
      if (g.rule.sinks < 0) {
        return Status::InvalidArgument(
            fmt::format("manager config: group {} has {} sinks", i, g.rule.sinks));
      }
      [[fallthrough]];
    case TokenRuleKind::kAll:
    case TokenRuleKind::kEncoder:
      if (g.block_tokens < 1) {
        return Status::InvalidArgument(fmt::format(
            "manager config: group {} has block_tokens {}; expected >= 1", i, g.block_tokens));
      }
      break;
  }
  return Status::Ok();
}

}  // namespace

Status ManagerConfig::Validate() const {
  HKV_RETURN_IF_ERROR(ValidatePools(*this));
  if (groups.empty()) return Status::InvalidArgument("manager config: no groups");
  bool has_encoder = false;
  for (size_t i = 0; i < groups.size(); ++i) {
    HKV_RETURN_IF_ERROR(ValidateGroup(*this, i));
    has_encoder = has_encoder || groups[i].is_encoder();
  }
  if (max_model_len < 1) {
    return Status::InvalidArgument(
        fmt::format("manager config: max_model_len {}; expected >= 1", max_model_len));
  }
  if (has_encoder && max_encoder_tokens < 1) {
    return Status::InvalidArgument(
        fmt::format("manager config: a cross-attention group needs max_encoder_tokens >= 1, got {}",
                    max_encoder_tokens));
  }
  if (max_encoder_tokens < 0) {
    return Status::InvalidArgument(
        fmt::format("manager config: max_encoder_tokens {} is negative", max_encoder_tokens));
  }
  if (state_align_tokens < 1) {
    return Status::InvalidArgument(
        fmt::format("manager config: state_align_tokens {}; expected >= 1", state_align_tokens));
  }
  const int64_t align = AlignOf(*this);
  if (align > kMaxAlignTokens) {
    return Status::InvalidArgument(fmt::format(
        "manager config: the lcm of the groups' block sizes exceeds {} tokens; choose block "
        "sizes that divide one another",
        kMaxAlignTokens));
  }
  if (checkpoint_interval < 0 || checkpoint_interval % align != 0) {
    return Status::InvalidArgument(fmt::format(
        "manager config: checkpoint_interval {} must be 0 or a positive multiple of the hit "
        "alignment ({} tokens)",
        checkpoint_interval, align));
  }
  if (branch_memory_entries < 0 || branch_memory_entries > (1 << 24)) {
    return Status::InvalidArgument(
        fmt::format("manager config: branch_memory_entries {} must be in [0, {}]",
                    branch_memory_entries, 1 << 24));
  }
  if (!(branch_bonus >= 0 && branch_bonus <= 64)) {
    return Status::InvalidArgument(fmt::format(
        "manager config: branch_bonus {} must be in [0, 64] cache turnovers", branch_bonus));
  }
  if (!(thrash_keep_share >= 0 && thrash_keep_share <= 1)) {
    return Status::InvalidArgument(
        fmt::format("manager config: thrash_keep_share {} must be 0 (learned) or in (0, 1]",
                    thrash_keep_share));
  }
  if (branch_bonus_levels < 1 || branch_bonus_levels > 254) {
    return Status::InvalidArgument(fmt::format(
        "manager config: branch_bonus_levels {} must be in [1, 254]", branch_bonus_levels));
  }
  if (rolling_stride_after_give_back < 0 || rolling_stride_after_give_back % align != 0) {
    return Status::InvalidArgument(fmt::format(
        "manager config: rolling_stride_after_give_back {} must be 0 or a positive multiple of "
        "the hit alignment ({} tokens)",
        rolling_stride_after_give_back, align));
  }
  if (max_state_splits < 0) {
    return Status::InvalidArgument(fmt::format(
        "manager config: max_state_splits {} is negative; expected 0 (no checkpoint inside a "
        "step) or more",
        max_state_splits));
  }
  if (admission_headroom_steps < 0 || admission_headroom_steps > max_model_len) {
    return Status::InvalidArgument(fmt::format(
        "manager config: admission_headroom_steps {} must be in [0, max_model_len ({})]: decode "
        "steps of growth an admission leaves room for",
        admission_headroom_steps, max_model_len));
  }
  if (max_interval_checkpoints < 0) {
    return Status::InvalidArgument(
        fmt::format("manager config: max_interval_checkpoints {} is negative; expected 0 (no cap) "
                    "or more",
                    max_interval_checkpoints));
  }
  return Status::Ok();
}

bool ManagerConfig::pool_holds_states(int32_t pool) const {
  return std::any_of(groups.begin(), groups.end(),
                     [&](const GroupConfig& g) { return g.is_state() && g.pool == pool; });
}

int32_t ManagerConfig::hash_tokens() const {
  int32_t gcd = 0;
  for (const GroupConfig& g : groups) {
    if (manager_internal::IsDecoderTokens(g) && g.block_tokens > 0)
      gcd = std::gcd(gcd, g.block_tokens);
  }
  return gcd == 0 ? state_align_tokens : gcd;
}

int32_t ManagerConfig::align_tokens() const {
  return static_cast<int32_t>(AlignOf(*this));
}

}  // namespace hkv
