#include "model_families.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace hkv::spec_internal {
namespace {

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

Pattern UniformPattern(int64_t n, std::vector<Mixer> mixers) {
  Pattern p;
  p.mixers.assign(static_cast<size_t>(n), std::move(mixers));
  return p;
}

bool IsAttentionMixer(Mixer m) {
  return m == Mixer::kFull || m == Mixer::kSliding || m == Mixer::kChunked || m == Mixer::kCross ||
         m == Mixer::kMla;
}

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

constexpr MambaDefaults kMambaDefaults{4, 0, 2, 0, 0, 0, 0, false};
constexpr MambaDefaults kJambaDefaults{4, 16, 2, 0, 0, 0, 0, false};
constexpr MambaDefaults kBambaDefaults{4, 256, 2, 128, 0, 1, 0, false};
constexpr MambaDefaults kNemotronDefaults{4, 128, 2, 128, 64, 8, 0, true};
constexpr MambaDefaults kFalconDefaults{4, 256, 2, 128, 0, 1, 1024, false};
constexpr MambaDefaults kZambaDefaults{4, 64, 2, 8, 0, 1, 0, false};

constexpr Family Plain(std::string_view model_type) {
  return Family{model_type, Mixer::kMamba2, Mixer::kGdn, kMambaDefaults};
}

// Families with a dedicated reader. Nested text model types map to the same reader.
constexpr Family kFamilies[] = {
    Plain("llama"),
    Plain("mistral"),
    Plain("ministral"),
    Plain("qwen2"),
    Plain("gemma2"),
    Plain("gemma3"),
    Plain("gemma3_text"),
    Plain("gemma3n"),
    Plain("gemma3n_text"),
    Plain("mllama"),
    Plain("mllama_text_model"),
    {"jamba", Mixer::kMamba1, Mixer::kMamba1, kJambaDefaults},
    {"bamba", Mixer::kMamba2, Mixer::kMamba2, kBambaDefaults},
    // Newer transformers spells granite's "mamba" layers "linear_attention".
    {"granitemoehybrid", Mixer::kMamba2, Mixer::kMamba2, kBambaDefaults},
    {"nemotron_h", Mixer::kMamba2, Mixer::kMamba2, kNemotronDefaults},
    {"falcon_h1", Mixer::kMamba2, Mixer::kMamba2, kFalconDefaults},
    {"zamba2", Mixer::kMamba2, Mixer::kMamba2, kZambaDefaults},
    Plain("qwen3_next"),
    Plain("gpt_oss"),
    Plain("llama4"),
    Plain("llama4_text"),
    Plain("deepseek_v2"),
    Plain("deepseek_v3"),
};

// Configs with only a layer_types list: nothing is assumed beyond the usual conv width/expand.
constexpr Family kGenericFamily{"", Mixer::kMamba2, Mixer::kGdn, kMambaDefaults};

const Family& FindFamily(std::string_view model_type) {
  for (const Family& f : kFamilies) {
    if (f.model_type == model_type) return f;
  }
  return kGenericFamily;
}

// ---------------------------------------------------------------------------------------------
// Layer patterns.

Result<Mixer> MixerFromLayerType(const ConfigReader& text, std::string_view key,
                                 std::string_view value, size_t index, const Family& family) {
  if (value == "full_attention" || value == "attention" || value == "global_attention") {
    return Mixer::kFull;
  }
  if (value == "sliding_attention" || value == "sliding_window" || value == "local_attention") {
    return Mixer::kSliding;
  }
  if (value == "chunked_attention") return Mixer::kChunked;
  if (value == "cross_attention") return Mixer::kCross;
  if (value == "linear_attention") return family.linear;
  if (value == "mamba") return family.mamba;
  if (value == "mamba1") return Mixer::kMamba1;
  if (value == "mamba2") return Mixer::kMamba2;
  if (value == "mlp" || value == "moe") return Mixer::kMlp;
  return Status::InvalidArgument(fmt::format(
      "{}: field '{}[{}]' = \"{}\": expected one of full_attention, sliding_attention, "
      "chunked_attention, cross_attention, linear_attention, mamba, mamba1, mamba2, mlp",
      text.source(), text.PathOf(key), index, value));
}

Result<Pattern> PatternFromLayerTypes(const ConfigReader& text, std::string_view key, int64_t n,
                                      const Family& family) {
  HKV_ASSIGN_OR_RETURN(std::vector<std::string> types, text.StringList(key));
  if (static_cast<int64_t>(types.size()) != n) {
    return text.Invalid(
        key, fmt::format("a list of num_hidden_layers = {} entries (found {})", n, types.size()));
  }
  Pattern p;
  for (size_t i = 0; i < types.size(); ++i) {
    HKV_ASSIGN_OR_RETURN(Mixer m, MixerFromLayerType(text, key, types[i], i, family));
    p.mixers.push_back({m});
  }
  return p;
}

// Layers listed in `key` get `listed`, the others `other`.
Result<Pattern> PatternFromIndexList(const ConfigReader& text, std::string_view key, int64_t n,
                                     Mixer listed, Mixer other) {
  HKV_ASSIGN_OR_RETURN(std::vector<int64_t> indices, text.IntList(key));
  Pattern p = UniformPattern(n, {other});
  for (int64_t i : indices) {
    if (i >= n) {
      return text.Invalid(key, fmt::format("layer indices below num_hidden_layers = {}", n));
    }
    p.mixers[static_cast<size_t>(i)] = {listed};
  }
  return p;
}

// Nemotron-H: one character per layer.
Result<Pattern> PatternFromHybridOverride(const ConfigReader& text, int64_t n) {
  HKV_ASSIGN_OR_RETURN(std::string pattern, text.String("hybrid_override_pattern"));
  if (static_cast<int64_t>(pattern.size()) != n) {
    return text.Invalid("hybrid_override_pattern",
                        fmt::format("one character per layer, num_hidden_layers = {} (found {})", n,
                                    pattern.size()));
  }
  Pattern p;
  for (char c : pattern) {
    switch (c) {
      case 'M':
        p.mixers.push_back({Mixer::kMamba2});
        break;
      case '*':
        p.mixers.push_back({Mixer::kFull});
        break;
      case '-':
      case 'E':
        p.mixers.push_back({Mixer::kMlp});
        break;
      default:
        return text.Invalid("hybrid_override_pattern",
                            fmt::format("only the characters M (Mamba-2), * (attention), - (MLP) "
                                        "and E (MoE); found '{}'",
                                        c));
    }
  }
  return p;
}

// gemma3n: the last num_kv_shared_layers layers read the cache of the last earlier layer of the
// same attention type.
Status ApplyKvSharing(const ConfigReader& text, int64_t n, Pattern& p) {
  HKV_ASSIGN_OR_RETURN(int64_t shared, text.NonNegativeIntOr("num_kv_shared_layers", 0));
  if (shared == 0) return Status::Ok();
  if (shared >= n) {
    return text.Invalid("num_kv_shared_layers",
                        fmt::format("fewer than num_hidden_layers = {} layers", n));
  }
  const int64_t first_shared = n - shared;
  for (int64_t i = first_shared; i < n; ++i) {
    const Mixer kind = p.mixers[static_cast<size_t>(i)].front();
    int32_t source = -1;
    for (int64_t j = first_shared - 1; j >= 0; --j) {
      if (p.mixers[static_cast<size_t>(j)].front() == kind) {
        source = static_cast<int32_t>(j);
        break;
      }
    }
    if (source < 0) {
      return text.Invalid("num_kv_shared_layers",
                          fmt::format("shared layer {} to find an earlier non-shared layer of the "
                                      "same attention type",
                                      i));
    }
    p.kv_source[static_cast<size_t>(i)] = source;
  }
  return Status::Ok();
}

Result<Pattern> ReadPattern(const ConfigReader& text, std::string_view type, int64_t n,
                            const Family& family, std::vector<std::string>& warnings) {
  Pattern p;
  if (type == "falcon_h1") {
    p = UniformPattern(n, {Mixer::kFull, Mixer::kMamba2});
  } else if (type == "zamba2") {
    // Every layer has a Mamba-2 block; the hybrid ones add (weight-shared) attention with a
    // cache of their own.
    // transformers derives hybrid_layer_ids from layers_block_type, so the latter wins.
    p = UniformPattern(n, {Mixer::kMamba2});
    if (text.Has("layers_block_type")) {
      HKV_ASSIGN_OR_RETURN(std::vector<std::string> blocks, text.StringList("layers_block_type"));
      if (static_cast<int64_t>(blocks.size()) != n) {
        return text.Invalid(
            "layers_block_type",
            fmt::format("num_hidden_layers = {} entries (found {})", n, blocks.size()));
      }
      for (size_t i = 0; i < blocks.size(); ++i) {
        if (blocks[i] == "hybrid") {
          p.mixers[i] = {Mixer::kMamba2, Mixer::kFull};
        } else if (blocks[i] != "mamba") {
          return text.Invalid("layers_block_type",
                              fmt::format("entries \"mamba\" or \"hybrid\" (item {})", i));
        }
      }
    } else {
      HKV_ASSIGN_OR_RETURN(std::vector<int64_t> ids, text.IntList("hybrid_layer_ids"));
      for (int64_t i : ids) {
        if (i >= n) {
          return text.Invalid("hybrid_layer_ids",
                              fmt::format("layer indices below num_hidden_layers = {}", n));
        }
        p.mixers[static_cast<size_t>(i)] = {Mixer::kMamba2, Mixer::kFull};
      }
    }
  } else if (text.Has("layer_types")) {
    HKV_ASSIGN_OR_RETURN(p, PatternFromLayerTypes(text, "layer_types", n, family));
  } else if (type == "granitemoehybrid") {
    // Older granite configs name the list layers_block_type; without either, all layers are Mamba.
    if (text.Has("layers_block_type")) {
      HKV_ASSIGN_OR_RETURN(p, PatternFromLayerTypes(text, "layers_block_type", n, family));
    } else {
      p = UniformPattern(n, {Mixer::kMamba2});
    }
  } else if (type == "llama" || type == "deepseek_v2" || type == "deepseek_v3") {
    p = UniformPattern(n, {type == "llama" ? Mixer::kFull : Mixer::kMla});
  } else if (type == "mistral" || type == "ministral") {
    // One sliding_window applies to every layer. null means none; an absent key means the
    // transformers default window (see WindowOf).
    const bool slides = text.Has("sliding_window") || !text.Contains("sliding_window");
    p = UniformPattern(n, {slides ? Mixer::kSliding : Mixer::kFull});
  } else if (type == "qwen2") {
    HKV_ASSIGN_OR_RETURN(bool use_sliding, text.BoolOr("use_sliding_window", false));
    p = UniformPattern(n, {Mixer::kFull});
    if (use_sliding && text.Has("sliding_window")) {
      // transformers: layers from max_window_layers on slide, the ones below stay full.
      HKV_ASSIGN_OR_RETURN(int64_t first, text.NonNegativeIntOr("max_window_layers", 28));
      for (int64_t i = first; i < n; ++i)
        p.mixers[static_cast<size_t>(i)] = {Mixer::kSliding};
    } else if (text.Has("sliding_window")) {
      warnings.push_back(
          fmt::format("{}: sliding_window = {} ignored because use_sliding_window "
                      "is false: every layer keeps every token",
                      text.PathOf("sliding_window"), text.Raw("sliding_window")));
    }
  } else if (type == "gemma2") {
    p = UniformPattern(n, {Mixer::kFull});
    for (int64_t i = 0; i < n; i += 2)
      p.mixers[static_cast<size_t>(i)] = {Mixer::kSliding};
  } else if (type == "gemma3" || type == "gemma3_text") {
    HKV_ASSIGN_OR_RETURN(int64_t period, text.PositiveIntOr("sliding_window_pattern", 6));
    p = UniformPattern(n, {Mixer::kSliding});
    for (int64_t i = period - 1; i < n; i += period)
      p.mixers[static_cast<size_t>(i)] = {Mixer::kFull};
  } else if (type == "mllama" || type == "mllama_text_model") {
    HKV_ASSIGN_OR_RETURN(
        p, PatternFromIndexList(text, "cross_attention_layers", n, Mixer::kCross, Mixer::kFull));
  } else if (type == "jamba") {
    HKV_ASSIGN_OR_RETURN(int64_t period, text.PositiveIntOr("attn_layer_period", 8));
    HKV_ASSIGN_OR_RETURN(int64_t offset, text.NonNegativeIntOr("attn_layer_offset", 4));
    if (offset >= period) {
      return text.Invalid("attn_layer_offset",
                          fmt::format("an offset below attn_layer_period = {}", period));
    }
    p = UniformPattern(n, {Mixer::kMamba1});
    for (int64_t i = offset; i < n; i += period)
      p.mixers[static_cast<size_t>(i)] = {Mixer::kFull};
  } else if (type == "bamba") {
    HKV_ASSIGN_OR_RETURN(
        p, PatternFromIndexList(text, "attn_layer_indices", n, Mixer::kFull, Mixer::kMamba2));
  } else if (type == "nemotron_h") {
    HKV_ASSIGN_OR_RETURN(p, PatternFromHybridOverride(text, n));
  } else if (type == "qwen3_next") {
    HKV_ASSIGN_OR_RETURN(int64_t interval, text.PositiveIntOr("full_attention_interval", 4));
    p = UniformPattern(n, {Mixer::kGdn});
    for (int64_t i = interval - 1; i < n; i += interval)
      p.mixers[static_cast<size_t>(i)] = {Mixer::kFull};
  } else if (type == "llama4" || type == "llama4_text") {
    // RoPE layers use chunked local attention; NoPE layers (no_rope_layers[i] == 0) are global.
    // An empty list means "not given", as in transformers.
    std::vector<int64_t> rope_flags(static_cast<size_t>(n), 1);
    std::vector<int64_t> listed;
    if (text.Has("no_rope_layers")) {
      HKV_ASSIGN_OR_RETURN(listed, text.IntList("no_rope_layers"));
    }
    if (!listed.empty()) {
      rope_flags = std::move(listed);
      if (static_cast<int64_t>(rope_flags.size()) != n) {
        return text.Invalid(
            "no_rope_layers",
            fmt::format("num_hidden_layers = {} entries (found {})", n, rope_flags.size()));
      }
    } else {
      HKV_ASSIGN_OR_RETURN(int64_t interval, text.PositiveIntOr("no_rope_layer_interval", 4));
      for (int64_t i = interval - 1; i < n; i += interval)
        rope_flags[static_cast<size_t>(i)] = 0;
    }
    const bool chunked = text.Has("attention_chunk_size") || !text.Contains("attention_chunk_size");
    p = UniformPattern(n, {Mixer::kFull});
    p.nope.assign(static_cast<size_t>(n), false);
    for (size_t i = 0; i < rope_flags.size(); ++i) {
      if (rope_flags[i] != 0 && chunked) p.mixers[i] = {Mixer::kChunked};
      p.nope[i] = rope_flags[i] == 0;
    }
  } else {
    return Status::Unsupported(fmt::format(
        "{}: model_type = \"{}\" has no layer pattern reader and the config has no layer_types "
        "list: expected one of the supported model types ({}) or an explicit layer_types",
        text.source(), type, fmt::join(FamilyModelTypes(), ", ")));
  }
  if (p.kv_source.empty()) p.kv_source.assign(static_cast<size_t>(n), -1);
  if (p.nope.empty()) p.nope.assign(static_cast<size_t>(n), false);
  if (type == "gpt_oss") p.learned_sinks = true;
  HKV_RETURN_IF_ERROR(ApplyKvSharing(text, n, p));
  return p;
}

// ---------------------------------------------------------------------------------------------
// Geometry.

struct AttentionGeometry {
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0;
};

Result<AttentionGeometry> ReadAttention(const ConfigReader& text, std::string_view type,
                                        int64_t hidden) {
  AttentionGeometry g;
  HKV_ASSIGN_OR_RETURN(g.q_heads, text.PositiveInt("num_attention_heads"));
  // Absent and null differ for Mistral: absent means its class default of 8 KV heads.
  const int64_t kv_default =
      (type == "mistral" && !text.Contains("num_key_value_heads")) ? 8 : g.q_heads;
  HKV_ASSIGN_OR_RETURN(g.kv_heads, text.PositiveIntOr("num_key_value_heads", kv_default));
  if (g.q_heads % g.kv_heads != 0) {
    return text.Invalid("num_key_value_heads",
                        fmt::format("a divisor of num_attention_heads = {}", g.q_heads));
  }
  // Zamba2's shared attention runs on the concatenation of the input and the original embedding.
  const int64_t attn_width = type == "zamba2" ? 2 * hidden : hidden;
  // transformers recomputes Zamba2's attention_head_dim from the widths, so we do too.
  const std::string_view head_key =
      type == "zamba2" ? std::string_view() : text.FirstPresent({"head_dim", "attention_head_dim"});
  if (!head_key.empty()) {
    HKV_ASSIGN_OR_RETURN(g.head_dim, text.PositiveInt(head_key));
  } else if (attn_width % g.q_heads != 0) {
    return text.Invalid("num_attention_heads",
                        fmt::format("a divisor of the attention width {} to derive the absent "
                                    "head_dim",
                                    attn_width));
  } else {
    g.head_dim = attn_width / g.q_heads;
  }
  return g;
}

// Mamba field names differ per family; the first present spelling wins, and an absent field takes
// the family's default (0: required).
Result<int64_t> MambaField(const ConfigReader& text, std::initializer_list<std::string_view> keys,
                           int64_t fallback, std::string_view what) {
  const std::string_view key = text.FirstPresent(keys);
  if (!key.empty()) return text.PositiveInt(key);
  if (fallback > 0) return fallback;
  return text.Missing(*keys.begin(), what);
}

const std::initializer_list<std::string_view> kConvKeys = {"mamba_d_conv", "conv_kernel"};
const std::initializer_list<std::string_view> kHeadsKeys = {"mamba_n_heads", "mamba_num_heads",
                                                            "n_mamba_heads"};
const std::initializer_list<std::string_view> kHeadDimKeys = {"mamba_d_head", "mamba_head_dim",
                                                              "mamba_headdim"};
const std::initializer_list<std::string_view> kGroupKeys = {"mamba_n_groups", "n_groups",
                                                            "mamba_ngroups"};

Result<RecurrentGeometry> ReadMamba(const ConfigReader& text, std::string_view type, Mixer kind,
                                    int64_t hidden, const MambaDefaults& d) {
  RecurrentGeometry g;
  HKV_ASSIGN_OR_RETURN(int64_t d_conv,
                       MambaField(text, kConvKeys, d.d_conv, "the Mamba convolution width"));
  if (d_conv < 2) return text.Invalid(text.FirstPresent(kConvKeys), "a convolution width >= 2");
  HKV_ASSIGN_OR_RETURN(int64_t d_state,
                       MambaField(text, {"mamba_d_state", "ssm_state_size", "state_size"},
                                  d.d_state, "the SSM state size"));
  g.d_conv = static_cast<int32_t>(d_conv);
  g.d_state = static_cast<int32_t>(d_state);

  int64_t d_inner = 0;
  if (text.Has("mamba_d_ssm")) {
    HKV_ASSIGN_OR_RETURN(d_inner, text.PositiveInt("mamba_d_ssm"));
  } else if (d.d_ssm_when_absent > 0 && !text.Contains("mamba_d_ssm")) {
    d_inner = d.d_ssm_when_absent;
  } else if (!d.inner_from_heads) {
    HKV_ASSIGN_OR_RETURN(int64_t expand, MambaField(text, {"mamba_expand", "expand"}, d.expand,
                                                    "the Mamba expansion factor"));
    d_inner = expand * hidden;
  }
  if (kind == Mixer::kMamba1) {
    g.d_inner = static_cast<int32_t>(d_inner);
    return g;
  }

  // Head width may be "auto" (Bamba, Falcon-H1) or recomputed by transformers (Zamba2): then it
  // is the inner width over the head count.
  const std::string_view heads_key = text.FirstPresent(kHeadsKeys);
  const std::string_view head_dim_key = text.FirstPresent(kHeadDimKeys);
  const bool derive_head_dim =
      type == "zamba2" || head_dim_key.empty() || text.Raw(head_dim_key) == "\"auto\"";
  int64_t head_dim = 0;
  int64_t heads = 0;
  if (!heads_key.empty()) {
    HKV_ASSIGN_OR_RETURN(heads, text.PositiveInt(heads_key));
  }
  if (!derive_head_dim) {
    HKV_ASSIGN_OR_RETURN(head_dim, text.PositiveInt(head_dim_key));
  } else if (d.head_dim > 0) {
    head_dim = d.head_dim;
  }
  if (heads == 0 && head_dim > 0 && d_inner > 0) heads = d_inner / head_dim;
  if (heads == 0) heads = d.n_heads;
  if (heads == 0) return text.Missing(*kHeadsKeys.begin(), "the Mamba-2 head count");
  if (d.inner_from_heads) {
    if (head_dim == 0) return text.Missing(*kHeadDimKeys.begin(), "the Mamba-2 head width");
    d_inner = heads * head_dim;
  }
  if (head_dim == 0) {
    if (d_inner % heads != 0) {
      return text.Invalid(heads_key.empty() ? *kHeadsKeys.begin() : heads_key,
                          fmt::format("a divisor of the Mamba inner width {}", d_inner));
    }
    head_dim = d_inner / heads;
  }
  if (heads * head_dim != d_inner) {
    return text.Invalid(heads_key.empty() ? head_dim_key : heads_key,
                        fmt::format("heads x head width = the Mamba inner width {} (heads {}, "
                                    "head width {})",
                                    d_inner, heads, head_dim));
  }
  HKV_ASSIGN_OR_RETURN(int64_t groups,
                       MambaField(text, kGroupKeys, d.n_groups, "the Mamba-2 group count"));
  if (heads % groups != 0) {
    return text.Invalid(text.FirstPresent(kGroupKeys),
                        fmt::format("a divisor of the Mamba-2 head count {}", heads));
  }
  g.d_inner = static_cast<int32_t>(d_inner);
  g.n_heads = static_cast<int32_t>(heads);
  g.head_dim = static_cast<int32_t>(head_dim);
  g.n_groups = static_cast<int32_t>(groups);
  return g;
}

Result<RecurrentGeometry> ReadGatedDeltaNet(const ConfigReader& text) {
  RecurrentGeometry g;
  HKV_ASSIGN_OR_RETURN(int64_t d_conv, text.PositiveIntOr("linear_conv_kernel_dim", 4));
  if (d_conv < 2) return text.Invalid("linear_conv_kernel_dim", "≥ 2");
  HKV_ASSIGN_OR_RETURN(int64_t nk, text.PositiveInt("linear_num_key_heads"));
  HKV_ASSIGN_OR_RETURN(int64_t dk, text.PositiveInt("linear_key_head_dim"));
  HKV_ASSIGN_OR_RETURN(int64_t nv, text.PositiveInt("linear_num_value_heads"));
  HKV_ASSIGN_OR_RETURN(int64_t dv, text.PositiveInt("linear_value_head_dim"));
  if (nv % nk != 0) {
    return text.Invalid("linear_num_key_heads",
                        fmt::format("a divisor of linear_num_value_heads = {}", nv));
  }
  g.d_conv = static_cast<int32_t>(d_conv);
  g.num_k_heads = static_cast<int32_t>(nk);
  g.k_head_dim = static_cast<int32_t>(dk);
  g.num_v_heads = static_cast<int32_t>(nv);
  g.v_head_dim = static_cast<int32_t>(dv);
  return g;
}

// State tensors in the layout engines allocate: conv keeps the last d_conv-1 inputs per channel.
std::vector<StateTensor> StateTensorsOf(Mixer kind, const RecurrentGeometry& g,
                                        const LoadOptions& o) {
  const int64_t keep = g.d_conv - 1;
  switch (kind) {
    case Mixer::kMamba1:
      return {{"conv", {keep, g.d_inner}, o.conv_dtype},
              {"ssm", {g.d_inner, g.d_state}, o.state_dtype}};
    case Mixer::kMamba2: {
      const int64_t conv_dim = int64_t{g.d_inner} + 2 * int64_t{g.n_groups} * g.d_state;
      return {{"conv", {keep, conv_dim}, o.conv_dtype},
              {"ssm", {g.n_heads, g.head_dim, g.d_state}, o.state_dtype}};
    }
    case Mixer::kGdn: {
      const int64_t conv_dim =
          2 * int64_t{g.num_k_heads} * g.k_head_dim + int64_t{g.num_v_heads} * g.v_head_dim;
      return {{"conv", {keep, conv_dim}, o.conv_dtype},
              {"ssm", {g.num_v_heads, g.v_head_dim, g.k_head_dim}, o.state_dtype}};
    }
    default:
      return {};
  }
}

LayerKind KindOf(Mixer m) {
  switch (m) {
    case Mixer::kFull:
      return LayerKind::kFullAttention;
    case Mixer::kSliding:
      return LayerKind::kSlidingWindow;
    case Mixer::kChunked:
      return LayerKind::kChunkedLocal;
    case Mixer::kCross:
      return LayerKind::kCrossAttention;
    case Mixer::kMla:
      return LayerKind::kMla;
    case Mixer::kMamba1:
      return LayerKind::kMamba1;
    case Mixer::kMamba2:
      return LayerKind::kMamba2;
    case Mixer::kGdn:
      return LayerKind::kGatedDeltaNet;
    case Mixer::kMlp:
      return LayerKind::kMlp;
  }
  return LayerKind::kMlp;
}

bool Uses(const Pattern& p, Mixer m) {
  return std::any_of(p.mixers.begin(), p.mixers.end(), [m](const std::vector<Mixer>& layer) {
    return std::find(layer.begin(), layer.end(), m) != layer.end();
  });
}

bool UsesAny(const Pattern& p, bool (*pred)(Mixer)) {
  return std::any_of(p.mixers.begin(), p.mixers.end(), [pred](const std::vector<Mixer>& layer) {
    return std::any_of(layer.begin(), layer.end(), pred);
  });
}

// Encoder tokens of the largest image mllama accepts: tiles × (patches per tile + class token).
Result<int64_t> ReadMaxEncoderTokens(const ConfigReader& root) {
  HKV_ASSIGN_OR_RETURN(std::optional<ConfigReader> vision, root.Object("vision_config"));
  if (!vision) return int64_t{0};
  HKV_ASSIGN_OR_RETURN(int64_t image, vision->PositiveIntOr("image_size", 560));
  HKV_ASSIGN_OR_RETURN(int64_t patch, vision->PositiveIntOr("patch_size", 14));
  HKV_ASSIGN_OR_RETURN(int64_t tiles, vision->PositiveIntOr("max_num_tiles", 4));
  if (image % patch != 0) {
    return vision->Invalid("image_size", fmt::format("a multiple of patch_size = {}", patch));
  }
  const int64_t side = image / patch;
  return tiles * (side * side + 1);
}

int32_t I32(int64_t v) {
  return static_cast<int32_t>(v);
}

}  // namespace

