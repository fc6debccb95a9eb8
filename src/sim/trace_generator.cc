#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include <hkv/common/splitmix64.h>
#include <hkv/sim/trace_generator.h>

namespace hkv {
namespace {

// The project's generator plus the distributions the trace needs.
class Rng : public SplitMix64 {
 public:
  using SplitMix64::SplitMix64;

  // Uniform integer in [lo, hi].
  int64_t Between(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(Next() % static_cast<uint64_t>(hi - lo + 1));
  }
  // Log-uniform integer in [lo, hi]: short messages are as likely per decade as long ones.
  int32_t LogUniform(int32_t lo, int32_t hi) {
    const double x = std::exp(std::log(lo) + Unit() * (std::log(hi + 1.0) - std::log(lo)));
    return static_cast<int32_t>(std::clamp<double>(std::floor(x), lo, hi));
  }
  double Exponential(double mean) { return -mean * std::log(1.0 - Unit()); }
};

void AppendRandomTokens(Rng& rng, int32_t count, int32_t vocab, std::vector<int32_t>& out) {
  for (int32_t i = 0; i < count; ++i)
    out.push_back(static_cast<int32_t>(rng.Between(0, vocab - 1)));
}

Status CheckRange(std::string_view name, int64_t lo, int64_t hi, int64_t min) {
  if (lo < min) {
    return Status::InvalidArgument(fmt::format(
        "trace option {}: range [{}, {}]: min {}: expected >= {}", name, lo, hi, lo, min));
  }
  if (hi < lo) {
    return Status::InvalidArgument(fmt::format(
        "trace option {}: range [{}, {}]: max {}: expected >= min {}", name, lo, hi, hi, lo));
  }
  return Status::Ok();
}

// A request before ids are assigned: sessions are generated one after another and sorted by
// arrival afterwards.
struct Pending {
  TraceRequest request;
  size_t previous = SIZE_MAX;  // index of the previous turn in the pending list
};

}  // namespace

Status ValidateTraceGenOptions(const TraceGenOptions& o) {
  if (o.num_requests < 0) {
    return Status::InvalidArgument(
        fmt::format("trace option requests = {}: expected >= 0", o.num_requests));
  }
  if (!(o.session_gap >= 0.0) || !std::isfinite(o.session_gap)) {
    return Status::InvalidArgument(
        fmt::format("trace option session_gap = {}: expected a finite value >= 0", o.session_gap));
  }
  if (o.max_turns < 1) {
    return Status::InvalidArgument(
        fmt::format("trace option max_turns = {}: expected >= 1", o.max_turns));
  }
  if (o.num_system_prompts < 0) {
    return Status::InvalidArgument(
        fmt::format("trace option system_prompts = {}: expected >= 0", o.num_system_prompts));
  }
  if (!(o.system_prompt_share >= 0.0 && o.system_prompt_share <= 1.0)) {
    return Status::InvalidArgument(
        fmt::format("trace option system_prompt_share = {}: expected a share in [0, 1]",
                    o.system_prompt_share));
  }
  HKV_RETURN_IF_ERROR(CheckRange("system_prompt_len", o.system_prompt_min, o.system_prompt_max, 1));
  HKV_RETURN_IF_ERROR(CheckRange("first_message_len", o.first_message_min, o.first_message_max, 1));
  HKV_RETURN_IF_ERROR(CheckRange("followup_len", o.followup_min, o.followup_max, 1));
  HKV_RETURN_IF_ERROR(CheckRange("output_len", o.output_min, o.output_max, 1));
  HKV_RETURN_IF_ERROR(CheckRange("think_steps", o.think_min, o.think_max, 0));
  if (o.max_prompt_tokens < o.first_message_min) {
    return Status::InvalidArgument(
        fmt::format("trace option max_prompt_tokens = {}: expected at least first_message_min = {}",
                    o.max_prompt_tokens, o.first_message_min));
  }
  if (o.prefill_tokens_per_step < 1) {
    return Status::InvalidArgument(fmt::format(
        "trace option prefill_tokens_per_step = {}: expected >= 1", o.prefill_tokens_per_step));
  }
  if (o.vocab_size < 1) {
    return Status::InvalidArgument(
        fmt::format("trace option vocab_size = {}: expected >= 1", o.vocab_size));
  }
  return Status::Ok();
}

namespace {

// The turns of one session (all of them, or as many as the trace still needs), appended to
// `pending`.
void GenerateSession(Rng& rng, const TraceGenOptions& o,
                     const std::vector<std::vector<int32_t>>& system_prompts, int64_t session,
                     double session_start, std::vector<Pending>& pending) {
  const int32_t turns = static_cast<int32_t>(rng.Between(1, o.max_turns));
  std::vector<int32_t> prompt;
  int32_t system_prompt = -1;
  if (!system_prompts.empty() && rng.Unit() < o.system_prompt_share) {
    system_prompt = static_cast<int32_t>(rng.Between(0, o.num_system_prompts - 1));
    prompt = system_prompts[static_cast<size_t>(system_prompt)];
  }
  int64_t arrival = static_cast<int64_t>(std::floor(session_start));
  size_t previous = SIZE_MAX;
  for (int32_t turn = 0; turn < turns && static_cast<int64_t>(pending.size()) < o.num_requests;
       ++turn) {
    const int32_t message = turn == 0 ? rng.LogUniform(o.first_message_min, o.first_message_max)
                                      : rng.LogUniform(o.followup_min, o.followup_max);
    const int32_t output_len = rng.LogUniform(o.output_min, o.output_max);
    if (previous != SIZE_MAX) {
      // The conversation so far (with the reply) is the next prompt's prefix.
      const TraceRequest& last = pending[previous].request;
      const int64_t prefill_steps =
          (static_cast<int64_t>(last.prompt.size()) + o.prefill_tokens_per_step - 1) /
          o.prefill_tokens_per_step;
      arrival = last.arrival_step + prefill_steps + last.output_len +
                rng.Between(o.think_min, o.think_max);
      prompt.insert(prompt.end(), last.output.begin(), last.output.end());
    }
    if (static_cast<int64_t>(prompt.size()) + message > o.max_prompt_tokens) {
      // The first turn is clipped to the cap; a later turn that no longer fits ends the session.
      if (turn > 0) break;
    }
    const int32_t room = o.max_prompt_tokens - static_cast<int32_t>(prompt.size());
    AppendRandomTokens(rng, std::clamp(message, 1, std::max(room, 1)), o.vocab_size, prompt);
    if (static_cast<int64_t>(prompt.size()) > o.max_prompt_tokens) {
      prompt.resize(static_cast<size_t>(o.max_prompt_tokens));
    }
    Pending p;
    p.request.arrival_step = arrival;
    p.request.prompt = prompt;
    p.request.output_len = output_len;
    AppendRandomTokens(rng, output_len, o.vocab_size, p.request.output);
    p.request.session = session;
    p.request.turn = turn;
    p.request.system_prompt = system_prompt;
    p.previous = previous;
    previous = pending.size();
    pending.push_back(std::move(p));
  }
}

// The pending requests in arrival order, ids assigned; ties keep generation order (earlier
// sessions first).
Trace InArrivalOrder(std::vector<Pending>& pending) {
  std::vector<size_t> order(pending.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return pending[a].request.arrival_step < pending[b].request.arrival_step;
  });
  std::vector<int64_t> id_of(pending.size());
  for (size_t rank = 0; rank < order.size(); ++rank)
    id_of[order[rank]] = static_cast<int64_t>(rank);

