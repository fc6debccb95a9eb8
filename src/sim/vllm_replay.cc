// ReplayVllm: the scheduler loop of ../shared/vllm_reference/run_vllm_manager.py (which follows
// vllm/v1/core/sched/scheduler.py) over vllm::KvCacheManager.
#include <algorithm>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <hkv/sim/replayer.h>
#include <hkv/vllm/kv_cache_manager.h>

#include "replay_common.h"
#include "step_loop.h"

namespace hkv {
namespace {

// Scheduler._mamba_block_aligned_split: in `align` mode a prefill chunk ends at a block boundary
// (or at the last one before the end of the prompt), so the state the kernel leaves at the end
// of the chunk is a state a block can cache.
int64_t MambaBlockAlignedSplit(const vllm::Request& r, int64_t n, int32_t block_size,
                               int64_t new_local_computed) {
  const int64_t computed = r.num_computed_tokens + new_local_computed;
  const int64_t num_tokens = r.num_tokens();
  if (computed < std::max(r.num_prompt_tokens(), num_tokens - 1)) {
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

// vLLM's manager as the step loop drives it (src/sim/step_loop.h), with the reference script's
// own rules: the Mamba `align` chunk split, the full-prompt admission gate, NewStepStarts and
// NumCommonPrefixBlocks every step, and the digest of the block ids handed to the model runner.
class VllmDriven {
 public:
  struct Request {
    const TraceRequest* trace = nullptr;
    vllm::Request req;  // its id is the request's position in the trace
    int32_t outputs = 0;
  };
  using Chunk = sim_internal::Chunk<Request>;

  VllmDriven(const vllm::KvCacheConfig& config, const ReplayOptions& o,
             vllm::KvCacheManager& manager)
      : o_(o),
        manager_(manager),
        split_(config.mamba_block_aligned_split()),
        cache_block_(config.cache_block_size),
        usable_(config.usable_blocks()) {}

  static int64_t Tokens(const Request& r) { return r.req.num_tokens(); }
  static int64_t& Computed(Request& r) { return r.req.num_computed_tokens; }

  Status BeginStep() {
    watch_.Run([&] { manager_.NewStepStarts(); });
    return Status::Ok();
  }
  int64_t RunningChunk(const Request& r, int64_t n) const {
    return split_ ? MambaBlockAlignedSplit(r.req, n, cache_block_, 0) : n;
  }
  Status AllocateRunning(Request& r, int64_t n) {
    vllm::AllocateArgs args;
    args.num_new_tokens = n;
    return watch_([&] { return manager_.AllocateSlots(r.req, args, &new_blocks_); });
  }
  Status Preempt(Request& r) {
    watch_.Run([&] { manager_.Free(r.req.id()); });
    return Status::Ok();
  }
  // vLLM hands a running request's new blocks on, or None when no group got any.
  void ScheduledRunning(const Request& r) {
    digest_.Request(r.trace->id, new_blocks_.empty() ? nullptr : &new_blocks_);
  }
  Result<sim_internal::MaybeAdmission> TryAdmit(Request& r, int64_t budget);
  // An admitted request's blocks are handed on whole.
  void Admitted(const Request& r) {
    watch_.Run([&] { new_blocks_ = manager_.GetBlockIds(r.req.id()); });
    digest_.Request(r.trace->id, &new_blocks_);
  }
  Status DoesNotFit(const Request& r) const {
    return Status::ResourceExhausted(fmt::format(
        "replay: request {} ({} tokens) does not fit in vLLM's {} blocks even with nothing "
        "else running; give it more memory",
        r.trace->id, r.req.num_tokens(), usable_));
  }
  Status ReadStep(std::span<const Chunk>, const std::vector<Request*>& running, ReplayStep&) {
    if (!running.empty()) {
      watch_.Run([&] { (void)manager_.NumCommonPrefixBlocks(running.front()->req.id()); });
    }
    return Status::Ok();
  }
  void CountBlocks(ReplayStep& step) const {
    const vllm::PoolStats pool = manager_.Stats();
    step.blocks_used = usable_ - pool.num_free;
    step.cached_blocks = pool.num_cached;
  }
  // vLLM's blocks are cached as they are allocated: nothing to commit.
  Status Commit(Request&, int64_t) { return Status::Ok(); }
  Status Append(Request& r, int32_t token) {
    r.req.AppendToken(token);
    return Status::Ok();
  }
  Status Finish(Request& r) {
    watch_.Run([&] { manager_.Free(r.req.id()); });
    return Status::Ok();
  }
  Status CheckInvariants() const { return manager_.CheckInvariants(); }
  double TakeManagerUs() { return watch_.Take(); }
  uint64_t digest() const { return digest_.value(); }

 private:
  const ReplayOptions& o_;
  vllm::KvCacheManager& manager_;
  const bool split_;
  const int32_t cache_block_;
  const int64_t usable_;
  vllm::GroupBlocks new_blocks_{};
  BlockIdDigest digest_{};
  sim_internal::Stopwatch watch_{};
};

// get_computed_blocks, then allocate_slots with the hit and, by default, the gate that requires
// the whole prompt to fit.
Result<sim_internal::MaybeAdmission> VllmDriven::TryAdmit(Request& r, int64_t budget) {
  HKV_ASSIGN_OR_RETURN(const vllm::ComputedBlocks hit,
                       watch_([&] { return manager_.GetComputedBlocks(r.req); }));
  int64_t n = std::min(r.req.num_tokens() - hit.num_tokens, budget);
  if (split_) {
    n = MambaBlockAlignedSplit(r.req, n, cache_block_, hit.num_tokens);
    if (n == 0) return sim_internal::MaybeAdmission();
  }
  vllm::AllocateArgs args;
  args.num_new_tokens = n;
  args.num_new_computed_tokens = hit.num_tokens;
  args.new_computed = &hit;
  args.full_sequence_must_fit = o_.reserve_full_prompt;
  const Status st = watch_([&] { return manager_.AllocateSlots(r.req, args); });
  if (st.code() == StatusCode::kResourceExhausted) return sim_internal::MaybeAdmission();
  HKV_RETURN_IF_ERROR(st);
  return sim_internal::MaybeAdmission({.n = n, .hit = hit.num_tokens});
}

}  // namespace

Result<ReplayReport> ReplayVllm(const Trace& trace, const vllm::KvCacheConfig& config,
                                const ReplayOptions& o) {
  HKV_RETURN_IF_ERROR(sim_internal::CheckReplayInputs(trace, o));
  HKV_RETURN_IF_ERROR(CheckVllmConfig(config, o));
  if (o.oracle) {
    return Status::InvalidArgument(
        "replay: the oracle mode evicts in hkv's pools; vLLM's manager keeps its own order");
  }
  HKV_ASSIGN_OR_RETURN(vllm::KvCacheManager manager,
                       vllm::KvCacheManager::Create(config, {.policy = o.vllm_policy}));
  sim_internal::ReplayBook book(trace, o);
  ReplayReport& report = book.report();
  report.num_blocks = config.usable_blocks();
  std::vector<VllmDriven::Request> reqs;
  reqs.reserve(trace.size());
  for (size_t i = 0; i < trace.size(); ++i) {
    reqs.push_back({&trace[i], vllm::Request(static_cast<vllm::RequestId>(i), trace[i].prompt,
                                             config.hash_block_size)});
  }
  VllmDriven driven(config, o, manager);
  sim_internal::StepLoop loop(o, book, driven, std::move(reqs));
  HKV_RETURN_IF_ERROR(loop.Run());
  report.block_id_digest = driven.digest();
  return book.Finish();
}

}  // namespace hkv