const std::vector<std::string_view>& FamilyModelTypes() {
  static const std::vector<std::string_view> types = [] {
    std::vector<std::string_view> out;
    for (const Family& f : kFamilies)
      out.push_back(f.model_type);
    return out;
  }();
  return types;
}

Result<ModelSpec> BuildModelSpec(const ConfigReader& root, const ConfigReader& text,
                                 std::string_view model_type, const LoadOptions& options) {
  ModelSpec spec;
  spec.source = root.source();
  spec.model_type = std::string(model_type);
  const Family& family = FindFamily(model_type);
  int64_t n = 0;
  if (model_type == "nemotron_h" && !text.Has("num_hidden_layers") &&
      text.Has("hybrid_override_pattern")) {
    // The pattern has one character per layer; num_hidden_layers is deprecated there.
    HKV_ASSIGN_OR_RETURN(std::string pattern, text.String("hybrid_override_pattern"));
    n = static_cast<int64_t>(pattern.size());
  } else {
    HKV_ASSIGN_OR_RETURN(n, text.PositiveInt("num_hidden_layers"));
  }
  HKV_ASSIGN_OR_RETURN(int64_t hidden, text.PositiveInt("hidden_size"));
  HKV_ASSIGN_OR_RETURN(spec.max_position_embeddings,
                       text.NonNegativeIntOr("max_position_embeddings", 0));
  spec.num_layers = I32(n);
  spec.hidden_size = I32(hidden);
  HKV_ASSIGN_OR_RETURN(Pattern pattern, ReadPattern(text, model_type, n, family, spec.warnings));

  AttentionGeometry attn;
  if (UsesAny(pattern, IsAttentionMixer)) {
    HKV_ASSIGN_OR_RETURN(attn, ReadAttention(text, model_type, hidden));
  }
  int64_t window = 0;
  if (Uses(pattern, Mixer::kSliding)) {
    // Mistral's class default window applies when the key is absent altogether.
    HKV_ASSIGN_OR_RETURN(window, model_type == "mistral"
                                     ? text.PositiveIntOr("sliding_window", 4096)
                                     : text.PositiveInt("sliding_window"));
  }
  int64_t chunk = 0;
  if (Uses(pattern, Mixer::kChunked)) {
    HKV_ASSIGN_OR_RETURN(chunk, model_type.starts_with("llama4")
                                    ? text.PositiveIntOr("attention_chunk_size", 8192)
                                    : text.PositiveInt("attention_chunk_size"));
  }
  int64_t kv_lora_rank = 0, rope_dim = 0;
  if (Uses(pattern, Mixer::kMla)) {
    HKV_ASSIGN_OR_RETURN(kv_lora_rank, text.PositiveInt("kv_lora_rank"));
    HKV_ASSIGN_OR_RETURN(rope_dim, text.PositiveInt("qk_rope_head_dim"));
  }
  if (Uses(pattern, Mixer::kCross)) {
    HKV_ASSIGN_OR_RETURN(spec.max_encoder_tokens, ReadMaxEncoderTokens(root));
  }
  RecurrentGeometry mamba1, mamba2, gdn;
  if (Uses(pattern, Mixer::kMamba1)) {
    HKV_ASSIGN_OR_RETURN(mamba1,
                         ReadMamba(text, model_type, Mixer::kMamba1, hidden, family.defaults));
  }
  if (Uses(pattern, Mixer::kMamba2)) {
    HKV_ASSIGN_OR_RETURN(mamba2,
                         ReadMamba(text, model_type, Mixer::kMamba2, hidden, family.defaults));
  }
  if (Uses(pattern, Mixer::kGdn)) {
    HKV_ASSIGN_OR_RETURN(gdn, ReadGatedDeltaNet(text));
  }

  if (root.Has("torch_dtype")) {
    const std::string dtype = root.Raw("torch_dtype");
    if (dtype != "\"bfloat16\"" && dtype != "\"float16\"") {
      spec.warnings.push_back(fmt::format(
          "torch_dtype = {} is the checkpoint's storage type; the cache is planned in {} (kv) / "
          "{} (state) as chosen by the plan options",
          dtype, DTypeName(options.kv_dtype), DTypeName(options.state_dtype)));
    }
  }

  for (int64_t i = 0; i < n; ++i) {
    const size_t li = static_cast<size_t>(i);
    for (Mixer m : pattern.mixers[li]) {
      LayerSpec l;
      l.layer = I32(i);
      l.kind = KindOf(m);
      if (IsAttentionMixer(m)) {
        l.num_q_heads = I32(attn.q_heads);
        l.num_kv_heads = I32(attn.kv_heads);
        l.head_dim_k = I32(attn.head_dim);
        l.head_dim_v = I32(attn.head_dim);
        l.kv_dtype = options.kv_dtype;
        l.learned_sinks = pattern.learned_sinks;
        l.rope = !pattern.nope[li] && m != Mixer::kCross;
        l.kv_source_layer = pattern.kv_source[li];
      }
      if (m == Mixer::kSliding) l.window = I32(window);
      if (m == Mixer::kChunked) l.chunk = I32(chunk);
      if (m == Mixer::kMla) {
        // The cache holds one latent (compressed KV + decoupled RoPE key) shared by all heads.
        l.num_kv_heads = 1;
        l.head_dim_k = I32(kv_lora_rank + rope_dim);
        l.head_dim_v = 0;
        l.kv_lora_rank = I32(kv_lora_rank);
        l.qk_rope_head_dim = I32(rope_dim);
      }
      if (m == Mixer::kMamba1) l.recurrent = mamba1;
      if (m == Mixer::kMamba2) l.recurrent = mamba2;
      if (m == Mixer::kGdn) l.recurrent = gdn;
      l.state = StateTensorsOf(m, l.recurrent, options);
      spec.layers.push_back(std::move(l));
    }
  }
  HKV_RETURN_IF_ERROR(spec.Validate());
  return spec;
}

}  // namespace hkv::spec_internal
