// Layer patterns: which mixers each model layer runs, read from a config's family fields.
//
// Contract: ReadPattern returns one entry per model layer (several for parallel hybrids), the
// KV source layer of shared layers and the NoPE flags, or a ConfigReader-style error. Which
// fields each family uses, and their transformers defaults, are in docs/config-families.md.
// Private to src/spec.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/spec/layer_spec.h>

#include "config_reader.h"

namespace hkv::spec_internal {

// What one model layer runs, before geometry is attached. A parallel hybrid layer has two.
enum class Mixer : unsigned char {
  kFull,
  kSliding,
  kChunked,
  kCross,
  kMla,
  kMamba1,
  kMamba2,
  kGdn,
  kMlp
};

struct Pattern {
  std::vector<std::vector<Mixer>> mixers;  // per model layer
  std::vector<int32_t> kv_source;          // per model layer, -1 when it owns its cache
  std::vector<bool> nope;                  // per model layer: attention without RoPE
  bool learned_sinks = false;
};

// Values transformers gives a recurrent layer's fields when the config leaves them out
// (0: the field is required). See docs/config-families.md.
struct MambaDefaults {
  int64_t d_conv = 0, d_state = 0, expand = 0, n_heads = 0, head_dim = 0, n_groups = 0;
  int64_t d_ssm_when_absent = 0;  // Falcon-H1: an absent mamba_d_ssm means 1024
  bool inner_from_heads = false;  // Nemotron-H: inner width = heads x head width
};

struct Family {
  std::string_view model_type;
  Mixer mamba = Mixer::kMamba2;  // what a "mamba" entry of layer_types means
  Mixer linear = Mixer::kGdn;    // what a "linear_attention" entry means
  MambaDefaults defaults;
};

bool IsAttentionMixer(Mixer m);
LayerKind KindOf(Mixer m);
bool Uses(const Pattern& p, Mixer m);
bool UsesAny(const Pattern& p, bool (*pred)(Mixer));

// The family of a model_type; configs of unknown types get a generic family (layer_types only).
const Family& FindFamily(std::string_view model_type);
const std::vector<std::string_view>& FamilyModelTypes();

Result<Pattern> ReadPattern(const ConfigReader& text, std::string_view type, int64_t n,
                            const Family& family, std::vector<std::string>& warnings);

}  // namespace hkv::spec_internal
