// The sparse-KV policies against oracles computed here from explicit attention matrices: a
// random multi-head (GQA) attention runs over a sequence in prefill chunks and decode steps,
// softmax over the tokens each policy kept, and each policy's scores and kept sets are checked
// against what its definition says, step by step, with the cache compacted as it chooses.
#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include <hkv/policy/policies.h>

namespace hkv {
namespace {

constexpr int kKvHeads = 2, kGroup = 3, kDim = 8;

// Random queries and keys per position: q[pos][q head][dim], k[pos][kv head][dim].
struct Qk {
  std::vector<std::vector<std::vector<float>>> q, k;
  explicit Qk(int64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    q.resize(static_cast<size_t>(n));
    k.resize(static_cast<size_t>(n));
    for (int64_t p = 0; p < n; ++p) {
      q[p].assign(kKvHeads * kGroup, std::vector<float>(kDim));
      k[p].assign(kKvHeads, std::vector<float>(kDim));
      for (auto& v : q[p])
        for (float& x : v)
          x = d(rng);
      for (auto& v : k[p])
        for (float& x : v)
          x = d(rng);
    }
  }
  // Softmax weights of query position qp, query head qh, over the cached positions it may see.
  std::vector<double> Row(int64_t qp, int qh, const std::vector<int64_t>& cached) const {
    const int kvh = qh / kGroup;
    std::vector<double> logit(cached.size(), -INFINITY);
    double mx = -INFINITY;
    for (size_t i = 0; i < cached.size(); ++i) {
      if (cached[i] > qp) continue;
      double dot = 0;
      for (int d = 0; d < kDim; ++d)
        dot += double{q[qp][qh][d]} * double{k[cached[i]][kvh][d]};
      logit[i] = dot / std::sqrt(double{kDim});
      mx = std::max(mx, logit[i]);
    }
    double z = 0;
    for (double& l : logit) {
      l = std::isinf(l) ? 0.0 : std::exp(l - mx);
      z += l;
    }
    for (double& l : logit)
      l /= z;
    return logit;
  }
  // The feedback of a step over `cached`: rows [from, end) summed, mean over each KV head's
  // query heads, as float32 [kv head][slot]; also the per-slot mean over KV heads in double.
  std::vector<float> Feedback(int64_t from, int64_t end, const std::vector<int64_t>& cached,
                              std::vector<double>* mean) const {
    std::vector<float> w(kKvHeads * cached.size(), 0.0f);
    if (mean != nullptr) mean->assign(cached.size(), 0.0);
    for (int h = 0; h < kKvHeads; ++h) {
      std::vector<double> acc(cached.size(), 0.0);
      for (int64_t r = from; r < end; ++r) {
        for (int g = 0; g < kGroup; ++g) {
          const std::vector<double> row = Row(r, h * kGroup + g, cached);
          for (size_t i = 0; i < cached.size(); ++i)
            acc[i] += row[i] / kGroup;
        }
      }
      for (size_t i = 0; i < cached.size(); ++i) {
        w[h * cached.size() + i] = static_cast<float>(acc[i]);
        if (mean != nullptr) (*mean)[i] += acc[i] / kKvHeads;
      }
    }
    return w;
  }
};

// Drives a policy over steps (prefill chunks, then single tokens), compacting to what it keeps
// at `budget` after each step. `check` sees the cache (before compaction), the step, and the
// requested rows' per-slot attention (mean over KV heads) after every Observe.
template <typename Check>
void Drive(KvPolicy& policy, const Qk& qk, const std::vector<int32_t>& steps, int64_t prompt,
           int64_t budget, Check&& check) {
  std::vector<int64_t> cached;
  int64_t pos = 0;
  for (int32_t count : steps) {
    const PolicyStep step{pos, count, pos < prompt && pos + count >= prompt};
    for (int32_t i = 0; i < count; ++i)
      cached.push_back(pos + i);
    if (policy.WantsKeys()) {  // the step's keys, as an engine writes them
      std::vector<float> keys;
      for (int64_t p = pos; p < pos + count; ++p)
        for (const auto& head : qk.k[static_cast<size_t>(p)])
          keys.insert(keys.end(), head.begin(), head.end());
      const std::span<const int64_t> fresh = std::span<const int64_t>(cached).last(count);
      policy.Written({fresh, kKvHeads, kKvHeads * kDim, 0, keys, {}});
    }
    pos += count;
    const int32_t rows = std::min(policy.AttentionRows(step), count);
    std::vector<double> mean;
    const std::vector<float> w = qk.Feedback(pos - rows, pos, cached, &mean);
    AttentionFeedback fb;
    if (rows > 0) fb = {kKvHeads, rows, w};
    policy.Observe(cached, step, fb);
    check(cached, step, rows, mean);
    std::vector<int32_t> keep;
    policy.Select(cached, budget, keep);
    ASSERT_TRUE(std::is_sorted(keep.begin(), keep.end()));
    policy.Compact(keep);
    std::vector<int64_t> kept;
    for (int32_t s : keep)
      kept.push_back(cached[static_cast<size_t>(s)]);
    cached = kept;
  }
}

// The positions `policy` keeps of `cached` at `budget`.
std::set<int64_t> KeptPositions(const KvPolicy& policy, const std::vector<int64_t>& cached,
                                int64_t budget) {
  std::vector<int32_t> keep;
  policy.Select(cached, budget, keep);
  std::set<int64_t> got;
  for (int32_t k : keep)
    got.insert(cached[static_cast<size_t>(k)]);
  return got;
}

std::unique_ptr<KvPolicy> Make(PolicyConfig c) {
  auto p = MakePolicy(c);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return std::move(p).value();
}

const std::vector<int32_t> kSteps = {11, 7, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};

// The top `n` positions by score (higher first, ties to the later position), as a set.
std::set<int64_t> Top(const std::vector<int64_t>& pos, const std::vector<double>& score, size_t n,
                      const std::set<int64_t>& exclude) {
  std::vector<size_t> idx;
  for (size_t i = 0; i < pos.size(); ++i)
    if (!exclude.contains(pos[i])) idx.push_back(i);
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
    return score[a] != score[b] ? score[a] > score[b] : pos[a] > pos[b];
  });
  std::set<int64_t> out;
  for (size_t i = 0; i < std::min(n, idx.size()); ++i)
    out.insert(pos[idx[i]]);
  return out;
}

