#include "layer_pattern.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace hkv::spec_internal {
namespace {

Pattern UniformPattern(int64_t n, std::vector<Mixer> mixers) {
  Pattern p;
  p.mixers.assign(static_cast<size_t>(n), std::move(mixers));
  return p;
}

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

}  // namespace

const Family& FindFamily(std::string_view model_type) {
  for (const Family& f : kFamilies) {
    if (f.model_type == model_type) return f;
  }
  return kGenericFamily;
}

bool IsAttentionMixer(Mixer m) {
  return m == Mixer::kFull || m == Mixer::kSliding || m == Mixer::kChunked || m == Mixer::kCross ||
         m == Mixer::kMla;
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

const std::vector<std::string_view>& FamilyModelTypes() {
  static const std::vector<std::string_view> types = [] {
    std::vector<std::string_view> out;
    for (const Family& f : kFamilies)
      out.push_back(f.model_type);
    return out;
  }();
  return types;
}

namespace {

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

// zamba2: every layer has a Mamba-2 block; the hybrid ones add (weight-shared) attention with
// a cache of their own.
Result<Pattern> Zamba2Pattern(const ConfigReader& text, int64_t n) {
  // transformers derives hybrid_layer_ids from layers_block_type, so the latter wins.
  Pattern p = UniformPattern(n, {Mixer::kMamba2});
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
  return p;
}

Result<Pattern> Qwen2Pattern(const ConfigReader& text, int64_t n,
                             std::vector<std::string>& warnings) {
  HKV_ASSIGN_OR_RETURN(bool use_sliding, text.BoolOr("use_sliding_window", false));
  Pattern p = UniformPattern(n, {Mixer::kFull});
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
  return p;
}

Result<Pattern> JambaPattern(const ConfigReader& text, int64_t n) {
  HKV_ASSIGN_OR_RETURN(int64_t period, text.PositiveIntOr("attn_layer_period", 8));
  HKV_ASSIGN_OR_RETURN(int64_t offset, text.NonNegativeIntOr("attn_layer_offset", 4));
  if (offset >= period) {
    return text.Invalid("attn_layer_offset",
                        fmt::format("an offset below attn_layer_period = {}", period));
  }
  Pattern p = UniformPattern(n, {Mixer::kMamba1});
  for (int64_t i = offset; i < n; i += period)
    p.mixers[static_cast<size_t>(i)] = {Mixer::kFull};
  return p;
}

Result<Pattern> Llama4Pattern(const ConfigReader& text, int64_t n) {
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
      return text.Invalid("no_rope_layers", fmt::format("num_hidden_layers = {} entries (found {})",
                                                        n, rope_flags.size()));
    }
  } else {
    HKV_ASSIGN_OR_RETURN(int64_t interval, text.PositiveIntOr("no_rope_layer_interval", 4));
    for (int64_t i = interval - 1; i < n; i += interval)
      rope_flags[static_cast<size_t>(i)] = 0;
  }
  const bool chunked = text.Has("attention_chunk_size") || !text.Contains("attention_chunk_size");
  Pattern p = UniformPattern(n, {Mixer::kFull});
  p.nope.assign(static_cast<size_t>(n), false);
  for (size_t i = 0; i < rope_flags.size(); ++i) {
    if (rope_flags[i] != 0 && chunked) p.mixers[i] = {Mixer::kChunked};
    p.nope[i] = rope_flags[i] == 0;
  }
  return p;
}

// The layers' mixers as the model type (or a layer_types list) gives them.
Result<Pattern> FamilyPattern(const ConfigReader& text, std::string_view type, int64_t n,
                              const Family& family, std::vector<std::string>& warnings) {
  Pattern p;
  if (type == "falcon_h1") {
    p = UniformPattern(n, {Mixer::kFull, Mixer::kMamba2});
  } else if (type == "zamba2") {
    HKV_ASSIGN_OR_RETURN(p, Zamba2Pattern(text, n));
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
    HKV_ASSIGN_OR_RETURN(p, Qwen2Pattern(text, n, warnings));
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
    HKV_ASSIGN_OR_RETURN(p, JambaPattern(text, n));
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
    HKV_ASSIGN_OR_RETURN(p, Llama4Pattern(text, n));
  } else {
    return Status::Unsupported(fmt::format(
        "{}: model_type = \"{}\" has no layer pattern reader and the config has no layer_types "
        "list: expected one of the supported model types ({}) or an explicit layer_types",
        text.source(), type, fmt::join(FamilyModelTypes(), ", ")));
  }
  return p;
}

}  // namespace

Result<Pattern> ReadPattern(const ConfigReader& text, std::string_view type, int64_t n,
                            const Family& family, std::vector<std::string>& warnings) {
  HKV_ASSIGN_OR_RETURN(Pattern p, FamilyPattern(text, type, n, family, warnings));
  if (p.kv_source.empty()) p.kv_source.assign(static_cast<size_t>(n), -1);
  if (p.nope.empty()) p.nope.assign(static_cast<size_t>(n), false);
  if (type == "gpt_oss") p.learned_sinks = true;
  HKV_RETURN_IF_ERROR(ApplyKvSharing(text, n, p));
  return p;
}

}  // namespace hkv::spec_internal
