// CacheCore: identities, the checkpoint policy and block movement, shared by every group.
#include "cache_core.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

namespace hkv::manager_internal {

void Must(const Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "hkv::KvCacheManager internal error: %s\n", s.ToString().c_str());
    std::abort();
  }
}

CacheCore::CacheCore(const ManagerConfig& c)
    : config(c), hash_tokens(c.hash_tokens()), hash_math(hash_tokens), align(c.align_tokens()) {
  need.resize(config.pool_blocks.size());
}

// ---- identities -----------------------------------------------------------------------------

namespace {

bool KeyLess(const PrefixKey& a, const PrefixKey& b) {
  if (a.hash.hi != b.hash.hi) return a.hash.hi < b.hash.hi;
  if (a.hash.lo != b.hash.lo) return a.hash.lo < b.hash.lo;
  return a.group < b.group;
}

}  // namespace

void CacheCore::AskExternal() {
  std::sort(external_keys.begin(), external_keys.end(), KeyLess);
  external_keys.erase(std::unique(external_keys.begin(), external_keys.end()), external_keys.end());
  external_answers.assign(external_keys.size(), 0);
  if (!external_keys.empty()) external->HasMany(external_keys, external_answers);
}

bool CacheCore::ExternalHas(const PrefixKey& key) const {
  const auto it = std::lower_bound(external_keys.begin(), external_keys.end(), key, KeyLess);
  if (it != external_keys.end() && *it == key) {
    return external_answers[static_cast<size_t>(it - external_keys.begin())] != 0;
  }
  return external->Has(key);
}

void CacheCore::ExtendHashes(Request& r) {
  const int64_t g = hash_tokens;
  // Called after every append: a decode token completes a block once in hash_tokens.
  if (r.known() < (static_cast<int64_t>(r.hashes.size()) + 1) * g) return;
  const int64_t full = r.known() / g;
  while (static_cast<int64_t>(r.hashes.size()) < full) {
    const int64_t i = static_cast<int64_t>(r.hashes.size());
    const int64_t start = i * g;
    scratch_items.clear();
    for (const PromptItem& item : r.items) {
      if (item.position >= start + g) break;
      if (item.position + item.length > start) {
        scratch_items.push_back({item.content, item.position - start});
      }
    }
    // A cross-attention decoder's KV depends on the encoder's input too: the first block
    // carries it, as an item at an offset no real item can have there (items start at >= 0).
    if (i == 0 && r.encoder_tokens > 0) {
      scratch_items.insert(scratch_items.begin(), {r.encoder_input, -1 - r.encoder_tokens});
    }
    const BlockHash& parent = i == 0 ? kRootHash : r.hashes.back();
    BlockExtraKeys extra{r.adapter, scratch_items, i == 0 ? std::string_view(r.salt) : ""};
    r.hashes.push_back(HashBlock(
        parent, std::span<const int32_t>(r.tokens.data() + start, static_cast<size_t>(g)), extra));
  }
}

void CacheCore::ComputeEncoderHashes(Request& r) {
  r.encoder_hashes.clear();
  int64_t blocks = 0;
  for (const GroupConfig& gc : config.groups) {
    if (gc.is_encoder()) blocks = std::max(blocks, CeilDiv(r.encoder_tokens, gc.block_tokens));
  }
  if (blocks == 0) return;
  // The root covers everything that decides the encoder's output: its input, its length, the
  // adapter and the salt. Blocks chain from it by index; keys are namespaced per group, so
  // groups with different block sizes never confuse their blocks.
  const MultimodalItem input{r.encoder_input, 0};
  const int32_t length[2] = {static_cast<int32_t>(r.encoder_tokens >> 31),
                             static_cast<int32_t>(r.encoder_tokens & 0x7fffffff)};
  const BlockHash root = HashBlock(kRootHash, length, {r.adapter, {&input, 1}, r.salt});
  for (int64_t i = 0; i < blocks; ++i) {
    const int32_t block_index = static_cast<int32_t>(i);
    r.encoder_hashes.push_back(HashBlock(root, {&block_index, 1}));
  }
}

// ---- checkpoint policy ----------------------------------------------------------------------

bool CacheCore::IsCheckpoint(const Request& r, int64_t p) const {
  if (p <= 0 || p % align != 0) return false;
  if (config.checkpoint_interval > 0 && p % config.checkpoint_interval == 0) return true;
  if (p == r.divergence) return true;
  return config.prompt_checkpoints && p == PromptCheckpoint(r);
}

bool CacheCore::IsIntervalOnly(const Request& r, int64_t p) const {
  return p > 0 && config.checkpoint_interval > 0 && p % config.checkpoint_interval == 0 &&
         p != r.divergence && p != PromptCheckpoint(r);
}

