// LayerSpec: what one layer of a model keeps in memory between steps, and how big it is.
//
// Contract: a LayerSpec describes one cache-relevant mixer of one model layer. A model layer that
// runs attention and a recurrence side by side (Falcon-H1, Zamba2's hybrid layers) is described by
// two LayerSpecs with the same `layer` index; a layer with no token mixer (an MLP-only layer of
// Nemotron-H) by one LayerSpec of kind kMlp that keeps nothing. Sizes are in elements; byte
// figures come from the dtypes stored here, which the loader sets from its options (never from the
// checkpoint's torch_dtype). A layer with kv_source_layer >= 0 reads another layer's cache and
// owns no memory of its own.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <hkv/common/dtype.h>

namespace hkv {

enum class LayerKind : unsigned char {
  kFullAttention,   // keeps every decoder token
  kSlidingWindow,   // keeps the last `window` tokens (plus `sink_tokens` first tokens)
  kChunkedLocal,    // keeps the tokens of the current chunk of `chunk` tokens
  kCrossAttention,  // keeps the encoder tokens of the request, fixed per request
  kMla,             // multi-head latent attention: one compressed latent per token, every token
  kMamba1,          // selective SSM: conv state + ssm state, independent of length
  kMamba2,          // SSD: conv state + per-head ssm state
  kGatedDeltaNet,   // gated delta-rule linear attention: conv state + recurrent matrix
  kMlp,             // no token mixer: keeps nothing
};

std::string_view LayerKindName(LayerKind kind);
bool IsAttentionKind(LayerKind kind);
bool IsRecurrentKind(LayerKind kind);

// One tensor of a recurrent state (e.g. "conv" of shape (d_conv-1, channels)).
struct StateTensor {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::kBF16;

  // Saturate at kSaturated instead of overflowing, so that ModelSpec::Validate can reject
  // absurd shapes by their size.
  static constexpr int64_t kSaturated = INT64_MAX;
  int64_t elements() const;
  int64_t bytes() const;
  bool operator==(const StateTensor&) const = default;
};

// Parameters of a recurrence, kept so that a runtime can rebuild the layer (scaled down or not);
// the state tensors above are derived from these by the loader.
struct RecurrentGeometry {
  int32_t d_conv = 0;    // convolution kernel width; the conv state keeps d_conv-1 columns
  int32_t d_inner = 0;   // Mamba inner width (expand * hidden, or mamba_d_ssm)
  int32_t d_state = 0;   // SSM state size per channel / head
  int32_t n_heads = 0;   // Mamba-2 heads
  int32_t head_dim = 0;  // Mamba-2 head width
  int32_t n_groups = 0;  // Mamba-2 B/C groups
  int32_t num_k_heads = 0, k_head_dim = 0;  // gated DeltaNet keys
  int32_t num_v_heads = 0, v_head_dim = 0;  // gated DeltaNet values
  bool operator==(const RecurrentGeometry&) const = default;
};

struct LayerSpec {
  int32_t layer = 0;  // index of the model layer this mixer belongs to
  LayerKind kind = LayerKind::kFullAttention;

  // Attention geometry. K and V may differ in width; MLA stores one latent of head_dim_k
  // (kv_lora_rank + qk_rope_head_dim) elements per token with num_kv_heads 1 and head_dim_v 0.
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim_k = 0;
  int32_t head_dim_v = 0;
  DType kv_dtype = DType::kBF16;
  int32_t window = 0;            // kSlidingWindow: tokens kept, including the current one
  int32_t chunk = 0;             // kChunkedLocal: chunk length
  int32_t sink_tokens = 0;       // first tokens of the sequence always kept (StreamingLLM sinks)
  bool learned_sinks = false;    // per-head sink logits (gpt-oss): change attention, not the cache
  bool rope = true;              // false on NoPE layers (Llama-4's global layers)
  int32_t kv_source_layer = -1;  // model layer whose cache this layer reads; -1: owns its cache
  int32_t kv_lora_rank = 0;      // MLA latent width
  int32_t qk_rope_head_dim = 0;  // MLA decoupled RoPE key width

  // Recurrent state (recurrent kinds only).
  RecurrentGeometry recurrent;
  std::vector<StateTensor> state;

  bool owns_kv() const { return IsAttentionKind(kind) && kv_source_layer < 0; }
  bool owns_state() const { return IsRecurrentKind(kind); }
  // Bytes this layer adds per cached token (0 for recurrent, MLP and KV-shared layers).
  int64_t kv_bytes_per_token() const;
  // Bytes of one copy of this layer's recurrent state (0 for non-recurrent layers).
  int64_t state_bytes() const;

  bool operator==(const LayerSpec&) const = default;
};

}  // namespace hkv
