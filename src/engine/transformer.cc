#include <algorithm>
#include <cmath>

#include <hkv/common/splitmix64.h>
#include <hkv/engine/transformer.h>

namespace hkv {
namespace {

// Eight interleaved partial sums: the compiler keeps them in vector lanes, where one running sum
// would serialise every add (strict float order forbids reassociating it). The order is fixed,
// so the dense and paged passes, which share this code, still agree bit for bit.
float Dot(const float* a, const float* b, int32_t n) {
  constexpr int32_t kLanes = 8;
  float lane[kLanes] = {};
  int32_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    for (int32_t k = 0; k < kLanes; ++k)
      lane[k] += a[c + k] * b[c + k];
  }
  float acc =
      ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  for (; c < n; ++c)
    acc += a[c] * b[c];
  return acc;
}

void MatVec(const Matrix& m, const float* x, float* y) {
  for (int32_t r = 0; r < m.rows; ++r)
    y[r] = Dot(m.w.data() + static_cast<size_t>(r) * static_cast<size_t>(m.cols), x, m.cols);
}

void RmsNorm(const float* x, const std::vector<float>& gain, float* y) {
  const auto n = static_cast<int32_t>(gain.size());
  float ss = 0.0f;
  for (int32_t i = 0; i < n; ++i)
    ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + 1e-6f);
  for (int32_t i = 0; i < n; ++i)
    y[i] = x[i] * inv * gain[static_cast<size_t>(i)];
}

// Rotary embedding on each head of `v` (heads x dim), pairs (i, i + dim/2).
void Rope(float* v, int32_t heads, int32_t dim, int64_t pos) {
  const int32_t half = dim / 2;
  for (int32_t i = 0; i < half; ++i) {
    const double freq = std::pow(10000.0, -2.0 * i / dim);
    const double angle = static_cast<double>(pos) * freq;
    const auto c = static_cast<float>(std::cos(angle)), s = static_cast<float>(std::sin(angle));
    for (int32_t h = 0; h < heads; ++h) {
      float* x = v + static_cast<size_t>(h) * static_cast<size_t>(dim);
      const float a = x[i], b = x[i + half];
      x[i] = a * c - b * s;
      x[i + half] = a * s + b * c;
    }
  }
}

// The positions query `q` of layer `l` attends to, as ascending [lo, hi) ranges (at most two).
int AttendedRanges(const LayerSpec& l, int64_t q, int64_t ranges[2][2]) {
  switch (l.kind) {
    case LayerKind::kSlidingWindow: {
      const int64_t lo = std::max<int64_t>(0, q - l.window + 1);
      const int64_t sinks = std::min<int64_t>(l.sink_tokens, lo);
      int count = 0;
      if (sinks > 0) {
        ranges[count][0] = 0;
        ranges[count++][1] = sinks;
      }
      ranges[count][0] = lo;
      ranges[count++][1] = q + 1;
      return count;
    }
    case LayerKind::kChunkedLocal:
      ranges[0][0] = q / l.chunk * l.chunk;
      ranges[0][1] = q + 1;
      return 1;
    default:
      ranges[0][0] = 0;
      ranges[0][1] = q + 1;
      return 1;
  }
}

// Appends the runs of rows covering [lo, hi) of `layer`.
void GatherRuns(KvStore& store, int32_t layer, int64_t lo, int64_t hi, std::vector<KvRows>& runs) {
  for (int64_t j = lo; j < hi;) {
    KvRows r = store.Rows(layer, j);
    r.n = std::clamp<int64_t>(r.n, 1, hi - j);
    runs.push_back(r);
    j += r.n;
  }
}

// Asks for the cache lines of `n` rows `width` floats apart, starting at `p`.
void Prefetch(const float* p, int64_t n, size_t width) {
  const auto* bytes = reinterpret_cast<const char*>(p);
  const size_t span = static_cast<size_t>(n) * width * sizeof(float);
  for (size_t off = 0; off < span; off += 64)
    __builtin_prefetch(bytes + off);
}

