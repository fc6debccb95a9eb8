// Resolving PlanOptions: "unset" values replaced by the model's own figures, explicit values
// checked against their ranges. Private to the plan part.
#pragma once

#include <string>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/plan/plan_options.h>
#include <hkv/spec/model_spec.h>

namespace hkv {

// Largest block size and token count the planner accepts; far beyond any real model, small enough
// that every byte product of the plan fits in int64.
inline constexpr int32_t kMaxBlockTokens = int32_t{1} << 20;
inline constexpr int64_t kMaxTokens = int64_t{1} << 32;

// Returns the options with every unset value resolved, or InvalidArgument naming the option.
// Non-fatal surprises (a context beyond the config's own) are appended to `warnings`.
Result<PlanOptions> ResolveOptions(const ModelSpec& model, const PlanOptions& options,
                                   std::vector<std::string>& warnings);

}  // namespace hkv
