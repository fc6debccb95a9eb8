// The replayer against traces small enough to replay by hand (the expected figures are worked
// out in the comments, step by step, from replay.md), determinism, and bad input.
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

#include <hkv/sim/replayer.h>
#include <hkv/sim/trace_generator.h>

#include "replay_test_util.h"

namespace hkv {
namespace {

using testing::FullAttention;
using testing::Request;

ReplayOptions Options(int64_t budget) {
  ReplayOptions o;
  o.token_budget = budget;
  o.max_model_len = 64;
  o.record_steps = true;
  o.check_invariants = true;
  return o;
}

// Budget 8, 10 blocks.
// s=0: R0 (8 tokens) admitted, no hit, 2 blocks; computes 8, appends output 100.
// s=1: R0 computes position 8 (third block); appends 101: done, freed. Its two full blocks stay
//      cached; the third (one token) has no identity.
// s=2..4: idle, skipped.
// s=5: R1 (R0's 8 prompt tokens + 4 more) hits 8, computes 4 (3 blocks), appends its only output.
// Steps 3, hit rate 8 / 20, peak 3 blocks, 1 running, 13 tokens scheduled.
TEST(Replayer, HitOnAPrefixThatOutlivedItsRequest) {
  const Trace trace{Request(0, 0, {1, 2, 3, 4, 5, 6, 7, 8}, {100, 101}),
                    Request(1, 5, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {200})};
  const ReplayReport r = Replay(trace, FullAttention(10), Options(8)).value();
  EXPECT_EQ(r.steps, 3);
  EXPECT_EQ(r.preemptions, 0);
  EXPECT_EQ(r.first_admission_tokens, 20);
  EXPECT_EQ(r.first_admission_hits, 8);
  EXPECT_DOUBLE_EQ(r.hit_rate(), 0.4);
  EXPECT_EQ(r.peak_blocks_used, 3);
  EXPECT_EQ(r.peak_running, 1);
  EXPECT_EQ(r.scheduled_tokens, 13);
  EXPECT_EQ(r.num_blocks, 10);
  ASSERT_EQ(r.log.size(), 3u);
  EXPECT_EQ(r.log[2].step, 5);
  EXPECT_EQ(r.log[2].hit_tokens, 8);
  EXPECT_EQ(r.manager_us.size(), 3u);
}

// Budget 16, 4 blocks: R0 = A1..A8 with 3 outputs, R1 = B1..B8 with 2 outputs, both at step 0.
// s=0: both admitted (2 blocks each, pool full); each computes 8 and appends its first output.
// s=1: R0 needs a third block: none free, so the last running request, R1, is preempted (its
//      blocks go to the free list tail first: B5..8 is evicted first). R0 takes that block and
//      appends its second output. No admissions in a step with a preemption.
// s=2: R0 computes position 9. R1 (9 tokens now) hits 4 (B1..4 is still cached) but needs that
//      block plus 2 fresh ones and only 1 block is free: not admitted. R0 appends its third
//      output: done, freed (A1..4, A5..8 keep identities; its partial block does not).
// s=3: R1 hits 4 again — a hit after the eviction of its second block — computes 5 tokens in 3
//      blocks and appends its second output: done.
// Steps 4, 1 preemption, first-admission hits 0 of 16, with the re-admission 4 of 25, peak 4
// blocks, 2 running, 8 + 8 + 1 + 1 + 5 = 23 tokens scheduled.
TEST(Replayer, PreemptionAndAHitAfterEviction) {
  const Trace trace{Request(0, 0, {1, 2, 3, 4, 5, 6, 7, 8}, {100, 101, 102}),
                    Request(1, 0, {11, 12, 13, 14, 15, 16, 17, 18}, {200, 201})};
  const ReplayReport r = Replay(trace, FullAttention(4), Options(16)).value();
  EXPECT_EQ(r.steps, 4);
  EXPECT_EQ(r.preemptions, 1);
  EXPECT_EQ(r.first_admission_tokens, 16);
  EXPECT_EQ(r.first_admission_hits, 0);
  EXPECT_EQ(r.admission_tokens, 25);
  EXPECT_EQ(r.admission_hits, 4);
  EXPECT_DOUBLE_EQ(r.hit_rate_incl_readmissions(), 4.0 / 25.0);
  EXPECT_EQ(r.peak_blocks_used, 4);
  EXPECT_EQ(r.peak_running, 2);
  EXPECT_EQ(r.scheduled_tokens, 23);
  ASSERT_EQ(r.log.size(), 4u);
  EXPECT_EQ(r.log[1].preemptions, 1);
  EXPECT_EQ(r.log[1].running, 1);
  EXPECT_EQ(r.log[1].waiting, 1);
  EXPECT_EQ(r.log[2].hit_tokens, 0);  // the lookup found 4, but R1 was not admitted
  EXPECT_EQ(r.log[3].hit_tokens, 4);
}

// The same trace and options give the same figures (timings aside), run after run.
TEST(Replayer, IsDeterministic) {
  TraceGenOptions to;
  to.num_requests = 60;
  to.seed = 3;
  const Trace trace = GenerateTrace(to).value();
  ReplayOptions o;
  o.record_steps = true;
  o.check_invariants = true;
  ManagerConfig c = FullAttention(2000);
  c.max_model_len = o.max_model_len;
  const ReplayReport a = Replay(trace, c, o).value();
  const ReplayReport b = Replay(trace, c, o).value();
  EXPECT_GT(a.steps, 0);
  EXPECT_GT(a.first_admission_hits, 0);
  EXPECT_EQ(a.steps, b.steps);
  EXPECT_EQ(a.preemptions, b.preemptions);
  EXPECT_EQ(a.admission_hits, b.admission_hits);
  EXPECT_EQ(a.peak_blocks_used, b.peak_blocks_used);
  ASSERT_EQ(a.log.size(), b.log.size());
  for (size_t i = 0; i < a.log.size(); ++i) {
    EXPECT_EQ(a.log[i].blocks_used, b.log[i].blocks_used) << i;
    EXPECT_EQ(a.log[i].running, b.log[i].running) << i;
  }
  // An infinite cache hits at least as much as a finite one.
  EXPECT_GE(IdealHitRate(trace, 4), a.hit_rate());
}

TEST(Replayer, RejectsBadOptionsAndOversizedPrompts) {
  const Trace trace{Request(0, 0, std::vector<int32_t>(70, 1), {1})};
  EXPECT_EQ(Replay(trace, FullAttention(100), Options(16)).status().code(),
            StatusCode::kInvalidArgument);  // 70 tokens > max model len 64
  // Each option below its minimum is named on its own.
  const auto bad_option = [](void (*edit)(ReplayOptions&), const std::string& what) {
    ReplayOptions o = Options(16);
    edit(o);
    const auto r = Replay({}, FullAttention(100), o);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << what;
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().message();
  };
  bad_option([](ReplayOptions& o) { o.token_budget = 0; }, "token_budget = 0: expected >= 1");
  bad_option([](ReplayOptions& o) { o.max_running = 0; }, "max_running = 0: expected >= 1");
  bad_option([](ReplayOptions& o) { o.max_model_len = 1; }, "max_model_len = 1: expected >= 2");
  bad_option([](ReplayOptions& o) { o.vocab = 0; }, "vocab = 0: expected >= 1");
  ReplayOptions o;
  o = Options(16);
  o.max_model_len = 128;  // beyond what the manager allows
  EXPECT_EQ(Replay({}, FullAttention(100), o).status().code(), StatusCode::kInvalidArgument);
  // Traces built in memory: an empty prompt, outputs that disagree with output_len, arrivals
  // out of order. Each is named.
  const auto refused = [](const Trace& t, const std::string& what) {
    const auto r = Replay(t, FullAttention(100), Options(16));
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << what;
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().message();
  };
  refused({Request(0, 0, {}, {1})}, "0-token prompt");
  TraceRequest short_output = Request(0, 0, {1, 2}, {7, 8});
  short_output.output_len = 3;
  refused({short_output}, "output_len 3 with 2 output tokens: expected as many tokens");
  TraceRequest negative_output = Request(0, 0, {1, 2}, {});
  negative_output.output_len = -1;
  refused({negative_output}, "output_len -1: expected >= 0");
  refused({Request(0, 5, {1, 2}, {3}), Request(1, 4, {1, 2}, {3})}, "arrival step 4");
}

TEST(Replayer, ARequestThatCanNeverFitIsAnErrorNotAHang) {
  // 3 blocks of 4 tokens; the second request's 13-token prompt needs 4 even when it runs alone.
  const Trace trace{Request(0, 0, {1, 2, 3}, {4}), Request(1, 0, std::vector<int32_t>(13, 5), {6})};
  const auto r = Replay(trace, FullAttention(3), Options(16));
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("request 1 (13 tokens) does not fit"), std::string::npos)
      << r.status().message();
}

TEST(Replayer, IdealHitRateByHand) {
  // R1 shares R0's first 8 prompt tokens and its first output block: with 4-token blocks and a
  // cap of prompt - 1 = 11 tokens, it hits 8 of 12. R0 hits nothing. 8 / 20.
  const Trace trace{Request(0, 0, {1, 2, 3, 4, 5, 6, 7, 8}, {9, 10, 11, 12}),
                    Request(1, 1, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {1})};
  EXPECT_DOUBLE_EQ(IdealHitRate(trace, 4), 8.0 / 20.0);
  // With a 13-token prompt a third block (9..12) is within the cap, but R0 never computed its
  // last output token (12): nothing holds that block. 8 / 21, not 12 / 21.
  const Trace longer{Request(0, 0, {1, 2, 3, 4, 5, 6, 7, 8}, {9, 10, 11, 12}),
                     Request(1, 1, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}, {1})};
  EXPECT_DOUBLE_EQ(IdealHitRate(longer, 4), 8.0 / 21.0);
}

