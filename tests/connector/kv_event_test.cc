// KV events: the manager's events in vLLM's wire format, decoded back here with msgpack, and the
// ZeroMQ publisher's sequence numbers, replay and refusals.
#include <algorithm>
#include <map>
#include <string>

#include <gtest/gtest.h>
#include <zmq.h>

#define MSGPACK_NO_BOOST
#include <msgpack.hpp>

#include <hkv/connector/kv_events.h>

namespace hkv {
namespace {

ManagerConfig Config() {
  ManagerConfig c;
  c.pool_blocks = {32, 32};
  c.groups = {GroupConfig{{TokenRuleKind::kAll, 0, 0}, 4, 0},
              GroupConfig{{TokenRuleKind::kWindow, 6, 0}, 4, 0},
              GroupConfig{{TokenRuleKind::kState, 0, 0}, 0, 1}};
  c.max_model_len = 256;
  c.state_align_tokens = 4;
  return c;
}

// The state group's block_tokens is the manager's alignment (4): a checkpoint's parent distance.
const std::vector<KvEventGroup> kGroups = {
    {"full_attention", 4, std::nullopt}, {"sliding_window", 4, 6}, {"mamba", 4, std::nullopt}};

BlockHash HashOf(const msgpack::object& bin) {
  EXPECT_EQ(bin.type, msgpack::type::BIN);
  BlockHash h;
  for (int i = 0; i < 8; ++i) {
    h.hi = (h.hi << 8) | static_cast<unsigned char>(bin.via.bin.ptr[i]);
    h.lo = (h.lo << 8) | static_cast<unsigned char>(bin.via.bin.ptr[8 + i]);
  }
  return h;
}

std::map<std::string, msgpack::object> Fields(const msgpack::object& o) {
  EXPECT_EQ(o.type, msgpack::type::MAP);
  std::map<std::string, msgpack::object> m;
  for (uint32_t i = 0; i < o.via.map.size; ++i)
    m[o.via.map.ptr[i].key.as<std::string>()] = o.via.map.ptr[i].val;
  return m;
}

// Request 42 computes a 21-token prompt (5 full blocks per token group, checkpoints).
std::vector<int32_t> ComputePrompt(KvCacheManager& m) {
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 21; ++i)
    prompt.push_back(500 + i);
  RequestSpec spec;
  spec.id = 42;
  spec.prompt = prompt;
  EXPECT_TRUE(m.AddRequest(spec).ok());
  EXPECT_TRUE(m.Allocate(42, 21).ok());
  EXPECT_TRUE(m.Commit(42, 21).ok());
  return prompt;
}

TEST(KvEventTest, ABatchIsVllmsLayoutWithTheBlocksTokensAndGroups) {
  KvCacheManager m = KvCacheManager::Create(Config()).value();
  const std::vector<int32_t> prompt = ComputePrompt(m);
  const std::vector<ManagerEvent> events = m.TakeEvents();
  const RequestTokens tokens = [&](RequestId id) {
    return id == 42 ? std::span<const int32_t>(prompt) : std::span<const int32_t>{};
  };
  KvEventEncoding enc;
  enc.data_parallel_rank = 3;
  const std::vector<unsigned char> payload =
      EncodeKvEventBatch(events, kGroups, tokens, enc, 1234.5).value();
  // The manager knows the tokens itself: its record encodes the same batch.
  EXPECT_EQ(EncodeKvEventBatch(events, kGroups, TokensOf(m), enc, 1234.5).value(), payload);
  EXPECT_EQ(m.Tokens(42).value().size(), prompt.size());
  EXPECT_EQ(m.Tokens(7).status().code(), StatusCode::kNotFound);
  const msgpack::object_handle h =
      msgpack::unpack(reinterpret_cast<const char*>(payload.data()), payload.size());
  const msgpack::object& batch = h.get();
  ASSERT_EQ(batch.type, msgpack::type::ARRAY);
  ASSERT_EQ(batch.via.array.size, 3u);
  EXPECT_EQ(batch.via.array.ptr[0].as<double>(), 1234.5);
  EXPECT_EQ(batch.via.array.ptr[2].as<int>(), 3);
  const msgpack::object& list = batch.via.array.ptr[1];
  int full_blocks = 0, window_blocks = 0, checkpoints = 0;
  // Full attention's chain: the digest at the end of each of its blocks, in order.
  std::vector<BlockHash> chain;
  for (uint32_t i = 0; i < list.via.array.size; ++i) {
    auto f = Fields(list.via.array.ptr[i]);
    if (f["group_idx"].as<int>() != 0) continue;
    for (uint32_t k = 0; k < f["block_hashes"].via.array.size; ++k)
      chain.push_back(HashOf(f["block_hashes"].via.array.ptr[k]));
  }
  ASSERT_EQ(chain.size(), 5u);
  for (uint32_t i = 0; i < list.via.array.size; ++i) {
    auto f = Fields(list.via.array.ptr[i]);
    ASSERT_EQ(f["type"].as<std::string>(), "BlockStored");
    EXPECT_EQ(f["medium"].as<std::string>(), "GPU");
    EXPECT_TRUE(f["lora_id"].is_nil());  // the base model
    EXPECT_TRUE(f["lora_name"].is_nil());
    const int group = f["group_idx"].as<int>();
    const auto hashes = f["block_hashes"].via.array;
    const auto ids = f["token_ids"].as<std::vector<int32_t>>();
    for (uint32_t k = 0; k < hashes.size; ++k) {
      ASSERT_EQ(hashes.ptr[k].type, msgpack::type::BIN);
      EXPECT_EQ(hashes.ptr[k].via.bin.size, 16u);
    }
    if (group == 2) {
      // A checkpoint at p: its parent is the digest at p - 4 (the full-attention block ending
      // there) and it carries those 4 tokens; the first one, at 4, has none and tokens [0, 4).
      ++checkpoints;
      EXPECT_EQ(f["kv_cache_spec_kind"].as<std::string>(), "mamba");
      const int size = f["block_size"].as<int>();
      const BlockHash self = HashOf(hashes.ptr[0]);
      const auto at = std::find(chain.begin(), chain.end(), self);
      ASSERT_NE(at, chain.end()) << "a checkpoint at a block boundary has that block's digest";
      const int p = 4 * static_cast<int>(at - chain.begin() + 1);
      EXPECT_EQ(size, 4);
      EXPECT_EQ(ids, std::vector<int32_t>(prompt.begin() + (p - 4), prompt.begin() + p));
      if (p == 4) {
        EXPECT_TRUE(f["parent_block_hash"].is_nil());
      } else {
        EXPECT_EQ(HashOf(f["parent_block_hash"]), chain[static_cast<size_t>(p / 4 - 2)]);
      }
      continue;
    }
    // One event per run of blocks: the prompt's 5 full blocks, in order, with their tokens; the
    // run starts the sequence, so it has no parent.
    EXPECT_TRUE(f["parent_block_hash"].is_nil());
    EXPECT_EQ(f["block_size"].as<int>(), 4);
    EXPECT_EQ(ids, std::vector<int32_t>(prompt.begin(), prompt.begin() + 4 * hashes.size));
    if (group == 0) {
      full_blocks += static_cast<int>(hashes.size);
      EXPECT_EQ(f.count("kv_cache_spec_sliding_window"), 0u);
    } else {
      window_blocks += static_cast<int>(hashes.size);
      EXPECT_EQ(f["kv_cache_spec_sliding_window"].as<int>(), 6);
    }
  }
  EXPECT_EQ(full_blocks, 5);
  EXPECT_EQ(window_blocks, 5);
  EXPECT_GE(checkpoints, 1);
  EXPECT_EQ(list.via.array.size, 2u + static_cast<uint32_t>(checkpoints));

  // Removals and a reset: BlockRemoved runs per group, then AllBlocksCleared.
  ASSERT_TRUE(m.Free(42).ok());
  (void)m.TakeEvents();
  ASSERT_TRUE(m.ResetPrefixCache().ok());
  const std::vector<ManagerEvent> cleared = m.TakeEvents();
  const std::vector<unsigned char> p2 =
      EncodeKvEventBatch(cleared, kGroups, tokens, KvEventEncoding{}, 1.0).value();
  const msgpack::object_handle h2 =
      msgpack::unpack(reinterpret_cast<const char*>(p2.data()), p2.size());
  ASSERT_EQ(h2.get().via.array.size, 2u);  // no data_parallel_rank: omitted, as msgspec does
  const msgpack::object& l2 = h2.get().via.array.ptr[1];
  auto last = Fields(l2.via.array.ptr[l2.via.array.size - 1]);
  EXPECT_EQ(last["type"].as<std::string>(), "AllBlocksCleared");
  EXPECT_EQ(last.size(), 1u);

  const std::vector<ManagerEvent> bad = {
      ManagerEvent{KvEvent::Kind::kRemoved, 0, 7, BlockHash{1, 2}, 3}};
  EXPECT_EQ(EncodeKvEventBatch(bad, kGroups, tokens, KvEventEncoding{}, 1.0).status().code(),
            StatusCode::kInvalidArgument);
}

std::vector<std::string> RecvParts(void* socket, int timeout_ms) {
  std::vector<std::string> parts;
  zmq_pollitem_t item{socket, 0, ZMQ_POLLIN, 0};
  if (zmq_poll(&item, 1, timeout_ms) <= 0) return parts;
  int more = 1;
  while (more != 0) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, socket, 0) < 0) break;
    parts.emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
    size_t len = sizeof(more);
    zmq_getsockopt(socket, ZMQ_RCVMORE, &more, &len);
    zmq_msg_close(&m);
  }
  return parts;
}

