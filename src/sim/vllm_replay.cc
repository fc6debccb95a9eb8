// ReplayVllm: the scheduler loop of ../shared/vllm_reference/run_vllm_manager.py (which follows
// vllm/v1/core/sched/scheduler.py) over vllm::KvCacheManager.
#include <algorithm>
#include <deque>

#include <fmt/format.h>

#include <hkv/sim/replayer.h>
#include <hkv/vllm/kv_cache_manager.h>

#include "replay_common.h"

namespace hkv {
namespace {

struct Live {
  const TraceRequest* trace = nullptr;
  vllm::Request req;  // its id is the request's position in the trace
  int32_t outputs = 0;
};

// Scheduler._mamba_block_aligned_split: in `align` mode a prefill chunk ends at a block boundary
// (or at the last one before the end of the prompt), so the state the kernel leaves at the end
// of the chunk is a state a block can cache.
int64_t MambaBlockAlignedSplit(const Live& r, int64_t n, int32_t block_size,
                               int64_t new_local_computed) {
  const int64_t computed = r.req.num_computed_tokens + new_local_computed;
  const int64_t num_tokens = r.req.num_tokens();
  if (computed < std::max(r.req.num_prompt_tokens(), num_tokens - 1)) {
    const int64_t last_cache_position = num_tokens - num_tokens % block_size;
    const int64_t after = computed + n;
    if (after < last_cache_position) {
      n = n / block_size * block_size;
    } else if (computed < last_cache_position && last_cache_position < after) {
      n = last_cache_position - computed;
    }
  }
  return n;
}

// The reference script's running digest over block ids, modulo the Mersenne prime 2^61 - 1.
class BlockIdDigest {
 public:
  void Request(int64_t id, const vllm::GroupBlocks* ids) {
    Mix(id + 2);
    if (ids != nullptr) {
      for (const auto& group : ids->groups) {
        for (const int32_t b : group)
          Mix(int64_t{b} + 2);
        Mix(1);
      }
    }
    Mix(1);
  }
  uint64_t value() const { return d_; }

 private:
  static constexpr uint64_t kM61 = (uint64_t{1} << 61) - 1;
  // d = (d * 1000003 + v) mod 2^61 - 1 without 128-bit arithmetic: 2^61 = 1 (mod p), so the
  // high part of d * 1000003 folds back in.
  void Mix(int64_t v) {
    constexpr uint64_t kMul = 1000003;                                   // < 2^20
    const uint64_t hi = (d_ >> 32) * kMul;                               // < 2^49
    const uint64_t lo = (d_ & 0xFFFFFFFFu) * kMul;                       // < 2^52
    uint64_t s = (hi >> 29) + ((hi & ((uint64_t{1} << 29) - 1)) << 32);  // hi * 2^32 mod p
    s += lo + static_cast<uint64_t>(v);                                  // < 2^63
    s = (s & kM61) + (s >> 61);
    d_ = s >= kM61 ? s - kM61 : s;
  }
  uint64_t d_ = 0;
};

Status CheckVllmConfig(const vllm::KvCacheConfig& config, const ReplayOptions& o) {
  if (config.max_model_len != o.max_model_len) {
    return Status::InvalidArgument(
        fmt::format("replay: the vLLM config was made for max model len {}, the replay uses {}",
                    config.max_model_len, o.max_model_len));
  }
  if (config.max_num_batched_tokens != o.token_budget) {
    return Status::InvalidArgument(fmt::format(
        "replay: the vLLM config was made for {} batched tokens, the replay's token budget is {}",
        config.max_num_batched_tokens, o.token_budget));
  }
  return Status::Ok();
}

struct Scheduled {
  Live* r;
  int64_t n;
};

size_t At(const Live& r) {
  return static_cast<size_t>(r.req.id());
}

// One replay over vLLM's manager in progress: the requests waiting and running, and the step
// being scheduled.
struct VllmReplayRun {
  Result<bool> ScheduleRunning(ReplayStep& step, int64_t& budget);
  Status Admit(ReplayStep& step, int64_t& budget);
  void Outputs(ReplayStep& step);
  Status RunStep(ReplayStep& step);
  Status Run();

