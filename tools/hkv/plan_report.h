// Rendering a Plan: a JSON document for scripts and a table for people.
//
// Contract: PlanToJson emits every field documented in docs/cli.md for `hkv plan --json`; the
// document is a pure function of the plan (no timings, no paths other than the config source).
#pragma once

#include <iosfwd>

#include <nlohmann/json.hpp>

#include <hkv/plan/plan.h>

namespace hkv::cli {

nlohmann::json PlanToJson(const Plan& plan);
void PrintPlanTable(const Plan& plan, bool show_layout, std::ostream& out);

}  // namespace hkv::cli
