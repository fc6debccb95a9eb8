// ModelSpec: the cache-relevant description of a whole model.
//
// Contract: `layers` lists every mixer of every model layer in layer order (see LayerSpec for
// parallel hybrids and MLP-only layers), so every index in [0, num_layers) appears at least once.
// Validate() checks the invariants the planner relies on and names the first one broken; a spec
// built by the loader is always valid. `warnings` records config values the loader deliberately
// did not follow (e.g. a sliding_window disabled by use_sliding_window=false), for display.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <hkv/common/status.h>
#include <hkv/spec/layer_spec.h>

namespace hkv {

struct ModelSpec {
  std::string model_type;  // as the config names it (text model's type for nested configs)
  std::string source;      // file the spec was read from, or a label for built specs
  int32_t num_layers = 0;
  int32_t hidden_size = 0;
  int64_t max_position_embeddings = 0;  // 0: the config does not say
  int64_t max_encoder_tokens = 0;       // encoder tokens of the largest input (cross attention)
  // The recurrence's prefill chunk (`mamba_chunk_size`, else `chunk_size`); 0: not given. vLLM
  // aligns hybrid blocks to it in its `all` mamba cache mode.
  int32_t mamba_chunk_size = 0;
  std::vector<LayerSpec> layers;
  std::vector<std::string> warnings;

  // Limits far above any real model that keep byte arithmetic in the planner exact.
  static constexpr int32_t kMaxLayers = 1 << 16;
  static constexpr int32_t kMaxWidth = 1 << 20;  // heads, head widths
  static constexpr int64_t kMaxKvBytesPerToken = int64_t{1} << 28;
  static constexpr int64_t kMaxStateBytes = int64_t{1} << 40;

  Status Validate() const;

  // Sum of kv_bytes_per_token over cache-owning layers that keep every decoder token.
  int64_t bytes_per_token_full() const;
  // Sum of state_bytes over recurrent layers: one sequence's recurrent state.
  int64_t state_bytes_per_sequence() const;
  // Per model layer, its mixers' kind names joined by '+' (e.g. "mamba2+full_attention").
  std::vector<std::string> LayerKindNames() const;
  bool has_cross_attention() const;
};

}  // namespace hkv