TEST(PolicyTest, H2OScoresAreColumnSumsOfTheExplicitAttention) {
  for (bool normalize : {false, true}) {
    PolicyConfig c;
    c.kind = PolicyKind::kH2O;
    c.recent = 3;
    c.normalize_by_age = normalize;
    auto policy = Make(c);
    const Qk qk(40, 7);
    std::map<int64_t, double> sum, rows;  // per position, over every step so far
    int64_t evicted_steps = 0;
    Drive(*policy, qk, kSteps, 18, 12,
          [&](const std::vector<int64_t>& cached, const PolicyStep& step, int32_t r,
              const std::vector<double>& mean) {
            ASSERT_EQ(r, step.count);  // h2o wants every row
            for (size_t i = 0; i < cached.size(); ++i) {
              sum[cached[i]] += mean[i];
              rows[cached[i]] +=
                  static_cast<double>(step.first + step.count - std::max(cached[i], step.first));
            }
            std::vector<float> got;
            policy->Scores(cached, got);
            ASSERT_EQ(got.size(), cached.size());
            for (size_t i = 0; i < cached.size(); ++i) {
              const double want = normalize ? sum[cached[i]] / rows[cached[i]] : sum[cached[i]];
              EXPECT_NEAR(got[i], want, 1e-5) << "position " << cached[i];
            }
            if (cached.size() > 12) ++evicted_steps;
          });
    EXPECT_GT(evicted_steps, 10);
  }
}