// Softmax attention of `heads` query heads over `runs`, every `group` consecutive heads sharing
// one KV head: head h's query is q + h * d, its keys and values the d floats at column
// (h / group) * d of rows `k_width` / `v_width` wide; `sinks` holds a learned sink logit per head
// (null: none); head h's output goes to o + h * d. All heads share one pass over the keys and one
// over the values (the cache is read once per query position), and every head accumulates in
// position order whatever the run boundaries, so paged and contiguous stores give bit-identical
// results.
// With `feedback` (null: none), every weight divided by `group` is also added at
// feedback[(h / group) * feedback_stride + slot], the slot counted from the first run.
void Attend(std::span<const KvRows> runs, const float* q, int32_t heads, int32_t group, int32_t d,
            size_t k_width, size_t v_width, float scale, const float* sinks,
            std::vector<float>& scores, float* o, float* feedback = nullptr,
            size_t feedback_stride = 0) {
  int64_t total = 0;
  for (const KvRows& r : runs)
    total += r.n;
  const auto stride = static_cast<size_t>(total);
  const auto column = [&](int32_t h) { return static_cast<size_t>(h / group * d); };
  scores.resize(static_cast<size_t>(heads) * (stride + 1));  // scores, then a sum per head
  size_t at = 0;
  for (size_t ri = 0; ri < runs.size(); ++ri) {
    const KvRows& r = runs[ri];
    // Paged runs are blocks scattered in memory: fetch the keys two runs ahead while this one is
    // scored, as the hardware prefetcher does for a contiguous store.
    if (ri + 2 < runs.size()) Prefetch(runs[ri + 2].k, runs[ri + 2].n, k_width);
    for (int64_t i = 0; i < r.n; ++i, ++at) {
      const float* k = r.k + static_cast<size_t>(i) * k_width;
      for (int32_t h = 0; h < heads; ++h) {
        scores[static_cast<size_t>(h) * stride + at] =
            Dot(q + static_cast<size_t>(h * d), k + column(h), d) * scale;
      }
    }
  }
  float* denom = scores.data() + static_cast<size_t>(heads) * stride;
  for (int32_t h = 0; h < heads; ++h) {
    float* sh = scores.data() + static_cast<size_t>(h) * stride;
    const float sink = sinks != nullptr ? sinks[h] : -INFINITY;
    float mx = sink;
    for (size_t j = 0; j < stride; ++j)
      mx = std::max(mx, sh[j]);
    float sum = sinks != nullptr ? std::exp(sink - mx) : 0.0f;
    for (size_t j = 0; j < stride; ++j) {
      sh[j] = std::exp(sh[j] - mx);
      sum += sh[j];
    }
    denom[h] = sum;
  }
  std::fill(o, o + static_cast<size_t>(heads * d), 0.0f);
  if (feedback != nullptr) {
    const float share = 1.0f / static_cast<float>(group);
    for (int32_t h = 0; h < heads; ++h) {
      const float* sh = scores.data() + static_cast<size_t>(h) * stride;
      float* fb = feedback + static_cast<size_t>(h / group) * feedback_stride;
      for (size_t j = 0; j < stride; ++j)
        fb[j] += sh[j] / denom[h] * share;
    }
  }
  at = 0;
  for (size_t ri = 0; ri < runs.size(); ++ri) {
    const KvRows& r = runs[ri];
    if (ri + 2 < runs.size()) Prefetch(runs[ri + 2].v, runs[ri + 2].n, v_width);
    for (int64_t i = 0; i < r.n; ++i, ++at) {
      const float* v = r.v + static_cast<size_t>(i) * v_width;
      for (int32_t h = 0; h < heads; ++h) {
        const float p = scores[static_cast<size_t>(h) * stride + at] / denom[h];
        const float* vh = v + column(h);
        float* oh = o + static_cast<size_t>(h * d);
        for (int32_t c = 0; c < d; ++c)
          oh[c] += p * vh[c];
      }
    }
  }
}

float Silu(float v) {
  return v / (1.0f + std::exp(-v));
}
float Softplus(float v) {
  return v > 20.0f ? v : std::log1p(std::exp(v));
}

