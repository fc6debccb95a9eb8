// Synthetic evaluation of the sparse-KV policies: how much of dense attention each keeps, and
// whether it keeps a planted needle until it is asked for, without any trained weights.
//
// Contract: RunSyntheticEval runs, per trial, one synthetic sequence (seeded random keys and
// queries with planted structure, below) through a streaming GQA attention: the prompt in chunks
// of `chunk` tokens, then `decode_steps` single tokens. Each requested policy and budget runs as
// one layer's cache over the same sequence: at each step the step's tokens join the cache (a
// policy that WantsKeys is shown their keys and values), the step's queries attend only the
// cached tokens at or before their position (softmax in double over float32 logits), the policy
// observes the attention rows it asks for (summed over rows, averaged over each KV head's query
// heads, float32, as kv_policy.h says), and the cache is
// compacted to what Select keeps under budget.Resolve(tokens so far) — so a fraction keeps that
// share of the sequence at every step, prompt chunks included; original positions are kept.
// At each decode step it measures, against dense attention over the whole sequence (the query's
// softmax over every earlier token, averaged over all query heads):
// - mass: the dense attention on the tokens the cache holds when the step attends;
// - oracle mass: the most any set of that many tokens could hold (the largest dense weights).
// At the last decode step the needle is asked for; it is retrieved when it is still cached.
// Everything is a function of the options: the same seed gives the same report (trial t's
// sequence depends on the seed and t only). Options out of range are refused by name before
// anything runs; a policy whose Select breaks its contract (slots not ascending or out of range)
// fails the run with its name.
//
// The planted structure, per KV head (its query heads share the directions, not the noise):
// keys and queries are unit-variance noise per element (close to normal) plus components along
// random unit directions, scaled so that a key and query sharing a direction add the stated amount
// to the logit q.k/sqrt(d):
// - a sink: every query carries a shared direction and every key but token 0's its opposite,
//   so token 0 leads every query's logits by sink_logit, as trained models park attention on
//   their first token (the attended keys are thus the shorter ones, as Devoto et al. (2024)
//   observe in trained models);
// - heavy hitters: a heavy_share of the prompt carries less of the opposite, leading by
//   heavy_logit, so every query attends them somewhat — what cumulative-attention policies are
//   built to find;
// - locality: keys and queries follow a slowly drifting topic (an AR(1) direction, correlation
//   exp(-distance / local_tokens)), so queries favour recent tokens (local_logit at distance 0);
// - the needle: one prompt token's key carries a needle direction, asked for by the queries of
//   the last question_tokens prompt tokens (the question at the end of the prompt, which SnapKV's
//   window sees) and by the last decode step's query (needle_logit). With question_tokens 0 it
//   is cold: no query aims at it before it is asked (its longer key still draws random queries
//   somewhat more than an ordinary token's).
// Values are unstructured noise. Limits: no outputs (which tokens attention reaches, not what it
// reads from them), no RoPE, one layer, and attention far simpler than a trained model's; it ranks
// policies on the structures above, not on any task's accuracy.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/policy/policies.h>

namespace hkv {

// Logit amounts of the planted structure (see the contract above).
struct SyntheticShape {
  double sink_logit = 6.0;
  double heavy_share = 0.03;
  double heavy_logit = 3.0;
  double local_logit = 3.0;
  double local_tokens = 16.0;
  double needle_logit = 10.0;
};

struct SyntheticEvalOptions {
  // Attention geometry: KV heads, query heads per KV head, head width.
  int32_t num_kv_heads = 8;
  int32_t group = 4;
  int32_t head_dim = 128;
  int64_t prompt_len = 512;
  int64_t decode_steps = 64;
  int64_t chunk = 128;  // prompt tokens per step
  int32_t trials = 8;
  uint64_t seed = 1;
  int64_t question_tokens = 8;
  // Prompt position of the needle; -1: uniform per trial in [1, prompt_len - question_tokens).
  int64_t needle_position = -1;
  SyntheticShape shape;
  std::vector<PolicyConfig> policies;  // one fresh instance per trial and budget
  std::vector<PolicyBudget> budgets;   // every policy runs under each
  // Builds those instances; empty: MakePolicy. Lets a policy MakePolicy does not know (or a
  // test's probe around one) run through the same evaluation.
  std::function<Result<std::unique_ptr<KvPolicy>>(const PolicyConfig&)> make_policy;
};

// One policy under one budget, over every trial.
struct SyntheticEvalResult {
  PolicyConfig policy;
  PolicyBudget budget;
  int64_t budget_tokens = 0;     // the budget resolved at the last step (prompt + decode tokens)
  double mean_cache_tokens = 0;  // tokens cached when a decode step attends, mean over steps
  int32_t needles_retrieved = 0;
  double mean_mass = 0;         // mean over decode steps of every trial
  double mean_oracle_mass = 0;  // same steps
  double mean_ratio = 0;        // mean of mass / oracle mass per step
  double min_ratio = 0;         // the worst step
  // Per trial and decode step, index trial * decode_steps + step.
  std::vector<double> mass, oracle_mass;
};

struct SyntheticEvalReport {
  int32_t trials = 0;
  // Trials in which dense attention at the asking step puts its largest weight (mean over query
  // heads) on the needle: how well posed the needle task was.
  int32_t needle_dense_top = 0;
  std::vector<SyntheticEvalResult> results;  // policies in order, each with every budget
};

Result<SyntheticEvalReport> RunSyntheticEval(const SyntheticEvalOptions& options);

}  // namespace hkv