int64_t Seq(const std::string& s) {
  uint64_t u = 0;
  for (unsigned char c : s)
    u = (u << 8) | c;
  return static_cast<int64_t>(u);
}

TEST(KvEventTest, TheManagerNamesAFreedRequestsTokensForTheEventsOfItsFree) {
  // Free publishes the final state; its event is taken after the request is gone, and the
  // manager still names the request's tokens until the TakeEvents after that one.
  KvCacheManager m = KvCacheManager::Create(Config()).value();
  const std::vector<int32_t> prompt = ComputePrompt(m);
  ASSERT_TRUE(m.AppendTokens(42, std::vector<int32_t>{600, 601, 602}).ok());
  ASSERT_TRUE(m.Allocate(42, 3).ok());
  ASSERT_TRUE(m.Commit(42, 24).ok());
  m.TakeEvents();
  ASSERT_TRUE(m.Free(42).ok());
  const std::vector<ManagerEvent> at_free = m.TakeEvents();
  const auto final_state = std::find_if(at_free.begin(), at_free.end(), [](const ManagerEvent& e) {
    return e.kind == KvEvent::Kind::kStored && e.group == 2 && e.position == 24;
  });
  ASSERT_NE(final_state, at_free.end());
  ASSERT_EQ(m.Tokens(42).value().size(), 24u);
  EXPECT_EQ(m.Tokens(42).value()[23], 602);
  // Encoded from the manager's record: the checkpoint's last 4 tokens, after its parent at 20.
  ASSERT_TRUE(final_state->parent.has_value());
  const std::vector<unsigned char> payload =
      EncodeKvEventBatch({&*final_state, 1}, kGroups, TokensOf(m), KvEventEncoding{}, 1.0).value();
  const msgpack::object_handle h =
      msgpack::unpack(reinterpret_cast<const char*>(payload.data()), payload.size());
  auto f = Fields(h.get().via.array.ptr[1].via.array.ptr[0]);
  EXPECT_EQ(f["token_ids"].as<std::vector<int32_t>>(),
            (std::vector<int32_t>{504 + 16, 600, 601, 602}));
  EXPECT_EQ(f["block_size"].as<int>(), 4);
  m.TakeEvents();
  EXPECT_EQ(m.Tokens(42).status().code(), StatusCode::kNotFound);
}