  const ReplayOptions& o;
  vllm::KvCacheManager& manager;
  sim_internal::ReplayBook& book;
  const bool split;
  const int32_t cache_block;
  const int64_t usable;
  std::vector<Live> reqs{};
  std::deque<Live*> waiting{};
  std::vector<Live*> running{};
  std::vector<Scheduled> scheduled{};
  std::vector<Live*> stopped{};
  vllm::GroupBlocks new_blocks{};
  BlockIdDigest digest{};
  sim_internal::Stopwatch watch{};
};

// Running requests, while budget remains; blocks running short preempt from the back. Whether
// anyone was preempted.
Result<bool> VllmReplayRun::ScheduleRunning(ReplayStep& step, int64_t& budget) {
  bool preempted = false;
  for (size_t i = 0; i < running.size() && budget > 0;) {
    Live* r = running[i];
    int64_t n = std::min({r->req.num_tokens() - r->req.num_computed_tokens, budget,
                          o.max_model_len - 1 - r->req.num_computed_tokens});
    if (split) n = MambaBlockAlignedSplit(*r, n, cache_block, 0);
    if (n <= 0) {
      ++i;
      continue;
    }
    bool self_preempted = false;
    for (;;) {
      vllm::AllocateArgs args;
      args.num_new_tokens = n;
      const Status st = watch([&] { return manager.AllocateSlots(r->req, args, &new_blocks); });
      if (st.ok()) break;
      if (st.code() != StatusCode::kResourceExhausted) return st;
      Live* victim = running.back();
      running.pop_back();
      watch.Run([&] { manager.Free(victim->req.id()); });
      victim->req.num_computed_tokens = 0;
      waiting.push_front(victim);
      book.Preempted(At(*victim), step);
      preempted = true;
      if (victim == r) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;
    // vLLM hands a running request's new blocks on, or None when no group got any.
    digest.Request(r->trace->id, new_blocks.empty() ? nullptr : &new_blocks);
    scheduled.push_back({r, n});
    budget -= n;
    ++i;
  }
  return preempted;
}

// Waiting requests (the caller admits only in a step without preemption).
Status VllmReplayRun::Admit(ReplayStep& step, int64_t& budget) {
  while (!waiting.empty() && budget > 0 && static_cast<int64_t>(running.size()) < o.max_running) {
    Live* r = waiting.front();
    HKV_ASSIGN_OR_RETURN(const vllm::ComputedBlocks hit,
                         watch([&] { return manager.GetComputedBlocks(r->req); }));
    int64_t n = std::min(r->req.num_tokens() - hit.num_tokens, budget);
    if (split) {
      n = MambaBlockAlignedSplit(*r, n, cache_block, hit.num_tokens);
      if (n == 0) break;
    }
    vllm::AllocateArgs args;
    args.num_new_tokens = n;
    args.num_new_computed_tokens = hit.num_tokens;
    args.new_computed = &hit;
    args.full_sequence_must_fit = o.reserve_full_prompt;
    const Status st = watch([&] { return manager.AllocateSlots(r->req, args); });
    if (st.code() == StatusCode::kResourceExhausted) break;
    HKV_RETURN_IF_ERROR(st);
    waiting.pop_front();
    running.push_back(r);
    watch.Run([&] { new_blocks = manager.GetBlockIds(r->req.id()); });
    digest.Request(r->trace->id, &new_blocks);
    book.Admitted(At(*r), r->req.num_tokens(), hit.num_tokens, step);
    r->req.num_computed_tokens = hit.num_tokens;
    scheduled.push_back({r, n});
    budget -= n;
  }
  return Status::Ok();
}

// A token is sampled for every request past its prompt; finished ones are freed in order.
void VllmReplayRun::Outputs(ReplayStep& step) {
  stopped.clear();
  for (const Scheduled& sc : scheduled) {
    Live* r = sc.r;
    if (r->req.num_computed_tokens < r->req.num_tokens()) continue;
    if (r->outputs < r->trace->output_len) {
      r->req.AppendToken(book.Output(At(*r), r->outputs));
      ++r->outputs;
    }
    if (r->outputs >= r->trace->output_len || r->req.num_tokens() >= o.max_model_len)
      stopped.push_back(r);
  }
  if (!stopped.empty()) {
    std::erase_if(running, [&](Live* r) {
      return std::find(stopped.begin(), stopped.end(), r) != stopped.end();
    });
    for (Live* r : stopped) {
      watch.Run([&] { manager.Free(r->req.id()); });
      book.Finished(At(*r), step);
    }
  }
}

Status VllmReplayRun::RunStep(ReplayStep& step) {
  watch.Run([&] { manager.NewStepStarts(); });
  int64_t budget = o.token_budget;
  scheduled.clear();
  HKV_ASSIGN_OR_RETURN(const bool preempted, ScheduleRunning(step, budget));
  if (!preempted) HKV_RETURN_IF_ERROR(Admit(step, budget));
  if (!preempted && running.empty() && !waiting.empty()) {
    const Live& r = *waiting.front();
    return Status::ResourceExhausted(fmt::format(
        "replay: request {} ({} tokens) does not fit in vLLM's {} blocks even with nothing "
        "else running; give it more memory",
        r.trace->id, r.req.num_tokens(), usable));
  }
  if (!running.empty()) {
    watch.Run([&] { (void)manager.NumCommonPrefixBlocks(running.front()->req.id()); });
  }

  const vllm::PoolStats pool = manager.Stats();
  step.blocks_used = usable - pool.num_free;
  step.cached_blocks = pool.num_cached;
  step.running = static_cast<int64_t>(running.size());
  step.waiting = static_cast<int64_t>(waiting.size());

  for (const Scheduled& sc : scheduled) {
    sc.r->req.num_computed_tokens += sc.n;
    step.scheduled_tokens += sc.n;
  }
  Outputs(step);
  if (o.check_invariants) HKV_RETURN_IF_ERROR(manager.CheckInvariants());
  book.EndStep(step, watch.Take());
  return Status::Ok();
}

Status VllmReplayRun::Run() {
  size_t next = 0;
  int64_t s = 0;
  while (next < reqs.size() || !waiting.empty() || !running.empty()) {
    while (next < reqs.size() && reqs[next].trace->arrival_step <= s)
      waiting.push_back(&reqs[next++]);
    if (waiting.empty() && running.empty()) {
      s = reqs[next].trace->arrival_step;
      continue;
    }
    ReplayStep step;
    step.step = s;
    HKV_RETURN_IF_ERROR(RunStep(step));
    ++s;
  }
  return Status::Ok();
}

}  // namespace

Result<ReplayReport> ReplayVllm(const Trace& trace, const vllm::KvCacheConfig& config,
                                const ReplayOptions& o) {
  HKV_RETURN_IF_ERROR(sim_internal::CheckReplayInputs(trace, o));
  HKV_RETURN_IF_ERROR(CheckVllmConfig(config, o));
  HKV_ASSIGN_OR_RETURN(vllm::KvCacheManager manager, vllm::KvCacheManager::Create(config));
  sim_internal::ReplayBook book(trace, o);
  ReplayReport& report = book.report();
  report.num_blocks = config.usable_blocks();
  VllmReplayRun run{.o = o,
                    .manager = manager,
                    .book = book,
                    .split = config.mamba_block_aligned_split(),
                    .cache_block = config.cache_block_size,
                    .usable = config.usable_blocks()};
  run.reqs.reserve(trace.size());
  for (size_t i = 0; i < trace.size(); ++i) {
    run.reqs.push_back(Live{&trace[i], vllm::Request(static_cast<vllm::RequestId>(i),
                                                     trace[i].prompt, config.hash_block_size)});
  }
  HKV_RETURN_IF_ERROR(run.Run());
  report.block_id_digest = run.digest.value();
  return book.Finish();
}

}  // namespace hkv
