#include "synthetic_sequence.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include <hkv/common/splitmix64.h>

namespace hkv::policy_internal {
namespace {

// Unit-variance noise from SplitMix64: the centred sum of four 16-bit uniforms (one draw each),
// scaled. Close to normal (bounded by +-3.46), fixed by the seed with every standard library
// (<random>'s distributions are implementation-defined), and several times cheaper than
// Box-Muller's log and sincos, which dominated the evaluation's time.
class Noise {
 public:
  explicit Noise(uint64_t seed) : rng_(seed) {}
  float Next() {
    uint64_t bits = rng_.Next();
    double sum = 0;
    for (int i = 0; i < 4; ++i, bits >>= 16)
      sum += (static_cast<double>(bits & 0xFFFF) + 0.5) * 0x1.0p-16;
    // Each uniform has variance 1/12: four have 1/3.
    return static_cast<float>((sum - 2.0) * std::numbers::sqrt3);
  }
  SplitMix64& rng() { return rng_; }

 private:
  SplitMix64 rng_;
};

// A random unit vector, made orthogonal to `away` (a unit vector, or empty) so that two planted
// directions do not leak into each other's logits.
std::vector<double> UnitDirection(Noise& noise, int32_t dim, const std::vector<double>& away) {
  std::vector<double> v(static_cast<size_t>(dim));
  for (double& x : v)
    x = noise.Next();
  if (!away.empty() && dim > 1) {
    double dot = 0;
    for (int32_t d = 0; d < dim; ++d)
      dot += v[d] * away[d];
    for (int32_t d = 0; d < dim; ++d)
      v[d] -= dot * away[d];
  }
  double norm = 0;
  for (double x : v)
    norm += x * x;
  norm = std::sqrt(norm);
  for (double& x : v)
    x = norm > 0 ? x / norm : 0;
  return v;
}

// Eight partial sums, so the compiler can keep them in one vector register without reassociating
// a single float sum (which -O2 without -ffast-math never does).
float Dot(const float* a, const float* b, int32_t n) {
  float acc[8] = {};
  int32_t d = 0;
  for (; d + 8 <= n; d += 8) {
    for (int32_t i = 0; i < 8; ++i)
      acc[i] += a[d + i] * b[d + i];
  }
  float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; d < n; ++d)
    sum += a[d] * b[d];
  return sum;
}

}  // namespace

