#include <fmt/format.h>

#include <hkv/plan/plan.h>

#include "capacity.h"
#include "grouping.h"
#include "memory_layout.h"
#include "page_sizing.h"
#include "pool_sizing.h"
#include "resolve_options.h"
#include "slab_sizing.h"

namespace hkv {

Result<Plan> MakePlan(const ModelSpec& model, const PlanOptions& options) {
  HKV_RETURN_IF_ERROR(model.Validate());
  Plan plan;
  plan.warnings = model.warnings;
  HKV_ASSIGN_OR_RETURN(plan.options, ResolveOptions(model, options, plan.warnings));

  const std::vector<KvGroup> rule_groups =
      FormGroups(model, plan.options.block_tokens, plan.options.max_model_len);
  if (rule_groups.empty()) {
    return Status::InvalidArgument(
        fmt::format("{}: no layer keeps KV cache or recurrent state, so there is nothing to plan",
                    model.source));
  }
  plan.uniform_bytes_per_token = UniformBytesPerToken(model);

  std::vector<Candidate> candidates =
      PageCandidates(model, rule_groups, plan.options, plan.uniform_bytes_per_token);
  HKV_ASSIGN_OR_RETURN(const size_t chosen, ChooseCandidate(candidates, plan.options.strategy));
  for (const Candidate& c : candidates)
    plan.candidates.push_back(c.summary);
  plan.strategy = candidates[chosen].summary.strategy;
  plan.groups = std::move(candidates[chosen].groups);
  plan.page_classes = std::move(candidates[chosen].classes);

  if (plan.strategy == PageStrategy::kTwoLevel) {
    HKV_RETURN_IF_ERROR(SizeArena(plan.options, plan.groups, plan.page_classes, plan.arena));
  } else {
    HKV_RETURN_IF_ERROR(SizePools(plan.options, plan.groups, plan.page_classes, plan.warnings));
  }
  plan.layout = BuildLayout(model, plan.options.layout, plan.groups, plan.page_classes);
  plan.model = model;
  return plan;
}

}  // namespace hkv
