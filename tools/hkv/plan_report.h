// Rendering a Plan: a JSON document for scripts and a table for people.
//
// Contract: PlanToJson emits every field documented in docs/cli.md for `hkv plan --json`; the
// document is a pure function of the plan (no timings, no paths other than the config source).
// AllocatorsToJson / PrintAllocatorTable render the allocator comparison of
// `hkv plan --allocator` (the `allocators` array and its table).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <hkv/manager/allocator_mode.h>
#include <hkv/plan/plan.h>

namespace hkv::cli {

nlohmann::json PlanToJson(const Plan& plan);
void PrintPlanTable(const Plan& plan, bool show_layout, std::ostream& out);

// One sequence of `tokens` decoder tokens under one allocator mode.
struct AllocatorFigures {
  int64_t tokens = 0;
  int64_t bytes_per_sequence = 0;
  double waste = 0.0;         // against IdealBytes
  int64_t max_sequences = 0;  // INT64_MAX: the sequence needs no block
};

struct AllocatorReport {
  AllocatorMode mode = AllocatorMode::kHybridKV;
  std::optional<Allocator> allocator;  // empty: the mode cannot hold the model (`error`)
  std::string error;
  AllocatorFigures planning;              // at the plan's planning point
  std::vector<AllocatorFigures> lengths;  // at each compared length
};

nlohmann::json AllocatorsToJson(const std::vector<AllocatorReport>& reports);
// `show_lengths`: also the per-length table (when lengths other than the planning point were
// asked for).
void PrintAllocatorTable(const Plan& plan, const std::vector<AllocatorReport>& reports,
                         bool show_lengths, std::ostream& out);

}  // namespace hkv::cli
