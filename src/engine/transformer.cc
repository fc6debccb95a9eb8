#include <algorithm>
#include <cmath>

#include <hkv/engine/transformer.h>

namespace hkv {
namespace {

void MatVec(const Matrix& m, const float* x, float* y) {
  for (int32_t r = 0; r < m.rows; ++r) {
    const float* row = m.w.data() + static_cast<size_t>(r) * static_cast<size_t>(m.cols);
    float acc = 0.0f;
    for (int32_t c = 0; c < m.cols; ++c)
      acc += row[c] * x[c];
    y[r] = acc;
  }
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

bool Attends(const LayerSpec& l, int64_t q, int64_t j) {
  if (j > q) return false;
  switch (l.kind) {
    case LayerKind::kSlidingWindow:
      return j > q - l.window || j < l.sink_tokens;
    case LayerKind::kChunkedLocal:
      return j >= q / l.chunk * l.chunk;
    default:
      return true;
  }
}

// Keeps private K/V and states for every layer: the dense reference's store.
class DenseStore : public KvStore {
 public:
  DenseStore(const ModelSpec& spec, int64_t tokens) : rows_(spec.layers.size()) {
    for (size_t i = 0; i < spec.layers.size(); ++i) {
      const LayerSpec& l = spec.layers[i];
      width_.push_back(static_cast<size_t>(l.num_kv_heads) * static_cast<size_t>(l.head_dim_k));
      k_.emplace_back(width_.back() * static_cast<size_t>(tokens));
      v_.emplace_back(width_.back() * static_cast<size_t>(tokens));
      conv_.emplace_back(l.state.empty() ? 0 : static_cast<size_t>(l.state[0].elements()), 0.0f);
      ssm_.emplace_back(l.state.empty() ? 0 : static_cast<size_t>(l.state[1].elements()), 0.0f);
    }
  }
  float* State(int32_t layer, int which) override {
    return (which == 0 ? conv_ : ssm_)[static_cast<size_t>(layer)].data();
  }
  void AfterPosition(int32_t, int64_t) override {}
  float* Key(int32_t layer, int64_t pos) override {
    return k_[static_cast<size_t>(layer)].data() + width_[static_cast<size_t>(layer)] * pos;
  }
  float* Value(int32_t layer, int64_t pos) override {
    return v_[static_cast<size_t>(layer)].data() + width_[static_cast<size_t>(layer)] * pos;
  }

 private:
  size_t rows_;
  std::vector<size_t> width_;
  std::vector<std::vector<float>> k_, v_, conv_, ssm_;
};

float Silu(float v) {
  return v / (1.0f + std::exp(-v));
}
float Softplus(float v) {
  return v > 20.0f ? v : std::log1p(std::exp(v));
}

// One token through a recurrent mixer: `h` is the normed input, `y` (gate width) the output
// before the output projection. The conv state holds the last d_conv - 1 conv inputs, oldest
// first; the ssm state is updated in place.
void RecurrentToken(const LayerSpec& l, const LayerWeights& w, const float* h, float* conv,
                    float* ssm, std::vector<float>& proj, std::vector<float>& c, float* y) {
  const RecurrentWidths r = RecurrentWidthsOf(l);
  const RecurrentGeometry& g = l.recurrent;
  proj.resize(static_cast<size_t>(r.conv + r.gate + r.heads));
  MatVec(w.w_in, h, proj.data());
  const float* u = proj.data();
  const float* z = u + r.conv;
  const float* dt_raw = z + r.gate;
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
  const auto dt = [&](int32_t head) { return Softplus(dt_raw[head]); };
  const auto decay = [&](int32_t head) {
    return std::exp(-dt(head) * std::exp(w.decay[static_cast<size_t>(head)]));
  };
  switch (l.kind) {
    case LayerKind::kMamba1: {
      const int32_t n = g.d_state;
      for (int32_t ch = 0; ch < g.d_inner; ++ch) {
        const float a = decay(ch), x = c[static_cast<size_t>(ch)];
        float acc = w.skip[static_cast<size_t>(ch)] * x;
        for (int32_t s = 0; s < n; ++s) {
          const float b = c[static_cast<size_t>((ch + s + 1) % r.conv)];
          const float cc = c[static_cast<size_t>((ch + s + n) % r.conv)];
          float& st = ssm[ch * n + s];
          st = a * st + dt(ch) * x * b;
          acc += st * cc;
        }
        y[ch] = acc;
      }
      break;
    }
    case LayerKind::kMamba2: {
      const int32_t n = g.d_state, hd = g.head_dim;
      const float* b = c.data() + g.d_inner;
      const float* cc = b + n;
      for (int32_t head = 0; head < g.n_heads; ++head) {
        const float a = decay(head);
        for (int32_t p = 0; p < hd; ++p) {
          const float x = c[static_cast<size_t>(head * hd + p)];
          float* st = ssm + (head * hd + p) * n;
          float acc = w.skip[static_cast<size_t>(head)] * x;
          for (int32_t s = 0; s < n; ++s) {
            st[s] = a * st[s] + dt(head) * x * b[s];
            acc += st[s] * cc[s];
          }
          y[head * hd + p] = acc;
        }
      }
      break;
    }
    default: {  // gated delta rule: S <- a S + beta (v - a S k) k^T, out = S q
      const int32_t dk = g.k_head_dim, dv = g.v_head_dim, nk = g.num_k_heads;
      std::vector<float> q(c.begin(), c.begin() + nk * dk),
          k(c.begin() + nk * dk, c.begin() + 2 * nk * dk);
      for (std::vector<float>* v : {&q, &k}) {
        for (int32_t head = 0; head < nk; ++head) {
          float ss = 1e-6f;
          for (int32_t i = 0; i < dk; ++i)
            ss +=
                (*v)[static_cast<size_t>(head * dk + i)] * (*v)[static_cast<size_t>(head * dk + i)];
          const float inv = 1.0f / std::sqrt(ss);
          for (int32_t i = 0; i < dk; ++i)
            (*v)[static_cast<size_t>(head * dk + i)] *= inv;
        }
      }
      const float* v = c.data() + 2 * nk * dk;
      for (int32_t head = 0; head < g.num_v_heads; ++head) {
        const float a = decay(head);
        const float beta = 1.0f / (1.0f + std::exp(-w.skip[static_cast<size_t>(head)]));
        const float* kh = k.data() + (head % nk) * dk;
        const float* qh = q.data() + (head % nk) * dk;
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
      break;
    }
  }
  for (int32_t i = 0; i < r.gate; ++i)
    y[i] *= Silu(z[i]);
}

}  // namespace

std::vector<float> Forward(const ModelSpec& spec, const ModelWeights& weights,
                           std::span<const int32_t> tokens, int64_t begin, int64_t end,
                           KvStore& store) {
  const int32_t h = spec.hidden_size;
  const auto n = static_cast<size_t>(end - begin);
  const auto hs = static_cast<size_t>(h);
  std::vector<float> x(n * hs), normed(hs), buf, q, att, out(hs), gate, up;
  for (size_t t = 0; t < n; ++t) {
    const int32_t tok = tokens[static_cast<size_t>(begin) + t];
    std::copy_n(weights.embed.w.data() + static_cast<size_t>(tok) * hs, hs, x.data() + t * hs);
  }
  for (size_t li = 0; li < spec.layers.size(); ++li) {
    const LayerSpec& l = spec.layers[li];
    const LayerWeights& w = weights.layers[li];
    if (IsAttentionKind(l.kind)) {
      const int32_t qh = l.num_q_heads, kvh = l.num_kv_heads, d = l.head_dim_k;
      const auto own = static_cast<int32_t>(li);
      const int32_t source = l.kv_source_layer < 0 ? own : [&] {
        for (size_t s = 0; s < spec.layers.size(); ++s) {
          if (spec.layers[s].layer == l.kv_source_layer && spec.layers[s].kind == l.kind) {
            return static_cast<int32_t>(s);
          }
        }
        return own;
      }();
      std::vector<float> queries(n * static_cast<size_t>(qh * d));
      buf.resize(static_cast<size_t>(kvh * d));
      for (size_t t = 0; t < n; ++t) {
        const int64_t pos = begin + static_cast<int64_t>(t);
        RmsNorm(x.data() + t * hs, w.attn_norm, normed.data());
        float* qt = queries.data() + t * static_cast<size_t>(qh * d);
        MatVec(w.wq, normed.data(), qt);
        if (l.rope) Rope(qt, qh, d, pos);
        if (source == own) {
          float* k = store.Key(own, pos);
          MatVec(w.wk, normed.data(), k);
          if (l.rope) Rope(k, kvh, d, pos);
          MatVec(w.wv, normed.data(), store.Value(own, pos));
        }
      }
      const float scale = 1.0f / std::sqrt(static_cast<float>(d));
      std::vector<float> scores;
      att.resize(static_cast<size_t>(qh * d));
      for (size_t t = 0; t < n; ++t) {
        const int64_t pos = begin + static_cast<int64_t>(t);
        const float* qt = queries.data() + t * static_cast<size_t>(qh * d);
        std::fill(att.begin(), att.end(), 0.0f);
        for (int32_t head = 0; head < qh; ++head) {
          const int32_t kv = head / (qh / kvh);
          const float* qv = qt + head * d;
          scores.clear();
          float mx = l.learned_sinks ? w.sink_logits[static_cast<size_t>(head)] : -INFINITY;
          for (int64_t j = 0; j <= pos; ++j) {
            if (!Attends(l, pos, j)) continue;
            const float* k = store.Key(source, j) + kv * d;
            float s = 0.0f;
            for (int32_t i = 0; i < d; ++i)
              s += qv[i] * k[i];
            scores.push_back(s * scale);
            mx = std::max(mx, scores.back());
          }
          float denom =
              l.learned_sinks ? std::exp(w.sink_logits[static_cast<size_t>(head)] - mx) : 0.0f;
          for (float& s : scores) {
            s = std::exp(s - mx);
            denom += s;
          }
          float* o = att.data() + head * d;
          size_t k = 0;
          for (int64_t j = 0; j <= pos; ++j) {
            if (!Attends(l, pos, j)) continue;
            const float* v = store.Value(source, j) + kv * d;
            const float p = scores[k++] / denom;
            for (int32_t i = 0; i < d; ++i)
              o[i] += p * v[i];
          }
        }
        MatVec(w.wo, att.data(), out.data());
        for (size_t i = 0; i < hs; ++i)
          x[t * hs + i] += out[i];
      }
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

std::vector<float> DenseLogits(const ModelSpec& spec, const ModelWeights& weights,
                               std::span<const int32_t> tokens) {
  const auto n = static_cast<int64_t>(tokens.size());
  DenseStore store(spec, n);
  return Forward(spec, weights, tokens, 0, n, store);
}

int32_t Argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace hkv
