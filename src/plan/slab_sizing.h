// Slab sizing for the two-level strategy: the slab size, and how many slabs the budget buys.
// Private to the plan part.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <hkv/common/status.h>
#include <hkv/plan/plan.h>

namespace hkv {

// The slab size for these classes (page_bytes set) and budget: see ArenaPlan.
int64_t ChooseSlabBytes(const std::vector<PageClass>& classes, int64_t memory_bytes);

// Sets pages_per_slab of every class, and num_pages to the pages it would have with every slab.
void CarveClasses(int64_t slab_bytes, int64_t num_slabs, std::vector<PageClass>& classes);

// Chooses the slab, buys num_slabs = memory / slab, carves the classes. ResourceExhausted when
// the slabs cannot hold one sequence at the planning point.
Status SizeArena(const PlanOptions& options, const std::vector<KvGroup>& groups,
                 std::vector<PageClass>& classes, ArenaPlan& arena);

}  // namespace hkv
