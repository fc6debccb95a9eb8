#include <algorithm>

#include <fmt/format.h>

#include <hkv/spec/model_spec.h>
#include <hkv/spec/token_rule.h>

namespace hkv {
namespace {

Status LayerError(const ModelSpec& m, size_t i, std::string_view what) {
  return Status::InvalidArgument(fmt::format("{}: layers[{}] (model layer {}, {}): {}", m.source, i,
                                             m.layers[i].layer, LayerKindName(m.layers[i].kind),
                                             what));
}

Status CheckAttention(const ModelSpec& m, size_t i) {
  const LayerSpec& l = m.layers[i];
  constexpr int32_t kMaxWidth = ModelSpec::kMaxWidth;
  if (l.num_kv_heads <= 0 || l.num_kv_heads > kMaxWidth) {
    return LayerError(
        m, i,
        fmt::format("num_kv_heads = {}: expected positive heads, at most 2^20", l.num_kv_heads));
  }
  if (l.head_dim_k <= 0 || l.head_dim_k > kMaxWidth) {
    return LayerError(
        m, i,
        fmt::format("head_dim_k = {}: expected a positive width, at most 2^20", l.head_dim_k));
  }
  if (l.head_dim_v < 0 || l.head_dim_v > kMaxWidth) {
    return LayerError(
        m, i,
        fmt::format("head_dim_v = {}: expected a non-negative width, at most 2^20", l.head_dim_v));
  }
  if (l.num_q_heads > 0 && l.num_q_heads % l.num_kv_heads != 0) {
    return LayerError(m, i,
                      fmt::format("num_kv_heads = {} does not divide num_q_heads = {}",
                                  l.num_kv_heads, l.num_q_heads));
  }
  if (l.kind == LayerKind::kSlidingWindow && l.window <= 0) {
    return LayerError(m, i, fmt::format("window = {}: expected > 0", l.window));
  }
  if (l.kind == LayerKind::kChunkedLocal && l.chunk <= 0) {
    return LayerError(m, i, fmt::format("chunk = {}: expected > 0", l.chunk));
  }
  if (l.sink_tokens < 0) {
    return LayerError(m, i, fmt::format("sink_tokens = {}: expected >= 0", l.sink_tokens));
  }
  return Status::Ok();
}

// A KV-shared layer reads an earlier cache-owning layer of its own kind.
Status CheckKvSource(const ModelSpec& m, size_t i) {
  const LayerSpec& l = m.layers[i];
  if (!IsAttentionKind(l.kind)) return LayerError(m, i, "only attention layers share KV");
  if (l.kv_source_layer >= l.layer) {
    return LayerError(
        m, i, fmt::format("kv_source_layer = {}: expected an earlier layer", l.kv_source_layer));
  }
  bool found = false;
  for (const LayerSpec& s : m.layers) {
    if (s.layer == l.kv_source_layer && s.owns_kv() && s.kind == l.kind) found = true;
  }
  if (!found) {
    return LayerError(m, i,
                      fmt::format("kv_source_layer = {} is not a cache-owning attention layer "
                                  "of the same kind",
                                  l.kv_source_layer));
  }
  return Status::Ok();
}

Status CheckState(const ModelSpec& m, size_t i) {
  const LayerSpec& l = m.layers[i];
  if (l.state.empty()) return LayerError(m, i, "recurrent layer without state tensors");
  for (const StateTensor& t : l.state) {
    for (int64_t d : t.shape) {
      if (d <= 0) {
        return LayerError(
            m, i, fmt::format("state tensor '{}' has dimension {}: expected > 0", t.name, d));
      }
    }
  }
  return Status::Ok();
}

// Byte totals stay far from int64 overflow in the planner (bytes x tokens x blocks).
Status CheckByteTotals(const ModelSpec& m) {
  int64_t kv_bytes = 0;
  int64_t state_bytes = 0;
  for (const LayerSpec& l : m.layers) {
    kv_bytes += l.kv_bytes_per_token();
    if (__builtin_add_overflow(state_bytes, l.state_bytes(), &state_bytes)) {
      state_bytes = StateTensor::kSaturated;
    }
  }
  if (kv_bytes > ModelSpec::kMaxKvBytesPerToken) {
    return Status::InvalidArgument(
        fmt::format("{}: the layers keep {} KV bytes per token: expected at most {}", m.source,
                    kv_bytes, ModelSpec::kMaxKvBytesPerToken));
  }
  if (state_bytes > ModelSpec::kMaxStateBytes) {
    return Status::InvalidArgument(
        fmt::format("{}: the recurrent state is {} bytes per sequence: expected at most {}",
                    m.source, state_bytes, ModelSpec::kMaxStateBytes));
  }
  return Status::Ok();
}

}  // namespace

Status ModelSpec::Validate() const {
  if (num_layers <= 0 || num_layers > kMaxLayers) {
    return Status::InvalidArgument(fmt::format("{}: num_layers = {}: expected 1 to {} layers",
                                               source, num_layers, kMaxLayers));
  }
  if (layers.size() > 2 * static_cast<size_t>(kMaxLayers)) {
    return Status::InvalidArgument(
        fmt::format("{}: {} layer specs: expected at most two per layer, {} in all", source,
                    layers.size(), 2 * static_cast<size_t>(kMaxLayers)));
  }
  std::vector<int> seen(static_cast<size_t>(num_layers), 0);
  int32_t previous = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& l = layers[i];
    if (l.layer < 0 || l.layer >= num_layers) {
      return LayerError(*this, i,
                        fmt::format("layer index {} outside [0, {})", l.layer, num_layers));
    }
    if (l.layer < previous) return LayerError(*this, i, "layers are not in model-layer order");
    previous = l.layer;
    ++seen[static_cast<size_t>(l.layer)];
    if (IsAttentionKind(l.kind)) HKV_RETURN_IF_ERROR(CheckAttention(*this, i));
    if (l.kv_source_layer >= 0) HKV_RETURN_IF_ERROR(CheckKvSource(*this, i));
    if (IsRecurrentKind(l.kind)) HKV_RETURN_IF_ERROR(CheckState(*this, i));
  }
  HKV_RETURN_IF_ERROR(CheckByteTotals(*this));
  for (int32_t i = 0; i < num_layers; ++i) {
    if (seen[static_cast<size_t>(i)] == 0) {
      return Status::InvalidArgument(
          fmt::format("{}: model layer {} has no LayerSpec (use kind mlp for layers that keep "
                      "nothing)",
                      source, i));
    }
  }
  return Status::Ok();
}

int64_t ModelSpec::bytes_per_token_full() const {
  int64_t total = 0;
  for (const LayerSpec& l : layers) {
    if (TokenRuleOf(l).kind == TokenRuleKind::kAll) total += l.kv_bytes_per_token();
  }
  return total;
}

int64_t ModelSpec::state_bytes_per_sequence() const {
  int64_t total = 0;
  for (const LayerSpec& l : layers)
    total += l.state_bytes();
  return total;
}

std::vector<std::string> ModelSpec::LayerKindNames() const {
  std::vector<std::string> names(static_cast<size_t>(std::max(num_layers, 0)));
  for (const LayerSpec& l : layers) {
    if (l.layer < 0 || l.layer >= num_layers) continue;
    std::string& name = names[static_cast<size_t>(l.layer)];
    if (!name.empty()) name += '+';
    name += LayerKindName(l.kind);
  }
  return names;
}

bool ModelSpec::has_cross_attention() const {
  for (const LayerSpec& l : layers) {
    if (l.kind == LayerKind::kCrossAttention) return true;
  }
  return false;
}

}  // namespace hkv