// The causal conv over the token's conv inputs `u` into `c` (SiLU applied); the conv state then
// drops its oldest input and keeps `u`.
void ConvolveToken(const RecurrentGeometry& g, const RecurrentWidths& r, const LayerWeights& w,
                   const float* u, float* conv, std::vector<float>& c) {
  const int32_t keep = g.d_conv - 1;
  c.resize(static_cast<size_t>(r.conv));
  for (int32_t ch = 0; ch < r.conv; ++ch) {
    const float* k = w.conv_kernel.data() + static_cast<size_t>(ch) * static_cast<size_t>(g.d_conv);
    float acc = k[keep] * u[ch];
    for (int32_t j = 0; j < keep; ++j)
      acc += k[j] * conv[j * r.conv + ch];
    c[static_cast<size_t>(ch)] = Silu(acc);
  }
  for (int32_t j = 0; j + 1 < keep; ++j) {
    std::copy_n(conv + (j + 1) * r.conv, r.conv, conv + j * r.conv);
  }
  if (keep > 0) std::copy_n(u, r.conv, conv + (keep - 1) * r.conv);
}

void Mamba1Scan(const RecurrentGeometry& g, const RecurrentWidths& r, const LayerWeights& w,
                const std::vector<float>& c, const float* dts, const float* decays, float* ssm,
                float* y) {
  const int32_t n = g.d_state;
  for (int32_t ch = 0; ch < g.d_inner; ++ch) {
    const float a = decays[ch], x = c[static_cast<size_t>(ch)];
    float acc = w.skip[static_cast<size_t>(ch)] * x;
    for (int32_t s = 0; s < n; ++s) {
      const float b = c[static_cast<size_t>((ch + s + 1) % r.conv)];
      const float cc = c[static_cast<size_t>((ch + s + n) % r.conv)];
      float& st = ssm[ch * n + s];
      st = a * st + dts[ch] * x * b;
      acc += st * cc;
    }
    y[ch] = acc;
  }
}

void Mamba2Scan(const RecurrentGeometry& g, const LayerWeights& w, const std::vector<float>& c,
                const float* dts, const float* decays, float* ssm, float* y) {
  const int32_t n = g.d_state, hd = g.head_dim;
  const float* b = c.data() + g.d_inner;
  const float* cc = b + n;
  for (int32_t head = 0; head < g.n_heads; ++head) {
    const float a = decays[head];
    for (int32_t p = 0; p < hd; ++p) {
      const float x = c[static_cast<size_t>(head * hd + p)];
      float* st = ssm + (head * hd + p) * n;
      float acc = w.skip[static_cast<size_t>(head)] * x;
      for (int32_t s = 0; s < n; ++s) {
        st[s] = a * st[s] + dts[head] * x * b[s];
        acc += st[s] * cc[s];
      }
      y[head * hd + p] = acc;
    }
  }
}

// Gated delta rule: S <- a S + beta (v - a S k) k^T, out = S q.
void GatedDeltaScan(const RecurrentGeometry& g, const LayerWeights& w, std::vector<float>& c,
                    const float* decays, float* ssm, float* y) {
  const int32_t dk = g.k_head_dim, dv = g.v_head_dim, nk = g.num_k_heads;
  // Queries then keys, each head L2-normalised in place (no copies per token).
  float* q = c.data();
  float* k = q + nk * dk;
  for (int32_t head = 0; head < 2 * nk; ++head) {
    float* x = q + head * dk;
    const float inv = 1.0f / std::sqrt(1e-6f + Dot(x, x, dk));
    for (int32_t i = 0; i < dk; ++i)
      x[i] *= inv;
  }
  const float* v = c.data() + 2 * nk * dk;
  for (int32_t head = 0; head < g.num_v_heads; ++head) {
    const float a = decays[head];
    const float beta = 1.0f / (1.0f + std::exp(-w.skip[static_cast<size_t>(head)]));
    const float* kh = k + (head % nk) * dk;
    const float* qh = q + (head % nk) * dk;
    for (int32_t p = 0; p < dv; ++p) {
      float* row = ssm + (head * dv + p) * dk;
      float sk = 0.0f;
      for (int32_t i = 0; i < dk; ++i)
        sk += a * row[i] * kh[i];
      const float delta = beta * (v[head * dv + p] - sk);
      float out = 0.0f;
      for (int32_t i = 0; i < dk; ++i) {
        row[i] = a * row[i] + delta * kh[i];
        out += row[i] * qh[i];
      }
      y[head * dv + p] = out;
    }
  }
}

