// The synthetic evaluation (hkv/policy/synthetic_eval.h): its measurements against what they must
// be whatever the sequence (everything cached scores exactly the oracle, no cache beats it, nested
// caches never lose mass, cache sizes follow the budget), the feedback it gives policies against
// kv_policy.h's contract, the needle task against policies whose kept sets are known, and the
// ranking it was built to show.
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <hkv/policy/synthetic_eval.h>

namespace hkv {
namespace {

// A small GQA geometry, so each run takes milliseconds. Four KV heads: with fewer, the head
// mean is noisy enough that the asked needle is sometimes not dense attention's top token.
SyntheticEvalOptions Small() {
  SyntheticEvalOptions o;
  o.num_kv_heads = 4;
  o.group = 2;
  o.head_dim = 32;
  o.prompt_len = 128;
  o.decode_steps = 16;
  o.chunk = 32;
  o.trials = 6;
  o.seed = 5;
  return o;
}

// Every policy with options that fit the small sequence (SnapKV's window below every budget).
std::vector<PolicyConfig> AllPolicies() {
  std::vector<PolicyConfig> out;
  for (PolicyKind k : kAllPolicyKinds) {
    PolicyConfig c{.kind = k};
    c.window = 8;
    out.push_back(c);
  }
  return out;
}

PolicyBudget Share(double f) {
  return PolicyBudget::Fraction(f).value();
}
PolicyBudget Tokens(int64_t t) {
  return PolicyBudget::Tokens(t).value();
}

SyntheticEvalReport Evaluate(const SyntheticEvalOptions& o) {
  Result<SyntheticEvalReport> r = RunSyntheticEval(o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : SyntheticEvalReport{};
}

const SyntheticEvalResult& Find(const SyntheticEvalReport& r, PolicyKind kind, size_t budget) {
  size_t seen = 0;
  for (const SyntheticEvalResult& x : r.results) {
    if (x.policy.kind == kind && seen++ == budget) return x;
  }
  ADD_FAILURE() << "no result for " << PolicyKindName(kind);
  return r.results.front();
}

TEST(SyntheticEvalTest, EverythingCachedScoresExactlyTheOracleAndRetrievesEveryNeedle) {
  SyntheticEvalOptions o = Small();
  o.policies = AllPolicies();
  const int64_t length = o.prompt_len + o.decode_steps;
  o.budgets = {Share(1.0), Tokens(length)};
  const SyntheticEvalReport r = Evaluate(o);
  ASSERT_EQ(r.results.size(), 12u);
  // Dense keeps everything at any budget too.
  o.policies = {{.kind = PolicyKind::kDense}};
  o.budgets = {Share(0.1), Tokens(3)};
  const SyntheticEvalReport dense = Evaluate(o);
  // Before decode step s the cache holds the prompt and s generated tokens, plus the new one.
  const double all_cached =
      static_cast<double>(o.prompt_len) + static_cast<double>(o.decode_steps + 1) / 2;
  for (const SyntheticEvalReport* report : {&r, &dense}) {
    for (const SyntheticEvalResult& x : report->results) {
      SCOPED_TRACE(std::string(PolicyKindName(x.policy.kind)));
      EXPECT_EQ(x.mean_ratio, 1.0);
      EXPECT_EQ(x.min_ratio, 1.0);
      EXPECT_EQ(x.mass, x.oracle_mass);
      EXPECT_NEAR(x.mean_mass, 1.0, 1e-12);  // the whole softmax
      EXPECT_EQ(x.needles_retrieved, o.trials);
      EXPECT_DOUBLE_EQ(x.mean_cache_tokens, all_cached);
    }
  }
  EXPECT_EQ(r.needle_dense_top, o.trials);  // the needle task is well posed
}

TEST(SyntheticEvalTest, NoPolicyHoldsMoreThanTheOracleAtAnyStep) {
  SyntheticEvalOptions o = Small();
  o.policies = AllPolicies();
  o.budgets = {Share(0.1), Share(0.25), Share(0.5), Tokens(20)};
  const SyntheticEvalReport r = Evaluate(o);
  ASSERT_EQ(r.results.size(), 24u);
  const size_t samples = static_cast<size_t>(o.trials * o.decode_steps);
  for (const SyntheticEvalResult& x : r.results) {
    SCOPED_TRACE(std::string(PolicyKindName(x.policy.kind)) + " at " +
                 std::to_string(x.budget_tokens));
    ASSERT_EQ(x.mass.size(), samples);
    ASSERT_EQ(x.oracle_mass.size(), samples);
    for (size_t s = 0; s < samples; ++s) {
      EXPECT_GT(x.mass[s], 0.0) << "step " << s;  // the new token is always cached
      EXPECT_LE(x.mass[s], x.oracle_mass[s] * (1 + 1e-12)) << "step " << s;
      EXPECT_LE(x.oracle_mass[s], 1 + 1e-12) << "step " << s;
    }
    EXPECT_LE(x.min_ratio, x.mean_ratio);
    EXPECT_LE(x.mean_ratio, 1 + 1e-12);
  }
  // SnapKV keeps every generated token beyond its prompt budget: its oracle is of that size too,
  // which the bound above would break if the oracle used the budget instead.
  EXPECT_GT(Find(r, PolicyKind::kSnapKv, 3).mean_cache_tokens, 20 + 1);
}

TEST(SyntheticEvalTest, CacheSizesFollowTheBudgetAtEveryStep) {
  SyntheticEvalOptions o = Small();
  PolicyConfig snap{.kind = PolicyKind::kSnapKv};
  snap.window = 8;
  o.policies = {{.kind = PolicyKind::kStreamingLlm}, {.kind = PolicyKind::kTova}, snap};
  o.budgets = {Tokens(20), Share(0.25)};
  const SyntheticEvalReport r = Evaluate(o);
  const auto steps = static_cast<double>(o.decode_steps);
  // A token budget: 20 kept after each step, plus the token being decoded.
  EXPECT_DOUBLE_EQ(Find(r, PolicyKind::kStreamingLlm, 0).mean_cache_tokens, 21.0);
  EXPECT_DOUBLE_EQ(Find(r, PolicyKind::kTova, 0).mean_cache_tokens, 21.0);
  // A fraction is resolved against the tokens so far after every step.
  double quarter = 0;
  for (int64_t s = 0; s < o.decode_steps; ++s)
    quarter += static_cast<double>(Share(0.25).Resolve(o.prompt_len + s)) + 1;
  EXPECT_DOUBLE_EQ(Find(r, PolicyKind::kStreamingLlm, 1).mean_cache_tokens, quarter / steps);
  EXPECT_EQ(Find(r, PolicyKind::kStreamingLlm, 1).budget_tokens,
            Share(0.25).Resolve(o.prompt_len + o.decode_steps));
  // SnapKV budgets the prompt once and keeps every generated token: 20 + s + 1 at step s.
  EXPECT_DOUBLE_EQ(Find(r, PolicyKind::kSnapKv, 0).mean_cache_tokens, 21 + (steps - 1) / 2);
}

TEST(SyntheticEvalTest, NestedCachesNeverHoldLessMass) {
  // StreamingLLM's kept set under a larger budget contains the smaller one's (sinks plus a longer
  // recent window), so at every step its mass can only be larger: masses summed over the wrong
  // positions would break this.
  SyntheticEvalOptions o = Small();
  o.policies = {{.kind = PolicyKind::kStreamingLlm}};
  o.budgets = {Tokens(8), Tokens(16), Tokens(40), Tokens(100)};
  const SyntheticEvalReport r = Evaluate(o);
  ASSERT_EQ(r.results.size(), 4u);
  for (size_t b = 1; b < r.results.size(); ++b) {
    const SyntheticEvalResult &small = r.results[b - 1], &large = r.results[b];
    for (size_t s = 0; s < small.mass.size(); ++s)
      EXPECT_LE(small.mass[s], large.mass[s] * (1 + 1e-12)) << "budget " << b << " step " << s;
    EXPECT_LT(small.mean_mass, large.mean_mass);
  }
}

TEST(SyntheticEvalTest, StreamingLlmRetrievesANeedleOnlyInItsSinksOrRecentWindow) {
  SyntheticEvalOptions o = Small();
  o.policies = {{.kind = PolicyKind::kStreamingLlm, .sinks = 4}};
  o.budgets = {Tokens(24)};  // 4 sinks + 20 recent: the prompt's middle is gone when asked
  o.needle_position = 60;
  EXPECT_EQ(Evaluate(o).results[0].needles_retrieved, 0);
  o.needle_position = 2;  // a sink
  EXPECT_EQ(Evaluate(o).results[0].needles_retrieved, o.trials);
  // Recent enough: the budget's window reaches back past it when the needle is asked.
  o.budgets = {Tokens(4 + (o.prompt_len + o.decode_steps - 60))};
  o.needle_position = 60;
  EXPECT_EQ(Evaluate(o).results[0].needles_retrieved, o.trials);
}

TEST(SyntheticEvalTest, SnapKvKeepsANeedleItsWindowAsksAboutAndLosesACold) {
  SyntheticEvalOptions o = Small();
  PolicyConfig snap{.kind = PolicyKind::kSnapKv};
  snap.window = 8;
  o.policies = {snap};
  o.budgets = {Share(0.25)};
  o.needle_position = 40;
  o.question_tokens = 8;  // inside the window
  EXPECT_EQ(Evaluate(o).results[0].needles_retrieved, o.trials);
  o.question_tokens = 0;  // nothing attends it before it is asked
  const SyntheticEvalReport cold = Evaluate(o);
  EXPECT_LE(cold.results[0].needles_retrieved, 1);
  EXPECT_EQ(cold.needle_dense_top, o.trials);  // dense attention still finds it when asked
}

TEST(SyntheticEvalTest, ANeedleWithoutItsDirectionIsNotDenseAttentionsTop) {
  SyntheticEvalOptions o = Small();
  o.policies = {{.kind = PolicyKind::kDense}};
  o.budgets = {Share(0.5)};
  o.shape.needle_logit = 0;
  EXPECT_LE(Evaluate(o).needle_dense_top, 1);
}

TEST(SyntheticEvalTest, ScoringPoliciesBeatStreamingLlmAtTenPercent) {
  SyntheticEvalOptions o = Small();
  o.prompt_len = 256;
  o.chunk = 64;
  o.policies = AllPolicies();
  o.budgets = {Share(0.1)};
  const SyntheticEvalReport r = Evaluate(o);
  const double streaming = Find(r, PolicyKind::kStreamingLlm, 0).mean_ratio;
  // knorm too, from the keys it is shown alone: the attended keys are the short ones here.
  for (PolicyKind k :
       {PolicyKind::kH2O, PolicyKind::kTova, PolicyKind::kSnapKv, PolicyKind::kKnorm}) {
    EXPECT_GT(Find(r, k, 0).mean_ratio, streaming + 0.02) << PolicyKindName(k);
    EXPECT_LT(Find(r, k, 0).mean_ratio, 1.0) << PolicyKindName(k);  // none is the oracle
  }
}

TEST(SyntheticEvalTest, TheSameSeedGivesTheSameReportAndTrialsDoNotDependOnTheirCount) {
  SyntheticEvalOptions o = Small();
  o.policies = AllPolicies();
  o.budgets = {Share(0.25)};
  const SyntheticEvalReport a = Evaluate(o), b = Evaluate(o);
  ASSERT_EQ(a.results.size(), b.results.size());
  for (size_t i = 0; i < a.results.size(); ++i) {
    EXPECT_EQ(a.results[i].mass, b.results[i].mass);
    EXPECT_EQ(a.results[i].oracle_mass, b.results[i].oracle_mass);
    EXPECT_EQ(a.results[i].needles_retrieved, b.results[i].needles_retrieved);
  }
  // Trial t depends on the seed and t alone: the first two of six are the two of two.
  SyntheticEvalOptions two = o;
  two.trials = 2;
  const SyntheticEvalReport c = Evaluate(two);
  const size_t prefix = 2 * static_cast<size_t>(o.decode_steps);
  for (size_t i = 0; i < a.results.size(); ++i) {
    const std::vector<double> head(a.results[i].mass.begin(),
                                   a.results[i].mass.begin() + static_cast<ptrdiff_t>(prefix));
    EXPECT_EQ(c.results[i].mass, head);
  }
  // Another seed, another sequence.
  o.seed = 6;
  EXPECT_NE(Evaluate(o).results[1].mass, a.results[1].mass);
}

// Wraps a real policy and checks, at every call, what the evaluation hands it against
// kv_policy.h: positions ascending and carrying the step's tokens, the cache being what the last
// Select kept, and weights that are softmax rows summed (each KV head's sum is the row count, a
// slot gets weight only from rows at or after it).
class Probe final : public KvPolicy {
 public:
  explicit Probe(std::unique_ptr<KvPolicy> inner, int32_t* observed)
      : inner_(std::move(inner)), observed_(observed) {}
  std::string_view name() const override { return inner_->name(); }
  std::unique_ptr<KvPolicy> Clone() const override {
    auto copy = std::make_unique<Probe>(inner_->Clone(), observed_);
    copy->next_ = next_;
    copy->shown_ = shown_;
    copy->positions_ = positions_;
    copy->kept_ = kept_;
    return copy;
  }
  bool WantsKeys() const override { return inner_->WantsKeys(); }
  // Shown once per step, before Observe: exactly the step's tokens, each KV head's key and value.
  void Written(const WrittenKv& kv) override {
    EXPECT_TRUE(inner_->WantsKeys());
    ASSERT_FALSE(kv.positions.empty());
    EXPECT_EQ(kv.positions.front(), next_);  // the step about to be observed
    for (size_t i = 1; i < kv.positions.size(); ++i)
      EXPECT_EQ(kv.positions[i], kv.positions[i - 1] + 1);
    EXPECT_EQ(kv.num_kv_heads, 4);
    EXPECT_EQ(kv.key_width, 4 * 32);
    EXPECT_EQ(kv.value_width, 4 * 32);
    EXPECT_EQ(kv.keys.size(), kv.positions.size() * 4 * 32);
    EXPECT_EQ(kv.values.size(), kv.positions.size() * 4 * 32);
    shown_ = kv.positions.back() + 1;
    inner_->Written(kv);
  }
  int32_t AttentionRows(const PolicyStep& step) const override {
    return inner_->AttentionRows(step);
  }
  void Observe(std::span<const int64_t> positions, const PolicyStep& step,
               const AttentionFeedback& fb) override {
    ++*observed_;
    EXPECT_EQ(step.first, next_);
    next_ = step.first + step.count;
    if (inner_->WantsKeys()) {
      EXPECT_EQ(shown_, next_) << "the step's keys were not shown";
    }
    ASSERT_GE(positions.size(), static_cast<size_t>(step.count));
    const size_t n = positions.size(), fresh = n - static_cast<size_t>(step.count);
    for (size_t i = 0; i < fresh; ++i)
      EXPECT_EQ(positions[i], kept_[i]) << "slot " << i;  // what Compact was told
    EXPECT_EQ(fresh, kept_.size());
    for (size_t i = fresh; i < n; ++i)
      EXPECT_EQ(positions[i], step.first + static_cast<int64_t>(i - fresh));
    const int32_t want = std::min(inner_->AttentionRows(step), step.count);
    EXPECT_EQ(fb.rows, want);
    if (want > 0) {
      EXPECT_EQ(fb.num_kv_heads, 4);
      EXPECT_EQ(fb.weights.size(), n * 4);
      const int64_t end = step.first + step.count;
      for (int32_t h = 0; h < fb.num_kv_heads; ++h) {
        double sum = 0;
        for (size_t i = 0; i < n; ++i) {
          const float w = fb.weights[static_cast<size_t>(h) * n + i];
          sum += w;
          const auto rows_after =
              static_cast<double>(std::min<int64_t>(fb.rows, end - positions[i]));
          EXPECT_GE(w, 0.0f);
          EXPECT_LE(w, rows_after + 1e-5) << "slot at position " << positions[i];
        }
        EXPECT_NEAR(sum, fb.rows, 1e-4) << "KV head " << h;
      }
    } else {
      EXPECT_TRUE(fb.weights.empty());
    }
    inner_->Observe(positions, step, fb);
    positions_.assign(positions.begin(), positions.end());
  }
  void Select(std::span<const int64_t> positions, int64_t budget,
              std::vector<int32_t>& keep) const override {
    inner_->Select(positions, budget, keep);
  }
  void Compact(std::span<const int32_t> keep) override {
    kept_.clear();
    for (int32_t s : keep)
      kept_.push_back(positions_[static_cast<size_t>(s)]);
    inner_->Compact(keep);
  }
  void Scores(std::span<const int64_t> positions, std::vector<float>& out) const override {
    inner_->Scores(positions, out);
  }

 private:
  std::unique_ptr<KvPolicy> inner_;
  int32_t* observed_;
  int64_t next_ = 0, shown_ = 0;
  std::vector<int64_t> positions_, kept_;
};

TEST(SyntheticEvalTest, PoliciesAreFedAsTheContractSays) {
  SyntheticEvalOptions o = Small();
  o.chunk = 40;  // 128 = 40 + 40 + 40 + 8: a short last chunk, shorter than SnapKV's window
  o.trials = 2;
  PolicyConfig snap{.kind = PolicyKind::kSnapKv};
  snap.window = 16;
  o.policies = {{.kind = PolicyKind::kH2O},
                {.kind = PolicyKind::kTova},
                snap,
                {.kind = PolicyKind::kStreamingLlm},
                {.kind = PolicyKind::kKnorm}};
  o.budgets = {Share(0.25), Tokens(30)};
  int32_t observed = 0;
  o.make_policy = [&observed](const PolicyConfig& c) -> Result<std::unique_ptr<KvPolicy>> {
    HKV_ASSIGN_OR_RETURN(std::unique_ptr<KvPolicy> inner, MakePolicy(c));
    return std::unique_ptr<KvPolicy>(std::make_unique<Probe>(std::move(inner), &observed));
  };
  Evaluate(o);
  // 4 prompt chunks + 16 decode steps, per policy, budget and trial.
  EXPECT_EQ(observed, (4 + 16) * 5 * 2 * 2);
}

// Keeps every token but the one at position 1, whatever the budget, asking for `rows` rows and
// recording, per step, the weights (KV head 0) of the step's last two slots.
class KeepAllButOne final : public KvPolicy {
 public:
  KeepAllButOne(int32_t rows, std::vector<std::vector<float>>* last) : rows_(rows), last_(last) {}
  std::string_view name() const override { return "keep_all_but_one"; }
  std::unique_ptr<KvPolicy> Clone() const override {
    return std::make_unique<KeepAllButOne>(*this);
  }
  int32_t AttentionRows(const PolicyStep&) const override { return rows_; }
  void Observe(std::span<const int64_t> positions, const PolicyStep&,
               const AttentionFeedback& fb) override {
    if (fb.rows == 0) return;
    const size_t n = positions.size();
    last_->push_back({fb.weights[n - 2], fb.weights[n - 1]});
  }
  void Select(std::span<const int64_t> positions, int64_t,
              std::vector<int32_t>& keep) const override {
    for (size_t i = 0; i < positions.size(); ++i)
      if (positions[i] != 1) keep.push_back(static_cast<int32_t>(i));
  }
  void Compact(std::span<const int32_t>) override {}
  void Scores(std::span<const int64_t>, std::vector<float>&) const override {}

 private:
  int32_t rows_;
  std::vector<std::vector<float>>* last_;
};

TEST(SyntheticEvalTest, TheOracleHasTheCachesSizeNotTheBudgets) {
  // A cache far above its budget (one token dropped, budget one token): its oracle is the best
  // set of that size, so the cache comes within the dropped token of it and never above it.
  SyntheticEvalOptions o = Small();
  o.policies = {{.kind = PolicyKind::kDense}};  // replaced by make_policy
  o.budgets = {Tokens(1)};
  std::vector<std::vector<float>> unused;
  o.make_policy = [&unused](const PolicyConfig&) -> Result<std::unique_ptr<KvPolicy>> {
    return std::unique_ptr<KvPolicy>(std::make_unique<KeepAllButOne>(0, &unused));
  };
  const SyntheticEvalResult r = Evaluate(o).results.at(0);
  EXPECT_DOUBLE_EQ(r.mean_cache_tokens,
                   static_cast<double>(o.prompt_len) + static_cast<double>(o.decode_steps - 1) / 2);
  for (size_t s = 0; s < r.mass.size(); ++s)
    EXPECT_LE(r.mass[s], r.oracle_mass[s] * (1 + 1e-12)) << "step " << s;
  EXPECT_GT(r.min_ratio, 0.9);
}

TEST(SyntheticEvalTest, ARowAttendsNoLaterToken) {
  // Every run keeps every token but one, so caches agree; a slot k from the step's end receives
  // weight from the last k rows only, so its weight is the same whether 1, 2 or all rows are
  // summed (the same additions in the same order), exactly. Without the causal mask the earlier
  // rows would add to it.
  SyntheticEvalOptions o = Small();
  o.trials = 2;
  // The configs only tell make_policy how many rows each run asks for (in `window`).
  o.policies = {{.kind = PolicyKind::kDense, .window = 1},
                {.kind = PolicyKind::kDense, .window = 2},
                {.kind = PolicyKind::kDense, .window = KvPolicy::kAllRows}};
  o.budgets = {Tokens(1)};
  std::vector<std::vector<float>> one, two, all;
  o.make_policy = [&](const PolicyConfig& c) -> Result<std::unique_ptr<KvPolicy>> {
    auto* sink = c.window == 1 ? &one : c.window == 2 ? &two : &all;
    return std::unique_ptr<KvPolicy>(std::make_unique<KeepAllButOne>(c.window, sink));
  };
  Evaluate(o);
  const size_t steps = static_cast<size_t>(o.trials) * (4 + 16);
  ASSERT_EQ(one.size(), steps);
  ASSERT_EQ(two.size(), steps);
  ASSERT_EQ(all.size(), steps);
  for (size_t s = 0; s < steps; ++s) {
    EXPECT_EQ(one[s][1], all[s][1]) << "step " << s;
    EXPECT_EQ(two[s][0], all[s][0]) << "step " << s;
    EXPECT_EQ(two[s][1], all[s][1]) << "step " << s;
  }
}

// Breaks Select's contract: slots in descending order.
class KeepsDescending final : public KvPolicy {
 public:
  std::string_view name() const override { return "keeps_descending"; }
  std::unique_ptr<KvPolicy> Clone() const override {
    return std::make_unique<KeepsDescending>(*this);
  }
  int32_t AttentionRows(const PolicyStep&) const override { return 0; }
  void Observe(std::span<const int64_t>, const PolicyStep&, const AttentionFeedback&) override {}
  void Select(std::span<const int64_t> positions, int64_t,
              std::vector<int32_t>& keep) const override {
    for (size_t i = positions.size(); i-- > 0;)
      keep.push_back(static_cast<int32_t>(i));
  }
  void Compact(std::span<const int32_t>) override {}
  void Scores(std::span<const int64_t>, std::vector<float>&) const override {}
};

// Breaks Select's contract: a slot past the last one.
class KeepsOnePastTheEnd final : public KvPolicy {
 public:
  std::string_view name() const override { return "keeps_one_past_the_end"; }
  std::unique_ptr<KvPolicy> Clone() const override {
    return std::make_unique<KeepsOnePastTheEnd>(*this);
  }
  int32_t AttentionRows(const PolicyStep&) const override { return 0; }
  void Observe(std::span<const int64_t>, const PolicyStep&, const AttentionFeedback&) override {}
  void Select(std::span<const int64_t> positions, int64_t,
              std::vector<int32_t>& keep) const override {
    keep.push_back(static_cast<int32_t>(positions.size()));
  }
  void Compact(std::span<const int32_t>) override {}
  void Scores(std::span<const int64_t>, std::vector<float>&) const override {}
};

TEST(SyntheticEvalTest, BadOptionsAreRefusedByName) {
  const auto refused = [](const std::function<void(SyntheticEvalOptions&)>& edit,
                          const std::string& what) {
    SyntheticEvalOptions o = Small();
    o.policies = AllPolicies();
    o.budgets = {Share(0.1)};
    edit(o);
    const Result<SyntheticEvalReport> r = RunSyntheticEval(o);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().message();
  };
  refused([](auto& o) { o.num_kv_heads = 0; }, "num_kv_heads = 0");
  refused([](auto& o) { o.group = -1; }, "group = -1");
  refused([](auto& o) { o.head_dim = 0; }, "head_dim = 0");
  refused([](auto& o) { o.prompt_len = 1; }, "prompt_len = 1");
  refused([](auto& o) { o.decode_steps = 0; }, "decode_steps = 0");
  refused([](auto& o) { o.chunk = 0; }, "chunk = 0");
  refused([](auto& o) { o.trials = -2; }, "trials = -2");
  refused([](auto& o) { o.question_tokens = -1; }, "question_tokens = -1");
  refused([](auto& o) { o.question_tokens = 127; }, "question_tokens = 127");
  refused([](auto& o) { o.needle_position = 0; }, "needle_position = 0");
  refused([](auto& o) { o.needle_position = 120; }, "needle_position = 120");
  refused([](auto& o) { o.shape.sink_logit = -1; }, "sink_logit = -1");
  refused([](auto& o) { o.shape.needle_logit = NAN; }, "needle_logit = nan");
  refused([](auto& o) { o.shape.heavy_share = 1.5; }, "heavy_share = 1.5");
  refused([](auto& o) { o.shape.local_tokens = 0; }, "local_tokens = 0");
  refused([](auto& o) { o.policies.clear(); }, "policies");
  refused([](auto& o) { o.budgets.clear(); }, "budgets");
  refused([](auto& o) { o.policies = {{.kind = PolicyKind::kSnapKv, .kernel = 4}}; }, "kernel = 4");
  refused([](auto& o) { o.prompt_len = int64_t{1} << 27; }, "floats of queries and keys");
  // Narrow heads, long chunks: queries and keys fit, the per-step logits do not.
  refused(
      [](auto& o) {
        o.num_kv_heads = 1;
        o.group = 1;
        o.head_dim = 1;
        o.prompt_len = int64_t{1} << 15;
        o.chunk = int64_t{1} << 15;
      },
      "floats of step logits");
  refused(
      [](auto& o) {
        o.make_policy = [](const PolicyConfig&) -> Result<std::unique_ptr<KvPolicy>> {
          return std::unique_ptr<KvPolicy>();
        };
      },
      "built no policy");
  // A policy whose Select breaks the contract is reported, not followed.
  refused(
      [](auto& o) {
        o.make_policy = [](const PolicyConfig&) -> Result<std::unique_ptr<KvPolicy>> {
          return std::unique_ptr<KvPolicy>(std::make_unique<KeepsDescending>());
        };
      },
      "expected ascending slots");
  refused(
      [](auto& o) {
        o.make_policy = [](const PolicyConfig&) -> Result<std::unique_ptr<KvPolicy>> {
          return std::unique_ptr<KvPolicy>(std::make_unique<KeepsOnePastTheEnd>());
        };
      },
      "expected a slot in [0, ");
}

}  // namespace
}  // namespace hkv
