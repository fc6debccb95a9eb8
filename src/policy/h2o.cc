// h2o (heavy hitters): tokens that have drawn the most attention so far, summed over every query
// row of every step, plus a recent window that has not had time to draw any.
#include <algorithm>

#include "policy_factories.h"
#include "top_slots.h"

namespace hkv::policy_internal {
namespace {

class H2O final : public KvPolicy {
 public:
  H2O(int32_t recent, bool normalize) : recent_(recent), normalize_(normalize) {}
  std::string_view name() const override { return "h2o"; }
  std::unique_ptr<KvPolicy> Clone() const override { return std::make_unique<H2O>(*this); }
  int32_t AttentionRows(const PolicyStep&) const override { return kAllRows; }

  void Observe(std::span<const int64_t> positions, const PolicyStep& step,
               const AttentionFeedback& fb) override {
    const size_t n = positions.size();
    sum_.resize(n, 0.0f);
    rows_.resize(n, 0);
    if (!HeadMean(fb, n, mean_)) return;  // no weights this step: scores stand
    const int64_t end = step.first + step.count;
    const int64_t rows_from = end - std::min<int64_t>(fb.rows, step.count);
    for (size_t i = 0; i < n; ++i) {
      sum_[i] += mean_[i];
      // Rows that could attend the slot: the requested ones at or after its position.
      rows_[i] += std::max<int64_t>(0, end - std::max(positions[i], rows_from));
    }
  }

  void Select(std::span<const int64_t> positions, int64_t budget,
              std::vector<int32_t>& keep) const override {
    KeepRecentAndTop(*this, positions, recent_, budget, keep);
  }

  void Compact(std::span<const int32_t> keep) override {
    CompactRows(sum_, 1, keep);
    CompactRows(rows_, 1, keep);
  }

  void Scores(std::span<const int64_t> positions, std::vector<float>& out) const override {
    out.assign(positions.size(), 0.0f);
    for (size_t i = 0; i < positions.size() && i < sum_.size(); ++i) {
      out[i] = normalize_ && rows_[i] > 0 ? sum_[i] / static_cast<float>(rows_[i]) : sum_[i];
    }
  }

 private:
  int32_t recent_;
  bool normalize_;
  std::vector<float> sum_;     // per slot: attention summed over rows, mean over KV heads
  std::vector<int64_t> rows_;  // per slot: query rows that attended it
  std::vector<float> mean_;    // scratch: this step's weights, mean over KV heads
};

}  // namespace

std::unique_ptr<KvPolicy> NewH2O(int32_t recent, bool normalize_by_age) {
  return std::make_unique<H2O>(recent, normalize_by_age);
}

}  // namespace hkv::policy_internal
