// Prefill -> decode between two processes: a forked prefill process computes a prompt in its own
// engine, ships the blocks and recurrent checkpoints it published over a Unix socket, and this
// process - another engine, another memory - loads them and continues generating. The sequence
// equals the dense reference; a truncated or damaged transfer costs a recomputation, never a wrong
// output. Streamed (tier_stream.h), the blocks leave as the prefill engine publishes them and the
// decode engine serves from them before prefill has ended.
#include <chrono>
#include <csignal>
#include <string>
#include <thread>
#include <utility>

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hkv/connector/host_tier.h>
#include <hkv/connector/remote_tier.h>
#include <hkv/connector/tier_stream.h>
#include <hkv/connector/tier_transfer.h>
#include <hkv/engine/engine.h>
#include <hkv/engine/tiny_model.h>
#include <hkv/plan/plan.h>
#include <hkv/spec/config_loader.h>

#include "../connector/redis_server.h"

namespace hkv {
namespace {

constexpr int32_t kPrompt = 45;

enum class Damage { kNone, kTruncate, kFlipPayload };

// The same scaled model and weights in both processes.
struct Model {
  ModelSpec spec;
  ModelWeights weights;
  Plan plan;
  ManagerConfig config;
};

Result<Model> MakeModel(const std::string& model) {
  HKV_ASSIGN_OR_RETURN(const ModelSpec real,
                       LoadModelConfig(std::string(HKV_MODELS_DIR) + "/" + model + "/config.json"));
  TinyModelOptions tiny;
  HKV_ASSIGN_OR_RETURN(ModelSpec spec, ScaleModel(real, tiny));
  ModelWeights weights = ModelWeights::Random(spec, tiny.vocab, 0x7a5f);
  PlanOptions po;
  po.block_tokens = 4;
  po.max_model_len = 96;
  po.memory_bytes = int64_t{4} << 20;
  HKV_ASSIGN_OR_RETURN(Plan plan, MakePlan(spec, po));
  HKV_ASSIGN_OR_RETURN(ManagerConfig config, ManagerConfig::FromPlan(plan));
  return Model{std::move(spec), std::move(weights), std::move(plan), std::move(config)};
}

std::vector<int32_t> Prompt(int32_t vocab) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < kPrompt; ++i)
    p.push_back((i * 31 + 7) % vocab);
  return p;
}

Result<Sequence> Serve(const Model& s, Tier& tier, bool store, int32_t new_tokens,
                       EngineCounters* counters, std::vector<int32_t> prompt = {}) {
  EngineOptions eo;
  eo.poison_free_blocks = true;
  eo.offload = OffloadOptions{{&tier}, store, !store};
  HKV_ASSIGN_OR_RETURN(auto engine, Engine::Create(s.spec, s.weights, s.plan, s.config, eo));
  GenerationRequest g;
  g.id = 1;
  g.prompt = prompt.empty() ? Prompt(s.weights.vocab) : std::move(prompt);
  g.max_new_tokens = new_tokens;
  HKV_RETURN_IF_ERROR(engine->Submit(g));
  for (int step = 0; !engine->idle(); ++step) {
    if (step > 1000) return Status::FailedPrecondition("engine did not finish");
    HKV_RETURN_IF_ERROR(engine->Step());
    HKV_RETURN_IF_ERROR(engine->manager().CheckInvariants());
  }
  if (counters != nullptr) *counters = engine->counters();
  return engine->finished().at(0);
}

// The prefill process: compute the prompt (and its first token), send what was published.
[[noreturn]] void Prefill(const std::string& model, int fd, Damage damage) {
  auto setup = MakeModel(model);
  if (!setup.ok()) _exit(2);
  HostTier outbox(int64_t{64} << 20);
  if (!Serve(*setup, outbox, /*store=*/true, 1, nullptr).ok()) _exit(3);
  auto message = SerializeTierEntries(outbox);
  if (!message.ok()) _exit(4);
  std::vector<unsigned char>& m = *message;
  if (damage == Damage::kTruncate) m.resize(m.size() / 2);
  if (damage == Damage::kFlipPayload) {
    // One byte in the middle of every entry's bytes (24-byte message header; per entry a 40-byte
    // header whose little-endian length sits at offset 24): every block stream is damaged.
    for (size_t at = 24; at + 40 <= m.size();) {
      uint64_t length = 0;
      for (int i = 0; i < 8; ++i)
        length |= static_cast<uint64_t>(m[at + 24 + static_cast<size_t>(i)]) << (8 * i);
      m[at + 40 + length / 2] ^= 0x40;
      at += 40 + length;
    }
  }
  if (!SendAll(fd, m).ok()) _exit(5);
  close(fd);
  _exit(0);
}

struct Received {
  int64_t entries = 0;
  Status status;
};

