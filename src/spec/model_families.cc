#include "model_families.h"

#include <limits>

#include <fmt/format.h>

#include "layer_geometry.h"
#include "layer_pattern.h"

namespace hkv::spec_internal {
namespace {

// Far above any real model; keeps a hostile config from allocating per-layer tables of gigabytes.
constexpr int64_t kMaxLayers = ModelSpec::kMaxLayers;

int32_t I32(int64_t v) {
  return static_cast<int32_t>(v);
}

Result<int64_t> ReadNumLayers(const ConfigReader& text, std::string_view model_type) {
  int64_t n = 0;
  if (model_type == "nemotron_h" && !text.Has("num_hidden_layers") &&
      text.Has("hybrid_override_pattern")) {
    // The pattern has one character per layer; num_hidden_layers is deprecated there.
    HKV_ASSIGN_OR_RETURN(std::string pattern, text.String("hybrid_override_pattern"));
    n = static_cast<int64_t>(pattern.size());
  } else {
    HKV_ASSIGN_OR_RETURN(n, text.PositiveInt("num_hidden_layers"));
  }
  if (n > kMaxLayers) {
    return text.Invalid("num_hidden_layers", fmt::format("at most {} layers", kMaxLayers));
  }
  return n;
}

Result<int32_t> ReadMambaChunk(const ConfigReader& text) {
  HKV_ASSIGN_OR_RETURN(int64_t mamba_chunk, text.NonNegativeIntOr("mamba_chunk_size", 0));
  if (mamba_chunk == 0) {
    HKV_ASSIGN_OR_RETURN(mamba_chunk, text.NonNegativeIntOr("chunk_size", 0));
  }
  if (mamba_chunk > ModelSpec::kMaxWidth) {
    return text.Invalid(text.Has("mamba_chunk_size") ? "mamba_chunk_size" : "chunk_size",
                        fmt::format("at most {}", ModelSpec::kMaxWidth));
  }
  return I32(mamba_chunk);
}

// The geometry of every mixer the pattern uses; the fields of mixers it does not use stay 0.
struct MixerGeometry {
  AttentionGeometry attn;
  int64_t window = 0;
  int64_t chunk = 0;
  int64_t kv_lora_rank = 0, rope_dim = 0;
  int64_t max_encoder_tokens = 0;
  RecurrentGeometry mamba1, mamba2, gdn;
};

Result<MixerGeometry> ReadMixerGeometry(const ConfigReader& root, const ConfigReader& text,
                                        std::string_view model_type, int64_t hidden,
                                        const Family& family, const Pattern& pattern) {
  MixerGeometry g;
  if (UsesAny(pattern, IsAttentionMixer)) {
    HKV_ASSIGN_OR_RETURN(g.attn, ReadAttention(text, model_type, hidden));
  }
  if (Uses(pattern, Mixer::kSliding)) {
    // Mistral's class default window applies when the key is absent altogether.
    HKV_ASSIGN_OR_RETURN(g.window, model_type == "mistral"
                                       ? text.PositiveIntOr("sliding_window", 4096)
                                       : text.PositiveInt("sliding_window"));
  }
  if (Uses(pattern, Mixer::kChunked)) {
    HKV_ASSIGN_OR_RETURN(g.chunk, model_type.starts_with("llama4")
                                      ? text.PositiveIntOr("attention_chunk_size", 8192)
                                      : text.PositiveInt("attention_chunk_size"));
  }
  if (Uses(pattern, Mixer::kMla)) {
    HKV_ASSIGN_OR_RETURN(g.kv_lora_rank, text.PositiveInt("kv_lora_rank"));
    HKV_ASSIGN_OR_RETURN(g.rope_dim, text.PositiveInt("qk_rope_head_dim"));
    if (g.kv_lora_rank + g.rope_dim > std::numeric_limits<int32_t>::max()) {
      return text.Invalid("kv_lora_rank", "kv_lora_rank + qk_rope_head_dim that fits in int32");
    }
  }
  if (Uses(pattern, Mixer::kCross)) {
    HKV_ASSIGN_OR_RETURN(g.max_encoder_tokens, ReadMaxEncoderTokens(root));
  }
  if (Uses(pattern, Mixer::kMamba1)) {
    HKV_ASSIGN_OR_RETURN(g.mamba1,
                         ReadMamba(text, model_type, Mixer::kMamba1, hidden, family.defaults));
  }
  if (Uses(pattern, Mixer::kMamba2)) {
    HKV_ASSIGN_OR_RETURN(g.mamba2,
                         ReadMamba(text, model_type, Mixer::kMamba2, hidden, family.defaults));
  }
  if (Uses(pattern, Mixer::kGdn)) {
    HKV_ASSIGN_OR_RETURN(g.gdn, ReadGatedDeltaNet(text));
  }
  return g;
}

void WarnStorageDType(const ConfigReader& root, const LoadOptions& options,
                      std::vector<std::string>& warnings) {
  if (!root.Has("torch_dtype")) return;
  const std::string dtype = root.Raw("torch_dtype");
  if (dtype != "\"bfloat16\"" && dtype != "\"float16\"") {
    warnings.push_back(fmt::format(
        "torch_dtype = {} is the checkpoint's storage type; the cache is planned in {} (kv) / "
        "{} (state) as chosen by the plan options",
        dtype, DTypeName(options.kv_dtype), DTypeName(options.state_dtype)));
  }
}

// Mixer `m` of layer `i`.
LayerSpec MakeLayer(int64_t i, Mixer m, const Pattern& pattern, const MixerGeometry& g,
                    const LoadOptions& options) {
  const size_t li = static_cast<size_t>(i);
  LayerSpec l;
  l.layer = I32(i);
  l.kind = KindOf(m);
  if (IsAttentionMixer(m)) {
    l.num_q_heads = I32(g.attn.q_heads);
    l.num_kv_heads = I32(g.attn.kv_heads);
    l.head_dim_k = I32(g.attn.head_dim);
    l.head_dim_v = I32(g.attn.head_dim);
    l.kv_dtype = options.kv_dtype;
    l.learned_sinks = pattern.learned_sinks;
    l.rope = !pattern.nope[li] && m != Mixer::kCross;
    l.kv_source_layer = pattern.kv_source[li];
  }
  if (m == Mixer::kSliding) l.window = I32(g.window);
  if (m == Mixer::kChunked) l.chunk = I32(g.chunk);
  if (m == Mixer::kMla) {
    // The cache holds one latent (compressed KV + decoupled RoPE key) shared by all heads.
    l.num_kv_heads = 1;
    l.head_dim_k = I32(g.kv_lora_rank + g.rope_dim);
    l.head_dim_v = 0;
    l.kv_lora_rank = I32(g.kv_lora_rank);
    l.qk_rope_head_dim = I32(g.rope_dim);
  }
  if (m == Mixer::kMamba1) l.recurrent = g.mamba1;
  if (m == Mixer::kMamba2) l.recurrent = g.mamba2;
  if (m == Mixer::kGdn) l.recurrent = g.gdn;
  l.state = StateTensorsOf(m, l.recurrent, options);
  return l;
}

}  // namespace

Result<ModelSpec> BuildModelSpec(const ConfigReader& root, const ConfigReader& text,
                                 std::string_view model_type, const LoadOptions& options) {
  ModelSpec spec;
  spec.source = root.source();
  spec.model_type = std::string(model_type);
  const Family& family = FindFamily(model_type);
  HKV_ASSIGN_OR_RETURN(const int64_t n, ReadNumLayers(text, model_type));
  HKV_ASSIGN_OR_RETURN(int64_t hidden, text.PositiveInt("hidden_size"));
  HKV_ASSIGN_OR_RETURN(spec.max_position_embeddings,
                       text.NonNegativeIntOr("max_position_embeddings", 0));
  spec.num_layers = I32(n);
  spec.hidden_size = I32(hidden);
  HKV_ASSIGN_OR_RETURN(spec.mamba_chunk_size, ReadMambaChunk(text));
  HKV_ASSIGN_OR_RETURN(Pattern pattern, ReadPattern(text, model_type, n, family, spec.warnings));
  HKV_ASSIGN_OR_RETURN(const MixerGeometry geometry,
                       ReadMixerGeometry(root, text, model_type, hidden, family, pattern));
  if (Uses(pattern, Mixer::kCross)) spec.max_encoder_tokens = geometry.max_encoder_tokens;
  WarnStorageDType(root, options, spec.warnings);
  for (int64_t i = 0; i < n; ++i) {
    for (Mixer m : pattern.mixers[static_cast<size_t>(i)])
      spec.layers.push_back(MakeLayer(i, m, pattern, geometry, options));
  }
  HKV_RETURN_IF_ERROR(spec.Validate());
  return spec;
}

}  // namespace hkv::spec_internal
