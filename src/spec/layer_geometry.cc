#include "layer_geometry.h"

#include <limits>

#include <fmt/format.h>

namespace hkv::spec_internal {
namespace {

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

}  // namespace

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

namespace {

// The Mamba inner width: mamba_d_ssm, the family's width when the key is absent, or expand x
// hidden; 0 where it comes from the heads instead (inner_from_heads).
Result<int64_t> ReadMambaInner(const ConfigReader& text, int64_t hidden, const MambaDefaults& d) {
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
  if (d_inner > std::numeric_limits<int32_t>::max()) {
    return text.Invalid(text.FirstPresent({"mamba_d_ssm", "mamba_expand", "expand"}),
                        fmt::format("a Mamba inner width that fits in int32 (got {})", d_inner));
  }
  return d_inner;
}

// Mamba-2's heads, head width and groups (and the inner width, where the heads give it) into `g`.
Status ReadMamba2Heads(const ConfigReader& text, std::string_view type, const MambaDefaults& d,
                       int64_t d_inner, RecurrentGeometry& g) {
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
    if (d_inner > std::numeric_limits<int32_t>::max()) {
      return text.Invalid(*kHeadsKeys.begin(),
                          fmt::format("heads x head width that fits in int32 (got {})", d_inner));
    }
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
  return Status::Ok();
}

}  // namespace

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
  HKV_ASSIGN_OR_RETURN(const int64_t d_inner, ReadMambaInner(text, hidden, d));
  if (kind == Mixer::kMamba1) {
    g.d_inner = static_cast<int32_t>(d_inner);
    return g;
  }
  HKV_RETURN_IF_ERROR(ReadMamba2Heads(text, type, d, d_inner, g));
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

}  // namespace hkv::spec_internal