Received Transfer(const std::string& model, Damage damage, HostTier& inbox) {
  int sv[2];
  EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  const pid_t child = fork();
  if (child == 0) {
    close(sv[0]);
    Prefill(model, sv[1], damage);
  }
  close(sv[1]);
  auto message = ReceiveAll(sv[0], int64_t{1} << 30);
  close(sv[0]);
  int status = 0;
  EXPECT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "prefill process status " << status;
  EXPECT_TRUE(message.ok()) << message.status().ToString();
  Received r;
  auto taken = DeserializeTierEntries(*message, inbox);
  r.status = taken.status();
  r.entries = taken.ok() ? *taken : static_cast<int64_t>(inbox.LruOrder().size());
  return r;
}

class PrefillDecode : public ::testing::TestWithParam<std::string> {};

TEST_P(PrefillDecode, DecodeProcessContinuesFromShippedBlocksExactly) {
  const Model s = MakeModel(GetParam()).value();
  HostTier inbox(int64_t{64} << 20);
  const Received got = Transfer(GetParam(), Damage::kNone, inbox);
  ASSERT_TRUE(got.status.ok()) << got.status.ToString();
  ASSERT_GT(got.entries, 0);
  EngineCounters c;
  const Sequence seq = Serve(s, inbox, /*store=*/false, 8, &c).value();
  const DenseCheck d = CheckAgainstDense(s.spec, s.weights, seq);
  EXPECT_EQ(d.mismatches, 0);
  EXPECT_LE(d.max_logit_diff, 1e-4f);
  EXPECT_EQ(c.loads_completed, 1);
  EXPECT_EQ(c.loads_failed, 0);
  // Everything but the tail after the last reusable block boundary came from the other process.
  EXPECT_GE(c.external_hit_tokens, kPrompt - 1 - 2 * s.config.align_tokens());
  EXPECT_EQ(seq.logits.begin()->first, c.external_hit_tokens);
}

TEST_P(PrefillDecode, TruncatedOrDamagedTransfersRecomputeExactly) {
  const Model s = MakeModel(GetParam()).value();
  for (Damage damage : {Damage::kTruncate, Damage::kFlipPayload}) {
    SCOPED_TRACE(damage == Damage::kTruncate ? "truncated" : "damaged");
    HostTier inbox(int64_t{64} << 20);
    const Received got = Transfer(GetParam(), damage, inbox);
    if (damage == Damage::kTruncate) {
      EXPECT_EQ(got.status.code(), StatusCode::kIoError) << got.status.ToString();
      EXPECT_NE(got.status.message().find("truncated"), std::string::npos);
    }
    EngineCounters c;
    const Sequence seq = Serve(s, inbox, /*store=*/false, 8, &c).value();
    const DenseCheck d = CheckAgainstDense(s.spec, s.weights, seq);
    EXPECT_EQ(d.mismatches, 0);
    EXPECT_LE(d.max_logit_diff, 1e-4f);
    // Either nothing usable arrived (a shorter hit or none) or a load found the damage.
    if (damage == Damage::kFlipPayload) {
      EXPECT_EQ(c.loads_failed, 1);
    }
    EXPECT_EQ(c.loads_completed + c.loads_failed, c.external_hits);
  }
}