// One token through a recurrent mixer: `h` is the normed input, `y` (gate width) the output
// before the output projection. The conv state holds the last d_conv - 1 conv inputs, oldest
// first; the ssm state is updated in place.
void RecurrentToken(const LayerSpec& l, const LayerWeights& w, const float* h, float* conv,
                    float* ssm, std::vector<float>& proj, std::vector<float>& c, float* y) {
  const RecurrentWidths r = RecurrentWidthsOf(l);
  const RecurrentGeometry& g = l.recurrent;
  proj.resize(static_cast<size_t>(r.conv + r.gate + 3 * r.heads));  // + step sizes, decays
  MatVec(w.w_in, h, proj.data());
  const float* u = proj.data();
  const float* z = u + r.conv;
  const float* dt_raw = z + r.gate;
  ConvolveToken(g, r, w, u, conv, c);
  // Step size and decay once per head and token (the scans below use them per state element).
  float* dts = proj.data() + (r.conv + r.gate + r.heads);
  float* decays = dts + r.heads;
  for (int32_t head = 0; head < r.heads; ++head) {
    dts[head] = Softplus(dt_raw[head]);
    decays[head] = std::exp(-dts[head] * std::exp(w.decay[static_cast<size_t>(head)]));
  }
  switch (l.kind) {
    case LayerKind::kMamba1:
      Mamba1Scan(g, r, w, c, dts, decays, ssm, y);
      break;
    case LayerKind::kMamba2:
      Mamba2Scan(g, w, c, dts, decays, ssm, y);
      break;
    default:
      GatedDeltaScan(g, w, c, decays, ssm, y);
      break;
  }
  for (int32_t i = 0; i < r.gate; ++i)
    y[i] *= Silu(z[i]);
}

}  // namespace

