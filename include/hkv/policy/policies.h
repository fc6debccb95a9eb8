// The sparse-KV policies hybridkv ships, their options, and the budget they run under.
//
// Contract: MakePolicy(config) builds one policy instance per sequence and layer, or returns an
// error naming the option that is out of range; ParsePolicyKind accepts the names below.
// - dense: keeps every token whatever the budget.
// - streaming_llm: the first `sinks` tokens and the most recent budget - sinks.
// - h2o: the `recent` most recent tokens plus the rest of the budget by cumulative attention
//   (every query row of every step; with `normalize_by_age`, divided by the number of rows that
//   attended the token).
// - tova: the budget by the attention of the step's last query row.
// - snapkv: the budget applies to the prompt, scored once at the step that ends it: the last
//   `window` prompt tokens plus the rest of the budget by the attention of the last `window`
//   prompt queries, pooled over `kernel` neighbouring slots (average or max over those that
//   exist); tokens after the prompt are all kept (it compresses the prompt, as the method does).
//   The window is kept even when it exceeds the budget; its queries are those of the step that
//   ends the prompt (fewer than `window` when that step is shorter). Before the prompt ends it has
//   no signal and keeps all.
// - knorm: the `recent` most recent tokens plus the rest of the budget by the smallest key norm
//   (L2 norm of each KV head's key, averaged over the heads; low-norm keys draw high attention).
//   It needs no attention weights, only the keys as written (KvPolicy::Written).
// A budget is a token count or a fraction of the sequence's length (rounded up, at least 1); a
// default-constructed one is the whole sequence. ParsePolicyBudget reads one from text: an
// integer is a token count ("64"), a number with a decimal point or exponent a fraction ("0.25"),
// a number with '%' a percentage ("25%").
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include <hkv/common/result.h>
#include <hkv/policy/kv_policy.h>

namespace hkv {

enum class PolicyKind : unsigned char { kDense, kStreamingLlm, kH2O, kTova, kSnapKv, kKnorm };
inline constexpr PolicyKind kAllPolicyKinds[] = {PolicyKind::kDense,  PolicyKind::kStreamingLlm,
                                                 PolicyKind::kH2O,    PolicyKind::kTova,
                                                 PolicyKind::kSnapKv, PolicyKind::kKnorm};

std::string_view PolicyKindName(PolicyKind kind);  // "dense", "streaming_llm", "h2o", ...
Result<PolicyKind> ParsePolicyKind(std::string_view name);

struct PolicyConfig {
  PolicyKind kind = PolicyKind::kDense;
  int32_t sinks = 4;              // streaming_llm
  int32_t recent = 0;             // h2o, knorm: most recent tokens always kept
  bool normalize_by_age = false;  // h2o
  int32_t window = 32;            // snapkv: observation window (queries and kept tokens)
  int32_t kernel = 5;             // snapkv: pooling width (odd)
  bool max_pool = false;          // snapkv: max instead of average pooling
};

Result<std::unique_ptr<KvPolicy>> MakePolicy(const PolicyConfig& config);

class PolicyBudget {
 public:
  static Result<PolicyBudget> Tokens(int64_t tokens);  // >= 1
  static Result<PolicyBudget> Fraction(double share);  // in (0, 1]
  // Tokens to keep for a sequence of `length` tokens.
  int64_t Resolve(int64_t length) const;
  bool is_fraction() const { return tokens_ == 0; }
  int64_t tokens() const { return tokens_; }                 // 0 for a fraction
  double share() const { return tokens_ > 0 ? 0 : share_; }  // 0 for a token count

 private:
  // Default-constructed: the whole sequence (a fraction of 1).
  int64_t tokens_ = 0;
  double share_ = 1.0;
};

Result<PolicyBudget> ParsePolicyBudget(std::string_view text);

}  // namespace hkv