// Two engine processes sharing one Redis server: the first (a forked child) computes the prompt
// and stores what it publishes; this one, with its own connection, finds the prefix there.
TEST_P(PrefillDecode, EngineProcessesSharePrefixesThroughARedisServer) {
  const Model s = MakeModel(GetParam()).value();
  testing::RedisServer server;
  ASSERT_TRUE(server.Start().ok());
  const RemoteTierOptions options = server.Options("shared");
  const pid_t child = fork();
  if (child == 0) {
    auto model = MakeModel(GetParam());
    auto remote = RemoteTier::Connect(options);
    if (!model.ok() || !remote.ok()) _exit(2);
    _exit(Serve(*model, **remote, /*store=*/true, 1, nullptr).ok() ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  auto remote = RemoteTier::Connect(options).value();
  EngineCounters c;
  const Sequence seq = Serve(s, *remote, /*store=*/false, 8, &c).value();
  const DenseCheck d = CheckAgainstDense(s.spec, s.weights, seq);
  EXPECT_EQ(d.mismatches, 0);
  EXPECT_LE(d.max_logit_diff, 1e-4f);
  EXPECT_EQ(c.loads_completed, 1);
  EXPECT_GE(c.external_hit_tokens, kPrompt - 1 - 2 * s.config.align_tokens());
  EXPECT_GT(remote->hits(), 0);
  EXPECT_TRUE(remote->LruOrder().empty());  // it stored nothing: every entry was the other's
}

// Streaming: the prefill process sends each block as its engine publishes it. It computes prompt
// A, reports how many entries it sent, and waits; this process's decode engine loads A's blocks
// and finishes A while the stream is still open (prefill has not ended), then lets prefill go on
// to prompt B and reads the rest. Both sequences equal the dense reference and load from the
// stream. A prefill process killed before B leaves a stream cut short: A's entries are kept, the
// receiver says why, and B recomputes exactly.
TEST_P(PrefillDecode, StreamedBlocksServeDecodeBeforePrefillEnds) {
  const Model s = MakeModel(GetParam()).value();
  std::vector<int32_t> prompt_b = Prompt(s.weights.vocab);
  for (int32_t& t : prompt_b)
    t = (t + 5) % s.weights.vocab;
  for (const bool killed : {false, true}) {
    SCOPED_TRACE(killed ? "prefill killed after A" : "whole stream");
    int sv[2], control[2], report[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    ASSERT_EQ(pipe(control), 0);
    ASSERT_EQ(pipe(report), 0);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      close(sv[0]);
      close(control[1]);
      close(report[0]);
      auto sender = TierStreamSender::Open(sv[1]);
      if (!sender.ok()) _exit(2);
      if (!Serve(s, **sender, /*store=*/true, 1, nullptr).ok()) _exit(3);
      const int64_t sent = (*sender)->entries_sent();
      if (write(report[1], &sent, sizeof sent) != sizeof sent) _exit(4);
      char go = 0;
      if (read(control[0], &go, 1) != 1 || go != 'B') _exit(5);
      if (!Serve(s, **sender, /*store=*/true, 1, nullptr, prompt_b).ok()) _exit(6);
      _exit((*sender)->Finish().ok() ? 0 : 7);
    }
    close(sv[1]);
    close(control[0]);
    close(report[1]);
    auto receiver = TierStreamReceiver::Start(sv[0], int64_t{64} << 20, int64_t{16} << 20).value();
    int64_t sent_for_a = 0;
    ASSERT_EQ(read(report[0], &sent_for_a, sizeof sent_for_a),
              static_cast<ssize_t>(sizeof sent_for_a));
    ASSERT_GT(sent_for_a, 0);
    while (receiver->entries_received() < sent_for_a)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));

    EngineCounters c;
    const Sequence a = Serve(s, *receiver, /*store=*/false, 8, &c).value();
    EXPECT_TRUE(receiver->running());  // decode finished A before prefill ended
    EXPECT_EQ(CheckAgainstDense(s.spec, s.weights, a).mismatches, 0);
    EXPECT_EQ(c.loads_completed, 1);
    EXPECT_GE(c.external_hit_tokens, kPrompt - 1 - 2 * s.config.align_tokens());

    if (killed) {
      kill(child, SIGKILL);
    } else {
      ASSERT_EQ(write(control[1], "B", 1), 1);
    }
    const Status end = receiver->Wait();
    int status = 0;
    EXPECT_EQ(waitpid(child, &status, 0), child);
    if (killed) {
      EXPECT_EQ(end.code(), StatusCode::kIoError) << end.ToString();
      EXPECT_NE(end.message().find("cut short"), std::string::npos) << end.message();
      EXPECT_EQ(receiver->entries_received(), sent_for_a);
    } else {
      EXPECT_TRUE(end.ok()) << end.ToString();
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
      EXPECT_GT(receiver->entries_received(), sent_for_a);
    }
    const Sequence b = Serve(s, *receiver, /*store=*/false, 8, &c, prompt_b).value();
    EXPECT_EQ(CheckAgainstDense(s.spec, s.weights, b).mismatches, 0);
    EXPECT_EQ(c.loads_completed, killed ? 0 : 1);
    close(sv[0]);
    close(control[1]);
    close(report[0]);
  }
}

