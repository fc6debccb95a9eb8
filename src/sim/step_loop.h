// StepLoop: the scheduler loop of replay.md (synchronous first-come first-served continuous
// batching), written once for every manager a trace is replayed through: hkv's KvCacheManager
// (Replay), vLLM's restated manager (ReplayVllm) and, in the tests, the content-checking fake
// engine. What differs between them is what each asks its manager, never the loop's shape.
//
// Contract: a step is, in this order,
//   0. arrivals join the waiting tail in trace order (idle gaps are skipped, not counted);
//   1. the driven manager's step start (between steps: hkv's compacts two-level memory here);
//   2. running requests in order while budget remains: each schedules min(tokens not computed,
//      budget, max_model_len - 1 - computed), cut by the manager's own chunk rule, and skips a
//      request left with nothing; short of blocks it preempts from the back (AllocateOrPreempt:
//      the victim is freed, its computed count reset, and it returns to the front of waiting),
//      and the loop stops when the victim was the request itself;
//   3. only in a step without preemption, admissions from the waiting head while budget and the
//      running cap allow, each as the manager decides (TryAdmit: its hit, its chunk, whether it
//      fits), stopping at the first that does not; a step where nothing runs and the head still
//      did not fit is an error (it never will);
//   4. the step's reads, then its block counts, running and waiting;
//   5. commits in scheduling order;
//   6. outputs in scheduling order: a request that computed every known token appends its next
//      output token, and finishes (freed) at output_len or at max_model_len;
//   7. the invariant check (ReplayOptions::check_invariants), and the book's end of step with the
//      manager time the driven manager measured.
// The loop owns the scheduling state (queues, budget, computed positions, outputs); the driven
// manager owns the manager and makes every manager call, timing exactly those calls with its own
// stopwatch, so the measured region is the manager's work alone.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/common/status.h>
#include <hkv/sim/replayer.h>
#include <hkv/sim/trace.h>

#include "../common/preempt_from_back.h"
#include "replay_common.h"

namespace hkv::sim_internal {

// A request scheduled in the step being built, and its token count.
template <typename Request>
struct Chunk {
  Request* r;
  int64_t n;
};

// What a request's admission takes: `n` tokens this step after a `hit`-token prefix hit.
struct Admission {
  int64_t n = 0;
  int64_t hit = 0;
};
using MaybeAdmission = std::optional<Admission>;  // nullopt: the request does not fit

// The manager being driven. Its Request is one trace request's live state: `trace` and `outputs`
// (output tokens appended so far) for the loop, the rest its own; Tokens and Computed read the
// known and computed token counts the manager sees. Every call but the Tokens/Computed accessors
// may call the manager; Status-returning ones fail the replay.
template <typename D>
concept DrivenManager = requires(D& d, typename D::Request& r, const typename D::Request& cr,
                                 int64_t n, int32_t token, ReplayStep& step,
                                 std::span<const Chunk<typename D::Request>> chunks,
                                 const std::vector<typename D::Request*>& running) {
  { cr.trace } -> std::convertible_to<const TraceRequest*>;
  { r.outputs } -> std::same_as<int32_t&>;
  { D::Tokens(cr) } -> std::same_as<int64_t>;
  { D::Computed(r) } -> std::same_as<int64_t&>;
  { d.BeginStep() } -> std::same_as<Status>;  // between steps: no request has a step open
  // A running request's chunk of n tokens, cut as the manager's scheduler would.
  { d.RunningChunk(cr, n) } -> std::same_as<int64_t>;
  { d.AllocateRunning(r, n) } -> std::same_as<Status>;  // kResourceExhausted: short of blocks
  { d.Preempt(r) } -> std::same_as<Status>;             // free a preemption victim
  d.ScheduledRunning(cr);                               // a running request got its blocks
  // Admission of a waiting request within `n` budget tokens: nullopt when it does not fit.
  { d.TryAdmit(r, n) } -> std::same_as<Result<MaybeAdmission>>;
  d.Admitted(cr);
  { d.DoesNotFit(cr) } -> std::same_as<Status>;  // the error for a request that never fits
  { d.ReadStep(chunks, running, step) } -> std::same_as<Status>;
  d.CountBlocks(step);                         // blocks_used, cached_blocks
  { d.Commit(r, n) } -> std::same_as<Status>;  // computed up to n
  { d.Append(r, token) } -> std::same_as<Status>;
  { d.Finish(r) } -> std::same_as<Status>;
  { d.CheckInvariants() } -> std::same_as<Status>;
  { d.TakeManagerUs() } -> std::same_as<double>;  // manager time since the last take
};

template <DrivenManager D>
class StepLoop {
 public:
  using Request = typename D::Request;

  // `requests` in trace order: request i is the trace's i-th (the book's numbering).
  StepLoop(const ReplayOptions& options, ReplayBook& book, D& driven, std::vector<Request> requests)
      : o_(options), book_(book), d_(driven), reqs_(std::move(requests)) {}

