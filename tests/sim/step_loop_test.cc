// The replays' step loop (src/sim/step_loop.h) driving the tests' content-checking fake engine
// (tests/manager/fake_engine.h) over hkv's manager: every call the replay makes is one the
// manager must accept, every step reads exactly what was written, and the figures are Replay's
// own, since reading does not change what the manager allocates.
#include "../../src/sim/step_loop.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <ostream>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include <hkv/manager/allocator_mode.h>
#include <hkv/manager/compaction_policy.h>
#include <hkv/sim/replayer.h>
#include <hkv/sim/trace_generator.h>
#include <hkv/spec/config_loader.h>

#include "../manager/fake_engine.h"

namespace hkv {
namespace {

// The fake engine as the step loop's driven manager: Replay's calls, each through the fake
// engine's checked wrapper; a step's reads are the fake engine's batched forward pass.
class FakeDriven {
 public:
  struct Request {
    const TraceRequest* trace = nullptr;
    RequestId id = 0;
    std::vector<int32_t> tokens;
    int64_t computed = 0;
    int32_t outputs = 0;
    bool added = false;
  };
  using Chunk = sim_internal::Chunk<Request>;

  FakeDriven(testing::FakeEngine& engine, const KvCacheManager& manager)
      : eng_(engine), manager_(manager) {}

  static int64_t Tokens(const Request& r) { return static_cast<int64_t>(r.tokens.size()); }
  static int64_t& Computed(Request& r) { return r.computed; }

  // Compaction as Replay's driver does it (CompactionDue), through the fake engine, which copies
  // every moved page and poisons the old one.
  Status BeginStep() {
    int32_t for_pool = -1;
    const bool due = CompactionDue(manager_, refused_, limits_, for_pool);
    refused_ = false;
    if (!due) return Status::Ok();
    return (for_pool >= 0 ? eng_.CompactFor(for_pool, limits_) : eng_.Compact(limits_)).status();
  }
  int64_t RunningChunk(const Request&, int64_t n) const { return n; }
  Status AllocateRunning(Request& r, int64_t n) {
    const Status st = eng_.Allocate(r.id, n);
    refused_ = refused_ || st.code() == StatusCode::kResourceExhausted;
    return st;
  }
  Status Preempt(Request& r) {
    r.added = false;
    return eng_.Free(r.id);
  }
  void ScheduledRunning(const Request&) {}
  Result<sim_internal::MaybeAdmission> TryAdmit(Request& r, int64_t budget) {
    if (!r.added) {
      testing::EngineRequest spec;
      spec.id = r.id;
      spec.prompt = r.tokens;
      HKV_RETURN_IF_ERROR(eng_.Add(spec));
      r.added = true;
    }
    HKV_ASSIGN_OR_RETURN(const PrefixHit hit, eng_.Lookup(r.id));
    const int64_t n = std::min(Tokens(r) - hit.tokens, budget);
    const Status st = eng_.AllocateWithHit(r.id, n, hit, Tokens(r) - hit.tokens - n);
    if (st.code() == StatusCode::kResourceExhausted) return sim_internal::MaybeAdmission();
    HKV_RETURN_IF_ERROR(st);
    return sim_internal::MaybeAdmission({.n = n, .hit = hit.tokens});
  }
  void Admitted(const Request&) {}
  Status DoesNotFit(const Request& r) const {
    return Status::ResourceExhausted("request " + std::to_string(r.id) + " never fits");
  }
  Status ReadStep(std::span<const Chunk>, const std::vector<Request*>&, ReplayStep&) {
    eng_.Run();
    return Status::Ok();
  }
  void CountBlocks(ReplayStep& step) const {
    for (size_t p = 0; p < manager_.config().pool_blocks.size(); ++p) {
      const PoolUsage u = manager_.Usage(static_cast<int32_t>(p));
      step.blocks_used += u.num_blocks - u.num_free;
      step.cached_blocks += u.num_cached;
    }
  }
  Status Commit(Request& r, int64_t computed) { return eng_.Commit(r.id, computed); }
  Status Append(Request& r, int32_t token) {
    HKV_RETURN_IF_ERROR(eng_.Append(r.id, std::span<const int32_t>(&token, 1)));
    r.tokens.push_back(token);
    return Status::Ok();
  }
  Status Finish(Request& r) {
    r.added = false;
    return eng_.Free(r.id);
  }
  // The fake engine checks the invariants after every call; a violation fails the replay.
  Status CheckInvariants() const {
    return eng_.failed() ? Status::FailedPrecondition(eng_.Report()) : Status::Ok();
  }
  double TakeManagerUs() { return 0.0; }

