#include <fstream>
#include <limits>
#include <ostream>
#include <sstream>
#include <unordered_set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hkv/sim/trace.h>

namespace hkv {
namespace {

using nlohmann::json;

class LineReader {
 public:
  LineReader(const json& line, std::string_view source, int64_t line_no)
      : line_(line), source_(source), line_no_(line_no) {}

  Status Error(std::string_view field, std::string_view expected) const {
    auto it = line_.find(field);
    const std::string found =
        it == line_.end()
            ? "missing"
            : "= " + it->dump(-1, ' ', false, json::error_handler_t::replace).substr(0, 60);
    return Status::InvalidArgument(fmt::format("{}:{}: field '{}' {}: expected {}", source_,
                                               line_no_, field, found, expected));
  }

  Result<int64_t> Int(std::string_view field, int64_t min, int64_t fallback, bool required) const {
    auto it = line_.find(field);
    if (it == line_.end() || it->is_null()) {
      if (required) return Error(field, fmt::format("an integer >= {}", min));
      return fallback;
    }
    if (!it->is_number_integer() || it->get<int64_t>() < min) {
      return Error(field, fmt::format("an integer >= {}", min));
    }
    return it->get<int64_t>();
  }

  Result<std::vector<int32_t>> Tokens(std::string_view field, bool required) const {
    auto it = line_.find(field);
    if (it == line_.end() || it->is_null()) {
      if (required) return Error(field, "a list of token ids");
      return std::vector<int32_t>{};
    }
    if (!it->is_array()) return Error(field, "a list of token ids");
    std::vector<int32_t> tokens;
    tokens.reserve(it->size());
    for (const json& t : *it) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
          t.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return Error(field, fmt::format("token ids in [0, 2^31) (item {} is not)", tokens.size()));
      }
      tokens.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    return tokens;
  }

 private:
  const json& line_;
  std::string_view source_;
  int64_t line_no_;
};

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

Result<TraceRequest> ParseRequest(const json& line, std::string_view source, int64_t line_no) {
  if (!line.is_object()) {
    return Status::InvalidArgument(
        fmt::format("{}:{}: expected a JSON object per line", source, line_no));
  }
  const LineReader r(line, source, line_no);
  TraceRequest q;
  HKV_ASSIGN_OR_RETURN(q.id, r.Int("id", 0, 0, true));
  HKV_ASSIGN_OR_RETURN(q.arrival_step, r.Int("arrival_step", 0, 0, true));
  HKV_ASSIGN_OR_RETURN(q.prompt, r.Tokens("prompt", true));
  if (q.prompt.empty()) return r.Error("prompt", "at least one token");
  HKV_ASSIGN_OR_RETURN(int64_t output_len, r.Int("output_len", 1, 0, true));
  if (output_len > kInt32Max) return r.Error("output_len", "at most 2^31 - 1");
  q.output_len = static_cast<int32_t>(output_len);
  HKV_ASSIGN_OR_RETURN(q.output, r.Tokens("output", false));
  if (!q.output.empty() && static_cast<int64_t>(q.output.size()) != output_len) {
    return r.Error("output",
                   fmt::format("output_len = {} tokens (found {})", output_len, q.output.size()));
  }
  HKV_ASSIGN_OR_RETURN(q.session, r.Int("session", -1, -1, false));
  HKV_ASSIGN_OR_RETURN(int64_t turn, r.Int("turn", 0, 0, false));
  if (turn > kInt32Max) return r.Error("turn", "at most 2^31 - 1");
  q.turn = static_cast<int32_t>(turn);
  HKV_ASSIGN_OR_RETURN(q.parent, r.Int("parent", 0, -1, false));
  HKV_ASSIGN_OR_RETURN(int64_t system_prompt, r.Int("system_prompt", -1, -1, false));
  if (system_prompt > kInt32Max) return r.Error("system_prompt", "at most 2^31 - 1");
  q.system_prompt = static_cast<int32_t>(system_prompt);
  return q;
}

}  // namespace

Result<Trace> ParseTrace(std::string_view jsonl, std::string_view source) {
  Trace trace;
  std::unordered_set<int64_t> ids;
  int64_t line_no = 0;
  size_t pos = 0;
  while (pos < jsonl.size()) {
    size_t end = jsonl.find('\n', pos);
    if (end == std::string_view::npos) end = jsonl.size();
    const std::string_view text = jsonl.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (text.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    json line;
    try {
      line = json::parse(text);
    } catch (const json::exception& e) {
      return Status::ParseError(fmt::format("{}:{}: invalid JSON: {}", source, line_no, e.what()));
    }
    HKV_ASSIGN_OR_RETURN(TraceRequest q, ParseRequest(line, source, line_no));
    if (!trace.empty() && q.arrival_step < trace.back().arrival_step) {
      return Status::InvalidArgument(fmt::format(
          "{}:{}: arrival_step = {} is before the previous request's {}: expected arrival order",
          source, line_no, q.arrival_step, trace.back().arrival_step));
    }
    if (!ids.insert(q.id).second) {
      return Status::InvalidArgument(
          fmt::format("{}:{}: id = {} appears twice: expected unique ids", source, line_no, q.id));
    }
    if (q.parent >= 0 && (q.parent == q.id || !ids.contains(q.parent))) {
      return Status::InvalidArgument(fmt::format(
          "{}:{}: parent = {}: expected the id of an earlier request", source, line_no, q.parent));
    }
    trace.push_back(std::move(q));
  }
  return trace;
}

Result<Trace> ReadTrace(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(fmt::format("{}: cannot open trace file", path.string()));
  std::ostringstream text;
  text << in.rdbuf();
  return ParseTrace(text.str(), path.string());
}

void WriteTrace(const Trace& trace, std::ostream& out) {
  std::string line;
  for (const TraceRequest& q : trace) {
    line.clear();
    fmt::format_to(std::back_inserter(line), "{{\"id\":{},\"arrival_step\":{},\"prompt\":[{}]",
                   q.id, q.arrival_step, fmt::join(q.prompt, ","));
    fmt::format_to(std::back_inserter(line), ",\"output_len\":{}", q.output_len);
    if (!q.output.empty()) {
      fmt::format_to(std::back_inserter(line), ",\"output\":[{}]", fmt::join(q.output, ","));
    }
    fmt::format_to(std::back_inserter(line), ",\"session\":{},\"turn\":{},\"parent\":", q.session,
                   q.turn);
    if (q.parent >= 0) {
      fmt::format_to(std::back_inserter(line), "{}", q.parent);
    } else {
      line += "null";
    }
    fmt::format_to(std::back_inserter(line), ",\"system_prompt\":{}}}\n", q.system_prompt);
    out << line;
  }
}

Status WriteTraceFile(const Trace& trace, const std::filesystem::path& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Status::IoError(fmt::format("{}: cannot open for writing", path.string()));
  WriteTrace(trace, out);
  out.flush();
  if (!out) return Status::IoError(fmt::format("{}: write failed", path.string()));
  return Status::Ok();
}

}  // namespace hkv
