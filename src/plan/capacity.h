// Capacity arithmetic shared by the strategy choice, pool sizing and the Plan's own queries.
// Private to the plan part.
#pragma once

#include <cstdint>
#include <vector>

#include <hkv/plan/plan.h>

namespace hkv {

// Pages group `g` holds for one sequence of `tokens` decoder and `encoder_tokens` encoder tokens
// (the state group: one).
int64_t PagesNeeded(const KvGroup& g, int64_t tokens, int64_t encoder_tokens);

// Pages one such sequence needs from each class, indexed by class id.
std::vector<int64_t> ClassDemand(const std::vector<KvGroup>& groups, size_t num_classes,
                                 int64_t tokens, int64_t encoder_tokens);

// Footprint of one sequence with the given groups and classes (classes' page_bytes must be set).
// With two-level memory (slab_bytes > 0, classes carved) a page costs its share of a slab,
// unused slab tail included.
Footprint ComputeFootprint(const ModelSpec& model, const std::vector<KvGroup>& groups,
                           const std::vector<PageClass>& classes, int64_t uniform_bytes_per_token,
                           int32_t block_tokens, int64_t tokens, int64_t encoder_tokens,
                           int64_t slab_bytes = 0);

}  // namespace hkv
