// The synthetic trace generator follows replay.md's rules and is deterministic per seed.
#include <algorithm>
#include <sstream>

#include <gtest/gtest.h>

#include <hkv/sim/trace_generator.h>

namespace hkv {
namespace {

Trace MustGenerate(const TraceGenOptions& o) {
  Result<Trace> t = GenerateTrace(o);
  if (!t.ok()) ADD_FAILURE() << t.status().ToString();
  return t.ok() ? *t : Trace{};
}

std::string Bytes(const Trace& t) {
  std::ostringstream out;
  WriteTrace(t, out);
  return out.str();
}

TEST(TraceGeneratorTest, SameSeedSameBytesOtherSeedOtherTrace) {
  TraceGenOptions o;
  o.num_requests = 120;
  o.seed = 7;
  const std::string a = Bytes(MustGenerate(o));
  EXPECT_EQ(a, Bytes(MustGenerate(o)));
  o.seed = 8;
  EXPECT_NE(a, Bytes(MustGenerate(o)));
}

TEST(TraceGeneratorTest, FollowsTheReplayRules) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    TraceGenOptions o;
    o.num_requests = 300;
    o.seed = seed;
    const Trace t = MustGenerate(o);
    ASSERT_EQ(t.size(), 300u);
    int sessions = 0, with_system_prompt = 0;
    for (size_t i = 0; i < t.size(); ++i) {
      const TraceRequest& q = t[i];
      EXPECT_EQ(q.id, static_cast<int64_t>(i));
      if (i > 0) {
        EXPECT_GE(q.arrival_step, t[i - 1].arrival_step);
      }
      EXPECT_LE(q.prompt.size(), static_cast<size_t>(o.max_prompt_tokens));
      EXPECT_GE(q.output_len, o.output_min);
      EXPECT_LE(q.output_len, o.output_max);
      EXPECT_EQ(q.output.size(), static_cast<size_t>(q.output_len));
      EXPECT_LT(q.turn, o.max_turns);
      for (int32_t tok : q.prompt)
        ASSERT_TRUE(tok >= 0 && tok < o.vocab_size);
      if (q.turn == 0) {
        ++sessions;
        EXPECT_EQ(q.parent, -1);
        if (q.system_prompt >= 0) ++with_system_prompt;
        continue;
      }
      // A later turn: the previous prompt and its output are this prompt's prefix, and it
      // arrives after the previous turn's prefill, decode and think time.
      ASSERT_GE(q.parent, 0);
      ASSERT_LT(q.parent, q.id);
      const TraceRequest& p = t[static_cast<size_t>(q.parent)];
      EXPECT_EQ(p.session, q.session);
      EXPECT_EQ(p.turn + 1, q.turn);
      std::vector<int32_t> prefix = p.prompt;
      prefix.insert(prefix.end(), p.output.begin(), p.output.end());
      ASSERT_GT(q.prompt.size(), prefix.size());
      EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), q.prompt.begin()));
      const size_t message = q.prompt.size() - prefix.size();
      EXPECT_GE(message, static_cast<size_t>(o.followup_min));
      EXPECT_LE(message, static_cast<size_t>(o.followup_max));
      const int64_t prefill = (static_cast<int64_t>(p.prompt.size()) + 2047) / 2048;
      const int64_t gap = q.arrival_step - p.arrival_step - prefill - p.output_len;
      EXPECT_GE(gap, o.think_min);
      EXPECT_LE(gap, o.think_max);
    }
    // 80% of sessions use a shared system prompt; with ~80 sessions allow a wide margin.
    ASSERT_GT(sessions, 20);
    const double share = static_cast<double>(with_system_prompt) / sessions;
    EXPECT_GT(share, 0.6);
    EXPECT_LT(share, 0.95);
  }
}

TEST(TraceGeneratorTest, SessionsSharingASystemPromptShareItsTokens) {
  TraceGenOptions o;
  o.num_requests = 100;
  o.num_system_prompts = 1;
  o.system_prompt_share = 1.0;
  o.max_turns = 1;
  const Trace t = MustGenerate(o);
  const size_t n = static_cast<size_t>(o.system_prompt_min);
  for (const TraceRequest& q : t) {
    ASSERT_EQ(q.system_prompt, 0);
    EXPECT_TRUE(std::equal(t[0].prompt.begin(), t[0].prompt.begin() + static_cast<long>(n),
                           q.prompt.begin()));
  }
}

TEST(TraceGeneratorTest, RejectsBadOptionsByName) {
  const auto rejected = [](void (*mutate)(TraceGenOptions&), std::string_view fragment) {
    TraceGenOptions o;
    mutate(o);
    const Result<Trace> t = GenerateTrace(o);
    ASSERT_FALSE(t.ok()) << fragment;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(fragment), std::string::npos) << t.status().message();
  };
  rejected([](TraceGenOptions& o) { o.num_requests = -1; }, "requests = -1");
  rejected([](TraceGenOptions& o) { o.session_gap = -2; }, "session_gap");
  rejected([](TraceGenOptions& o) { o.max_turns = 0; }, "max_turns = 0");
  rejected([](TraceGenOptions& o) { o.system_prompt_share = 1.5; },
           "system_prompt_share = 1.5: expected a share in [0, 1]");
  rejected([](TraceGenOptions& o) { o.num_system_prompts = -1; },
           "system_prompts = -1: expected >= 0");
  rejected([](TraceGenOptions& o) { o.output_min = 0; }, "output_len: range [0, ");
  rejected([](TraceGenOptions& o) { o.output_min = 0; }, "min 0: expected >= 1");
  rejected([](TraceGenOptions& o) { o.first_message_max = 10; }, "first_message_len");
  rejected(
      [](TraceGenOptions& o) {
        o.first_message_min = 20;
        o.first_message_max = 10;
      },
      "max 10: expected >= min 20");
  rejected([](TraceGenOptions& o) { o.max_prompt_tokens = 10; }, "max_prompt_tokens");
  rejected([](TraceGenOptions& o) { o.prefill_tokens_per_step = 0; },
           "prefill_tokens_per_step = 0: expected >= 1");
  rejected([](TraceGenOptions& o) { o.vocab_size = 0; }, "vocab_size = 0: expected >= 1");
}

TEST(TraceGeneratorTest, ZeroRequestsIsAnEmptyTrace) {
  TraceGenOptions o;
  o.num_requests = 0;
  EXPECT_TRUE(MustGenerate(o).empty());
}

}  // namespace
}  // namespace hkv