TEST(PolicyTest, H2OKeepsTheRecentWindowAndTheHeaviestHitters) {
  PolicyConfig c;
  c.kind = PolicyKind::kH2O;
  c.recent = 4;
  auto policy = Make(c);
  const Qk qk(40, 9);
  Drive(*policy, qk, kSteps, 18, 10,
        [&](const std::vector<int64_t>& cached, const PolicyStep&, int32_t,
            const std::vector<double>&) {
          std::vector<float> s;
          policy->Scores(cached, s);
          const std::set<int64_t> got = KeptPositions(*policy, cached, 10);
          if (cached.size() <= 10) {
            EXPECT_EQ(got.size(), cached.size());
            return;
          }
          std::set<int64_t> recent(cached.end() - 4, cached.end());
          std::set<int64_t> want = recent;
          const std::vector<double> score(s.begin(), s.end());
          for (int64_t p : Top(cached, score, 6, recent))
            want.insert(p);
          EXPECT_EQ(got, want);
        });
}

TEST(PolicyTest, StreamingLlmKeepsExactlySinksAndRecent) {
  PolicyConfig c;
  c.kind = PolicyKind::kStreamingLlm;
  c.sinks = 2;
  auto policy = Make(c);
  const Qk qk(40, 3);
  Drive(*policy, qk, kSteps, 18, 9,
        [&](const std::vector<int64_t>& cached, const PolicyStep& step, int32_t rows,
            const std::vector<double>&) {
          EXPECT_EQ(rows, 0);  // needs no attention
          const std::set<int64_t> got = KeptPositions(*policy, cached, 9);
          const int64_t t = step.first + step.count;  // tokens so far
          std::set<int64_t> want;
          for (int64_t p = 0; p < std::min<int64_t>(t, 2); ++p)
            want.insert(p);
          for (int64_t p = std::max<int64_t>(2, t - 7); p < t; ++p)
            want.insert(p);
          EXPECT_EQ(got, want) << "after " << t << " tokens";
        });
}

TEST(PolicyTest, TovaKeepsTheTopOfTheLastQuerysAttention) {
  auto policy = Make({.kind = PolicyKind::kTova});
  const Qk qk(40, 11);
  Drive(*policy, qk, kSteps, 18, 8,
        [&](const std::vector<int64_t>& cached, const PolicyStep&, int32_t rows,
            const std::vector<double>& last) {
          EXPECT_EQ(rows, 1);
          const std::set<int64_t> got = KeptPositions(*policy, cached, 8);
          EXPECT_EQ(got, Top(cached, last, 8, {}));
        });
}

TEST(PolicyTest, KnormKeepsTheRecentWindowAndTheSmallestKeyNorms) {
  auto policy = Make({.kind = PolicyKind::kKnorm, .recent = 3});
  EXPECT_TRUE(policy->WantsKeys());
  const Qk qk(40, 13);
  const auto norm = [&](int64_t p) {  // mean over KV heads of each head's key L2 norm
    double total = 0;
    for (const auto& head : qk.k[static_cast<size_t>(p)]) {
      double ss = 0;
      for (float x : head)
        ss += double{x} * x;
      total += std::sqrt(ss);
    }
    return total / kKvHeads;
  };
  int checks = 0;
  Drive(*policy, qk, kSteps, 18, 9,
        [&](const std::vector<int64_t>& cached, const PolicyStep&, int32_t rows,
            const std::vector<double>&) {
          EXPECT_EQ(rows, 0);  // no attention weights needed
          if (cached.size() <= 9) return;
          std::set<int64_t> want(cached.end() - 3, cached.end());
          std::vector<double> score;
          for (int64_t p : cached)
            score.push_back(-norm(p));
          for (int64_t p : Top(cached, score, 6, want))
            want.insert(p);
          EXPECT_EQ(KeptPositions(*policy, cached, 9), want);
          ++checks;
        });
  EXPECT_EQ(checks, 16);
}