// Positions in [begin, end) after which the step must copy the recurrent state aside:
// - checkpoints strictly inside the step (known, aligned, an interval multiple or the prompt end);
// - the last aligned known position inside the step, when the step does not itself end on one,
//   so the rolling state keeps up with multi-token steps (chunked prefill);
// - every speculative position, so that Commit and Truncate can land on any of them.
// The state after `end` is the step's write slot and needs no copy. Each of the first three is a
// split of the step's chunk; at most max_state_splits are kept, the most useful first (a branch
// point others share, what an identical prompt hits, the rolling state, the newest intervals).
void CacheCore::PlanSnapshots(const Request& r, int64_t begin, int64_t end, int64_t divergence,
                              std::vector<int64_t>& out) const {
  out.clear();
  const int64_t known = r.known();
  // Checkpoints past an eviction could never be published (Commit): none are planned there.
  const int64_t last = std::min({end - 1, known, r.publish_until});
  // Without prefix caching nobody could hit a checkpoint: only speculative states are kept.
  if (config.enable_prefix_caching) {
    const auto splits = static_cast<size_t>(config.max_state_splits);
    const auto add = [&](int64_t p) {
      if (out.size() < splits && std::find(out.begin(), out.end(), p) == out.end())
        out.push_back(p);
    };
    if (divergence > begin && divergence <= last) add(divergence);
    const int64_t prompt_ckpt = PromptCheckpoint(r);
    if (config.prompt_checkpoints && prompt_ckpt > begin && prompt_ckpt <= last) add(prompt_ckpt);
    const int64_t stride = RollingStride(r);
    const int64_t rolling = last / stride * stride;
    const bool end_rolls = end % stride == 0 && end <= known;
    if (rolling > begin && !end_rolls) add(rolling);
    const int64_t interval = config.checkpoint_interval;
    if (interval > 0) {
      for (int64_t p = last / interval * interval; p > begin && out.size() < splits; p -= interval)
        add(p);
    }
  }
  // The state after 0 tokens is the zero state: it needs no copy.
  for (int64_t p = std::max({begin, known, int64_t{1}}); p < end; ++p)
    out.push_back(p);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
}

// ---- block movement -------------------------------------------------------------------------

void CacheCore::Release(int32_t pool, std::span<const int32_t> blocks, Retention retention) {
  if (blocks.empty()) return;
  BlockPool& bp = pools[static_cast<size_t>(pool)];
  release_low.clear();
  release_normal.clear();
  for (int32_t b : blocks) {
    // A reference that is not the last one only drops the count (the list may name a block
    // twice, e.g. a state that is both live and rolling); the last reference decides where the
    // block goes.
    if (bp.ref_count(b) > 1) {
      Must(bp.Free({&b, 1}));
    } else if (!bp.has_identity(b)) {
      release_low.push_back(b);
    } else {
      release_normal.push_back(b);
    }
  }
  Must(bp.Free(release_low, Retention::kLow));
  Must(bp.Free(release_normal, retention));
}

uint64_t CacheCore::GuardResidence() const {
  if (arena.num_slabs() == 0) return pools[static_cast<size_t>(guard_pool)].num_queued_cached();
  uint64_t queued = 0;
  for (const BlockPool& bp : pools)
    queued += bp.num_queued_cached();
  return queued;
}

void CacheCore::ReleaseOne(int32_t pool, int32_t block, Retention retention) {
  if (block == BlockPool::kNullBlock) return;
  Release(pool, {&block, 1}, retention);
}

void CacheCore::AcquireHeld(int32_t pool, int32_t block) {
  Must(pools[static_cast<size_t>(pool)].Acquire(block));
}

