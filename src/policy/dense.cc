// dense: the no-eviction baseline; every budget keeps everything.
#include "policy_factories.h"
#include "top_slots.h"

namespace hkv::policy_internal {
namespace {

class Dense final : public KvPolicy {
 public:
  std::string_view name() const override { return "dense"; }
  std::unique_ptr<KvPolicy> Clone() const override { return std::make_unique<Dense>(*this); }
  int32_t AttentionRows(const PolicyStep&) const override { return 0; }
  void Observe(std::span<const int64_t>, const PolicyStep&, const AttentionFeedback&) override {}
  void Select(std::span<const int64_t> positions, int64_t,
              std::vector<int32_t>& keep) const override {
    KeepAll(positions.size(), keep);
  }
  void Compact(std::span<const int32_t>) override {}
  void Scores(std::span<const int64_t>, std::vector<float>&) const override {}
};

}  // namespace

std::unique_ptr<KvPolicy> NewDense() {
  return std::make_unique<Dense>();
}

}  // namespace hkv::policy_internal
