// Finding the longest usable prefix: for a new request (Lookup, from the prefix index) and for a
// request being cut back (Truncate, from what it holds plus the index).
//
// Both are fixed points over the groups. Each group answers "the largest x' <= x at which I
// could continue computing", and x shrinks to the smallest answer until every group agrees.
// Any position valid for all groups and <= x stays <= every later x, so the result is the
// largest common valid position, whatever the number and mix of groups.
#include <algorithm>

#include "manager_impl.h"

namespace hkv {

namespace {

int64_t FloorTo(int64_t x, int64_t unit) {
  return x / unit * unit;
}

// Largest x' <= x, a multiple of `unit`, whose needed blocks all satisfy `available`. A miss at
// block j rules out every x' whose needed range contains j, so the search jumps below it; blocks
// are visited once in the window part, from the top down.
template <typename NeededAt, typename Available>
int64_t ScanDown(int64_t bs, int64_t x, int64_t unit, const NeededAt& needed_at,
                 const Available& available) {
  x = FloorTo(x, unit);
  while (x > 0) {
    const NeededBlocks n = needed_at(x);
    int64_t miss = -1;
    for (int64_t j = n.hi - 1; j >= n.lo; --j) {
      if (!available(j)) {
        miss = j;
        break;
      }
    }
    for (int64_t j = 0; miss < 0 && j < n.sinks; ++j) {
      if (!available(j)) miss = j;
    }
    if (miss < 0) return x;
    x = FloorTo(miss * bs, unit);
  }
  return 0;
}

}  // namespace

int64_t KvCacheManager::Impl::LookupFixedPoint(const Request& r, int64_t cap,
                                               bool token_groups_only) {
  if (cap <= 0) return 0;
  std::fill(full_prefix.begin(), full_prefix.end(), -1);
  int64_t x = cap / align * align;
  for (;;) {
    const int64_t before = x;
    for (size_t k = 0; k < search_order.size() && x > 0; ++k) {
      const size_t gi = search_order[k];
      const auto g = static_cast<int32_t>(gi);
      const GroupConfig& gc = config.groups[gi];
      const BlockPool& bp = pools[static_cast<size_t>(gc.pool)];
      switch (gc.rule.kind) {
        case TokenRuleKind::kAll: {
          // Full attention needs the whole prefix: count cached blocks from the front once.
          int64_t& m = full_prefix[gi];
          if (m < 0) {
            const int64_t limit = cap / gc.block_tokens;
            m = 0;
            while (m < limit && Available(bp, TokenKey(r, g, m)))
              ++m;
          }
          x = std::min(x, FloorTo(m * gc.block_tokens, align));
          break;
        }
        case TokenRuleKind::kWindow:
        case TokenRuleKind::kChunk:
          x = ScanDown(
              gc.block_tokens, x, align, [&](int64_t at) { return Needed(g, at); },
              [&](int64_t j) { return Available(bp, TokenKey(r, g, j)); });
          break;
        case TokenRuleKind::kState:
          if (token_groups_only) break;
          while (x > 0 && !Available(bp, StateKey(r, g, x)))
            x -= align;
          break;
        case TokenRuleKind::kEncoder:
        case TokenRuleKind::kNothing:
          break;
      }
    }
    if (x == before || x == 0) return x;
  }
}

int32_t KvCacheManager::Impl::CountLoads(const Request& r, int64_t tokens) const {
  if (tokens <= 0) return 0;
  int32_t loads = 0;
  for (size_t gi = 0; gi < config.groups.size(); ++gi) {
    const auto g = static_cast<int32_t>(gi);
    const GroupConfig& gc = config.groups[gi];
    const BlockPool& bp = pools[static_cast<size_t>(gc.pool)];
    if (IsDecoderTokens(gc)) {
      const NeededBlocks nb = Needed(g, tokens);
      for (int64_t j = 0; j < nb.hi; ++j) {
        if ((j < nb.sinks || j >= nb.lo) && bp.Find(TokenKey(r, g, j)) < 0) ++loads;
      }
    } else if (gc.is_state() && bp.Find(StateKey(r, g, tokens)) < 0) {
      ++loads;
    }
  }
  return loads;
}

int64_t KvCacheManager::Impl::DivergenceOf(const Request& r, int64_t hit) {
  if (!config.enable_prefix_caching || r.known() < 2) return 0;
  bool has_state = false, has_tokens = false;
  for (const GroupConfig& gc : config.groups) {
    has_state = has_state || gc.is_state();
    has_tokens = has_tokens || IsDecoderTokens(gc);
  }
  if (!has_state || !has_tokens) return 0;
  const int64_t attention = LookupFixedPoint(r, r.known() - 1, /*token_groups_only=*/true);
  return attention > hit ? attention : 0;
}

int64_t KvCacheManager::Impl::WindowBranchOf(const Request& r, int64_t hit) {
  if (!config.enable_prefix_caching || !config.coherent_eviction || r.known() < 2) return 0;
  bool releases = false;
  for (const GroupConfig& gc : config.groups)
    releases = releases || ReleasesTokens(gc);
  if (!releases) return 0;
  // Full-attention blocks are cached only if some request computed this very prefix, and held
  // only while one runs: both mark a point where prefixes branch.
  const int64_t cap = r.known() - 1;
  int64_t reach = cap;
  bool held = hit > 0;
  bool any_full = false;
  for (size_t gi = 0; gi < config.groups.size(); ++gi) {
    const GroupConfig& gc = config.groups[gi];
    if (gc.rule.kind != TokenRuleKind::kAll) continue;
    any_full = true;
    const auto g = static_cast<int32_t>(gi);
    const BlockPool& bp = pools[static_cast<size_t>(gc.pool)];
    const int64_t limit = cap / gc.block_tokens;
    int64_t m = 0;
    while (m < limit && bp.Find(TokenKey(r, g, m)) >= 0)
      ++m;
    reach = std::min(reach, m * gc.block_tokens);
    if (held) {
      const int32_t last = bp.Find(TokenKey(r, g, hit / gc.block_tokens - 1));
      held = last >= 0 && bp.ref_count(last) > 0;
    }
  }
  if (!any_full) return 0;
  reach = FloorTo(reach, align);
  if (reach > hit) return reach;  // its window blocks were evicted, its full attention not
  return held ? hit : 0;          // another running request shares the whole hit
}

bool KvCacheManager::Impl::EncoderCached(const Request& r) const {
  for (size_t gi = 0; gi < config.groups.size(); ++gi) {
    const GroupConfig& gc = config.groups[gi];
    if (!gc.is_encoder()) continue;
    const BlockPool& bp = pools[static_cast<size_t>(gc.pool)];
    const int64_t blocks = (r.encoder_tokens + gc.block_tokens - 1) / gc.block_tokens;
    for (int64_t i = 0; i < blocks; ++i) {
      if (bp.Find({r.encoder_hashes[static_cast<size_t>(i)], static_cast<int32_t>(gi)}) < 0) {
        return false;
      }
    }
  }
  return true;
}

int64_t KvCacheManager::Impl::TruncateFixedPoint(const Request& r, int64_t x,
                                                 int64_t new_known) const {
  for (;;) {
    const int64_t before = x;
    for (size_t gi = 0; gi < config.groups.size() && x > 0; ++gi) {
      const auto g = static_cast<int32_t>(gi);
      const GroupConfig& gc = config.groups[gi];
      const BlockPool& bp = pools[static_cast<size_t>(gc.pool)];
      const auto& gs = r.groups[gi];
      switch (gc.rule.kind) {
        case TokenRuleKind::kWindow:
        case TokenRuleKind::kChunk: {
          // A block the request still holds is valid up to `computed`; one it released can be
          // taken back from the cache if its identity survived.
          const int64_t bs = gc.block_tokens;
          x = ScanDown(
              bs, x, 1, [&](int64_t at) { return Needed(g, at); },
              [&](int64_t j) {
                if (j < static_cast<int64_t>(gs.table.size()) &&
                    gs.table[static_cast<size_t>(j)] != BlockPool::kNullBlock) {
                  return true;
                }
                return (j + 1) * bs <= new_known && bp.Find(TokenKey(r, g, j)) >= 0;
              });
          break;
        }
        case TokenRuleKind::kState: {
          int64_t best = 0;
          if (r.computed <= x) best = r.computed;
          if (gs.rolling.block != BlockPool::kNullBlock && gs.rolling.position <= x) {
            best = std::max(best, gs.rolling.position);
          }
          for (const auto& h : gs.held) {
            if (h.position <= x) best = std::max(best, h.position);
          }
          for (int64_t p = FloorTo(std::min(x, new_known), align); p > best; p -= align) {
            if (bp.Find(StateKey(r, g, p)) >= 0) {
              best = p;
              break;
            }
          }
          x = best;
          break;
        }
        default:
          break;  // full attention holds every block up to `computed`; encoders are apart
      }
    }
    if (x == before || x == 0) return x;
  }
}

}  // namespace hkv