 private:
  testing::FakeEngine& eng_;
  const KvCacheManager& manager_;
  bool refused_ = false;  // a running request's allocation was refused since the last compaction
  std::vector<int64_t> limits_;
};

// A chat trace short enough for the fake engine: shared system prompts, next turns, preemption.
Trace SmallTrace() {
  TraceGenOptions g;
  g.num_requests = 40;
  g.seed = 5;
  g.session_gap = 4.0;
  g.max_turns = 4;
  g.system_prompt_min = 100;
  g.system_prompt_max = 300;
  g.first_message_min = 20;
  g.first_message_max = 400;
  g.followup_min = 10;
  g.followup_max = 150;
  g.output_min = 4;
  g.output_max = 40;
  g.max_prompt_tokens = 900;
  g.think_min = 2;
  g.think_max = 10;
  g.vocab_size = 500;
  return GenerateTrace(g).value();
}

struct Case {
  const char* model;
  AllocatorMode mode;
  int64_t sequences;      // of 700 tokens, in the memory given
  bool compacts = false;  // the replay compacts two-level memory (CompactionDue) at some step
  // The mode's admission headroom holds an admission back at some step (Bamba's few attention
  // layers leave room for it throughout this trace).
  bool headroom_holds = true;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.model << " " << AllocatorModeName(c.mode) << " " << c.sequences << " sequences";
}

// The case's allocator, in memory for its sequences (more on recurrent models, whose requests
// also hold checkpoints).
ManagerConfig SmallConfig(const Case& c) {
  const ModelSpec spec = LoadModelConfig(std::filesystem::path(HKV_MODELS_DIR) / c.model).value();
  PlanOptions a;
  a.max_model_len = 1024;
  a.seq_tokens = 700;
  const Allocator probe = MakeAllocator(spec, c.mode, a).value();
  a.memory_bytes = c.sequences * probe.BytesPerSequence(700, 0);
  return MakeAllocator(spec, c.mode, a).value().config;
}

ReplayOptions SmallOptions() {
  ReplayOptions o;
  o.token_budget = 256;
  o.max_model_len = 1024;
  o.vocab = 500;
  o.record_steps = true;
  o.record_requests = true;
  return o;
}

void ExpectSameCourse(const ReplayReport& got, const ReplayReport& want) {
  EXPECT_EQ(got.steps, want.steps);
  EXPECT_EQ(got.preemptions, want.preemptions);
  EXPECT_EQ(got.scheduled_tokens, want.scheduled_tokens);
  EXPECT_EQ(got.admission_hits, want.admission_hits);
  EXPECT_EQ(got.first_admission_hits, want.first_admission_hits);
  EXPECT_EQ(got.peak_blocks_used, want.peak_blocks_used);
  EXPECT_EQ(got.peak_running, want.peak_running);
  EXPECT_EQ(got.requests, want.requests);
  ASSERT_EQ(got.log.size(), want.log.size());
  for (size_t i = 0; i < got.log.size(); ++i) {
    const ReplayStep& a = got.log[i];
    const ReplayStep& b = want.log[i];
    ASSERT_TRUE(a.step == b.step && a.running == b.running && a.waiting == b.waiting &&
                a.blocks_used == b.blocks_used && a.cached_blocks == b.cached_blocks &&
                a.hit_tokens == b.hit_tokens && a.preemptions == b.preemptions &&
                a.scheduled_tokens == b.scheduled_tokens)
        << "step " << a.step;
  }
}

class StepLoopOverFakeEngine : public ::testing::TestWithParam<Case> {};

// Replays the trace through Replay and through the fake engine under the same step loop: the
// same course, every read checked; returns Replay's report.
ReplayReport ReplayOverFakeEngine(const Trace& trace, const ManagerConfig& config) {
  const ReplayOptions o = SmallOptions();
  const ReplayReport want = Replay(trace, config, o).value();
  EXPECT_GT(want.first_admission_hits, 0);

  ManagerConfig checked = config;
  checked.record_events = true;  // the fake engine checks the release order through the events
  // As the replay runs it: a request admitted in a step hits what an earlier one computes in it,
  // and the fake engine's batch writes KV before it reads any.
  checked.publish_at_allocate = o.publish_at_allocate;
  KvCacheManager manager = KvCacheManager::Create(checked).value();
  testing::FakeEngine engine(manager);
  FakeDriven driven(engine, manager);
  std::vector<FakeDriven::Request> reqs(trace.size());
  for (size_t i = 0; i < trace.size(); ++i) {
    reqs[i].trace = &trace[i];
    reqs[i].id = static_cast<RequestId>(i);
    reqs[i].tokens = trace[i].prompt;
  }
  sim_internal::ReplayBook book(trace, o);
  ReplayOptions checking = o;
  checking.check_invariants = true;
  sim_internal::StepLoop loop(checking, book, driven, std::move(reqs));
  const Status st = loop.Run();
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_FALSE(engine.failed()) << engine.Report();
  EXPECT_GT(engine.counters().steps, want.steps);  // every step's reads were checked
  ExpectSameCourse(book.Finish(), want);
  // The same compactions, every moved page copied and read back intact.
  EXPECT_EQ(engine.counters().compactions, want.compactions);
  EXPECT_EQ(engine.counters().pages_moved, want.pages_moved);
  return want;
}

TEST_P(StepLoopOverFakeEngine, ReadsExactlyWhatWasWrittenAndMatchesReplay) {
  const Trace trace = SmallTrace();
  // Admitting whatever fits (no headroom): the memory is small enough to preempt.
  ManagerConfig admit_all = SmallConfig(GetParam());
  admit_all.admission_headroom_steps = 0;
  const ReplayReport preempting = ReplayOverFakeEngine(trace, admit_all);
  EXPECT_GT(preempting.preemptions, 0);
  EXPECT_EQ(preempting.pages_moved > 0, GetParam().compacts);
  RecordProperty("pages_moved", std::to_string(preempting.pages_moved));
  // The mode's own admission rule: uniform and hybridkv keep admissions waiting for headroom.
  const ManagerConfig config = SmallConfig(GetParam());
  const ReplayReport own = ReplayOverFakeEngine(trace, config);
  EXPECT_EQ(own.manager_stats.admissions_held_for_headroom > 0,
            config.admission_headroom_steps > 0 && GetParam().headroom_holds);
}

INSTANTIATE_TEST_SUITE_P(
    Models, StepLoopOverFakeEngine,
    ::testing::Values(Case{"meta-llama--Llama-3.1-8B", AllocatorMode::kHybridKV, 3},
                      Case{"google--gemma-2-9b", AllocatorMode::kHybridKV, 3},
                      Case{"google--gemma-2-9b", AllocatorMode::kPadded, 3},
                      Case{"ibm-ai-platform--Bamba-9B", AllocatorMode::kHybridKV, 7, false, false},
                      Case{"Qwen--Qwen3-Next-80B-A3B-Instruct", AllocatorMode::kHybridKV, 5, true}),
    [](const auto& p) {
      std::string name =
          std::string(p.param.model) + "_" + std::string(AllocatorModeName(p.param.mode));
      std::replace_if(
          name.begin(), name.end(), [](char c) { return !std::isalnum(c); }, '_');
      return name;
    });

}  // namespace
}  // namespace hkv
