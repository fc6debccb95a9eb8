#include <gtest/gtest.h>

#include <hkv/spec/model_spec.h>

namespace hkv {
namespace {

LayerSpec Attention(int32_t layer, LayerKind kind) {
  LayerSpec l;
  l.layer = layer;
  l.kind = kind;
  l.num_q_heads = 8;
  l.num_kv_heads = 2;
  l.head_dim_k = 64;
  l.head_dim_v = 64;
  if (kind == LayerKind::kSlidingWindow) l.window = 128;
  if (kind == LayerKind::kChunkedLocal) l.chunk = 256;
  return l;
}

LayerSpec Mamba(int32_t layer) {
  LayerSpec l;
  l.layer = layer;
  l.kind = LayerKind::kMamba2;
  l.state = {{"conv", {3, 160}, DType::kBF16}, {"ssm", {4, 32, 16}, DType::kFP32}};
  return l;
}

ModelSpec Valid() {
  ModelSpec m;
  m.source = "built";
  m.num_layers = 3;
  m.layers = {Attention(0, LayerKind::kSlidingWindow), Mamba(1),
              Attention(1, LayerKind::kFullAttention), Attention(2, LayerKind::kFullAttention)};
  m.layers[3].kv_source_layer = 1;
  return m;
}

void ExpectInvalid(const ModelSpec& m, std::string_view fragment) {
  const Status s = m.Validate();
  ASSERT_FALSE(s.ok()) << "expected failure mentioning " << fragment;
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(fragment), std::string::npos) << s.message();
}

TEST(ModelSpecTest, FiguresOfAValidSpec) {
  const ModelSpec m = Valid();
  ASSERT_TRUE(m.Validate().ok()) << m.Validate().ToString();
  // K+V: 2 heads * (64 + 64) * 2 bytes = 512 per token; the shared layer owns nothing and the
  // sliding layer does not keep every token.
  EXPECT_EQ(m.layers[0].kv_bytes_per_token(), 512);
  EXPECT_EQ(m.layers[3].kv_bytes_per_token(), 0);
  EXPECT_EQ(m.bytes_per_token_full(), 512);
  EXPECT_EQ(m.state_bytes_per_sequence(), 3 * 160 * 2 + 4 * 32 * 16 * 4);
  const std::vector<std::string> names = m.LayerKindNames();
  ASSERT_EQ(names.size(), 3u);
  EXPECT_EQ(names[0], "sliding_window");
  EXPECT_EQ(names[1], "mamba2+full_attention");
  EXPECT_EQ(names[2], "full_attention");
}

TEST(ModelSpecTest, RejectsBrokenInvariants) {
  {
    ModelSpec m = Valid();
    m.num_layers = 0;
    ExpectInvalid(m, "num_layers = 0");
  }
  {
    ModelSpec m = Valid();
    m.num_layers = ModelSpec::kMaxLayers + 1;
    ExpectInvalid(m, "num_layers = 65537: expected 1 to 65536 layers");
  }
  {
    ModelSpec m = Valid();
    m.layers.resize(2 * static_cast<size_t>(ModelSpec::kMaxLayers) + 1, m.layers[0]);
    ExpectInvalid(m, "131073 layer specs: expected at most two per layer");
  }
  {
    ModelSpec m = Valid();
    m.layers[2].num_kv_heads = 0;
    ExpectInvalid(m, "num_kv_heads = 0: expected positive heads");
  }
  {
    ModelSpec m = Valid();
    m.layers[2].head_dim_k = ModelSpec::kMaxWidth + 1;
    ExpectInvalid(m, "head_dim_k = 1048577: expected a positive width, at most 2^20");
  }
  {
    ModelSpec m = Valid();
    m.layers[2].head_dim_v = -1;
    ExpectInvalid(m, "head_dim_v = -1: expected a non-negative width");
  }
  {
    ModelSpec m = Valid();
    m.layers[2].num_kv_heads = 3;
    ExpectInvalid(m, "does not divide num_q_heads");
  }
  {
    ModelSpec m = Valid();
    m.layers[0].window = 0;
    ExpectInvalid(m, "window = 0");
  }
  {
    ModelSpec m = Valid();
    m.layers[3].kv_source_layer = 2;
    ExpectInvalid(m, "expected an earlier layer");
  }
  {
    ModelSpec m = Valid();
    m.layers[3].kv_source_layer = 0;  // layer 0 is sliding, layer 2 full: not the same kind
    ExpectInvalid(m, "same kind");
  }
  {
    ModelSpec m = Valid();
    m.layers[1].state[1].shape[0] = 0;
    ExpectInvalid(m, "dimension 0");
  }
  {
    ModelSpec m = Valid();
    m.layers.pop_back();
    ExpectInvalid(m, "model layer 2 has no LayerSpec");
  }
  {
    ModelSpec m = Valid();
    std::swap(m.layers[0], m.layers[2]);
    ExpectInvalid(m, "model-layer order");
  }
}

}  // namespace
}  // namespace hkv
