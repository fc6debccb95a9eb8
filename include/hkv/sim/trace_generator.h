// Synthetic multi-turn chat traffic, as replay.md specifies it.
//
// Contract: GenerateTrace is a pure function of its options: the same options give the same
// trace on every machine (it draws from its own 64-bit generator, not from the standard library's
// distributions, whose results differ between implementations). Sessions start at Poisson
// arrival times; each has 1..max_turns turns. A turn's prompt is the previous turn's prompt, its
// output and a new user message, so later turns share the earlier ones as a prefix; the first
// prompt starts with one of the shared system prompts for `system_prompt_share` of sessions. A
// session ends early rather than exceed `max_prompt_tokens`. Requests are numbered in arrival
// order and the trace holds exactly `num_requests` of them. Bad options are rejected by name.
#pragma once

#include <cstdint>

#include <hkv/common/result.h>
#include <hkv/sim/trace.h>

namespace hkv {

struct TraceGenOptions {
  int64_t num_requests = 200;
  uint64_t seed = 1;
  double session_gap = 50.0;  // mean steps between session starts (exponential gaps)
  int32_t max_turns = 8;
  int32_t num_system_prompts = 4;
  double system_prompt_share = 0.8;
  int32_t system_prompt_min = 500, system_prompt_max = 2000;
  int32_t first_message_min = 50, first_message_max = 6000;  // log-uniform
  int32_t followup_min = 20, followup_max = 1500;            // log-uniform
  int32_t output_min = 50, output_max = 1000;                // log-uniform
  int32_t max_prompt_tokens = 8000;
  int32_t think_min = 20, think_max = 400;  // steps between a reply and the next turn
  int32_t prefill_tokens_per_step = 2048;   // arrival rule: ceil(prompt / this) steps of prefill
  int32_t vocab_size = 32000;
};

Status ValidateTraceGenOptions(const TraceGenOptions& options);
Result<Trace> GenerateTrace(const TraceGenOptions& options);

}  // namespace hkv
