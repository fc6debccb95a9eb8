// TinyModel: a real model's architecture scaled down until a CPU runs it in microseconds, and the
// seeded random weights that make it a deterministic function.
//
// Contract: ScaleModel keeps the layer pattern of `real` — kinds, their order, NoPE and learned
// sinks, KV sharing (a shared layer whose source is cut reads the nearest kept layer of the same
// kind that owns a cache) — for its first `max_layers` model layers plus the first layer of every
// kind those lack (renumbered consecutively), and replaces every width by
// the options' small ones, windows and chunks by the options' spans (so they cross several blocks
// of a test), caches by float32. The result validates and plans like any ModelSpec. Weights are a
// pure function of (spec, vocab, seed). Recurrent layers get a small geometry of their kind with
// state tensors in the planned shapes; MLA layers a small latent (MlaWidthsOf); cross-attention
// models an encoder of at most `encoder_tokens` tokens. A KV-shared layer counts as a kind of its
// own, so that the scaled model keeps one when the real one has any.
#pragma once

#include <cstdint>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/spec/model_spec.h>

namespace hkv {

struct TinyModelOptions {
  int32_t max_layers = 8;
  int32_t hidden = 64;
  int32_t kv_heads = 2;
  int32_t q_per_kv = 2;  // query heads per KV head (GQA)
  int32_t head_dim = 16;
  int32_t window = 12;  // every sliding window becomes this many tokens
  int32_t chunk = 16;   // every chunked-local span becomes this many tokens
  int32_t vocab = 97;
  int32_t encoder_tokens = 10;  // cross-attention models: the largest encoder input
};

Result<ModelSpec> ScaleModel(const ModelSpec& real, const TinyModelOptions& options);

// Row-major float matrices; `rows` outputs of `cols` inputs each.
struct Matrix {
  int32_t rows = 0, cols = 0;
  std::vector<float> w;
};

struct LayerWeights {
  std::vector<float> attn_norm, mlp_norm;  // RMSNorm gains
  Matrix wq, wk, wv, wo;                   // attention (empty for MLP-only layers)
  std::vector<float> sink_logits;          // per query head, learned sinks only
  Matrix w_uk, w_uv;                       // MLA: latent -> per-head keys (no RoPE) and values
  Matrix w_gate, w_up, w_down;             // SwiGLU MLP of width 2 * hidden
  // Recurrent mixers (Mamba-1/2, gated DeltaNet).
  Matrix w_in, w_out;
  std::vector<float> conv_kernel;  // conv channels x d_conv
  std::vector<float> decay, skip;  // per step-size head
};

// Widths of a recurrent mixer's projections: conv channels, gated output width, step-size heads.
struct RecurrentWidths {
  int32_t conv = 0, gate = 0, heads = 0;
};
RecurrentWidths RecurrentWidthsOf(const LayerSpec& layer);

// Widths of an MLA layer: the cached latent is [compressed KV (rank) | RoPE key (rope)]; each
// query head has a `nope` part matched against the latent through w_uk and a `rope` part matched
// against the shared RoPE key; values are `v` wide per head.
struct MlaWidths {
  int32_t rank = 0, rope = 0, nope = 0, v = 0;
};
MlaWidths MlaWidthsOf(const LayerSpec& layer);

struct ModelWeights {
  int32_t vocab = 0;
  Matrix embed;                      // vocab rows of hidden
  std::vector<LayerWeights> layers;  // per LayerSpec
  std::vector<float> final_norm;
  Matrix lm_head;

  static ModelWeights Random(const ModelSpec& spec, int32_t vocab, uint64_t seed);
};

}  // namespace hkv