// A request of an adapter: every event of its blocks names it as lora_id; a later run of blocks
// names the block before it as parent.
TEST(KvEventTest, AdaptersAndLaterRunsAreNamed) {
  KvCacheManager m = KvCacheManager::Create(Config()).value();
  std::vector<int32_t> prompt(8);
  for (int32_t i = 0; i < 8; ++i)
    prompt[static_cast<size_t>(i)] = 700 + i;
  RequestSpec spec;
  spec.id = 5;
  spec.prompt = prompt;
  spec.adapter_id = 7;
  ASSERT_TRUE(m.AddRequest(spec).ok());
  ASSERT_TRUE(m.Allocate(5, 8).ok());
  ASSERT_TRUE(m.Commit(5, 8).ok());
  const std::vector<ManagerEvent> first = m.TakeEvents();
  ASSERT_TRUE(m.AppendTokens(5, std::vector<int32_t>{800, 801, 802, 803}).ok());
  ASSERT_TRUE(m.Allocate(5, 4).ok());
  ASSERT_TRUE(m.Commit(5, 12).ok());
  const std::vector<ManagerEvent> second = m.TakeEvents();
  BlockHash second_block_of_first{};
  for (const ManagerEvent& e : first) {
    if (e.group == 0 && e.position == 4) second_block_of_first = e.hash;
  }
  const std::vector<unsigned char> payload =
      EncodeKvEventBatch(second, kGroups, TokensOf(m), KvEventEncoding{}, 1.0).value();
  const msgpack::object_handle h =
      msgpack::unpack(reinterpret_cast<const char*>(payload.data()), payload.size());
  const msgpack::object& list = h.get().via.array.ptr[1];
  bool saw_full = false;
  for (uint32_t i = 0; i < list.via.array.size; ++i) {
    auto f = Fields(list.via.array.ptr[i]);
    EXPECT_EQ(f["lora_id"].as<int>(), 7);
    if (f["group_idx"].as<int>() != 0) continue;
    saw_full = true;
    EXPECT_EQ(HashOf(f["parent_block_hash"]), second_block_of_first);
    EXPECT_EQ(f["token_ids"].as<std::vector<int32_t>>(),
              (std::vector<int32_t>{800, 801, 802, 803}));
  }
  EXPECT_TRUE(saw_full);
}

