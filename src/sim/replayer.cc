#include <algorithm>
#include <chrono>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <hkv/common/splitmix64.h>
#include <hkv/manager/compaction_policy.h>
#include <hkv/manager/kv_cache_manager.h>
#include <hkv/pool/block_hash.h>
#include <hkv/sim/future_use.h>
#include <hkv/sim/replayer.h>

#include "replay_common.h"
#include "step_loop.h"

namespace hkv {
namespace {

// hkv's KvCacheManager as the step loop drives it (src/sim/step_loop.h).
class HkvDriven {
 public:
  struct Request {
    const TraceRequest* trace = nullptr;
    RequestId id = 0;             // the request's position in the trace
    std::vector<int32_t> tokens;  // prompt and the outputs appended so far
    int64_t computed = 0;
    int32_t outputs = 0;
    bool added = false;  // registered with the manager (and not freed since)
  };
  using Chunk = sim_internal::Chunk<Request>;

  HkvDriven(const ManagerConfig& mc, KvCacheManager& manager, ReplayReport& report, bool compact,
            FutureUse* future)
      : mc_(mc),
        manager_(manager),
        report_(report),
        compact_(compact && mc.arena.enabled()),
        future_(future) {}

  static int64_t Tokens(const Request& r) { return static_cast<int64_t>(r.tokens.size()); }
  static int64_t& Computed(Request& r) { return r.computed; }

  Status BeginStep();
  int64_t RunningChunk(const Request&, int64_t n) const { return n; }
  Status AllocateRunning(Request& r, int64_t n) {
    const Status st = watch_([&] { return manager_.Allocate(r.id, n); });
    refused_ = refused_ || st.code() == StatusCode::kResourceExhausted;
    return st;
  }
  Status Preempt(Request& r) {
    // The oracle: the victim needs its prefixes again, so what it frees is ranked as such.
    const std::span<const BlockHash> again = future_ != nullptr
                                                 ? future_->Return(static_cast<size_t>(r.id))
                                                 : std::span<const BlockHash>();
    HKV_RETURN_IF_ERROR(watch_([&] { return manager_.Free(r.id, FreeReason::kPreempted); }));
    r.added = false;
    return future_ != nullptr ? manager_.Rerank(again) : Status::Ok();
  }
  void ScheduledRunning(const Request&) {}
  Result<sim_internal::MaybeAdmission> TryAdmit(Request& r, int64_t budget);
  void Admitted(const Request&) {}
  Status DoesNotFit(const Request& r) const {
    return Status::ResourceExhausted(fmt::format(
        "replay: request {} ({} tokens) does not fit in the pools even with nothing else "
        "running; give the manager more memory",
        r.trace->id, Tokens(r)));
  }
  Status ReadStep(std::span<const Chunk> scheduled, const std::vector<Request*>& running,
                  ReplayStep& step);
  void CountBlocks(ReplayStep& step) const {
    for (size_t p = 0; p < mc_.pool_blocks.size(); ++p) {
      const PoolUsage u = manager_.Usage(static_cast<int32_t>(p));
      step.blocks_used += u.num_blocks - u.num_free;
      step.cached_blocks += u.num_cached;
    }
  }
  Status Commit(Request& r, int64_t computed) {
    return watch_([&] { return manager_.Commit(r.id, computed); });
  }
  Status Append(Request& r, int32_t token) {
    HKV_RETURN_IF_ERROR(watch_([&] { return manager_.AppendTokens(r.id, {&token, 1}); }));
    r.tokens.push_back(token);
    return Status::Ok();
  }
  Status Finish(Request& r) {
    HKV_RETURN_IF_ERROR(watch_([&] { return manager_.Free(r.id); }));
    r.added = false;
    return Status::Ok();
  }
  Status CheckInvariants() const { return manager_.CheckInvariants(); }
  double TakeManagerUs() { return watch_.Take(); }

