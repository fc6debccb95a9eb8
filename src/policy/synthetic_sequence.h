// One trial's synthetic sequence for the policy evaluation (synthetic_eval.h describes the planted
// structure): float32 queries, keys and values per position and head, the attention logits of any
// run of query rows over the positions before them, and the rows as a cache would hold them.
//
// Contract: built from valid options (RunSyntheticEval checks them) and a trial seed; the same
// options and seed give the same sequence, bit for bit, on one build. Logits(begin, end, out)
// fills out[((r - begin) * query_heads + h) * end + c] = q[r][h] . k[c][h / group] / sqrt(d) for
// every row r in [begin, end) and column c <= r; columns after a row's position are not written
// (causal attention never reads them). Rows(begin, end, keys, values) fills, per position in
// [begin, end), its keys and then its values of every KV head ([position][kv head][dim]), the
// layout WrittenKv (kv_policy.h) shows policies.
#pragma once

#include <cstdint>
#include <vector>

#include <hkv/policy/synthetic_eval.h>

namespace hkv::policy_internal {

class SyntheticSequence {
 public:
  SyntheticSequence(const SyntheticEvalOptions& options, uint64_t trial_seed);

  int64_t length() const { return length_; }
  int64_t needle() const { return needle_; }
  int32_t query_heads() const { return kv_heads_ * group_; }
  int32_t kv_heads() const { return kv_heads_; }
  int32_t head_dim() const { return dim_; }
  void Logits(int64_t begin, int64_t end, std::vector<float>& out) const;
  void Rows(int64_t begin, int64_t end, std::vector<float>& keys, std::vector<float>& values) const;

 private:
  int32_t kv_heads_, group_, dim_;
  int64_t length_, needle_;
  std::vector<float> q_;  // [position][query head][dim]
  std::vector<float> k_;  // [kv head][position][dim]
  std::vector<float> v_;  // [position][kv head][dim]
};

}  // namespace hkv::policy_internal