TEST(KvEventTest, SubscribersGetNumberedBatchesAndCanReplayWhatTheyMissed) {
  KvEventPublisherOptions o;
  o.endpoint = "tcp://127.0.0.1:*";
  o.replay_endpoint = "tcp://127.0.0.1:*";
  auto pub = KvEventPublisher::Bind(o, kGroups).value();
  ASSERT_NE(pub->endpoint().find("127.0.0.1:"), std::string::npos);
  void* ctx = zmq_ctx_new();
  void* sub = zmq_socket(ctx, ZMQ_SUB);
  zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "kv-events", 9);
  ASSERT_EQ(zmq_connect(sub, pub->endpoint().c_str()), 0);
  ASSERT_TRUE(pub->WaitForSubscriber(5000));
  const std::vector<ManagerEvent> one = {
      ManagerEvent{KvEvent::Kind::kRemoved, 0, 1, BlockHash{1, 2}, 3}};
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(pub->Publish(one, nullptr).ok());
  ASSERT_TRUE(pub->Publish({}, nullptr).ok());  // nothing to say: no batch
  EXPECT_EQ(pub->next_sequence(), 3);
  for (int64_t i = 0; i < 3; ++i) {
    const std::vector<std::string> parts = RecvParts(sub, 5000);
    ASSERT_EQ(parts.size(), 3u);
    EXPECT_EQ(parts[0], "kv-events");
    EXPECT_EQ(Seq(parts[1]), i);
  }
  // A subscriber that missed batches asks from sequence 1 on.
  void* replay = zmq_socket(ctx, ZMQ_DEALER);
  ASSERT_EQ(zmq_connect(replay, pub->replay_endpoint().c_str()), 0);
  const unsigned char from[8] = {0, 0, 0, 0, 0, 0, 0, 1};
  ASSERT_EQ(zmq_send(replay, "", 0, ZMQ_SNDMORE), 0);
  ASSERT_EQ(zmq_send(replay, from, 8, 0), 8);
  std::vector<int64_t> got;
  for (;;) {
    const std::vector<std::string> parts = RecvParts(replay, 5000);
    ASSERT_EQ(parts.size(), 3u);  // empty delimiter, sequence, payload
    got.push_back(Seq(parts[1]));
    if (got.back() == -1) {
      EXPECT_TRUE(parts[2].empty());
      break;
    }
    EXPECT_FALSE(parts[2].empty());
  }
  EXPECT_EQ(got, (std::vector<int64_t>{1, 2, -1}));
  // Malformed requests are ignored, an oversized one costs its sender the connection; neither
  // gets an answer, and a good request after them still does.
  void* rogue = zmq_socket(ctx, ZMQ_DEALER);
  ASSERT_EQ(zmq_connect(rogue, pub->replay_endpoint().c_str()), 0);
  const std::string big(4096, 'x');
  ASSERT_EQ(zmq_send(rogue, "", 0, ZMQ_SNDMORE), 0);
  ASSERT_EQ(zmq_send(rogue, big.data(), big.size(), 0), static_cast<int>(big.size()));
  EXPECT_TRUE(RecvParts(rogue, 300).empty());
  void* odd = zmq_socket(ctx, ZMQ_DEALER);
  ASSERT_EQ(zmq_connect(odd, pub->replay_endpoint().c_str()), 0);
  for (int i = 0; i < 5; ++i)
    ASSERT_EQ(zmq_send(odd, from, 8, ZMQ_SNDMORE), 8);
  ASSERT_EQ(zmq_send(odd, from, 8, 0), 8);  // six parts
  ASSERT_EQ(zmq_send(odd, "", 0, ZMQ_SNDMORE), 0);
  ASSERT_EQ(zmq_send(odd, from, 3, 0), 3);  // a 3-byte sequence
  EXPECT_TRUE(RecvParts(odd, 300).empty());
  const unsigned char from_two[8] = {0, 0, 0, 0, 0, 0, 0, 2};
  ASSERT_EQ(zmq_send(replay, "", 0, ZMQ_SNDMORE), 0);
  ASSERT_EQ(zmq_send(replay, from_two, 8, 0), 8);
  EXPECT_EQ(Seq(RecvParts(replay, 5000).at(1)), 2);
  EXPECT_EQ(Seq(RecvParts(replay, 5000).at(1)), -1);
  zmq_close(odd);
  zmq_close(rogue);
  zmq_close(replay);
  zmq_close(sub);
  zmq_ctx_term(ctx);
}

