// What both replays (hkv's manager and vLLM's) share: the trace checks they rely on, the book
// they keep (figures, per-request records, outputs, step log, progress), and the stopwatch
// around manager calls.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include <hkv/common/status.h>
#include <hkv/sim/replayer.h>

namespace hkv::sim_internal {

// Options in range, and every request replayable: a prompt of 1..max_model_len-1 tokens, outputs
// that agree with output_len, arrivals in order.
Status CheckReplayInputs(const Trace& trace, const ReplayOptions& options);

// The accounting of one replay, the same for every manager: replay.md's figures, the
// per-request records (options.record_requests), the outputs requests append (the trace's, or
// drawn from options.output_seed when it gives none), the step log and the progress hook.
// Requests are named by their position in the trace.
class ReplayBook {
 public:
  ReplayBook(const Trace& trace, const ReplayOptions& options);

  // The token request `i` appends as its output number `k`.
  int32_t Output(size_t i, int32_t k) const;
  // Request `i`, with `tokens` known tokens, admitted in `step` with a `hit`-token prefix hit.
  void Admitted(size_t i, int64_t tokens, int64_t hit, ReplayStep& step);
  void Preempted(size_t i, ReplayStep& step);
  void Finished(size_t i, const ReplayStep& step);
  // Closes a step whose figures are complete: totals, peaks, the log, progress.
  void EndStep(const ReplayStep& step, double manager_us);
  // The report so far (the replay adds what only it knows); Finish calls the progress hook once
  // more and hands it over.
  ReplayReport& report() { return report_; }
  ReplayReport Finish();

 private:
  const Trace& trace_;
  const ReplayOptions& o_;
  ReplayReport report_;
  std::vector<std::vector<int32_t>> generated_;  // per request, when the trace gives no output
  std::vector<char> admitted_;
  int64_t finished_ = 0;
};

// Ticks of the clock the stopwatch reads, and how many of them make a microsecond. On x86-64 the
// time-stamp counter (constant rate on every CPU this runs on; calibrated once against
// steady_clock): reading it costs a few nanoseconds where steady_clock costs ~30, and with five
// manager calls per running request and step the clock would otherwise be most of what is
// measured. Elsewhere steady_clock's nanoseconds.
#if defined(__x86_64__)
inline uint64_t StopwatchTicks() {
  return __rdtsc();
}
inline double StopwatchTicksPerMicro() {
  static const double per_micro = [] {
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    const uint64_t c0 = __rdtsc();
    while (Clock::now() - t0 < std::chrono::milliseconds(20)) {
    }
    const auto t1 = Clock::now();
    const uint64_t c1 = __rdtsc();
    return static_cast<double>(c1 - c0) /
           std::chrono::duration<double, std::micro>(t1 - t0).count();
  }();
  return per_micro;
}
#else
inline uint64_t StopwatchTicks() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}
inline double StopwatchTicksPerMicro() {
  return 1000.0;
}
#endif

// Ticks an empty timed region reads: the clock's own cost between its two reads, taken as the
// least of many tries, so that it is never more than what any region pays. Each region is charged
// its reading less this, as a benchmark harness subtracts its timer; without it five clock reads
// per running request and step would be a tenth of what is measured.
inline uint64_t StopwatchOverheadTicks() {
  static const uint64_t overhead = [] {
    uint64_t least = UINT64_MAX;
    for (int i = 0; i < 2000; ++i) {
      const uint64_t start = StopwatchTicks();
      const uint64_t end = StopwatchTicks();
      least = std::min(least, end - start);
    }
    return least;
  }();
  return overhead;
}

// Accumulates the time spent inside manager calls of one step.
class Stopwatch {
 public:
  Stopwatch() : per_micro_(StopwatchTicksPerMicro()), overhead_(StopwatchOverheadTicks()) {}
  template <typename F>
  auto operator()(F&& f) {
    const uint64_t start = StopwatchTicks();
    auto result = f();
    Add(StopwatchTicks() - start);
    return result;
  }
  template <typename F>
  void Run(F&& f) {
    const uint64_t start = StopwatchTicks();
    f();
    Add(StopwatchTicks() - start);
  }
  // Microseconds accumulated since the last Take.
  double Take() {
    const double t = static_cast<double>(ticks_) / per_micro_;
    ticks_ = 0;
    return t;
  }

 private:
  void Add(uint64_t ticks) { ticks_ += ticks > overhead_ ? ticks - overhead_ : 0; }

  double per_micro_;
  uint64_t overhead_;
  uint64_t ticks_ = 0;
};

}  // namespace hkv::sim_internal
