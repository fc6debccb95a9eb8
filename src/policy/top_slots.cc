#include "top_slots.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace hkv::policy_internal {

bool HeadMean(const AttentionFeedback& fb, size_t n, std::vector<float>& out) {
  if (fb.num_kv_heads <= 0 || fb.weights.size() != n * static_cast<size_t>(fb.num_kv_heads)) {
    return false;
  }
  out.assign(n, 0.0f);
  for (int32_t h = 0; h < fb.num_kv_heads; ++h) {
    for (size_t i = 0; i < n; ++i)
      out[i] += fb.weights[static_cast<size_t>(h) * n + i];
  }
  for (float& x : out)
    x /= static_cast<float>(fb.num_kv_heads);
  return true;
}

void KeepAll(size_t n, std::vector<int32_t>& keep) {
  for (size_t i = 0; i < n; ++i)
    keep.push_back(static_cast<int32_t>(i));
}

void KeepTop(std::span<const float> score, std::span<const int64_t> positions, size_t forced_from,
             int64_t budget, std::vector<int32_t>& keep) {
  // Scratch kept per thread: Select runs every decode step on every layer, and is const.
  thread_local std::vector<int32_t> rest;
  thread_local std::vector<uint8_t> chosen;
  const size_t n = positions.size();
  forced_from = std::min(forced_from, n);
  rest.resize(forced_from);
  std::iota(rest.begin(), rest.end(), 0);
  const auto room =
      static_cast<size_t>(std::max<int64_t>(0, budget - static_cast<int64_t>(n - forced_from)));
  if (room < rest.size()) {
    // NaN ranks lowest, so the order stays a strict weak ordering whatever the weights.
    const auto key = [&](int32_t i) {
      const float v = score[static_cast<size_t>(i)];
      return std::isnan(v) ? -std::numeric_limits<float>::infinity() : v;
    };
    const auto better = [&](int32_t a, int32_t b) {
      const float sa = key(a), sb = key(b);
      if (sa != sb) return sa > sb;
      return positions[static_cast<size_t>(a)] > positions[static_cast<size_t>(b)];
    };
    std::nth_element(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(room), rest.end(),
                     better);
    rest.resize(room);
  }
  // Ascending by a scan rather than a sort of the kept slots.
  chosen.assign(forced_from, 0);
  for (int32_t i : rest)
    chosen[static_cast<size_t>(i)] = 1;
  for (size_t i = 0; i < forced_from; ++i) {
    if (chosen[i] != 0) keep.push_back(static_cast<int32_t>(i));
  }
  for (size_t i = forced_from; i < n; ++i)
    keep.push_back(static_cast<int32_t>(i));
}

void KeepRecentAndTop(const KvPolicy& policy, std::span<const int64_t> positions, int64_t recent,
                      int64_t budget, std::vector<int32_t>& keep) {
  const size_t n = positions.size();
  if (static_cast<int64_t>(n) <= budget) {
    KeepAll(n, keep);
    return;
  }
  thread_local std::vector<float> score;
  policy.Scores(positions, score);
  const auto tail = static_cast<size_t>(std::clamp<int64_t>(recent, 0, budget));
  KeepTop(score, positions, n - tail, budget, keep);
}

}  // namespace hkv::policy_internal