TEST(PolicyTest, SnapKvCutsThePromptOnceByPooledWindowAttention) {
  for (bool max_pool : {false, true}) {
    PolicyConfig c;
    c.kind = PolicyKind::kSnapKv;
    c.window = 4;
    c.kernel = 3;
    c.max_pool = max_pool;
    auto policy = Make(c);
    const Qk qk(40, 13);
    const std::vector<int32_t> steps = {12, 10, 1, 1, 1, 1, 1};
    int64_t prompt_checked = 0;
    Drive(*policy, qk, steps, 22, 10,
          [&](const std::vector<int64_t>& cached, const PolicyStep& step, int32_t rows,
              const std::vector<double>& raw) {
            const std::set<int64_t> got = KeptPositions(*policy, cached, 10);
            if (!step.ends_prompt) {
              EXPECT_EQ(rows, 0);
              EXPECT_EQ(got.size(), cached.size());  // before: no signal; after: all kept
              return;
            }
            EXPECT_EQ(rows, 4);
            std::vector<double> pooled(cached.size());
            for (size_t i = 0; i < cached.size(); ++i) {
              const size_t lo = i == 0 ? 0 : i - 1, hi = std::min(i + 1, cached.size() - 1);
              double acc = max_pool ? raw[lo] : 0;
              for (size_t j = lo; j <= hi; ++j)
                acc = max_pool ? std::max(acc, raw[j]) : acc + raw[j];
              pooled[i] = max_pool ? acc : acc / static_cast<double>(hi - lo + 1);
            }
            std::set<int64_t> window = {18, 19, 20, 21};
            std::set<int64_t> want = window;
            for (int64_t p : Top(cached, pooled, 6, window))
              want.insert(p);
            EXPECT_EQ(got, want);
            ++prompt_checked;
          });
    EXPECT_EQ(prompt_checked, 1);
  }
}

TEST(PolicyTest, EveryPolicyKeepsEverythingWithinItsBudget) {
  for (PolicyKind kind : {PolicyKind::kDense, PolicyKind::kStreamingLlm, PolicyKind::kH2O,
                          PolicyKind::kTova, PolicyKind::kSnapKv, PolicyKind::kKnorm}) {
    auto policy = Make({.kind = kind});
    const Qk qk(40, 5);
    Drive(*policy, qk, kSteps, 18, 40,
          [&](const std::vector<int64_t>& cached, const PolicyStep&, int32_t,
              const std::vector<double>&) {
            std::vector<int32_t> keep;
            policy->Select(cached, 40, keep);
            EXPECT_EQ(keep.size(), cached.size()) << PolicyKindName(kind);
          });
  }
  // Dense ignores the budget altogether.
  auto dense = Make({.kind = PolicyKind::kDense});
  const std::vector<int64_t> positions = {0, 1, 2, 3, 4};
  std::vector<int32_t> keep;
  dense->Select(positions, 1, keep);
  EXPECT_EQ(keep.size(), 5u);
}

TEST(PolicyTest, EqualScoresKeepTheMoreRecentTokens) {
  auto policy = Make({.kind = PolicyKind::kTova});
  const std::vector<int64_t> positions = {0, 1, 2, 3, 4, 5};
  const std::vector<float> flat(6, 1.0f / 6);
  policy->Observe(positions, {5, 1, false}, {1, 1, flat});
  std::vector<int32_t> keep;
  policy->Select(positions, 2, keep);
  EXPECT_EQ(keep, (std::vector<int32_t>{4, 5}));
}

TEST(PolicyTest, NanWeightsRankLowestAndUnseenSlotsCompactToZero) {
  auto policy = Make({.kind = PolicyKind::kTova});
  const std::vector<int64_t> positions = {0, 1, 2, 3};
  const std::vector<float> w = {0.5f, std::nanf(""), 0.1f, 0.4f};
  policy->Observe(positions, {3, 1, false}, {1, 1, w});
  std::vector<int32_t> keep;
  policy->Select(positions, 2, keep);
  EXPECT_EQ(keep, (std::vector<int32_t>{0, 3}));
  // A cache larger than what the policy observed: unseen slots score 0 and compact safely.
  const std::vector<int32_t> kept = {0, 4, 5};
  policy->Compact(kept);
  std::vector<float> s;
  policy->Scores(std::vector<int64_t>{0, 4, 5}, s);
  EXPECT_EQ(s, (std::vector<float>{0.5f, 0.0f, 0.0f}));
}

