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

// Appends to `keep`, ascending: every slot with forced[i] != 0, then the highest-scoring others
// until `budget` slots are kept (all forced ones are kept even beyond the budget).
void KeepTop(std::span<const float> score, std::span<const int64_t> positions,
             std::span<const uint8_t> forced, int64_t budget, std::vector<int32_t>& keep);

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
