// Selection shared by the score-based policies: the slots a policy must keep, plus the best
// scored of the rest up to the budget; ties keep the more recent token.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <hkv/policy/kv_policy.h>

namespace hkv::policy_internal {

// The feedback's weights of n slots averaged over KV heads into `out` (n values); false, and
// `out` untouched, when the step carried no weights for n slots.
bool HeadMean(const AttentionFeedback& fb, size_t n, std::vector<float>& out);

// Appends to `keep`, ascending: every slot from `forced_from` on (the policies force a recent
// tail; kept even beyond the budget), then the highest-scoring earlier slots until `budget` slots
// are kept.
void KeepTop(std::span<const float> score, std::span<const int64_t> positions, size_t forced_from,
             int64_t budget, std::vector<int32_t>& keep);

// The Select of the score-ranked policies (h2o, tova, knorm): everything within the budget,
// else the `recent` newest slots plus the best of the rest by policy.Scores().
void KeepRecentAndTop(const KvPolicy& policy, std::span<const int64_t> positions, int64_t recent,
                      int64_t budget, std::vector<int32_t>& keep);

// Appends 0..n-1 to `keep`.
void KeepAll(size_t n, std::vector<int32_t>& keep);

// Per-slot state with `width` values per slot, compacted to `keep`; slots the state has not seen
// yet (beyond its size) start from zero.
template <typename T>
void CompactRows(std::vector<T>& rows, size_t width, std::span<const int32_t> keep) {
  const size_t have = rows.size() / width;
  size_t to = 0;
  for (int32_t from : keep) {
    const auto f = static_cast<size_t>(from);
    for (size_t k = 0; k < width; ++k) {
      const T v = f < have ? rows[f * width + k] : T{};
      if (to * width + k < rows.size()) {
        rows[to * width + k] = v;
      } else {
        rows.push_back(v);
      }
    }
    ++to;
  }
  rows.resize(to * width);
}

}  // namespace hkv::policy_internal
