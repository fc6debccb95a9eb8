#include <algorithm>

#include <hkv/engine/masked_reference.h>

namespace hkv {
namespace {

// A contiguous store in which each sparse layer of the current step is seen through its slots:
// slot i is the row of position positions[i], so runs are as long as the positions stay
// consecutive.
class MaskedStore : public KvStore {
 public:
  MaskedStore(const ModelSpec& spec, int64_t tokens, int64_t encoder_tokens)
      : base_(spec, tokens, encoder_tokens), views_(spec.layers.size()) {}

  void Enter(const SparseStepRecord& step) {
    std::fill(views_.begin(), views_.end(), nullptr);
    positions_.resize(step.layers.size());
    slots_.resize(step.layers.size());
    for (size_t i = 0; i < step.layers.size(); ++i) {
      std::vector<int64_t>& p = positions_[i];
      p = step.kept[i];
      const auto first_new = static_cast<int64_t>(p.size());
      for (int64_t x = step.begin; x < step.end; ++x)
        p.push_back(x);
      slots_[i] = SlotView{p, first_new, 0, {}};
      views_[static_cast<size_t>(step.layers[i])] = &slots_[i];
    }
  }

  const SlotView* Slots(int32_t layer) override { return views_[static_cast<size_t>(layer)]; }
  KvRows Rows(int32_t layer, int64_t i) override {
    const SlotView* v = views_[static_cast<size_t>(layer)];
    if (v == nullptr) return base_.Rows(layer, i);
    const std::span<const int64_t> p = v->positions;
    const auto at = static_cast<size_t>(i);
    size_t run = 1;
    while (at + run < p.size() && p[at + run] == p[at] + static_cast<int64_t>(run))
      ++run;
    KvRows r = base_.Rows(layer, p[at]);
    r.n = std::min<int64_t>(r.n, static_cast<int64_t>(run));
    return r;
  }
  bool EncoderPending() const override { return true; }
  float* State(int32_t layer, int which) override { return base_.State(layer, which); }
  void AfterPosition(int32_t layer, int64_t position) override {
    base_.AfterPosition(layer, position);
  }

 private:
  ContiguousKvStore base_;
  std::vector<const SlotView*> views_;  // per LayerSpec: the current step's, or null
  std::vector<std::vector<int64_t>> positions_;
  std::vector<SlotView> slots_;
};

}  // namespace

std::vector<float> MaskedLogits(const ModelSpec& spec, const ModelWeights& weights,
                                std::span<const int32_t> tokens,
                                std::span<const SparseStepRecord> steps,
                                const EncoderInput& encoder) {
  const auto n = static_cast<int64_t>(tokens.size());
  MaskedStore store(spec, n, encoder.tokens);
  std::vector<float> logits;
  for (const SparseStepRecord& step : steps) {
    store.Enter(step);
    const std::vector<float> part =
        Forward(spec, weights, tokens, step.begin, step.end, store, encoder);
    logits.insert(logits.end(), part.begin(), part.end());
  }
  return logits;
}

}  // namespace hkv