void CacheCore::PublishBlock(int32_t pool, int32_t block, const PrefixKey& key, const Request& r,
                             int64_t position, int32_t parent, bool ahead) {
  if (!config.enable_prefix_caching) return;
  BlockPool& bp = pools[static_cast<size_t>(pool)];
  if (bp.has_identity(block)) return;
  // The block's parent in the group's chain: the digest where it starts (a checkpoint: where the
  // previous aligned position would have one), for KV events.
  const bool state = config.groups[static_cast<size_t>(key.group)].is_state();
  const int64_t before = state ? position - align : position;
  PublishOrigin from{r.id, position, std::nullopt, r.adapter};
  if (before > 0 && before < (static_cast<int64_t>(r.hashes.size()) + 1) * hash_tokens) {
    from.parent = HashAt(r, before);
  }
  // A key a free block held moves to this one (BlockPool::Publish): its continuations and the
  // coverage of its checkpoint were counted when it was first published. Not from a block the
  // Allocate under way plans to hit (a give-back publishes rolling states before the hit is
  // taken).
  bool take_over = !ahead;
  if (take_over && !hit_keep.empty()) {
    const int32_t planned = bp.Find(key);
    take_over = std::none_of(hit_keep.begin(), hit_keep.end(),
                             [&](PoolBlock k) { return k.pool == pool && k.block == planned; });
  }
  int32_t holder = -1;
  Must(bp.Publish(block, key, from, take_over, &holder));
  if (holder >= 0) {
    if (bp.has_identity(block)) ++stats.keys_taken_over;
    return;
  }
  if (share_branches && bp.has_identity(block)) {
    if (state) {
      ShareCheckpoint(key.group, block, r, position);
    } else if (IsDecoderTokens(config.groups[static_cast<size_t>(key.group)])) {
      NoteContinuation(key, r, position, parent);
    }
  }
  // Counted only when this block took the key: a copy of a checkpoint already cached stays
  // private and covers nothing more.
  if (cover && group_cover[static_cast<size_t>(key.group)] == kCoverState &&
      bp.has_identity(block)) {
    const auto n = std::min(r.hashes.size(), static_cast<size_t>(position / hash_tokens));
    coverage.Cover({r.hashes.data(), n}, position == r.divergence);
  }
}

void CacheCore::NoteContinuation(const PrefixKey& child, const Request& r, int64_t position,
                                 int32_t parent) {
  if (position <= 0) return;
  const int32_t group = child.group;
  BlockPool& bp = pools[static_cast<size_t>(config.groups[static_cast<size_t>(group)].pool)];
  // The table's block before it holds the parent's identity unless it is a private copy.
  const PrefixKey want{HashAt(r, position), group};
  if (parent == BlockPool::kNullBlock || !bp.has_identity(parent) || !(bp.identity(parent) == want))
    parent = bp.Find(want);
  if (parent <= BlockPool::kNullBlock) return;  // a window group's parent may be gone
  const Result<int32_t> count = bp.AddContinuation(parent, static_cast<uint32_t>(child.hash.lo));
  Must(count.status());
  const int32_t counted = std::min(*count, config.branch_bonus_levels + 1);
  const int32_t level = std::max(counted, bp.share_level(parent));
  if (level < 2) return;
  if (counted > bp.share_level(parent)) ++stats.shared_prefixes_marked;
  // Every group's blocks of the prefix, from its end back, up to the first one marked at this
  // level already (its predecessors were marked with it) or gone (a hit needs nothing before it:
  // a window's older blocks, or a prefix broken there). Blocks computed again after an eviction,
  // a window's mostly, are marked by the next request that continues the prefix.
  for (size_t g = 0; g < config.groups.size(); ++g) {
    const GroupConfig& gc = config.groups[g];
    BlockPool& gp = pools[static_cast<size_t>(gc.pool)];
    const auto gi = static_cast<int32_t>(g);
    if (gc.is_state()) {
      const int32_t b = gp.Find({HashAt(r, position), gi});
      if (b > BlockPool::kNullBlock) Must(gp.MarkShared(b, level));
    } else if (IsDecoderTokens(gc)) {
      for (int64_t end = position / gc.block_tokens * gc.block_tokens; end > 0;
           end -= gc.block_tokens) {
        const int32_t b = gp.Find({HashAt(r, end), gi});
        if (b <= BlockPool::kNullBlock || gp.share_level(b) >= level) break;
        Must(gp.MarkShared(b, level));
      }
    }
  }
}

void CacheCore::ShareCheckpoint(int32_t group, int32_t block, const Request& r, int64_t position) {
  if (position <= 0) return;
  for (size_t g = 0; g < config.groups.size(); ++g) {
    const GroupConfig& gc = config.groups[g];
    if (gc.rule.kind != TokenRuleKind::kAll || position % gc.block_tokens != 0) continue;
    const BlockPool& gp = pools[static_cast<size_t>(gc.pool)];
    const int32_t b = gp.Find({HashAt(r, position), static_cast<int32_t>(g)});
    if (b > BlockPool::kNullBlock && gp.share_level(b) >= 2) {
      Must(pools[static_cast<size_t>(config.groups[static_cast<size_t>(group)].pool)].MarkShared(
          block, gp.share_level(b)));
    }
    return;
  }
}

