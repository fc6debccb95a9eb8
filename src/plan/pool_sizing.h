// Pool sizing: how many pages each class buffer gets from the memory budget.
// Private to the plan part.
#pragma once

#include <string>
#include <vector>

#include <hkv/common/status.h>
#include <hkv/plan/plan.h>

namespace hkv {

// Sets num_pages of every class (page_bytes must already be the layout's). The budget first buys
// as many whole planning-point sequences as fit, each taking its pages from every class; the bytes
// left over go to the classes in proportion to that same per-sequence demand, in whole pages. With
// one class this is simply floor(memory / page). ResourceExhausted when the budget cannot hold one
// planning-point sequence. Classes the planning point never draws from get no pages (warned).
Status SizePools(const PlanOptions& options, const std::vector<KvGroup>& groups,
                 std::vector<PageClass>& classes, std::vector<std::string>& warnings);

}  // namespace hkv