 private:
  const ManagerConfig& mc_;
  KvCacheManager& manager_;
  ReplayReport& report_;
  StepInputs inputs_{};
  sim_internal::Stopwatch watch_{};
  const bool compact_;
  FutureUse* const future_;  // the oracle mode's future; nullptr otherwise
  bool refused_ = false;     // a running request's allocation was refused since the last compaction
  std::vector<int64_t> compact_limits_;
};

// Between steps no request has a step open, so the manager may move pages; the engine would copy
// each moved page before the step's model run.
Status HkvDriven::BeginStep() {
  if (!compact_) return Status::Ok();
  int32_t for_pool = -1;
  const bool due =
      watch_([&] { return CompactionDue(manager_, refused_, compact_limits_, for_pool); });
  refused_ = false;
  if (!due) return Status::Ok();
  HKV_ASSIGN_OR_RETURN(const CompactionResult r, watch_([&] {
                         return for_pool >= 0 ? manager_.CompactFor(for_pool, compact_limits_)
                                              : manager_.Compact(compact_limits_);
                       }));
  if (r.slabs.empty()) return Status::Ok();
  ++report_.compactions;
  report_.pages_moved += static_cast<int64_t>(r.moves.size());
  report_.slabs_compacted += static_cast<int64_t>(r.slabs.size());
  report_.cached_pages_moved = manager_.Arena().cached_pages_moved;  // the arena counts them
  return Status::Ok();
}

// The request is registered (once: a refused admission stays registered), looked up, and
// allocated the step's chunk with the rest of its prompt reserved as lookahead: the whole
// remaining prompt must fit.
Result<sim_internal::MaybeAdmission> HkvDriven::TryAdmit(Request& r, int64_t budget) {
  if (!r.added) {
    RequestSpec spec;
    spec.id = r.id;
    spec.prompt = r.tokens;
    HKV_RETURN_IF_ERROR(watch_([&] { return manager_.AddRequest(spec); }));
    r.added = true;
  }
  HKV_ASSIGN_OR_RETURN(const PrefixHit hit, watch_([&] { return manager_.Lookup(r.id); }));
  const int64_t n = std::min(Tokens(r) - hit.tokens, budget);
  const int64_t rest = Tokens(r) - hit.tokens - n;
  const Status st = watch_([&] { return manager_.Allocate(r.id, n, hit, rest); });
  if (st.code() == StatusCode::kResourceExhausted) return sim_internal::MaybeAdmission();
  HKV_RETURN_IF_ERROR(st);
  // Outside the measured time: the oracle's bookkeeping is not the manager's work.
  if (future_ != nullptr) HKV_RETURN_IF_ERROR(manager_.Rerank(future_->Consume(r.id)));
  return sim_internal::MaybeAdmission({.n = n, .hit = hit.tokens});
}

// What an engine receives for the step: for every scheduled request what changed in its tables,
// its slots and its state slots, in one call (TakeStepInputs). A recurrent checkpoint inside the
// step's chunk splits the chunk there.
Status HkvDriven::ReadStep(std::span<const Chunk> scheduled, const std::vector<Request*>&,
                           ReplayStep& step) {
  for (const Chunk& sc : scheduled) {
    HKV_RETURN_IF_ERROR(watch_([&] { return manager_.TakeStepInputs(sc.r->id, inputs_); }));
    for (size_t g = 0; g < mc_.groups.size(); ++g) {
      if (!mc_.groups[g].is_state()) continue;
      const std::span<const StateSnapshot> snaps = inputs_.states[g].snapshots;
      const auto splits =
          static_cast<int64_t>(std::count_if(snaps.begin(), snaps.end(), [&](const auto& x) {
            return x.position < sc.r->computed + sc.n && x.position <= Tokens(*sc.r);
          }));
      step.state_splits += splits;
      report_.max_request_state_splits = std::max(report_.max_request_state_splits, splits);
      break;  // every state group splits at the same positions
    }
  }
  return Status::Ok();
}

}  // namespace

double ReplayReport::hit_rate() const {
  return first_admission_tokens == 0 ? 0.0
                                     : static_cast<double>(first_admission_hits) /
                                           static_cast<double>(first_admission_tokens);
}

StepTimes ReplayReport::manager_times() const {
  StepTimes t;
  if (manager_us.empty()) return t;
  std::vector<double> us = manager_us;
  t.mean = std::accumulate(us.begin(), us.end(), 0.0) / static_cast<double>(us.size());
  const auto rank = [&](double q) {
    const auto k = static_cast<size_t>(q * static_cast<double>(us.size() - 1) + 0.5);
    std::nth_element(us.begin(), us.begin() + static_cast<std::ptrdiff_t>(k), us.end());
    return us[k];
  };
  t.p50 = rank(0.50);
  t.p99 = rank(0.99);
  return t;
}

double ReplayReport::state_splits_per_step() const {
  return steps == 0 ? 0.0 : static_cast<double>(state_splits) / static_cast<double>(steps);
}

double ReplayReport::hit_rate_incl_readmissions() const {
  return admission_tokens == 0
             ? 0.0
             : static_cast<double>(admission_hits) / static_cast<double>(admission_tokens);
}

Result<ReplayReport> Replay(const Trace& trace, const ManagerConfig& config,
                            const ReplayOptions& o) {
  HKV_RETURN_IF_ERROR(sim_internal::CheckReplayInputs(trace, o));
  if (config.max_model_len < o.max_model_len) {
    return Status::InvalidArgument(
        fmt::format("replay: the manager allows {} tokens per request, the replay {}",
                    config.max_model_len, o.max_model_len));
  }
  ManagerConfig mc = config;
  mc.record_events = false;
  mc.publish_at_allocate = o.publish_at_allocate;
  std::shared_ptr<FutureUse> future;
  if (o.oracle) {
    if (config.eviction_rank != nullptr) {
      return Status::InvalidArgument(
          "replay: the oracle mode ranks evictions itself; the config already has an eviction "
          "rank");
    }
    HKV_RETURN_IF_ERROR(config.Validate());
    HKV_ASSIGN_OR_RETURN(future, FutureUse::Create(trace, config.hash_tokens()));
    mc.eviction_rank = future;
  }
  HKV_ASSIGN_OR_RETURN(KvCacheManager manager, KvCacheManager::Create(mc));
  sim_internal::ReplayBook book(trace, o);
  ReplayReport& report = book.report();
  for (size_t p = 0; p < mc.pool_blocks.size(); ++p)
    report.num_blocks += mc.pool_blocks[p] - 1;

  std::vector<HkvDriven::Request> reqs(trace.size());
  for (size_t i = 0; i < trace.size(); ++i) {
    reqs[i].trace = &trace[i];
    reqs[i].id = static_cast<RequestId>(i);
    reqs[i].tokens = trace[i].prompt;
  }
  HkvDriven driven(mc, manager, report, o.compact, future.get());
  sim_internal::StepLoop loop(o, book, driven, std::move(reqs));
  HKV_RETURN_IF_ERROR(loop.Run());
  report.manager_stats = manager.stats();
  return book.Finish();
}

double IdealHitRate(const Trace& trace, int32_t block_tokens) {
  struct Hasher {
    size_t operator()(const BlockHash& h) const { return static_cast<size_t>(h.lo ^ h.hi); }
  };
  std::unordered_set<BlockHash, Hasher> seen;
  int64_t prompt_tokens = 0, hits = 0;
  const auto bs = static_cast<size_t>(std::max(block_tokens, 1));
  std::vector<int32_t> all;
  for (const TraceRequest& t : trace) {
    if (t.prompt.empty()) continue;
    prompt_tokens += static_cast<int64_t>(t.prompt.size());
    // Longest cached chain of whole blocks within the first prompt - 1 tokens.
    BlockHash h = kRootHash;
    const size_t limit = (t.prompt.size() - 1) / bs;
    size_t b = 0;
    for (; b < limit; ++b) {
      h = HashBlock(h, std::span<const int32_t>(t.prompt).subspan(b * bs, bs));
      if (!seen.contains(h)) break;
    }
    hits += static_cast<int64_t>(b * bs);
    // The request then stores every whole block of its prompt and output.
    // The last output token is sampled, never computed, so no block holds it.
    all = t.prompt;
    if (!t.output.empty()) all.insert(all.end(), t.output.begin(), t.output.end() - 1);
    h = kRootHash;
    for (size_t k = 0; (k + 1) * bs <= all.size(); ++k) {
      h = HashBlock(h, std::span<const int32_t>(all).subspan(k * bs, bs));
      seen.insert(h);
    }
  }
  return prompt_tokens == 0 ? 0.0 : static_cast<double>(hits) / static_cast<double>(prompt_tokens);
}

namespace sim_internal {

Status CheckReplayInputs(const Trace& trace, const ReplayOptions& o) {
  const auto at_least = [](std::string_view field, int64_t value, int64_t min) {
    return value >= min ? Status::Ok()
                        : Status::InvalidArgument(
                              fmt::format("replay: {} = {}: expected >= {}", field, value, min));
  };
  for (const Status& st :
       {at_least("token_budget", o.token_budget, 1), at_least("max_running", o.max_running, 1),
        at_least("max_model_len", o.max_model_len, 2), at_least("vocab", o.vocab, 1)}) {
    if (!st.ok()) return st;
  }
  // ReadTrace checks files; a trace built in memory gets the checks the replay relies on.
  for (size_t i = 0; i < trace.size(); ++i) {
    const TraceRequest& t = trace[i];
    std::string why;
    if (t.prompt.empty() || static_cast<int64_t>(t.prompt.size()) >= o.max_model_len) {
      why = fmt::format("a {}-token prompt (1..{} allowed)", t.prompt.size(), o.max_model_len - 1);
    } else if (t.output_len < 0) {
      why = fmt::format("output_len {}: expected >= 0", t.output_len);
    } else if (!t.output.empty() && t.output.size() != static_cast<size_t>(t.output_len)) {
      why = fmt::format(
          "output_len {} with {} output tokens: expected as many tokens as "
          "output_len, or none",
          t.output_len, t.output.size());
    } else if (i > 0 && t.arrival_step < trace[i - 1].arrival_step) {
      why = fmt::format("arrival step {} before the previous request's {}", t.arrival_step,
                        trace[i - 1].arrival_step);
    }
    if (!why.empty()) {
      return Status::InvalidArgument(fmt::format("replay: request {} (#{}): {}", t.id, i, why));
    }
  }
  return Status::Ok();
}

ReplayBook::ReplayBook(const Trace& trace, const ReplayOptions& o)
    : trace_(trace), o_(o), generated_(trace.size()), admitted_(trace.size(), 0) {
  SplitMix64 rng(o.output_seed);
  for (size_t i = 0; i < trace.size(); ++i) {
    if (!trace[i].output.empty()) continue;
    for (int32_t k = 0; k < trace[i].output_len; ++k)
      generated_[i].push_back(rng.Below(o.vocab));
  }
  if (o.record_requests) {
    report_.requests.resize(trace.size());
    for (size_t i = 0; i < trace.size(); ++i) {
      report_.requests[i].id = trace[i].id;
      report_.requests[i].arrival_step = trace[i].arrival_step;
    }
  }
}

int32_t ReplayBook::Output(size_t i, int32_t k) const {
  const auto at = static_cast<size_t>(k);
  return trace_[i].output.empty() ? generated_[i][at] : trace_[i].output[at];
}

void ReplayBook::Admitted(size_t i, int64_t tokens, int64_t hit, ReplayStep& step) {
  report_.admission_tokens += tokens;
  report_.admission_hits += hit;
  step.hit_tokens += hit;
  if (admitted_[i]) return;
  admitted_[i] = 1;
  report_.first_admission_tokens += tokens;
  report_.first_admission_hits += hit;
  if (o_.record_requests) {
    report_.requests[i].first_scheduled_step = step.step;
    report_.requests[i].first_hit_tokens = hit;
  }
}

void ReplayBook::Preempted(size_t i, ReplayStep& step) {
  ++report_.preemptions;
  ++step.preemptions;
  if (o_.record_requests) ++report_.requests[i].preemptions;
}

void ReplayBook::Finished(size_t i, const ReplayStep& step) {
  ++finished_;
  if (o_.record_requests) report_.requests[i].finish_step = step.step;
}

void ReplayBook::EndStep(const ReplayStep& step, double manager_us) {
  report_.peak_blocks_used = std::max(report_.peak_blocks_used, step.blocks_used);
  report_.peak_running = std::max(report_.peak_running, step.running);
  report_.scheduled_tokens += step.scheduled_tokens;
  report_.state_splits += step.state_splits;
  report_.max_step_state_splits = std::max(report_.max_step_state_splits, step.state_splits);
  report_.manager_us.push_back(manager_us);
  if (o_.record_steps) report_.log.push_back(step);
  ++report_.steps;
  if (o_.on_progress && report_.steps % 256 == 0) o_.on_progress(finished_);
}

ReplayReport ReplayBook::Finish() {
  if (o_.on_progress) o_.on_progress(finished_);
  return std::move(report_);
}

}  // namespace sim_internal
}  // namespace hkv