// A stream that is not one, or whose entry is larger than the receiver allows, stops it with the
// reason; nothing of the oversized entry is read.
TEST(TierStream, DamagedOrOversizedStreamsAreRefusedByName) {
  for (const int which : {0, 1}) {
    int sv[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    auto receiver = TierStreamReceiver::Start(sv[0], 1 << 20, 100).value();
    if (which == 0) {
      ASSERT_TRUE(SendAll(sv[1], std::vector<unsigned char>(24, 0x33)).ok());
      const Status s = receiver->Wait();
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
      EXPECT_NE(s.message().find("stream header is damaged"), std::string::npos) << s.message();
    } else {
      auto sender = TierStreamSender::Open(sv[1]).value();
      ASSERT_TRUE(sender->Put({{1, 2}, 0}, std::vector<unsigned char>(100, 1)).ok());
      ASSERT_TRUE(sender->Put({{1, 2}, 0}, std::vector<unsigned char>(100, 1)).ok());  // once
      ASSERT_TRUE(sender->Put({{3, 4}, 0}, std::vector<unsigned char>(101, 1)).ok());
      const Status s = receiver->Wait();
      EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
      EXPECT_NE(s.message().find("larger than the limit of 100 bytes"), std::string::npos)
          << s.message();
      EXPECT_EQ(receiver->entries_received(), 1);
      EXPECT_EQ(sender->entries_sent(), 2);
      EXPECT_EQ(sender->Get({{1, 2}, 0}).status().code(), StatusCode::kNotFound);
    }
    close(sv[0]);
    close(sv[1]);
  }
  EXPECT_EQ(TierStreamReceiver::Start(-1, 1, 1).status().code(), StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Models, PrefillDecode,
                         ::testing::Values("meta-llama--Llama-3.1-8B", "google--gemma-2-9b",
                                           "ibm-ai-platform--Bamba-9B", "ai21labs--Jamba-v0.1",
                                           "deepseek-ai--DeepSeek-V2-Lite",
                                           "Qwen--Qwen3-Next-80B-A3B-Instruct"),
                         [](const auto& p) {
                           std::string n = p.param.substr(p.param.find("--") + 2);
                           for (char& ch : n) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

TEST(TierTransfer, MessagesRoundTripAndRefuseDamageByName) {
  HostTier a(1 << 20), b(1 << 20);
  for (int i = 0; i < 5; ++i) {
    const std::vector<unsigned char> bytes(static_cast<size_t>(100 + i),
                                           static_cast<unsigned char>(i));
    ASSERT_TRUE(a.Put({{static_cast<uint64_t>(i), 7}, i % 2}, bytes).ok());
  }
  std::vector<unsigned char> m = SerializeTierEntries(a).value();
  EXPECT_EQ(DeserializeTierEntries(m, b).value(), 5);
  EXPECT_EQ(b.LruOrder(), a.LruOrder());
  for (const PrefixKey& k : a.LruOrder())
    EXPECT_EQ(b.Get(k).value(), a.Get(k).value());
  // Damaged message header (magic, version, count under the checksum): nothing put, and the
  // field that failed is named.
  HostTier c(1 << 20);
  std::vector<unsigned char> bad;
  for (const auto& [at, what] : {std::pair<size_t, std::string>{0, "the magic is wrong"},
                                 {4, "version 3; expected version 1"},
                                 {9, "its checksum fails"}}) {
    bad = m;
    bad[at] ^= 2;
    const Status header = DeserializeTierEntries(bad, c).status();
    EXPECT_EQ(header.code(), StatusCode::kInvalidArgument) << what;
    EXPECT_NE(header.message().find(what), std::string::npos) << header.message();
    EXPECT_EQ(c.used_bytes(), 0);
  }
  // Damaged second entry header: the first one kept.
  bad = m;
  bad[24 + 40 + 100 + 3] ^= 1;
  const Status s = DeserializeTierEntries(bad, c).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("entry 1"), std::string::npos) << s.ToString();
  EXPECT_EQ(c.LruOrder().size(), 1u);
  // Every truncation keeps whole entries only, and says so.
  for (size_t cut = 0; cut < m.size(); cut += 37) {
    HostTier d(1 << 20);
    const auto r = DeserializeTierEntries(std::span(m).first(cut), d);
    EXPECT_EQ(r.status().code(), StatusCode::kIoError) << cut;
    for (const PrefixKey& k : d.LruOrder())
      EXPECT_EQ(d.Get(k).value(), a.Get(k).value());
  }
  // Trailing bytes are refused.
  m.push_back(0);
  HostTier e(1 << 20);
  EXPECT_EQ(DeserializeTierEntries(m, e).status().code(), StatusCode::kInvalidArgument);
}

// A receiver takes at most its limit: a message exactly at it arrives whole, one byte more is
// refused by name as soon as the limit is passed (the sender is still writing).
TEST(TierTransfer, ReceiveRefusesAMessageOverItsLimit) {
  for (const size_t size : {size_t{1000}, size_t{1001}, size_t{3} << 20}) {
    SCOPED_TRACE(size);
    int sv[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    std::thread sender([&] {
      const std::vector<unsigned char> bytes(size, 0x5a);
      (void)SendAll(sv[1], bytes);  // fails once the receiver stops reading and closes
      close(sv[1]);
    });
    const auto got = ReceiveAll(sv[0], 1000);
    close(sv[0]);
    sender.join();
    if (size == 1000) {
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_EQ(got->size(), 1000u);
    } else {
      EXPECT_EQ(got.status().code(), StatusCode::kResourceExhausted);
      EXPECT_NE(got.status().message().find("limit of 1000 bytes"), std::string::npos)
          << got.status().message();
    }
  }
  EXPECT_EQ(ReceiveAll(0, -1).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hkv
