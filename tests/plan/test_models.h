// Small hand-built models for the plan tests, and checks shared between test files.
//
// Every attention layer here keeps 32 bytes per token unless stated (2 KV heads, head_dim 4, bf16),
// so a 16-token block of one layer is 512 bytes and the expected numbers stay checkable by hand.
// The Mamba layers keep conv (3, 40) + ssm (4, 8, 16) in bf16: 240 + 1024 = 1264 bytes.
#pragma once

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include <hkv/plan/plan.h>

namespace hkv::testing {

inline constexpr int64_t kLayerTokenBytes = 32;   // bytes per token of one attention layer
inline constexpr int64_t kLayerBlockBytes = 512;  // one 16-token block of one attention layer
inline constexpr int64_t kMambaStateBytes = 1264;
inline constexpr int64_t kMiB = int64_t{1} << 20;

inline LayerSpec Attention(int32_t layer, LayerKind kind, int32_t kv_heads = 2,
                           int32_t head_dim = 4) {
  LayerSpec l;
  l.layer = layer;
  l.kind = kind;
  l.num_q_heads = 2 * kv_heads;
  l.num_kv_heads = kv_heads;
  l.head_dim_k = head_dim;
  l.head_dim_v = head_dim;
  return l;
}
inline LayerSpec Full(int32_t layer) {
  return Attention(layer, LayerKind::kFullAttention);
}
inline LayerSpec Sliding(int32_t layer, int32_t window, int32_t sinks = 0) {
  LayerSpec l = Attention(layer, LayerKind::kSlidingWindow);
  l.window = window;
  l.sink_tokens = sinks;
  return l;
}
inline LayerSpec Chunked(int32_t layer, int32_t chunk) {
  LayerSpec l = Attention(layer, LayerKind::kChunkedLocal);
  l.chunk = chunk;
  return l;
}
inline LayerSpec Cross(int32_t layer) {
  return Attention(layer, LayerKind::kCrossAttention);
}
inline LayerSpec Shared(LayerSpec l, int32_t source) {
  l.kv_source_layer = source;
  return l;
}
// DeepSeek-style latent: kv_lora_rank 16 + rope 8 = 24 elements, 48 bytes per token.
inline LayerSpec Mla(int32_t layer) {
  LayerSpec l;
  l.layer = layer;
  l.kind = LayerKind::kMla;
  l.num_q_heads = 4;
  l.num_kv_heads = 1;
  l.head_dim_k = 24;
  l.head_dim_v = 0;
  l.kv_lora_rank = 16;
  l.qk_rope_head_dim = 8;
  return l;
}
inline LayerSpec Mamba(int32_t layer) {
  LayerSpec l;
  l.layer = layer;
  l.kind = LayerKind::kMamba2;
  l.state = {{"conv", {3, 40}, DType::kBF16}, {"ssm", {4, 8, 16}, DType::kBF16}};
  return l;
}
inline LayerSpec Mlp(int32_t layer) {
  LayerSpec l;
  l.layer = layer;
  l.kind = LayerKind::kMlp;
  return l;
}

inline ModelSpec Model(std::string name, std::vector<LayerSpec> layers, int64_t max_pos = 128) {
  ModelSpec m;
  m.model_type = name;
  m.source = std::move(name);
  m.max_position_embeddings = max_pos;
  m.layers = std::move(layers);
  for (const LayerSpec& l : m.layers)
    m.num_layers = std::max(m.num_layers, l.layer + 1);
  return m;
}

// Gemma-2: sliding (window 32) and full layers alternate; 4 layers.
inline ModelSpec Gemma2Like() {
  return Model("gemma2-like", {Sliding(0, 32), Full(1), Sliding(2, 32), Full(3)});
}

// Gemma-3: five sliding layers (window 32) per full one; 15 layers, full at 5 and 11.
inline ModelSpec Gemma3Like() {
  std::vector<LayerSpec> layers;
  for (int32_t i = 0; i < 15; ++i)
    layers.push_back(i % 6 == 5 ? Full(i) : Sliding(i, 32));
  return Model("gemma3-like", std::move(layers));
}

// mllama: 8 self-attention layers and cross attention at 3 and 8; images of 100 encoder tokens.
inline ModelSpec MllamaLike() {
  std::vector<LayerSpec> layers;
  for (int32_t i = 0; i < 10; ++i)
    layers.push_back(i == 3 || i == 8 ? Cross(i) : Full(i));
  ModelSpec m = Model("mllama-like", std::move(layers), 256);
  m.max_encoder_tokens = 100;
  return m;
}

// Jamba-like: Mamba-2 everywhere but full attention at 3 and 7.
inline ModelSpec MambaHybrid() {
  std::vector<LayerSpec> layers;
  for (int32_t i = 0; i < 8; ++i)
    layers.push_back(i % 4 == 3 ? Full(i) : Mamba(i));
  return Model("mamba-hybrid", std::move(layers));
}

inline ModelSpec MlaModel() {
  return Model("mla", {Mla(0), Mla(1), Mla(2)});
}

// Llama-4-like: three chunked layers (chunk 64) then one full layer.
inline ModelSpec ChunkedModel() {
  return Model("chunked", {Chunked(0, 64), Chunked(1, 64), Chunked(2, 64), Full(3)});
}

// Gemma-3n-like: the last two layers read layers 2 and 3's caches; an MLP-only layer at the end.
inline ModelSpec KvSharedModel() {
  return Model("kv-shared", {Sliding(0, 32), Full(1), Sliding(2, 32), Full(3),
                             Shared(Sliding(4, 32), 2), Shared(Full(5), 3), Mlp(6)});
}

// Falcon-H1: every model layer runs attention and Mamba side by side; 3 layers.
inline ModelSpec FalconH1Like() {
  return Model("falcon-h1-like", {Full(0), Mamba(0), Full(1), Mamba(1), Full(2), Mamba(2)});
}

inline PlanOptions Options(int64_t memory_bytes = kMiB, int64_t seq_tokens = 0,
                           int64_t encoder_tokens = -1) {
  PlanOptions o;
  o.memory_bytes = memory_bytes;
  o.seq_tokens = seq_tokens;
  o.encoder_tokens = encoder_tokens;
  return o;
}

inline Plan MustPlan(const ModelSpec& model, const PlanOptions& options) {
  Result<Plan> r = MakePlan(model, options);
  if (!r.ok()) {
    ADD_FAILURE() << r.status().ToString();
    return Plan{};
  }
  return std::move(r).value();
}

inline std::vector<int32_t> Ids(std::initializer_list<int32_t> ids) {
  return ids;
}

}  // namespace hkv::testing
