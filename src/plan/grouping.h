// Grouping: which layers share one block table. Private to the plan part.
#pragma once

#include <cstdint>
#include <vector>

#include <hkv/plan/plan.h>

namespace hkv {

// Layers with equal token-keeping rules, in order of first appearance; all recurrent layers form
// one state group. A window or chunk of at least `max_model_len` tokens keeps every token a
// request can have, so its layers join full attention (Ministral-8B's 32768-token window).
// Layers that keep nothing (MLP, KV-shared) are in no group. page_bytes is the unpadded page
// (block_tokens * sum of kv bytes per token, or the sum of state bytes); ids follow the vector
// order; page_class is left 0.
std::vector<KvGroup> FormGroups(const ModelSpec& model, int32_t block_tokens,
                                int64_t max_model_len);

// Bytes one page of `layers` occupies: one block of each (attention) or one state (recurrent).
int64_t PageBytesOf(const ModelSpec& model, const std::vector<int32_t>& layers,
                    int32_t block_tokens);

}  // namespace hkv
