#include <algorithm>
#include <cmath>
#include <string_view>

#include <fmt/format.h>

#include <hkv/common/splitmix64.h>
#include <hkv/engine/tiny_model.h>

namespace hkv {

namespace {

// Small recurrent geometry with the state tensors in the shapes engines allocate (see
// src/spec/layer_geometry.cc): conv keeps d_conv - 1 inputs of every conv channel.
void ScaleRecurrent(LayerSpec& s, const TinyModelOptions& o) {
  RecurrentGeometry g;
  g.d_conv = 4;
  const int64_t keep = g.d_conv - 1;
  switch (s.kind) {
    case LayerKind::kMamba1:
      g.d_inner = 2 * o.hidden;
      g.d_state = 4;
      s.state = {{"conv", {keep, g.d_inner}, DType::kFP32},
                 {"ssm", {g.d_inner, g.d_state}, DType::kFP32}};
      break;
    case LayerKind::kMamba2:
      g.n_heads = 4;
      g.head_dim = 8;
      g.d_inner = g.n_heads * g.head_dim;
      g.d_state = 8;
      g.n_groups = 1;
      s.state = {{"conv", {keep, g.d_inner + 2 * g.n_groups * g.d_state}, DType::kFP32},
                 {"ssm", {g.n_heads, g.head_dim, g.d_state}, DType::kFP32}};
      break;
    default:  // gated DeltaNet
      g.num_k_heads = 2;
      g.k_head_dim = 8;
      g.num_v_heads = 2;
      g.v_head_dim = 8;
      s.state = {{"conv",
                  {keep, 2 * g.num_k_heads * g.k_head_dim + g.num_v_heads * g.v_head_dim},
                  DType::kFP32},
                 {"ssm", {g.num_v_heads, g.v_head_dim, g.k_head_dim}, DType::kFP32}};
      break;
  }
  s.recurrent = g;
}

Status CheckTinyOptions(const TinyModelOptions& o) {
  const auto at_least = [](std::string_view field, int32_t value, int32_t min) {
    return value >= min ? Status::Ok()
                        : Status::InvalidArgument(fmt::format("tiny model: {} = {}: expected >= {}",
                                                              field, value, min));
  };
  for (const Status& st : {at_least("max_layers", o.max_layers, 1), at_least("hidden", o.hidden, 8),
                           at_least("kv_heads", o.kv_heads, 1), at_least("q_per_kv", o.q_per_kv, 1),
                           at_least("head_dim", o.head_dim, 4)}) {
    if (!st.ok()) return st;
  }
  if (o.head_dim % 4 != 0) {
    return Status::InvalidArgument(
        fmt::format("tiny model: head_dim = {}: expected a multiple of 4", o.head_dim));
  }
  for (const Status& st :
       {at_least("window", o.window, 1), at_least("chunk", o.chunk, 1),
        at_least("vocab", o.vocab, 2), at_least("encoder_tokens", o.encoder_tokens, 1)}) {
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

// The first max_layers model layers, plus the first layer of every kind they lack (Bamba's
// first attention layer is its tenth, Gemma-3n's first KV-shared layer its twentieth), ascending.
std::vector<int32_t> KeptLayers(const ModelSpec& real, const TinyModelOptions& o) {
  std::vector<int32_t> keep;
  for (int32_t i = 0; i < std::min(real.num_layers, o.max_layers); ++i)
    keep.push_back(i);
  const auto same_kind = [](const LayerSpec& a, const LayerSpec& b) {
    return a.kind == b.kind && (a.kv_source_layer >= 0) == (b.kv_source_layer >= 0);
  };
  for (const LayerSpec& l : real.layers) {
    const bool covered =
        std::any_of(real.layers.begin(), real.layers.end(), [&](const LayerSpec& k) {
          return same_kind(k, l) && std::find(keep.begin(), keep.end(), k.layer) != keep.end();
        });
    if (!covered) keep.push_back(l.layer);
  }
  std::sort(keep.begin(), keep.end());
  keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
  return keep;
}

void ScaleAttention(LayerSpec& s, const LayerSpec& l, const TinyModelOptions& o) {
  s.num_kv_heads = o.kv_heads;
  s.num_q_heads = o.kv_heads * o.q_per_kv;
  s.head_dim_k = s.head_dim_v = o.head_dim;
  s.kv_dtype = DType::kFP32;
  if (l.kind == LayerKind::kSlidingWindow) s.window = o.window;
  if (l.kind == LayerKind::kChunkedLocal) s.chunk = o.chunk;
  s.sink_tokens = std::min(l.sink_tokens, 2);
  if (l.kind == LayerKind::kMla) {
    s.num_kv_heads = 1;
    s.qk_rope_head_dim = o.head_dim / 2;
    s.kv_lora_rank = 2 * o.head_dim;
    s.head_dim_k = s.kv_lora_rank + s.qk_rope_head_dim;
    s.head_dim_v = 0;
  }
}

// A shared layer whose source was cut (-2) reads the nearest earlier kept layer of its kind that
// owns a cache, or owns its own cache when there is none.
void ResolveCutSources(std::vector<LayerSpec>& layers) {
  for (LayerSpec& s : layers) {
    if (s.kv_source_layer != -2) continue;
    s.kv_source_layer = -1;
    for (const LayerSpec& c : layers) {
      if (c.layer < s.layer && c.kind == s.kind && c.kv_source_layer == -1) {
        s.kv_source_layer = c.layer;
      }
    }
  }
}

}  // namespace

Result<ModelSpec> ScaleModel(const ModelSpec& real, const TinyModelOptions& o) {
  HKV_RETURN_IF_ERROR(CheckTinyOptions(o));
  ModelSpec t;
  t.model_type = real.model_type;
  t.source = real.source + " (scaled)";
  t.hidden_size = o.hidden;
  t.max_position_embeddings = real.max_position_embeddings;
  if (real.max_encoder_tokens > 0) t.max_encoder_tokens = o.encoder_tokens;
  // The kept layers, renumbered consecutively.
  const std::vector<int32_t> keep = KeptLayers(real, o);
  t.num_layers = static_cast<int32_t>(keep.size());
  const auto renumber = [&](int32_t layer) {
    const auto it = std::find(keep.begin(), keep.end(), layer);
    return it == keep.end() ? -1 : static_cast<int32_t>(it - keep.begin());
  };
  for (const LayerSpec& l : real.layers) {
    if (renumber(l.layer) < 0) continue;
    LayerSpec s = l;
    s.layer = renumber(l.layer);
    // -2 marks a shared layer whose source was cut away.
    s.kv_source_layer = l.kv_source_layer < 0 ? -1 : renumber(l.kv_source_layer);
    if (l.kv_source_layer >= 0 && s.kv_source_layer < 0) s.kv_source_layer = -2;
    if (IsRecurrentKind(l.kind)) ScaleRecurrent(s, o);
    if (IsAttentionKind(l.kind)) ScaleAttention(s, l, o);
    t.layers.push_back(s);
  }
  ResolveCutSources(t.layers);
  HKV_RETURN_IF_ERROR(t.Validate());
  return t;
}

namespace {

// Uniform in [-scale, scale).
float Uniform(SplitMix64& rng, float scale) {
  return static_cast<float>((2.0 * rng.Unit() - 1.0) * scale);
}

Matrix RandomMatrix(SplitMix64& rng, int32_t rows, int32_t cols) {
  Matrix m{rows, cols, std::vector<float>(static_cast<size_t>(rows) * static_cast<size_t>(cols))};
  // Scaled so activations keep unit size through the layers.
  const float scale = 1.0f / std::sqrt(static_cast<float>(cols));
  for (float& w : m.w)
    w = Uniform(rng, scale);
  return m;
}

std::vector<float> Gains(SplitMix64& rng, int32_t n) {
  std::vector<float> g(static_cast<size_t>(n));
  for (float& x : g)
    x = 1.0f + Uniform(rng, 0.1f);
  return g;
}

}  // namespace

ModelWeights ModelWeights::Random(const ModelSpec& spec, int32_t vocab, uint64_t seed) {
  SplitMix64 rng(seed);
  const int32_t h = spec.hidden_size;
  ModelWeights w;
  w.vocab = vocab;
  w.embed = RandomMatrix(rng, vocab, h);
  for (float& x : w.embed.w)
    x *= std::sqrt(static_cast<float>(h));  // unit-size embeddings
  for (const LayerSpec& l : spec.layers) {
    LayerWeights lw;
    lw.attn_norm = Gains(rng, h);
    lw.mlp_norm = Gains(rng, h);
    if (l.kind == LayerKind::kMla) {
      const MlaWidths m = MlaWidthsOf(l);
      lw.wq = RandomMatrix(rng, l.num_q_heads * (m.nope + m.rope), h);
      lw.wk = RandomMatrix(rng, m.rank + m.rope, h);  // the cached latent
      lw.w_uk = RandomMatrix(rng, l.num_q_heads * m.nope, m.rank);
      lw.w_uv = RandomMatrix(rng, l.num_q_heads * m.v, m.rank);
      lw.wo = RandomMatrix(rng, h, l.num_q_heads * m.v);
    } else if (IsAttentionKind(l.kind)) {
      lw.wq = RandomMatrix(rng, l.num_q_heads * l.head_dim_k, h);
      lw.wk = RandomMatrix(rng, l.num_kv_heads * l.head_dim_k, h);
      lw.wv = RandomMatrix(rng, l.num_kv_heads * l.head_dim_v, h);
      lw.wo = RandomMatrix(rng, h, l.num_q_heads * l.head_dim_v);
      if (l.learned_sinks) {
        for (int32_t i = 0; i < l.num_q_heads; ++i)
          lw.sink_logits.push_back(Uniform(rng, 1.0f));
      }
    }
    if (IsRecurrentKind(l.kind)) {
      // One input projection to the conv channels plus gate and step size, a depthwise conv
      // kernel, per-channel/head decay, and an output projection; RecurrentWidths says how wide.
      const RecurrentWidths r = RecurrentWidthsOf(l);
      lw.w_in = RandomMatrix(rng, r.conv + r.gate + r.heads, h);
      lw.conv_kernel.resize(static_cast<size_t>(r.conv) * static_cast<size_t>(l.recurrent.d_conv));
      for (float& x : lw.conv_kernel)
        x = Uniform(rng, 0.5f);
      for (int32_t i = 0; i < r.heads; ++i) {
        lw.decay.push_back(Uniform(rng, 1.0f));
        lw.skip.push_back(Uniform(rng, 1.0f));
      }
      lw.w_out = RandomMatrix(rng, h, r.gate);
    }
    const int32_t ffn = 2 * h;
    lw.w_gate = RandomMatrix(rng, ffn, h);
    lw.w_up = RandomMatrix(rng, ffn, h);
    lw.w_down = RandomMatrix(rng, h, ffn);
    w.layers.push_back(std::move(lw));
  }
  w.final_norm = Gains(rng, h);
  w.lm_head = RandomMatrix(rng, vocab, h);
  return w;
}

MlaWidths MlaWidthsOf(const LayerSpec& l) {
  MlaWidths m;
  m.rank = l.kv_lora_rank;
  m.rope = l.qk_rope_head_dim;
  m.nope = 2 * l.qk_rope_head_dim;
  m.v = 2 * l.qk_rope_head_dim;
  return m;
}

RecurrentWidths RecurrentWidthsOf(const LayerSpec& l) {
  const RecurrentGeometry& g = l.recurrent;
  RecurrentWidths r;
  switch (l.kind) {
    case LayerKind::kMamba1:
      r.conv = g.d_inner;
      r.gate = g.d_inner;
      r.heads = g.d_inner;  // a step size per channel
      break;
    case LayerKind::kMamba2:
      r.conv = g.d_inner + 2 * g.n_groups * g.d_state;
      r.gate = g.d_inner;
      r.heads = g.n_heads;
      break;
    case LayerKind::kGatedDeltaNet:
      r.conv = 2 * g.num_k_heads * g.k_head_dim + g.num_v_heads * g.v_head_dim;
      r.gate = g.num_v_heads * g.v_head_dim;
      r.heads = g.num_v_heads;  // decay and write strength per value head
      break;
    default:
      break;
  }
  return r;
}

}  // namespace hkv
