// knorm: keys with a small L2 norm draw high attention (Devoto et al., 2024), so the tokens with
// the smallest key norm are kept — a signal read from the cache itself, no attention weights.
#include <algorithm>
#include <cmath>

#include "policy_factories.h"
#include "top_slots.h"

namespace hkv::policy_internal {
namespace {

class Knorm final : public KvPolicy {
 public:
  explicit Knorm(int32_t recent) : recent_(recent) {}
  std::string_view name() const override { return "knorm"; }
  std::unique_ptr<KvPolicy> Clone() const override { return std::make_unique<Knorm>(*this); }
  bool WantsKeys() const override { return true; }
  int32_t AttentionRows(const PolicyStep&) const override { return 0; }

  void Written(const WrittenKv& kv) override {
    if (kv.num_kv_heads <= 0 || kv.key_width % kv.num_kv_heads != 0 ||
        kv.keys.size() != kv.positions.size() * static_cast<size_t>(kv.key_width)) {
      return;  // malformed rows: nothing learned, the slots rank as unseen
    }
    const int32_t d = kv.key_width / kv.num_kv_heads;
    for (size_t i = 0; i < kv.positions.size(); ++i) {
      const float* row = kv.keys.data() + i * static_cast<size_t>(kv.key_width);
      double total = 0.0;
      for (int32_t h = 0; h < kv.num_kv_heads; ++h) {
        double ss = 0.0;
        for (int32_t c = 0; c < d; ++c) {
          const double x = row[h * d + c];
          ss += x * x;
        }
        total += std::sqrt(ss);
      }
      norm_.push_back(static_cast<float>(total / kv.num_kv_heads));
    }
  }

  void Observe(std::span<const int64_t> positions, const PolicyStep&,
               const AttentionFeedback&) override {
    // Slots never shown rank as if their key had norm 0 (kept first): nothing says to drop them.
    norm_.resize(positions.size(), 0.0f);
  }

  void Select(std::span<const int64_t> positions, int64_t budget,
              std::vector<int32_t>& keep) const override {
    KeepRecentAndTop(*this, positions, recent_, budget, keep);
  }

  void Compact(std::span<const int32_t> keep) override { CompactRows(norm_, 1, keep); }

  // Higher is better: the negated norm.
  void Scores(std::span<const int64_t> positions, std::vector<float>& out) const override {
    out.assign(positions.size(), 0.0f);
    for (size_t i = 0; i < positions.size() && i < norm_.size(); ++i)
      out[i] = -norm_[i];
  }

 private:
  int32_t recent_;
  std::vector<float> norm_;  // per slot: key L2 norm, mean over KV heads
};

}  // namespace

std::unique_ptr<KvPolicy> NewKnorm(int32_t recent) {
  return std::make_unique<Knorm>(recent);
}

}  // namespace hkv::policy_internal
