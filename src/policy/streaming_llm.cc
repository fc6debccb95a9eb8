// streaming_llm: attention sinks (the first tokens, which soak up attention mass in trained
// models) plus a recent window; needs no attention weights.
#include <algorithm>

#include "policy_factories.h"
#include "top_slots.h"

namespace hkv::policy_internal {
namespace {

class StreamingLlm final : public KvPolicy {
 public:
  explicit StreamingLlm(int32_t sinks) : sinks_(sinks) {}
  std::string_view name() const override { return "streaming_llm"; }
  std::unique_ptr<KvPolicy> Clone() const override { return std::make_unique<StreamingLlm>(*this); }
  int32_t AttentionRows(const PolicyStep&) const override { return 0; }
  void Observe(std::span<const int64_t>, const PolicyStep&, const AttentionFeedback&) override {}
  void Select(std::span<const int64_t> positions, int64_t budget,
              std::vector<int32_t>& keep) const override {
    const auto n = static_cast<int64_t>(positions.size());
    if (n <= budget) {
      KeepAll(positions.size(), keep);
      return;
    }
    // Slots are in position order: the sinks are the first slots, the window the last ones.
    const int64_t sinks = std::min<int64_t>(sinks_, budget);
    for (int64_t i = 0; i < sinks; ++i)
      keep.push_back(static_cast<int32_t>(i));
    for (int64_t i = n - (budget - sinks); i < n; ++i)
      keep.push_back(static_cast<int32_t>(i));
  }
  void Compact(std::span<const int32_t>) override {}
  void Scores(std::span<const int64_t>, std::vector<float>&) const override {}

 private:
  int32_t sinks_;
};

}  // namespace

std::unique_ptr<KvPolicy> NewStreamingLlm(int32_t sinks) {
  return std::make_unique<StreamingLlm>(sinks);
}

}  // namespace hkv::policy_internal
