// The synthetic evaluation's driver: every policy and budget runs in lockstep over one trial's
// sequence, so the logits of a step are computed once and each run reads the columns it still
// caches.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>

#include <fmt/format.h>

#include <hkv/common/splitmix64.h>
#include <hkv/policy/synthetic_eval.h>

#include "synthetic_sequence.h"

namespace hkv {
namespace {

using policy_internal::SyntheticSequence;

// Far above any useful run, far below what would exhaust a machine: keys, queries and one step's
// logits, in floats.
constexpr int64_t kMaxFloats = int64_t{1} << 28;

Result<std::unique_ptr<KvPolicy>> Build(const SyntheticEvalOptions& o, const PolicyConfig& c) {
  Result<std::unique_ptr<KvPolicy>> p = o.make_policy ? o.make_policy(c) : MakePolicy(c);
  if (p.ok() && *p == nullptr) {
    return Status::InvalidArgument(
        fmt::format("make_policy built no policy for {}", PolicyKindName(c.kind)));
  }
  return p;
}

Status CheckShape(const SyntheticShape& s) {
  const auto logit = [](const char* name, double v) {
    if (std::isfinite(v) && v >= 0) return Status::Ok();
    return Status::InvalidArgument(fmt::format("{} = {}: expected a finite value >= 0", name, v));
  };
  for (const Status& st :
       {logit("sink_logit", s.sink_logit), logit("heavy_logit", s.heavy_logit),
        logit("local_logit", s.local_logit), logit("needle_logit", s.needle_logit)}) {
    if (!st.ok()) return st;
  }
  if (!(s.heavy_share >= 0 && s.heavy_share <= 1)) {
    return Status::InvalidArgument(
        fmt::format("heavy_share = {}: expected a share in [0, 1]", s.heavy_share));
  }
  if (!(std::isfinite(s.local_tokens) && s.local_tokens > 0)) {
    return Status::InvalidArgument(
        fmt::format("local_tokens = {}: expected a finite value > 0", s.local_tokens));
  }
  return Status::Ok();
}

Status Check(const SyntheticEvalOptions& o) {
  const auto at_least = [](const char* name, int64_t v, int64_t lo) {
    if (v >= lo) return Status::Ok();
    return Status::InvalidArgument(fmt::format("{} = {}: expected >= {}", name, v, lo));
  };
  for (const Status& st :
       {at_least("num_kv_heads", o.num_kv_heads, 1), at_least("group", o.group, 1),
        at_least("head_dim", o.head_dim, 1), at_least("prompt_len", o.prompt_len, 2),
        at_least("decode_steps", o.decode_steps, 1), at_least("chunk", o.chunk, 1),
        at_least("trials", o.trials, 1), at_least("question_tokens", o.question_tokens, 0)}) {
    if (!st.ok()) return st;
  }
  // The needle needs a prompt position after the sink and before the question.
  if (o.question_tokens > o.prompt_len - 2) {
    return Status::InvalidArgument(
        fmt::format("question_tokens = {}: expected at most prompt_len - 2 = {}", o.question_tokens,
                    o.prompt_len - 2));
  }
  const int64_t needle_end = o.prompt_len - o.question_tokens;
  if (o.needle_position != -1 && (o.needle_position < 1 || o.needle_position >= needle_end)) {
    return Status::InvalidArgument(
        fmt::format("needle_position = {}: expected -1 (varied) or a prompt position in [1, {})",
                    o.needle_position, needle_end));
  }
  // Products checked one factor at a time so that none overflows before the comparison.
  const int64_t q_heads = int64_t{o.num_kv_heads} * o.group;
  const int64_t length = o.prompt_len + o.decode_steps;
  // Every factor is >= 1 here, so a single factor above the limit already makes the product
  // exceed it.
  if (q_heads > kMaxFloats || o.head_dim > kMaxFloats || o.prompt_len > kMaxFloats ||
      o.decode_steps > kMaxFloats || q_heads * o.head_dim > kMaxFloats / length) {
    return Status::InvalidArgument(fmt::format(
        "{} query heads of width {} over {} tokens: more than {} floats of queries and keys; "
        "expected a smaller run",
        q_heads, o.head_dim, length, kMaxFloats));
  }
  if (std::min(o.chunk, o.prompt_len) * q_heads > kMaxFloats / length) {
    return Status::InvalidArgument(fmt::format(
        "{} query heads over {} tokens in chunks of {}: more than {} floats of step logits; "
        "expected a smaller run",
        q_heads, length, o.chunk, kMaxFloats));
  }
  HKV_RETURN_IF_ERROR(CheckShape(o.shape));
  if (o.policies.empty()) return Status::InvalidArgument("policies: expected at least one");
  if (o.budgets.empty()) return Status::InvalidArgument("budgets: expected at least one");
  for (const PolicyConfig& c : o.policies) {
    Result<std::unique_ptr<KvPolicy>> p = Build(o, c);
    if (!p.ok()) return p.status();
  }
  return Status::Ok();
}

// One policy under one budget in one trial: its cache (the positions it holds) and what it has
// measured so far.
struct Run {
  std::unique_ptr<KvPolicy> policy;
  PolicyBudget budget;
  SyntheticEvalResult* result = nullptr;
  std::vector<int64_t> positions;
};

// The step's last rows the policy asks for, at most the step's tokens.
int64_t RowsAsked(const KvPolicy& policy, const PolicyStep& step) {
  return std::clamp<int64_t>(policy.AttentionRows(step), 0, step.count);
}

// The weights the policy asked for: rows [end - rows, end) of `logits` (whose first row is
// `first_row`) over the cached `positions`, each row's softmax over the slots at or before it,
// summed over the rows and averaged over each KV head's query heads.
void Feedback(const std::vector<float>& logits, int64_t first_row, int64_t end, int32_t rows,
              const std::vector<int64_t>& positions, const SyntheticEvalOptions& o,
              std::vector<double>& acc, std::vector<double>& row, std::vector<float>& out) {
  const size_t n = positions.size();
  const auto q_heads = static_cast<size_t>(o.num_kv_heads) * static_cast<size_t>(o.group);
  const auto stride = static_cast<size_t>(end);
  acc.assign(static_cast<size_t>(o.num_kv_heads) * n, 0.0);
  row.resize(n);
  for (int64_t r = end - rows; r < end; ++r) {
    // Slots are in position order: the ones a row may attend are a prefix.
    const auto visible = static_cast<size_t>(
        std::upper_bound(positions.begin(), positions.end(), r) - positions.begin());
    for (size_t h = 0; h < q_heads; ++h) {
      const float* l = &logits[(static_cast<size_t>(r - first_row) * q_heads + h) * stride];
      double mx = -std::numeric_limits<double>::infinity();
      for (size_t i = 0; i < visible; ++i)
        mx = std::max(mx, double{l[positions[i]]});
      double z = 0;
      for (size_t i = 0; i < visible; ++i) {
        row[i] = std::exp(double{l[positions[i]]} - mx);
        z += row[i];
      }
      double* a = &acc[h / static_cast<size_t>(o.group) * n];
      for (size_t i = 0; i < visible; ++i)
        a[i] += row[i] / z / o.group;
    }
  }
  out.resize(acc.size());
  for (size_t i = 0; i < acc.size(); ++i)
    out[i] = static_cast<float>(acc[i]);
}

// Dense attention of query row r (the last row of `logits`, whose rows end at r + 1) over every
// position 0..r, averaged over all query heads.
void DenseRow(const std::vector<float>& logits, int64_t r, int32_t q_heads,
              std::vector<double>& dense) {
  const auto n = static_cast<size_t>(r + 1);
  const size_t rows = logits.size() / (static_cast<size_t>(q_heads) * n);
  dense.assign(n, 0.0);
  std::vector<double> w(n);
  for (int32_t h = 0; h < q_heads; ++h) {
    const float* l = &logits[((rows - 1) * static_cast<size_t>(q_heads) + h) * n];
    double mx = -std::numeric_limits<double>::infinity();
    for (size_t c = 0; c < n; ++c)
      mx = std::max(mx, double{l[c]});
    double z = 0;
    for (size_t c = 0; c < n; ++c) {
      w[c] = std::exp(double{l[c]} - mx);
      z += w[c];
    }
    for (size_t c = 0; c < n; ++c)
      dense[c] += w[c] / z / q_heads;
  }
}

// Select's answer, checked before it indexes anything: a policy from make_policy may be wrong.
Status CheckKeep(const KvPolicy& policy, const std::vector<int32_t>& keep, size_t n) {
  for (size_t i = 0; i < keep.size(); ++i) {
    if (keep[i] < 0 || static_cast<size_t>(keep[i]) >= n) {
      return Status::FailedPrecondition(
          fmt::format("policy {}: Select kept slot {} (entry {}): expected a slot in [0, {})",
                      policy.name(), keep[i], i, n));
    }
    if (i > 0 && keep[i] <= keep[i - 1]) {
      return Status::FailedPrecondition(
          fmt::format("policy {}: Select kept slot {} (entry {}) after slot {}: expected "
                      "ascending slots",
                      policy.name(), keep[i], i, keep[i - 1]));
    }
  }
  return Status::Ok();
}

// One trial's sequence and the buffers its steps and runs reuse.
struct Trial {
  const SyntheticEvalOptions& o;
  const SyntheticSequence& seq;
  int32_t trial;
  std::vector<float> logits{}, weights{}, keys{}, values{};
  std::vector<double> dense{}, best{}, acc{}, row{};
  std::vector<int32_t> keep{};
  std::vector<int64_t> kept{};
};

// One step of a trial: tokens [first, end); rows from first_row on have logits.
struct TrialStep {
  PolicyStep step;
  int64_t first = 0, end = 0, first_row = 0;
  bool decode = false;
  double total = 0;  // decode: the dense row's mass
};

// A decode step's measure of a run: the dense mass its cache holds against the best any cache of
// its size could hold.
void MeasureDecode(const Trial& t, const TrialStep& s, Run& run) {
  // Both sums run in position order when every token is cached, so a cache holding all of
  // them scores exactly the oracle (ratio 1, not 1 up to rounding).
  double mass = 0;
  for (int64_t p : run.positions)
    mass += t.dense[static_cast<size_t>(p)];
  const size_t m = run.positions.size();
  const double oracle = static_cast<int64_t>(m) >= s.end ? s.total : t.best[m - 1];
  SyntheticEvalResult& r = *run.result;
  const int64_t decode_step = s.first - t.o.prompt_len;
  const auto at = static_cast<size_t>(t.trial * t.o.decode_steps + decode_step);
  r.mass[at] = mass;
  r.oracle_mass[at] = oracle;
  r.mean_cache_tokens += static_cast<double>(m);
  if (s.end == t.seq.length() &&
      std::binary_search(run.positions.begin(), run.positions.end(), t.seq.needle())) {
    ++r.needles_retrieved;
  }
}

// The step as one run sees it: its new tokens, the attention it asked for, then what it keeps.
Status StepRun(Trial& t, const TrialStep& s, Run& run) {
  const int64_t count = s.end - s.first;
  for (int64_t p = s.first; p < s.end; ++p)
    run.positions.push_back(p);
  if (run.policy->WantsKeys()) {
    // Only the step's tokens are new to it: every earlier slot was shown when it was written.
    const int32_t width = t.seq.kv_heads() * t.seq.head_dim();
    const WrittenKv kv{std::span<const int64_t>(run.positions).last(static_cast<size_t>(count)),
                       t.seq.kv_heads(),
                       width,
                       width,
                       t.keys,
                       t.values};
    run.policy->Written(kv);
  }
  const auto rows = static_cast<int32_t>(RowsAsked(*run.policy, s.step));
  AttentionFeedback fb;
  if (rows > 0) {
    Feedback(t.logits, s.first_row, s.end, rows, run.positions, t.o, t.acc, t.row, t.weights);
    fb = {t.o.num_kv_heads, rows, t.weights};
  }
  run.policy->Observe(run.positions, s.step, fb);
  if (s.decode) MeasureDecode(t, s, run);
  t.keep.clear();
  run.policy->Select(run.positions, run.budget.Resolve(s.end), t.keep);
  HKV_RETURN_IF_ERROR(CheckKeep(*run.policy, t.keep, run.positions.size()));
  run.policy->Compact(t.keep);
  t.kept.clear();
  for (int32_t slot : t.keep)
    t.kept.push_back(run.positions[static_cast<size_t>(slot)]);
  run.positions.swap(t.kept);
  return Status::Ok();
}

Status RunTrial(const SyntheticEvalOptions& o, const SyntheticSequence& seq, int32_t trial,
                std::vector<Run>& runs, SyntheticEvalReport& report) {
  const int64_t n = seq.length();
  Trial t{.o = o, .seq = seq, .trial = trial};
  for (int64_t first = 0; first < n;) {
    TrialStep s;
    s.decode = first >= o.prompt_len;
    const int64_t count = s.decode ? 1 : std::min(o.chunk, o.prompt_len - first);
    s.first = first;
    s.end = first + count;
    s.step = {first, static_cast<int32_t>(count), !s.decode && s.end == o.prompt_len};
    // Only the rows some run asks for (or the decode row the mass is measured on) are computed.
    int64_t rows_needed = s.decode ? 1 : 0;
    for (const Run& run : runs)
      rows_needed = std::max(rows_needed, RowsAsked(*run.policy, s.step));
    s.first_row = s.end - rows_needed;
    if (rows_needed > 0) seq.Logits(s.first_row, s.end, t.logits);
    const bool any_wants_keys =
        std::any_of(runs.begin(), runs.end(), [](const Run& r) { return r.policy->WantsKeys(); });
    if (any_wants_keys) seq.Rows(first, s.end, t.keys, t.values);
    if (s.decode) {
      DenseRow(t.logits, s.end - 1, seq.query_heads(), t.dense);
      for (double w : t.dense)
        s.total += w;
      t.best = t.dense;
      std::sort(t.best.begin(), t.best.end(), std::greater<>());
      for (size_t i = 1; i < t.best.size(); ++i)
        t.best[i] += t.best[i - 1];  // best[m - 1]: the largest m weights
    }
    for (Run& run : runs)
      HKV_RETURN_IF_ERROR(StepRun(t, s, run));
    if (s.end == n &&
        std::max_element(t.dense.begin(), t.dense.end()) - t.dense.begin() == seq.needle()) {
      ++report.needle_dense_top;
    }
    first = s.end;
  }
  return Status::Ok();
}

}  // namespace

Result<SyntheticEvalReport> RunSyntheticEval(const SyntheticEvalOptions& o) {
  HKV_RETURN_IF_ERROR(Check(o));
  SyntheticEvalReport report;
  report.trials = o.trials;
  const int64_t length = o.prompt_len + o.decode_steps;
  const auto samples = static_cast<size_t>(o.trials) * static_cast<size_t>(o.decode_steps);
  for (const PolicyConfig& c : o.policies) {
    for (const PolicyBudget& b : o.budgets) {
      SyntheticEvalResult& r = report.results.emplace_back();
      r.policy = c;
      r.budget = b;
      r.budget_tokens = b.Resolve(length);
      r.mass.assign(samples, 0.0);
      r.oracle_mass.assign(samples, 0.0);
    }
  }
  // Trial t's sequence depends on the seed and t only, not on how many trials run.
  SplitMix64 seeds(o.seed);
  for (int32_t trial = 0; trial < o.trials; ++trial) {
    const SyntheticSequence seq(o, seeds.Next());
    std::vector<Run> runs;
    size_t i = 0;
    for (const PolicyConfig& c : o.policies) {
      for (const PolicyBudget& b : o.budgets) {
        Run& run = runs.emplace_back();
        HKV_ASSIGN_OR_RETURN(run.policy, Build(o, c));
        run.budget = b;
        run.result = &report.results[i++];
      }
    }
    HKV_RETURN_IF_ERROR(RunTrial(o, seq, trial, runs, report));
  }
  for (SyntheticEvalResult& r : report.results) {
    double mass = 0, oracle = 0, ratio = 0;
    r.min_ratio = std::numeric_limits<double>::infinity();
    for (size_t s = 0; s < samples; ++s) {
      mass += r.mass[s];
      oracle += r.oracle_mass[s];
      ratio += r.mass[s] / r.oracle_mass[s];
      r.min_ratio = std::min(r.min_ratio, r.mass[s] / r.oracle_mass[s]);
    }
    const auto count = static_cast<double>(samples);
    r.mean_mass = mass / count;
    r.mean_oracle_mass = oracle / count;
    r.mean_ratio = ratio / count;
    r.mean_cache_tokens /= count;
  }
  return report;
}

}  // namespace hkv
