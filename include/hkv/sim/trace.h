// Trace: the requests a serving simulation replays, in the JSONL format of replay.md.
//
// Contract: one request per line, in arrival order:
//   {"id", "arrival_step", "prompt": [tokens], "output_len", "output": [tokens]?, "session"?,
//    "turn"?, "parent"?, "system_prompt"?}
// ReadTrace accepts exactly that (unknown keys are ignored) and rejects, naming the file, the
// line and the field: malformed JSON, missing or mistyped required fields, negative token ids or
// counts, an empty prompt, an output whose length differs from output_len, arrival steps that go
// backwards, duplicate ids, and a parent that is not an earlier request. WriteTrace emits the
// canonical form (keys in the order above, no spaces), so a written trace reads back equal and
// the same trace always has the same bytes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <string_view>
#include <vector>

#include <hkv/common/result.h>

namespace hkv {

struct TraceRequest {
  int64_t id = 0;
  int64_t arrival_step = 0;
  std::vector<int32_t> prompt;
  int32_t output_len = 0;
  std::vector<int32_t> output;  // empty when the trace leaves outputs to the replayer
  int64_t session = -1;
  int32_t turn = 0;
  int64_t parent = -1;         // id of the previous turn of the session, -1 for none
  int32_t system_prompt = -1;  // which shared system prompt the prompt starts with, -1 for none

  bool operator==(const TraceRequest&) const = default;
};

using Trace = std::vector<TraceRequest>;

Result<Trace> ParseTrace(std::string_view jsonl, std::string_view source);
Result<Trace> ReadTrace(const std::filesystem::path& path);
void WriteTrace(const Trace& trace, std::ostream& out);
Status WriteTraceFile(const Trace& trace, const std::filesystem::path& path);

}  // namespace hkv