SyntheticSequence::SyntheticSequence(const SyntheticEvalOptions& o, uint64_t trial_seed)
    : kv_heads_(o.num_kv_heads),
      group_(o.group),
      dim_(o.head_dim),
      length_(o.prompt_len + o.decode_steps) {
  Noise noise(trial_seed);
  const SyntheticShape& s = o.shape;
  const int64_t prompt = o.prompt_len;
  const int64_t question_from = prompt - o.question_tokens;
  needle_ = o.needle_position >= 0 ? o.needle_position
                                   : 1 + noise.rng().Below(static_cast<int32_t>(question_from - 1));
  std::vector<uint8_t> heavy(static_cast<size_t>(length_), 0);
  for (int64_t j = 1; j < prompt; ++j) {
    const bool pick = noise.rng().Unit() < s.heavy_share;  // drawn for every j: fixed stream
    heavy[j] = pick && j != needle_ ? 1 : 0;
  }
  const auto asks = [&](int64_t t) {
    return (t >= question_from && t < prompt) || t == length_ - 1;
  };

  // A key and a query carrying a unit direction with amplitude a each add a * a / sqrt(d) to the
  // logit: amplitude sqrt(L * sqrt(d)) adds L.
  const double root_d = std::sqrt(static_cast<double>(dim_));
  const auto amplitude = [&](double logit) { return std::sqrt(logit * root_d); };
  const double a_sink = amplitude(s.sink_logit), a_local = amplitude(s.local_logit);
  const double a_needle = amplitude(s.needle_logit);
  // The sink's lead is made by taking from the others: every other key carries -a_sink of the
  // sink direction (costing it sink_logit against every query), the sink none, a heavy hitter
  // heavy_logit's worth less. Relative logits are as if the sink and heavy hitters carried the
  // direction instead, but the attended keys are the ones with the smaller norm, as Devoto et al.
  // (2024) observe in trained models, rather than the larger, which would invert knorm's signal.
  const double ordinary = -a_sink;
  const double heavy_part = a_sink > 0 ? ordinary + s.heavy_logit * root_d / a_sink : 0;
  const double rho = std::exp(-1.0 / s.local_tokens);
  const double fresh = std::sqrt(1.0 - rho * rho);
  const double step_sd = 1.0 / root_d;  // a topic draw has unit expected norm

  const auto n = static_cast<size_t>(length_);
  const auto d = static_cast<size_t>(dim_);
  const auto kv = static_cast<size_t>(kv_heads_);
  const auto qh = static_cast<size_t>(query_heads());
  q_.assign(n * qh * d, 0.0f);
  k_.assign(kv * n * d, 0.0f);
  v_.assign(n * kv * d, 0.0f);
  for (size_t h = 0; h < kv; ++h) {
    const std::vector<double> sink = UnitDirection(noise, dim_, {});
    const std::vector<double> needle = UnitDirection(noise, dim_, sink);
    std::vector<double> topic(d);
    for (double& x : topic)
      x = step_sd * noise.Next();
    for (size_t t = 0; t < n; ++t) {
      if (t > 0) {
        for (double& x : topic)
          x = rho * x + fresh * step_sd * noise.Next();
      }
      float* key = &k_[(h * n + t) * d];
      const double key_sink = t == 0 ? 0.0 : heavy[t] != 0 ? heavy_part : ordinary;
      const double key_needle = static_cast<int64_t>(t) == needle_ ? a_needle : 0.0;
      for (size_t i = 0; i < d; ++i) {
        key[i] = static_cast<float>(noise.Next() + key_sink * sink[i] + a_local * topic[i] +
                                    key_needle * needle[i]);
      }
      // Values carry no structure: no metric reads them; they are there for policies that rank
      // by the cache as written.
      float* value = &v_[(t * kv + h) * d];
      for (size_t i = 0; i < d; ++i)
        value[i] = noise.Next();
      const double query_needle = asks(static_cast<int64_t>(t)) ? a_needle : 0.0;
      for (size_t g = 0; g < static_cast<size_t>(group_); ++g) {
        float* query = &q_[(t * qh + h * static_cast<size_t>(group_) + g) * d];
        for (size_t i = 0; i < d; ++i) {
          query[i] = static_cast<float>(noise.Next() + a_sink * sink[i] + a_local * topic[i] +
                                        query_needle * needle[i]);
        }
      }
    }
  }
}

void SyntheticSequence::Rows(int64_t begin, int64_t end, std::vector<float>& keys,
                             std::vector<float>& values) const {
  const auto n = static_cast<size_t>(length_);
  const auto d = static_cast<size_t>(dim_);
  const auto kv = static_cast<size_t>(kv_heads_);
  const auto first = static_cast<size_t>(begin), last = static_cast<size_t>(end);
  keys.resize((last - first) * kv * d);
  for (size_t t = first; t < last; ++t) {
    for (size_t h = 0; h < kv; ++h)
      std::copy_n(&k_[(h * n + t) * d], d, &keys[((t - first) * kv + h) * d]);
  }
  values.assign(v_.begin() + static_cast<std::ptrdiff_t>(first * kv * d),
                v_.begin() + static_cast<std::ptrdiff_t>(last * kv * d));
}

void SyntheticSequence::Logits(int64_t begin, int64_t end, std::vector<float>& out) const {
  const auto qh = static_cast<size_t>(query_heads());
  const auto d = static_cast<size_t>(dim_);
  const auto n = static_cast<size_t>(length_);
  const auto stride = static_cast<size_t>(end);
  const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dim_)));
  out.resize(static_cast<size_t>(end - begin) * qh * stride);
  for (int64_t r = begin; r < end; ++r) {
    for (size_t h = 0; h < qh; ++h) {
      const float* query = &q_[(static_cast<size_t>(r) * qh + h) * d];
      const float* keys = &k_[h / static_cast<size_t>(group_) * n * d];
      float* row = &out[(static_cast<size_t>(r - begin) * qh + h) * stride];
      for (int64_t c = 0; c <= r; ++c)
        row[c] = scale * Dot(query, keys + static_cast<size_t>(c) * d, dim_);
    }
  }
}

}  // namespace hkv::policy_internal
