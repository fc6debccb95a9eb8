// KvPolicy: decides which cached tokens of one sequence, in one attention layer (or group of
// layers sharing a decision), survive under a token budget.
//
// Contract: the policy sees the cache as slots 0..n-1 in cache order, slot i holding the token
// at original position positions[i] (positions ascend; they survive compaction, so RoPE and the
// causal mask keep using them). Per step:
// 1. AttentionRows(step) says how many of the step's last query rows it needs attention weights
//    for (0: none; kAllRows: every row).
// 2. After the step's attention, Observe(positions, feedback) receives the cache's positions
//    (the step's tokens appended) and, when asked for, the weights: for each KV head and slot,
//    the softmax weights of the requested query rows summed, averaged over the query heads that
//    share the KV head (float32). A row never attends a slot at a later position.
// 3. Select(positions, budget, keep) appends to `keep` the slots to keep, ascending: all of them
//    when n <= budget, otherwise exactly `budget` unless the policy's description (policies.h)
//    says otherwise (dense keeps all; snapkv budgets the prompt only). Select does not change
//    the policy: the same call gives the same set.
// 4. Compact(keep) tells the policy the cache now holds only those slots, in that order; any
//    per-slot state follows them.
// Ties between equal scores keep the more recent token, so every implementation agrees on the
// set. Decisions are per layer, not per KV head (scores are averaged over KV heads), so one
// block table still serves every head.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace hkv {

// The step a policy is about to see: tokens at positions [first, first + count), and whether the
// step ends the prompt (the last prompt token is among them).
struct PolicyStep {
  int64_t first = 0;
  int32_t count = 0;
  bool ends_prompt = false;
};

// Keys and values as the engine wrote them (keys after RoPE), for policies that rank by them:
// row i of `keys` (key_width floats, num_kv_heads heads) and of `values` (value_width floats)
// belongs to positions[i], in slot order. `values` is empty where the layer caches one latent
// (MLA: one "head", the latent and its RoPE key).
struct WrittenKv {
  std::span<const int64_t> positions;
  int32_t num_kv_heads = 0;
  int32_t key_width = 0, value_width = 0;
  std::span<const float> keys;
  std::span<const float> values;
};

struct AttentionFeedback {
  int32_t num_kv_heads = 0;
  int32_t rows = 0;                // query rows summed: the step's last `rows` (fewer if shorter)
  std::span<const float> weights;  // [num_kv_heads][num_slots], num_slots = positions.size()
};

class KvPolicy {
 public:
  static constexpr int32_t kAllRows = std::numeric_limits<int32_t>::max();

  virtual ~KvPolicy() = default;
  virtual std::string_view name() const = 0;
  // An independent copy with the same state: a forked sequence (parallel sampling) continues
  // from its parent's decisions.
  virtual std::unique_ptr<KvPolicy> Clone() const = 0;
  // Policies that rank by the cached keys or values say so; the engine then calls Written after
  // each step's pass, before Observe, with the rows of every slot the policy has not been shown
  // yet (the step's new tokens, and at a request's first step what its prefix hit brought),
  // appended after the slots it has seen.
  virtual bool WantsKeys() const { return false; }
  virtual void Written(const WrittenKv& /*kv*/) {}
  virtual int32_t AttentionRows(const PolicyStep& step) const = 0;
  virtual void Observe(std::span<const int64_t> positions, const PolicyStep& step,
                       const AttentionFeedback& feedback) = 0;
  virtual void Select(std::span<const int64_t> positions, int64_t budget,
                      std::vector<int32_t>& keep) const = 0;
  virtual void Compact(std::span<const int32_t> keep) = 0;
  // The score Select ranks slots by (mean over KV heads), one per slot; empty for policies that
  // rank by position only.
  virtual void Scores(std::span<const int64_t> positions, std::vector<float>& out) const = 0;
};

}  // namespace hkv