TEST(KvEventTest, BadEndpointsAreRefusedByName) {
  KvEventPublisherOptions o;
  o.endpoint = "";
  const Status no_endpoint = KvEventPublisher::Bind(o, kGroups).status();
  EXPECT_EQ(no_endpoint.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_endpoint.message().find("the endpoint is empty"), std::string::npos)
      << no_endpoint.ToString();
  o.endpoint = "tcp://127.0.0.1:*";
  o.topic = "";
  const Status no_topic = KvEventPublisher::Bind(o, kGroups).status();
  EXPECT_EQ(no_topic.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_topic.message().find("the topic is empty"), std::string::npos)
      << no_topic.ToString();
  o.topic = "kv-events";
  o.endpoint = "bogus://nowhere";
  const Status s = KvEventPublisher::Bind(o, kGroups).status();
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("bogus://nowhere"), std::string::npos) << s.ToString();
  o.endpoint = "tcp://127.0.0.1:*";
  o.replay_endpoint = "tcp://256.1.1.1:1";
  EXPECT_EQ(KvEventPublisher::Bind(o, kGroups).status().code(), StatusCode::kIoError);
  o.replay_endpoint = "";
  auto pub = KvEventPublisher::Bind(o, kGroups).value();
  EXPECT_FALSE(pub->WaitForSubscriber(50));  // nobody there
}

}  // namespace
}  // namespace hkv
