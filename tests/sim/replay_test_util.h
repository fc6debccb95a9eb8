// Hand-built inputs for replay tests: a full-attention config and a trace request.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <hkv/manager/manager_config.h>
#include <hkv/sim/trace.h>

namespace hkv::testing {

// One full-attention group of 4-token blocks over `blocks` blocks, max model len 64.
inline ManagerConfig FullAttention(int32_t blocks) {
  ManagerConfig c;
  c.pool_blocks = {blocks + 1};
  GroupConfig g;
  g.rule.kind = TokenRuleKind::kAll;
  g.block_tokens = 4;
  c.groups = {g};
  c.max_model_len = 64;
  return c;
}

inline TraceRequest Request(int64_t id, int64_t arrival, std::vector<int32_t> prompt,
                            std::vector<int32_t> output) {
  TraceRequest t;
  t.id = id;
  t.arrival_step = arrival;
  t.prompt = std::move(prompt);
  t.output_len = static_cast<int32_t>(output.size());
  t.output = std::move(output);
  return t;
}

}  // namespace hkv::testing
