// Page sizing: the page-size strategies the planner weighs and the choice between them.
// Private to the plan part.
#pragma once

#include <vector>

#include <hkv/common/result.h>
#include <hkv/plan/plan.h>

namespace hkv {

// One strategy worked out in full: its groups and classes (page_bytes set for the layout,
// num_pages still 0) and its summary for Plan::candidates.
struct Candidate {
  PageCandidate summary;
  std::vector<KvGroup> groups;
  std::vector<PageClass> classes;
};

// The single-class, multi-class and two-level candidates, evaluated at the planning point of the
// resolved `options`. `rule_groups` come from FormGroups.
std::vector<Candidate> PageCandidates(const ModelSpec& model,
                                      const std::vector<KvGroup>& rule_groups,
                                      const PlanOptions& options, int64_t uniform_bytes_per_token);

// Index of the candidate `strategy` asks for: kAuto takes the feasible one with the fewest wasted
// bytes (a tie goes to the single class: one pool is simpler), except that two-level replaces a
// winning multi-class when its slab tails cost at most 1% more of a sequence. An explicit
// infeasible strategy is InvalidArgument with its reason.
Result<size_t> ChooseCandidate(const std::vector<Candidate>& candidates, PageStrategy strategy);

}  // namespace hkv
