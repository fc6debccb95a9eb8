// Layer geometry: the sizes of each mixer's cache, read from a config's fields.
//
// Contract: each reader returns the geometry of one mixer kind for the whole model (all layers
// of a kind share it in every supported family) or a ConfigReader-style error naming the field.
// StateTensorsOf gives the recurrent state tensors in the layout engines allocate. Private to
// src/spec.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/spec/config_loader.h>
#include <hkv/spec/layer_spec.h>

#include "config_reader.h"
#include "layer_pattern.h"

namespace hkv::spec_internal {

struct AttentionGeometry {
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0;
};

Result<AttentionGeometry> ReadAttention(const ConfigReader& text, std::string_view type,
                                        int64_t hidden);
Result<RecurrentGeometry> ReadMamba(const ConfigReader& text, std::string_view type, Mixer kind,
                                    int64_t hidden, const MambaDefaults& defaults);
Result<RecurrentGeometry> ReadGatedDeltaNet(const ConfigReader& text);
std::vector<StateTensor> StateTensorsOf(Mixer kind, const RecurrentGeometry& g,
                                        const LoadOptions& options);
// Encoder tokens of the largest image a cross-attention model accepts (0 without vision_config).
Result<int64_t> ReadMaxEncoderTokens(const ConfigReader& root);

}  // namespace hkv::spec_internal