  // Replays the trace to the end: every request admitted, run and finished.
  Status Run() {
    size_t next = 0;
    int64_t s = 0;
    while (next < reqs_.size() || !waiting_.empty() || !running_.empty()) {
      while (next < reqs_.size() && reqs_[next].trace->arrival_step <= s)
        waiting_.push_back(&reqs_[next++]);
      if (waiting_.empty() && running_.empty()) {
        s = reqs_[next].trace->arrival_step;
        continue;
      }
      ReplayStep step;
      step.step = s;
      HKV_RETURN_IF_ERROR(RunStep(step));
      ++s;
    }
    return Status::Ok();
  }

 private:
  size_t At(const Request& r) const { return static_cast<size_t>(&r - reqs_.data()); }

  Status RunStep(ReplayStep& step) {
    HKV_RETURN_IF_ERROR(d_.BeginStep());
    int64_t budget = o_.token_budget;
    scheduled_.clear();
    HKV_ASSIGN_OR_RETURN(const bool preempted, ScheduleRunning(step, budget));
    if (!preempted) HKV_RETURN_IF_ERROR(Admit(step, budget));
    // The head was tried with nothing running, so every cached block was free to evict, and it
    // still did not fit: it never will, and waiting for it would loop forever.
    if (!preempted && running_.empty() && !waiting_.empty())
      return d_.DoesNotFit(*waiting_.front());
    HKV_RETURN_IF_ERROR(d_.ReadStep(scheduled_, running_, step));
    d_.CountBlocks(step);
    step.running = static_cast<int64_t>(running_.size());
    step.waiting = static_cast<int64_t>(waiting_.size());
    for (const Chunk<Request>& sc : scheduled_) {
      HKV_RETURN_IF_ERROR(d_.Commit(*sc.r, D::Computed(*sc.r) + sc.n));
      D::Computed(*sc.r) += sc.n;
      step.scheduled_tokens += sc.n;
    }
    HKV_RETURN_IF_ERROR(Outputs(step));
    if (o_.check_invariants) HKV_RETURN_IF_ERROR(d_.CheckInvariants());
    book_.EndStep(step, d_.TakeManagerUs());
    return Status::Ok();
  }

  // 2. Whether anyone was preempted.
  Result<bool> ScheduleRunning(ReplayStep& step, int64_t& budget) {
    bool preempted = false;
    for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
      Request* r = running_[i];
      const int64_t computed = D::Computed(*r);
      const int64_t n = d_.RunningChunk(
          *r, std::min({D::Tokens(*r) - computed, budget, o_.max_model_len - 1 - computed}));
      if (n <= 0) continue;
      HKV_ASSIGN_OR_RETURN(const bool allocated,
                           common_internal::AllocateOrPreempt(
                               running_, r, [&] { return d_.AllocateRunning(*r, n); },
                               [&](Request* victim, const Status&) {
                                 preempted = true;
                                 return Preempt(*victim, step);
                               }));
      if (!allocated) break;
      d_.ScheduledRunning(*r);
      scheduled_.push_back({r, n});
      budget -= n;
    }
    return preempted;
  }

  Status Preempt(Request& victim, ReplayStep& step) {
    running_.pop_back();
    HKV_RETURN_IF_ERROR(d_.Preempt(victim));
    D::Computed(victim) = 0;
    book_.Preempted(At(victim), step);
    waiting_.push_front(&victim);
    return Status::Ok();
  }

  // 3.
  Status Admit(ReplayStep& step, int64_t& budget) {
    while (!waiting_.empty() && budget > 0 &&
           static_cast<int64_t>(running_.size()) < o_.max_running) {
      Request* r = waiting_.front();
      HKV_ASSIGN_OR_RETURN(const MaybeAdmission a, d_.TryAdmit(*r, budget));
      if (!a) break;
      waiting_.pop_front();
      running_.push_back(r);
      d_.Admitted(*r);
      book_.Admitted(At(*r), D::Tokens(*r), a->hit, step);
      D::Computed(*r) = a->hit;
      scheduled_.push_back({r, a->n});
      budget -= a->n;
    }
    return Status::Ok();
  }

  // 6.
  Status Outputs(ReplayStep& step) {
    for (const Chunk<Request>& sc : scheduled_) {
      Request* r = sc.r;
      if (D::Computed(*r) < D::Tokens(*r)) continue;
      if (r->outputs < r->trace->output_len) {
        HKV_RETURN_IF_ERROR(d_.Append(*r, book_.Output(At(*r), r->outputs)));
        ++r->outputs;
      }
      // A request that reaches max_model_len finishes there, as vLLM's scheduler does.
      if (r->outputs >= r->trace->output_len || D::Tokens(*r) >= o_.max_model_len) {
        running_.erase(std::find(running_.begin(), running_.end(), r));
        HKV_RETURN_IF_ERROR(d_.Finish(*r));
        book_.Finished(At(*r), step);
      }
    }
    return Status::Ok();
  }

  const ReplayOptions& o_;
  ReplayBook& book_;
  D& d_;
  std::vector<Request> reqs_;
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;
  std::vector<Chunk<Request>> scheduled_;
};

}  // namespace hkv::sim_internal
