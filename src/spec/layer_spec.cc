#include <hkv/spec/layer_spec.h>

namespace hkv {

std::string_view LayerKindName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kFullAttention:
      return "full_attention";
    case LayerKind::kSlidingWindow:
      return "sliding_window";
    case LayerKind::kChunkedLocal:
      return "chunked_local";
    case LayerKind::kCrossAttention:
      return "cross_attention";
    case LayerKind::kMla:
      return "mla";
    case LayerKind::kMamba1:
      return "mamba1";
    case LayerKind::kMamba2:
      return "mamba2";
    case LayerKind::kGatedDeltaNet:
      return "gated_deltanet";
    case LayerKind::kMlp:
      return "mlp";
  }
  return "unknown";
}

bool IsAttentionKind(LayerKind kind) {
  switch (kind) {
    case LayerKind::kFullAttention:
    case LayerKind::kSlidingWindow:
    case LayerKind::kChunkedLocal:
    case LayerKind::kCrossAttention:
    case LayerKind::kMla:
      return true;
    default:
      return false;
  }
}

bool IsRecurrentKind(LayerKind kind) {
  return kind == LayerKind::kMamba1 || kind == LayerKind::kMamba2 ||
         kind == LayerKind::kGatedDeltaNet;
}

int64_t StateTensor::elements() const {
  if (shape.empty()) return 0;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return kSaturated;
  }
  return n;
}

int64_t StateTensor::bytes() const {
  int64_t b = 0;
  if (__builtin_mul_overflow(elements(), DTypeBytes(dtype), &b)) return kSaturated;
  return b;
}

int64_t LayerSpec::kv_bytes_per_token() const {
  if (!owns_kv()) return 0;
  const int64_t elements = int64_t{num_kv_heads} * (int64_t{head_dim_k} + head_dim_v);
  return elements * DTypeBytes(kv_dtype);
}

int64_t LayerSpec::state_bytes() const {
  int64_t total = 0;
  for (const StateTensor& t : state) {
    if (__builtin_add_overflow(total, t.bytes(), &total)) return StateTensor::kSaturated;
  }
  return total;
}

}  // namespace hkv