namespace {

// Index into ModelSpec::layers of the layer whose cache `li` reads (itself unless KV-shared).
int32_t CacheSource(const ModelSpec& spec, size_t li) {
  const LayerSpec& l = spec.layers[li];
  if (l.kv_source_layer >= 0) {
    for (size_t s = 0; s < spec.layers.size(); ++s) {
      if (spec.layers[s].layer == l.kv_source_layer && spec.layers[s].kind == l.kind) {
        return static_cast<int32_t>(s);
      }
    }
  }
  return static_cast<int32_t>(li);
}

// Scratch buffers of one Forward call, reused across layers and positions.
struct Scratch {
  std::vector<float> normed, queries, att, out, scores, absorbed, latent_out;
  std::vector<KvRows> runs;
};

// GQA attention (full, sliding window, chunked, learned sinks, KV-shared) and cross attention,
// over positions [begin, end) whose hidden states are `x` (rows of `hs`).
void Attention(const ModelSpec& spec, size_t li, const LayerWeights& w, int64_t begin, int64_t end,
               const EncoderInput& encoder, const std::vector<float>* encoder_states,
               KvStore& store, std::vector<float>& x, Scratch& s) {
  const LayerSpec& l = spec.layers[li];
  const auto hs = static_cast<size_t>(spec.hidden_size);
  const auto n = static_cast<size_t>(end - begin);
  const int32_t qh = l.num_q_heads, kvh = l.num_kv_heads, d = l.head_dim_k;
  const auto own = static_cast<int32_t>(li);
  const int32_t source = CacheSource(spec, li);
  const bool cross = l.kind == LayerKind::kCrossAttention;
  const SlotView* sv = cross ? nullptr : store.Slots(source);
  // Where position `pos` of the step lives in the layer's cache: its slot for a sparse layer.
  const auto at = [&](int64_t pos) { return sv != nullptr ? sv->first_new + (pos - begin) : pos; };
  if (cross && encoder_states != nullptr) {
    // The encoder's K/V, once per request (the store says whether they are cached already).
    for (int64_t t = 0; t < encoder.tokens; ++t) {
      const KvRows r = store.Rows(own, t);
      const float* e = encoder_states->data() + static_cast<size_t>(t) * hs;
      MatVec(w.wk, e, r.k);
      MatVec(w.wv, e, r.v);
    }
  }
  const auto q_width = static_cast<size_t>(qh * d);
  s.queries.resize(n * q_width);
  for (size_t t = 0; t < n; ++t) {
    const int64_t pos = begin + static_cast<int64_t>(t);
    RmsNorm(x.data() + t * hs, w.attn_norm, s.normed.data());
    float* qt = s.queries.data() + t * q_width;
    MatVec(w.wq, s.normed.data(), qt);
    if (l.rope && !cross) Rope(qt, qh, d, pos);
    if (source == own && !cross) {
      const KvRows r = store.Rows(own, at(pos));
      MatVec(w.wk, s.normed.data(), r.k);
      if (l.rope) Rope(r.k, kvh, d, pos);
      MatVec(w.wv, s.normed.data(), r.v);
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const auto row = static_cast<size_t>(kvh * d);
  s.att.resize(q_width);
  for (size_t t = 0; t < n; ++t) {
    const int64_t pos = begin + static_cast<int64_t>(t);
    s.runs.clear();
    if (cross) {
      GatherRuns(store, source, 0, encoder.tokens, s.runs);
    } else if (sv != nullptr) {
      GatherRuns(store, source, 0, at(pos) + 1, s.runs);
    } else {
      int64_t ranges[2][2];
      const int count = AttendedRanges(l, pos, ranges);
      for (int i = 0; i < count; ++i)
        GatherRuns(store, source, ranges[i][0], ranges[i][1], s.runs);
    }
    // Feedback goes to the policy of the layer that owns the cache, from its own queries.
    const bool observed =
        sv != nullptr && source == own && static_cast<int64_t>(n - t) <= int64_t{sv->feedback_rows};
    Attend(s.runs, s.queries.data() + t * q_width, qh, qh / kvh, d, row, row, scale,
           l.learned_sinks ? w.sink_logits.data() : nullptr, s.scores, s.att.data(),
           observed ? sv->feedback.data() : nullptr, sv != nullptr ? sv->positions.size() : 0);
    MatVec(w.wo, s.att.data(), s.out.data());
    for (size_t i = 0; i < hs; ++i)
      x[t * hs + i] += s.out[i];
  }
}

// Multi-head latent attention in the absorbed form: the cache row is [latent | rope key]; each
// head's no-RoPE query is mapped into latent space through w_uk, and its output read from the
// attention-weighted latent through w_uv.
void LatentAttention(const ModelSpec& spec, size_t li, const LayerWeights& w, int64_t begin,
                     int64_t end, KvStore& store, std::vector<float>& x, Scratch& s) {
  const LayerSpec& l = spec.layers[li];
  const MlaWidths m = MlaWidthsOf(l);
  const auto hs = static_cast<size_t>(spec.hidden_size);
  const auto n = static_cast<size_t>(end - begin);
  const int32_t qh = l.num_q_heads;
  const auto own = static_cast<int32_t>(li);
  const auto q_head = static_cast<size_t>(m.nope + m.rope);
  const auto q_width = static_cast<size_t>(qh) * q_head;
  const SlotView* sv = store.Slots(own);
  const auto at = [&](int64_t pos) { return sv != nullptr ? sv->first_new + (pos - begin) : pos; };
  s.queries.resize(n * q_width);
  for (size_t t = 0; t < n; ++t) {
    const int64_t pos = begin + static_cast<int64_t>(t);
    RmsNorm(x.data() + t * hs, w.attn_norm, s.normed.data());
    float* qt = s.queries.data() + t * q_width;
    MatVec(w.wq, s.normed.data(), qt);
    for (int32_t head = 0; head < qh; ++head)
      Rope(qt + static_cast<size_t>(head) * q_head + m.nope, 1, m.rope, pos);
    float* latent = store.Rows(own, at(pos)).k;
    MatVec(w.wk, s.normed.data(), latent);
    Rope(latent + m.rank, 1, m.rope, pos);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(m.nope + m.rope));
  const auto row = static_cast<size_t>(m.rank + m.rope);
  s.att.resize(static_cast<size_t>(qh * m.v));
  s.absorbed.resize(static_cast<size_t>(qh) * row);
  s.latent_out.resize(static_cast<size_t>(qh) * row);
  for (size_t t = 0; t < n; ++t) {
    const int64_t pos = begin + static_cast<int64_t>(t);
    s.runs.clear();
    GatherRuns(store, own, 0, at(pos) + 1, s.runs);
    // Values are the latent part of the same rows.
    for (KvRows& r : s.runs)
      r.v = r.k;
    // absorbed(head) = [w_uk(head)^T q_nope | q_rope]: one dot product with the cached row.
    for (int32_t head = 0; head < qh; ++head) {
      const float* q = s.queries.data() + t * q_width + static_cast<size_t>(head) * q_head;
      float* a = s.absorbed.data() + static_cast<size_t>(head) * row;
      for (int32_t r = 0; r < m.rank; ++r) {
        float acc = 0.0f;
        for (int32_t i = 0; i < m.nope; ++i) {
          acc += w.w_uk.w[static_cast<size_t>((head * m.nope + i) * m.rank + r)] * q[i];
        }
        a[r] = acc;
      }
      std::copy_n(q + m.nope, m.rope, a + m.rank);
    }
    // Every head attends over the same latent rows: one pass for all of them.
    // One latent serves every head: the feedback has a single KV head.
    const bool observed =
        sv != nullptr && static_cast<int64_t>(n - t) <= int64_t{sv->feedback_rows};
    Attend(s.runs, s.absorbed.data(), qh, qh, m.rank + m.rope, row, row, scale, nullptr, s.scores,
           s.latent_out.data(), observed ? sv->feedback.data() : nullptr,
           sv != nullptr ? sv->positions.size() : 0);
    // The averaged rows include the rope keys; only the latent part feeds w_uv.
    for (int32_t head = 0; head < qh; ++head) {
      const float* lat = s.latent_out.data() + static_cast<size_t>(head) * row;
      for (int32_t i = 0; i < m.v; ++i) {
        const float* wr = w.w_uv.w.data() + static_cast<size_t>((head * m.v + i) * m.rank);
        float acc = 0.0f;
        for (int32_t r = 0; r < m.rank; ++r)
          acc += wr[r] * lat[r];
        s.att[static_cast<size_t>(head * m.v + i)] = acc;
      }
    }
    MatVec(w.wo, s.att.data(), s.out.data());
    for (size_t i = 0; i < hs; ++i)
      x[t * hs + i] += s.out[i];
  }
}

}  // namespace

std::vector<float> StandInEncoder(const EncoderInput& input, int32_t hidden) {
  std::vector<float> states(static_cast<size_t>(input.tokens) * static_cast<size_t>(hidden));
  SplitMix64 rng(input.image * 0x9e3779b97f4a7c15ULL + 0x2545f4914f6cdd1dULL);
  for (float& v : states)
    v = static_cast<float>(2.0 * rng.Unit() - 1.0);
  return states;
}

std::vector<float> Forward(const ModelSpec& spec, const ModelWeights& weights,
                           std::span<const int32_t> tokens, int64_t begin, int64_t end,
                           KvStore& store, const EncoderInput& encoder) {
  const int32_t h = spec.hidden_size;
  const auto n = static_cast<size_t>(end - begin);
  const auto hs = static_cast<size_t>(h);
  std::vector<float> x(n * hs), normed(hs), out(hs), gate, up;
  Scratch scratch;
  scratch.normed.resize(hs);
  scratch.out.resize(hs);
  std::vector<float> encoder_states;
  const bool run_encoder = encoder.tokens > 0 && store.EncoderPending();
  if (run_encoder) encoder_states = StandInEncoder(encoder, h);
  for (size_t t = 0; t < n; ++t) {
    const int32_t tok = tokens[static_cast<size_t>(begin) + t];
    std::copy_n(weights.embed.w.data() + static_cast<size_t>(tok) * hs, hs, x.data() + t * hs);
  }
  for (size_t li = 0; li < spec.layers.size(); ++li) {
    const LayerSpec& l = spec.layers[li];
    const LayerWeights& w = weights.layers[li];
    if (l.kind == LayerKind::kMla) {
      LatentAttention(spec, li, w, begin, end, store, x, scratch);
    } else if (IsAttentionKind(l.kind)) {
      Attention(spec, li, w, begin, end, encoder, run_encoder ? &encoder_states : nullptr, store, x,
                scratch);
    }
    if (IsRecurrentKind(l.kind)) {
      const auto own = static_cast<int32_t>(li);
      float* conv = store.State(own, 0);
      float* ssm = store.State(own, 1);
      std::vector<float> proj, c, y(static_cast<size_t>(RecurrentWidthsOf(l).gate));
      for (size_t t = 0; t < n; ++t) {
        RmsNorm(x.data() + t * hs, w.attn_norm, normed.data());
        RecurrentToken(l, w, normed.data(), conv, ssm, proj, c, y.data());
        MatVec(w.w_out, y.data(), out.data());
        for (size_t i = 0; i < hs; ++i)
          x[t * hs + i] += out[i];
        store.AfterPosition(own, begin + static_cast<int64_t>(t) + 1);
      }
    }
    // SwiGLU MLP after every mixer.
    gate.resize(static_cast<size_t>(w.w_gate.rows));
    up.resize(gate.size());
    for (size_t t = 0; t < n; ++t) {
      RmsNorm(x.data() + t * hs, w.mlp_norm, normed.data());
      MatVec(w.w_gate, normed.data(), gate.data());
      MatVec(w.w_up, normed.data(), up.data());
      for (size_t i = 0; i < gate.size(); ++i)
        gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
      MatVec(w.w_down, gate.data(), out.data());
      for (size_t i = 0; i < hs; ++i)
        x[t * hs + i] += out[i];
    }
  }
  std::vector<float> logits(n * static_cast<size_t>(weights.vocab));
  for (size_t t = 0; t < n; ++t) {
    RmsNorm(x.data() + t * hs, weights.final_norm, normed.data());
    MatVec(weights.lm_head, normed.data(), logits.data() + t * static_cast<size_t>(weights.vocab));
  }
  return logits;
}

ContiguousKvStore::ContiguousKvStore(const ModelSpec& spec, int64_t tokens,
                                     int64_t encoder_tokens) {
  for (const LayerSpec& l : spec.layers) {
    Layer c;
    c.k_width = static_cast<size_t>(l.num_kv_heads) * static_cast<size_t>(l.head_dim_k);
    c.v_width = static_cast<size_t>(l.num_kv_heads) * static_cast<size_t>(l.head_dim_v);
    c.rows = l.kind == LayerKind::kCrossAttention ? encoder_tokens : tokens;
    c.k.resize(c.k_width * static_cast<size_t>(c.rows));
    c.v.resize(c.v_width * static_cast<size_t>(c.rows));
    if (!l.state.empty()) {
      c.conv.resize(static_cast<size_t>(l.state[0].elements()));
      c.ssm.resize(static_cast<size_t>(l.state[1].elements()));
    }
    layers_.push_back(std::move(c));
  }
}

KvRows ContiguousKvStore::Rows(int32_t layer, int64_t pos) {
  Layer& c = layers_[static_cast<size_t>(layer)];
  const auto p = static_cast<size_t>(pos);
  return {c.k.data() + c.k_width * p, c.v_width == 0 ? nullptr : c.v.data() + c.v_width * p,
          c.rows - pos};
}

float* ContiguousKvStore::State(int32_t layer, int which) {
  Layer& c = layers_[static_cast<size_t>(layer)];
  return (which == 0 ? c.conv : c.ssm).data();
}

std::vector<float> DenseLogits(const ModelSpec& spec, const ModelWeights& weights,
                               std::span<const int32_t> tokens, const EncoderInput& encoder) {
  const auto n = static_cast<int64_t>(tokens.size());
  ContiguousKvStore store(spec, n, encoder.tokens);
  return Forward(spec, weights, tokens, 0, n, store, encoder);
}

int32_t Argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace hkv
