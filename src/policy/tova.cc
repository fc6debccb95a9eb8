// tova: the tokens the newest query attends to most; a token's past popularity does not count.
#include "policy_factories.h"
#include "top_slots.h"

namespace hkv::policy_internal {
namespace {

class Tova final : public KvPolicy {
 public:
  std::string_view name() const override { return "tova"; }
  std::unique_ptr<KvPolicy> Clone() const override { return std::make_unique<Tova>(*this); }
  int32_t AttentionRows(const PolicyStep&) const override { return 1; }

  void Observe(std::span<const int64_t> positions, const PolicyStep&,
               const AttentionFeedback& fb) override {
    if (!HeadMean(fb, positions.size(), last_)) last_.assign(positions.size(), 0.0f);
  }

  void Select(std::span<const int64_t> positions, int64_t budget,
              std::vector<int32_t>& keep) const override {
    KeepRecentAndTop(*this, positions, 0, budget, keep);
  }

  void Compact(std::span<const int32_t> keep) override { CompactRows(last_, 1, keep); }

  void Scores(std::span<const int64_t> positions, std::vector<float>& out) const override {
    out.assign(positions.size(), 0.0f);
    for (size_t i = 0; i < positions.size() && i < last_.size(); ++i)
      out[i] = last_[i];
  }

 private:
  std::vector<float> last_;  // per slot: the last query row's attention, mean over KV heads
};

}  // namespace

std::unique_ptr<KvPolicy> NewTova() {
  return std::make_unique<Tova>();
}

}  // namespace hkv::policy_internal