// A request whose prompt + output is longer than max_model_len finishes when it reaches it (as
// vLLM's scheduler does) instead of waiting forever for a step it can never take. The progress
// hook stops a replay that runs away (it used to loop forever, its per-step vectors growing).
TEST(Replayer, ARequestFinishesAtMaxModelLen) {
  // 60-token prompt, 10 outputs, max model len 64: outputs 1..4 make 64 tokens; it finishes at
  // its fourth output, in step 4 (prefill at step 0, then one decode step per output).
  const Trace trace{Request(0, 0, std::vector<int32_t>(60, 3), {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}),
                    Request(1, 2, {1, 2, 3}, {4, 5})};
  ReplayOptions o = Options(64);
  o.record_requests = true;
  int64_t calls = 0;
  o.on_progress = [&calls](int64_t) {
    if (++calls > 8) throw std::runtime_error("the replay does not end");
  };
  ReplayReport r;
  ASSERT_NO_THROW(r = Replay(trace, FullAttention(40), o).value());
  ASSERT_EQ(r.requests.size(), 2u);
  EXPECT_EQ(r.requests[0].finish_step, 3);
  EXPECT_EQ(r.requests[1].finish_step, 3);
  EXPECT_EQ(r.steps, 4);
  // The same through vLLM's manager and scheduler.
  vllm::KvCacheConfig vc;
  vllm::KvCacheSpec full;
  full.block_size = 4;
  full.num_kv_heads = 1;
  full.head_size = full.head_size_v = 2;
  full.dtype_bytes = 2;
  vc.groups = {{full, {0}}};
  vc.num_blocks = 41;
  vc.cache_block_size = vc.hash_block_size = vc.scheduler_block_size = 4;
  vc.max_model_len = 64;
  vc.max_num_batched_tokens = 64;
  calls = 0;
  ASSERT_NO_THROW(r = ReplayVllm(trace, vc, o).value());
  EXPECT_EQ(r.requests[0].finish_step, 3);
  EXPECT_EQ(r.steps, 4);
}

}  // namespace
}  // namespace hkv