void CacheCore::StartCoverage() {
  group_cover.clear();
  cover_token_groups.clear();
  cover_state_groups.clear();
  for (size_t g = 0; g < config.groups.size(); ++g) {
    const GroupConfig& gc = config.groups[g];
    // Window and chunked groups keep a hit's last blocks only; they stay out of the count.
    uint8_t kind = kCoverNone;
    if (gc.is_state()) {
      kind = kCoverState;
      cover_state_groups.push_back(static_cast<int32_t>(g));
    } else if (gc.rule.kind == TokenRuleKind::kAll) {
      kind = kCoverToken;
      cover_token_groups.push_back(static_cast<int32_t>(g));
    }
    group_cover.push_back(kind);
  }
  cover = config.evict_uncovered && config.enable_prefix_caching && !cover_state_groups.empty() &&
          !cover_token_groups.empty();
  if (!cover) return;
  for (const auto* list : {&cover_token_groups, &cover_state_groups}) {
    for (int32_t g : *list)
      pools[static_cast<size_t>(config.groups[static_cast<size_t>(g)].pool)].TrackDropped(true);
  }
}

Status CacheCore::CheckCoverage() const {
  if (!cover) return Status::Ok();
  HKV_RETURN_IF_ERROR(coverage.CheckInvariants());
  for (int32_t g : cover_state_groups) {
    const BlockPool& bp = pools[static_cast<size_t>(config.groups[static_cast<size_t>(g)].pool)];
    for (int32_t b = 1; b < bp.num_blocks(); ++b) {
      if (!bp.has_identity(b) || bp.identity(b).group != g) continue;
      if (coverage.Count(bp.identity(b).hash) == 0) {
        return Status::FailedPrecondition(fmt::format(
            "checkpoint coverage: cached checkpoint in block {} of group {} covers nothing", b, g));
      }
    }
  }
  return Status::Ok();
}

void CacheCore::SettleDrops() {
  if (!cover) return;
  const auto demote = [&](int32_t g, const BlockHash& h, int64_t& counter) {
    BlockPool& bp = pools[static_cast<size_t>(config.groups[static_cast<size_t>(g)].pool)];
    const int32_t b = bp.Find({h, g});
    if (b > BlockPool::kNullBlock && bp.ref_count(b) == 0) {
      Must(bp.Demote(b));
      ++counter;
    }
  };
  for (BlockPool& bp : pools) {
    bp.TakeDropped(dropped);
    for (const PrefixKey& k : dropped) {
      // Moved by compaction (or published again within the call): not evicted.
      if (bp.Find(k) >= 0) continue;
      const uint8_t kind = group_cover[static_cast<size_t>(k.group)];
      if (kind == kCoverState) {
        uncovered.clear();
        coverage.Uncover(k.hash, uncovered);
        for (const BlockHash& h : uncovered) {
          for (int32_t g : cover_token_groups)
            demote(g, h, stats.uncovered_blocks_demoted);
        }
      } else if (kind == kCoverToken && coverage.Count(k.hash) > 0) {
        for (int32_t g : cover_state_groups)
          demote(g, k.hash, stats.unreachable_checkpoints_demoted);
      }
    }
  }
}

Status CacheCore::ReserveBlocks() {
  if (arena.num_slabs() > 0) {
    // Two-level memory: move slabs so every pool can allocate its need (nothing moves when it
    // cannot); the caller then only draws from the pools.
    const Status reserved = arena.Reserve(pools, need, hit_keep);
    // Anything but a shortage means the manager passed the arena bad pools or keeps: a bug,
    // not a reason for the engine to preempt.
    if (reserved.code() != StatusCode::kResourceExhausted) Must(reserved);
    return reserved;
  }
  for (size_t p = 0; p < pools.size(); ++p) {
    if (need[p] > pools[p].num_free()) {
      return Status::ResourceExhausted(
          fmt::format("pool {} needs {} free blocks, has {}", p, need[p], pools[p].num_free()));
    }
  }
  return Status::Ok();
}

bool CacheCore::FixedPoolsFit() const {
  for (size_t p = 0; p < pools.size(); ++p) {
    if (need[p] > pools[p].num_free()) return false;
  }
  return true;
}

bool CacheCore::CanReserveBlocks() {
  if (arena.num_slabs() == 0) return FixedPoolsFit();
  const Status possible = arena.CheckReserve(pools, need, hit_keep);
  if (possible.code() != StatusCode::kResourceExhausted) Must(possible);
  if (!possible.ok()) arena_shortage = possible.message();
  return possible.ok();
}

bool CacheCore::TryReserveBlocks() {
  if (arena.num_slabs() == 0) return FixedPoolsFit();
  const Status reserved = ReserveBlocks();
  if (!reserved.ok()) arena_shortage = reserved.message();
  return reserved.ok();
}

std::span<const int32_t> CacheCore::AllocateReserved(int32_t pool, int64_t n) {
  fresh.clear();
  Must(pools[static_cast<size_t>(pool)].Allocate(static_cast<int32_t>(n), fresh));
  return fresh;
}

}  // namespace hkv::manager_internal
