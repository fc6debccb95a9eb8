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

int64_t KvCacheManager::Impl::LookupFixedPoint(const Request& r, int64_t cap,
                                               bool token_groups_only) {
  if (cap <= 0) return 0;
  for (auto& g : groups)
    g->BeginSearch();
  const size_t searched = token_groups_only ? token_search_groups : search_order.size();
  const int64_t align = core.align;
  int64_t x = cap / align * align;
  for (;;) {
    const int64_t before = x;
    for (size_t k = 0; k < searched && x > 0; ++k)
      x = group(search_order[k]).LookupBound(r, x, cap);
    if (x == before || x == 0) return x;
  }
}

int32_t KvCacheManager::Impl::CountLoads(const Request& r, int64_t tokens) const {
  int32_t loads = 0;
  for (const auto& g : groups)
    loads += g->CountLoads(r, tokens);
  return loads;
}

bool KvCacheManager::Impl::EncoderCached(const Request& r) const {
  return std::all_of(groups.begin(), groups.end(),
                     [&](const auto& g) { return g->EncoderCached(r); });
}

int64_t KvCacheManager::Impl::DivergenceOf(const Request& r, int64_t hit) {
  if (!config.enable_prefix_caching || r.known() < 2) return 0;
  if (!has_state_groups || !has_token_groups) return 0;
  const int64_t attention = LookupFixedPoint(r, r.known() - 1, /*token_groups_only=*/true);
  return attention > hit ? attention : 0;
}

int64_t KvCacheManager::Impl::WindowBranchOf(const Request& r, int64_t hit) {
  if (!config.enable_prefix_caching || !config.coherent_eviction || r.known() < 2) return 0;
  if (!has_window_groups) return 0;
  // Full-attention blocks are cached only if some request computed this very prefix, and held
  // only while one runs: both mark a point where prefixes branch.
  const int64_t cap = r.known() - 1;
  int64_t reach = cap;
  bool held = hit > 0;
  bool any_full = false;
  for (const auto& g : groups)
    any_full = g->BranchReach(r, cap, hit, reach, held) || any_full;
  if (!any_full) return 0;
  reach = reach / core.align * core.align;
  // Its window blocks were evicted, its full attention not; or another running request shares
  // the whole hit.
  const int64_t seen = reach > hit ? reach : (held ? hit : 0);
  if (seen > 0) {
    branches.Remember(core.HashAt(r, seen));
    return seen;
  }
  if (!branches.enabled()) return 0;
  // Nothing in the cache shows a branch, but the prefix may be one seen before and evicted since
  // (a system prompt all of whose users had ended): the largest such position of the prompt.
  for (int64_t p = cap / core.align * core.align; p > 0; p -= core.align) {
    if (branches.Contains(core.HashAt(r, p))) {
      ++core.stats.remembered_branches_kept;
      return p;
    }
  }
  return 0;
}

int64_t KvCacheManager::Impl::TruncateFixedPoint(const Request& r, int64_t x,
                                                 int64_t new_known) const {
  for (;;) {
    const int64_t before = x;
    for (size_t g = 0; g < groups.size() && x > 0; ++g)
      x = group(g).TruncateBound(r, x, new_known);
    if (x == before || x == 0) return x;
  }
}

}  // namespace hkv