TEST(PolicyTest, BadOptionsAndBudgetsAreRefusedByName) {
  EXPECT_EQ(ParsePolicyKind("h2o").value(), PolicyKind::kH2O);
  EXPECT_EQ(ParsePolicyKind("streaming_llm").value(), PolicyKind::kStreamingLlm);
  const auto bad = ParsePolicyKind("lru");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'lru'"), std::string::npos);
  for (PolicyKind k : {PolicyKind::kDense, PolicyKind::kStreamingLlm, PolicyKind::kH2O,
                       PolicyKind::kTova, PolicyKind::kSnapKv, PolicyKind::kKnorm}) {
    EXPECT_EQ(ParsePolicyKind(PolicyKindName(k)).value(), k);
  }
  const auto refused = [](PolicyConfig c, const char* what) {
    const auto p = MakePolicy(c);
    ASSERT_FALSE(p.ok());
    EXPECT_NE(p.status().message().find(what), std::string::npos) << p.status().message();
  };
  refused({.kind = PolicyKind::kStreamingLlm, .sinks = -1}, "sinks = -1");
  refused({.kind = PolicyKind::kH2O, .recent = -2}, "recent = -2");
  refused({.kind = PolicyKind::kKnorm, .recent = -3}, "knorm: recent = -3");
  refused({.kind = PolicyKind::kSnapKv, .window = 0}, "window = 0");
  refused({.kind = PolicyKind::kSnapKv, .kernel = 4}, "kernel = 4");
  EXPECT_FALSE(PolicyBudget::Tokens(0).ok());
  EXPECT_FALSE(PolicyBudget::Fraction(0.0).ok());
  EXPECT_FALSE(PolicyBudget::Fraction(1.5).ok());
  EXPECT_FALSE(PolicyBudget::Fraction(std::nan("")).ok());
  EXPECT_EQ(PolicyBudget::Tokens(64).value().Resolve(1000), 64);
  EXPECT_EQ(PolicyBudget::Fraction(0.25).value().Resolve(1000), 250);
  EXPECT_EQ(PolicyBudget::Fraction(0.25).value().Resolve(10), 3);   // rounded up
  EXPECT_EQ(PolicyBudget::Fraction(0.01).value().Resolve(5), 1);    // at least one
  EXPECT_EQ(PolicyBudget::Fraction(0.07).value().Resolve(100), 7);  // 7.000000000000001
  EXPECT_EQ(PolicyBudget::Fraction(0.14).value().Resolve(100), 14);
}

TEST(PolicyTest, BudgetsAreParsedFromText) {
  const PolicyBudget tokens = ParsePolicyBudget("64").value();
  EXPECT_FALSE(tokens.is_fraction());
  EXPECT_EQ(tokens.tokens(), 64);
  EXPECT_EQ(tokens.Resolve(1000), 64);
  const PolicyBudget share = ParsePolicyBudget("0.25").value();
  EXPECT_TRUE(share.is_fraction());
  EXPECT_EQ(share.share(), 0.25);
  EXPECT_EQ(share.Resolve(1000), 250);
  EXPECT_EQ(ParsePolicyBudget("10%").value().share(), 0.1);
  EXPECT_EQ(ParsePolicyBudget("12.5%").value().Resolve(1000), 125);
  EXPECT_EQ(ParsePolicyBudget("1e-1").value().share(), 0.1);
  // "1" is one token; "1.0" is the whole sequence.
  EXPECT_EQ(ParsePolicyBudget("1").value().Resolve(1000), 1);
  EXPECT_EQ(ParsePolicyBudget("1.0").value().Resolve(1000), 1000);
  const auto refused = [](const char* text, const char* what) {
    const auto b = ParsePolicyBudget(text);
    ASSERT_FALSE(b.ok()) << text;
    EXPECT_NE(b.status().message().find(what), std::string::npos) << b.status().message();
  };
  refused("0", "budget '0': budget of 0 tokens");
  refused("-3", "budget of -3 tokens");
  refused("1.5", "budget '1.5': budget fraction 1.5");
  refused("0.0", "budget fraction 0");
  refused("150%", "budget '150%'");
  refused("", "budget '': expected a token count");
  refused("ten", "budget 'ten': expected a token count");
  refused("64k", "budget '64k'");
  refused("nan", "budget 'nan'");
  refused("1e400", "budget '1e400'");
  refused("%", "budget '%'");
}

}  // namespace
}  // namespace hkv
