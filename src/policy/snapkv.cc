// snapkv: one look at the end of the prompt: what the prompt's last queries (an observation
// window) attend to predicts what generation will need, so the prompt is cut to that, smoothed
// over neighbouring tokens so that a needed span keeps its context.
#include <algorithm>

#include "policy_factories.h"
#include "top_slots.h"

namespace hkv::policy_internal {
namespace {

class SnapKv final : public KvPolicy {
 public:
  SnapKv(int32_t window, int32_t kernel, bool max_pool)
      : window_(window), kernel_(kernel), max_pool_(max_pool) {}
  std::string_view name() const override { return "snapkv"; }
  std::unique_ptr<KvPolicy> Clone() const override { return std::make_unique<SnapKv>(*this); }
  int32_t AttentionRows(const PolicyStep& step) const override {
    return step.ends_prompt ? window_ : 0;
  }

  void Observe(std::span<const int64_t> positions, const PolicyStep& step,
               const AttentionFeedback& fb) override {
    const size_t n = positions.size();
    pooled_.resize(n, 0.0f);
    std::vector<float> raw;
    if (!step.ends_prompt || !HeadMean(fb, n, raw)) return;
    prompt_end_ = step.first + step.count;
    const auto half = static_cast<int64_t>(kernel_ / 2);
    for (size_t i = 0; i < n; ++i) {
      const int64_t lo = std::max<int64_t>(0, static_cast<int64_t>(i) - half);
      const int64_t hi =
          std::min<int64_t>(static_cast<int64_t>(n) - 1, static_cast<int64_t>(i) + half);
      float acc = max_pool_ ? raw[static_cast<size_t>(lo)] : 0.0f;
      for (int64_t j = lo; j <= hi; ++j) {
        acc = max_pool_ ? std::max(acc, raw[static_cast<size_t>(j)])
                        : acc + raw[static_cast<size_t>(j)];
      }
      pooled_[i] = max_pool_ ? acc : acc / static_cast<float>(hi - lo + 1);
    }
  }

  void Select(std::span<const int64_t> positions, int64_t budget,
              std::vector<int32_t>& keep) const override {
    const size_t n = positions.size();
    size_t prompt = 0;
    while (prompt < n && positions[prompt] < prompt_end_)
      ++prompt;
    if (prompt_end_ == 0 || static_cast<int64_t>(prompt) <= budget) {
      KeepAll(n, keep);
      return;
    }
    const size_t window = std::min<size_t>(static_cast<size_t>(window_), prompt);
    thread_local std::vector<float> score;
    Scores(positions, score);
    // Forced: the observation window and everything after the prompt.
    KeepTop(score, positions, prompt - window, budget + static_cast<int64_t>(n - prompt), keep);
  }

  void Compact(std::span<const int32_t> keep) override { CompactRows(pooled_, 1, keep); }

  void Scores(std::span<const int64_t> positions, std::vector<float>& out) const override {
    out.assign(positions.size(), 0.0f);
    for (size_t i = 0; i < positions.size() && i < pooled_.size(); ++i)
      out[i] = pooled_[i];
  }

 private:
  int32_t window_, kernel_;
  bool max_pool_;
  int64_t prompt_end_ = 0;     // 0 until the step that ends the prompt was observed
  std::vector<float> pooled_;  // per slot: pooled window attention, mean over KV heads
};

}  // namespace

std::unique_ptr<KvPolicy> NewSnapKv(int32_t window, int32_t kernel, bool max_pool) {
  return std::make_unique<SnapKv>(window, kernel, max_pool);
}

}  // namespace hkv::policy_internal
