// The attention weights a sparse layer feeds its policy are the softmax of the pass itself:
// compared here with attention recomputed by hand for the first layer of a scaled Llama (GQA, 4
// query heads over 2 KV heads, RoPE), from the model's weights and the keys the pass cached.
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <hkv/engine/tiny_model.h>
#include <hkv/engine/transformer.h>
#include <hkv/spec/config_loader.h>

namespace hkv {
namespace {

// Layer 0 seen through slots 0..n-1 (position i in slot i), asking for the last `rows` rows.
class FeedbackStore : public ContiguousKvStore {
 public:
  FeedbackStore(const ModelSpec& spec, int64_t n, int32_t rows)
      : ContiguousKvStore(spec, n, 0), positions_(static_cast<size_t>(n)) {
    for (int64_t i = 0; i < n; ++i)
      positions_[static_cast<size_t>(i)] = i;
    feedback_.assign(static_cast<size_t>(spec.layers[0].num_kv_heads * n), 0.0f);
    view_ = SlotView{positions_, 0, rows, feedback_};
  }
  const SlotView* Slots(int32_t layer) override { return layer == 0 ? &view_ : nullptr; }
  const std::vector<float>& feedback() const { return feedback_; }

 private:
  std::vector<int64_t> positions_;
  std::vector<float> feedback_;
  SlotView view_;
};

std::vector<double> Query(const ModelSpec& spec, const ModelWeights& w, int32_t token,
                          int64_t pos) {
  const LayerSpec& l = spec.layers[0];
  const LayerWeights& lw = w.layers[0];
  const auto hs = static_cast<size_t>(spec.hidden_size);
  std::vector<double> x(hs), normed(hs);
  double ss = 0;
  for (size_t i = 0; i < hs; ++i) {
    x[i] = w.embed.w[static_cast<size_t>(token) * hs + i];
    ss += x[i] * x[i];
  }
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(hs) + 1e-6);
  for (size_t i = 0; i < hs; ++i)
    normed[i] = x[i] * inv * lw.attn_norm[i];
  std::vector<double> q(static_cast<size_t>(lw.wq.rows));
  for (int32_t r = 0; r < lw.wq.rows; ++r) {
    for (size_t c = 0; c < hs; ++c)
      q[static_cast<size_t>(r)] += lw.wq.w[static_cast<size_t>(r) * hs + c] * normed[c];
  }
  const int32_t d = l.head_dim_k, half = d / 2;
  for (int32_t h = 0; h < l.num_q_heads; ++h) {
    for (int32_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(pos) * std::pow(10000.0, -2.0 * i / d);
      double& a = q[static_cast<size_t>(h * d + i)];
      double& b = q[static_cast<size_t>(h * d + i + half)];
      const double a0 = a, b0 = b;
      a = a0 * std::cos(angle) - b0 * std::sin(angle);
      b = a0 * std::sin(angle) + b0 * std::cos(angle);
    }
  }
  return q;
}

TEST(SparseFeedback, EqualsTheExplicitAttentionOfThePass) {
  const LoadOptions load{DType::kFP32, DType::kFP32, DType::kFP32};
  auto real = LoadModelConfig(std::string(HKV_MODELS_DIR) + "/meta-llama--Llama-3.1-8B", load);
  ASSERT_TRUE(real.ok());
  const ModelSpec spec = ScaleModel(*real, {}).value();
  const LayerSpec& l = spec.layers[0];
  ASSERT_EQ(l.kind, LayerKind::kFullAttention);
  ASSERT_TRUE(l.rope);
  const ModelWeights weights = ModelWeights::Random(spec, 97, 21);
  const int64_t n = 23;
  std::vector<int32_t> tokens;
  for (int64_t i = 0; i < n; ++i)
    tokens.push_back(static_cast<int32_t>((i * 41 + 7) % 97));
  const int32_t group = l.num_q_heads / l.num_kv_heads, d = l.head_dim_k;
  ASSERT_GT(group, 1);
  for (int32_t rows : {int32_t{n}, 3, 1}) {
    FeedbackStore store(spec, n, rows);
    const std::vector<float> logits = Forward(spec, weights, tokens, 0, n, store);
    // The same pass without feedback: asking for weights changes nothing.
    EXPECT_EQ(logits, DenseLogits(spec, weights, tokens));
    std::vector<double> want(static_cast<size_t>(l.num_kv_heads * n), 0.0);
    for (int64_t t = n - rows; t < n; ++t) {
      const std::vector<double> q = Query(spec, weights, tokens[static_cast<size_t>(t)], t);
      for (int32_t h = 0; h < l.num_q_heads; ++h) {
        const int32_t kvh = h / group;
        std::vector<double> s(static_cast<size_t>(t + 1));
        double mx = -INFINITY;
        for (int64_t j = 0; j <= t; ++j) {
          const float* k = store.Rows(0, j).k + kvh * d;
          double dot = 0;
          for (int32_t c = 0; c < d; ++c)
            dot += q[static_cast<size_t>(h * d + c)] * k[c];
          s[static_cast<size_t>(j)] = dot / std::sqrt(static_cast<double>(d));
          mx = std::max(mx, s[static_cast<size_t>(j)]);
        }
        double z = 0;
        for (double& v : s) {
          v = std::exp(v - mx);
          z += v;
        }
        for (int64_t j = 0; j <= t; ++j)
          want[static_cast<size_t>(kvh * n + j)] += s[static_cast<size_t>(j)] / z / group;
      }
    }
    const std::vector<float>& got = store.feedback();
    double total = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-5)
          << "rows " << rows << " kv head " << i / n << " slot " << i % n;
      total += got[i];
    }
    // Each row's weights sum to one per query head: rows per KV head in all.
    EXPECT_NEAR(total, static_cast<double>(rows * l.num_kv_heads), 1e-4);
  }
}

}  // namespace
}  // namespace hkv
