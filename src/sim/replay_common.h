// What both replays (hkv's manager and vLLM's) share: the trace checks they rely on, the
// outputs of requests whose trace gives none, and the stopwatch around manager calls.
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

// Per request, the outputs drawn from options.output_seed when the trace gives none (empty
// otherwise), in trace order.
std::vector<std::vector<int32_t>> GeneratedOutputs(const Trace& trace,
                                                   const ReplayOptions& options);

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
