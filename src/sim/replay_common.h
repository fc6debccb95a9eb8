// What both replays (hkv's manager and vLLM's) share: the trace checks they rely on, the book
// they keep (figures, per-request records, outputs, step log, progress), and the stopwatch
// around manager calls.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

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

// Accumulates the time spent inside manager calls of one step.
class Stopwatch {
 public:
  template <typename F>
  auto operator()(F&& f) {
    const auto start = std::chrono::steady_clock::now();
    auto result = f();
    total_ +=
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    return result;
  }
  template <typename F>
  void Run(F&& f) {
    const auto start = std::chrono::steady_clock::now();
    f();
    total_ +=
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  }
  double Take() {
    const double t = total_;
    total_ = 0;
    return t;
  }

 private:
  double total_ = 0;
};

}  // namespace hkv::sim_internal