  Trace trace;
  trace.reserve(pending.size());
  for (size_t index : order) {
    TraceRequest q = std::move(pending[index].request);
    q.id = id_of[index];
    q.parent = pending[index].previous == SIZE_MAX ? -1 : id_of[pending[index].previous];
    trace.push_back(std::move(q));
  }
  return trace;
}

}  // namespace

Result<Trace> GenerateTrace(const TraceGenOptions& o) {
  HKV_RETURN_IF_ERROR(ValidateTraceGenOptions(o));
  Rng rng(o.seed);

  std::vector<std::vector<int32_t>> system_prompts(static_cast<size_t>(o.num_system_prompts));
  for (std::vector<int32_t>& p : system_prompts) {
    AppendRandomTokens(rng,
                       static_cast<int32_t>(rng.Between(o.system_prompt_min, o.system_prompt_max)),
                       o.vocab_size, p);
  }

  std::vector<Pending> pending;
  pending.reserve(static_cast<size_t>(o.num_requests));
  double session_start = 0.0;
  for (int64_t session = 0; static_cast<int64_t>(pending.size()) < o.num_requests; ++session) {
    if (session > 0) session_start += rng.Exponential(o.session_gap);
    GenerateSession(rng, o, system_prompts, session, session_start, pending);
  }
  return InArrivalOrder(pending);
}

}  // namespace hkv
