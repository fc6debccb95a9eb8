// KV events for KV-aware routers: the manager's stored / removed / cleared events in vLLM's
// KV-event wire format (msgpack), published over ZeroMQ.
//
// Contract (format followed: vllm/distributed/kv_events.py as of late 2026, where
// KVCacheEvent is a tagged msgspec Struct without array_like, EventBatch is array_like):
// - A batch is a msgpack array [ts (float64), [event, ...]] (plus data_parallel_rank when set).
//   Each event is a map tagged by "type": BlockStored {block_hashes, parent_block_hash,
//   token_ids, block_size, lora_id, medium, lora_name, group_idx, kv_cache_spec_kind,
//   kv_cache_spec_sliding_window (windows only)}, BlockRemoved {block_hashes, medium,
//   group_idx}, AllBlocksCleared {}. Fields whose vLLM default is None are left out when None,
//   as msgspec's omit_defaults does; the others are always there (nil when unknown).
// - Block hashes are the 16 bytes of the 128-bit prefix digest, big-endian (vLLM allows bytes or
//   int; a 128-bit digest does not fit msgpack's 64-bit ints). They are namespaced per group, so
//   group_idx says which group's block it is. parent_block_hash is the digest before a run's
//   first block - the previous block of the group's chain - and nil for a sequence's first block;
//   lora_id is the request's adapter (nil for the base model); lora_name is nil.
// - Consecutive stored events of one request and group at consecutive positions become one
//   BlockStored; consecutive removals of one group one BlockRemoved. token_ids of a KV group are
//   the tokens the blocks hold (block_size = the group's block tokens). A recurrent checkpoint
//   stands for its whole prefix, but its event is bounded: its parent is the digest
//   KvEventGroup::block_tokens (the manager's alignment) tokens earlier, and token_ids are only
//   those tokens (block_size = their count); the first checkpoint has no parent and the tokens
//   from the start. A router that follows parents recovers every prefix.
//   Tokens come from a RequestTokens (the manager's: TokensOf); when unknown, an empty list.
// - `medium` is the encoding's ("GPU" for the engine's cache); tiers publish their own stores and
//   removals under theirs (Tier::medium: "CPU", "DISK", "REMOTE").
// - The publisher binds a ZeroMQ XPUB socket (SUB peers connect as to vLLM's PUB) and sends each
//   batch as [topic, sequence (int64 big-endian, from 0, +1 per batch), payload]. With a replay
//   endpoint it binds a ROUTER socket too, served by a thread: a request [sequence] (from a DEALER
//   or REQ peer) is answered with every buffered batch from that sequence on, each as
//   [sequence, payload], then [-1, empty]. The newest `replay_buffer` batches are kept. A
//   request larger than kMaxReplayRequestBytes is dropped by ZeroMQ (ZMQ_MAXMSGSIZE), one with
//   more than three parts or without an 8-byte sequence is ignored; replies are sent outside the
//   lock Publish takes, so a replay of the whole buffer never delays publishing.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/manager/kv_cache_manager.h>
#include <hkv/plan/plan.h>

namespace hkv {

// What events say about a group: vLLM's kv_cache_spec_kind ("full_attention", "mla_attention",
// "sliding_window", "chunked_local_attention", "mamba", "cross_attention"), its block size and
// window.
struct KvEventGroup {
  std::string kind;
  int32_t block_tokens = 0;  // a state group: the manager's alignment (align_tokens)
  std::optional<int64_t> sliding_window;
};
std::vector<KvEventGroup> KvEventGroupsOf(const Plan& plan);

// The tokens a request knows (empty when the caller does not know the request).
using RequestTokens = std::function<std::span<const int32_t>(RequestId)>;
// The manager's own record (KvCacheManager::Tokens): right for events taken right after the call
// that published them, while their requests are live; empty for a request no longer there.
RequestTokens TokensOf(const KvCacheManager& manager);

struct KvEventEncoding {
  std::string medium = "GPU";
  std::optional<int64_t> data_parallel_rank;
};

// One batch's payload. kInvalidArgument for an event of a group outside `groups`.
Result<std::vector<unsigned char>> EncodeKvEventBatch(std::span<const ManagerEvent> events,
                                                      std::span<const KvEventGroup> groups,
                                                      const RequestTokens& tokens,
                                                      const KvEventEncoding& encoding, double ts);

// The largest message the replay socket accepts: a request is an 8-byte sequence number.
inline constexpr int64_t kMaxReplayRequestBytes = 64;

struct KvEventPublisherOptions {
  std::string endpoint = "tcp://127.0.0.1:5557";  // bound; "tcp://127.0.0.1:*" picks a port
  std::string replay_endpoint;                    // empty: no replay socket
  std::string topic = "kv-events";
  KvEventEncoding encoding;
  size_t replay_buffer = 10000;  // batches kept for replay
};

class KvEventPublisher {
 public:
  // kInvalidArgument for an empty endpoint or topic; kIoError naming the endpoint when a socket
  // cannot be bound.
  static Result<std::unique_ptr<KvEventPublisher>> Bind(const KvEventPublisherOptions& options,
                                                        std::vector<KvEventGroup> groups);
  ~KvEventPublisher();
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // Sends the events as one batch (nothing for none). A send failure is kIoError; the sequence
  // number is used either way, so subscribers see the gap and can ask for a replay.
  Status Publish(std::span<const ManagerEvent> events, const RequestTokens& tokens);
  // The same under another medium (a tier's: TierEvent::medium).
  Status Publish(std::span<const ManagerEvent> events, const RequestTokens& tokens,
                 std::string_view medium);
  // Waits until some subscriber has subscribed (XPUB sees the subscription), at most timeout_ms.
  bool WaitForSubscriber(int timeout_ms);

  int64_t next_sequence() const;
  const std::string& endpoint() const;  // as bound (real port)
  const std::string& replay_endpoint() const;

 private:
  struct State;  // sockets, the replay buffer and its thread (kv_event_publisher.cc)
  explicit KvEventPublisher(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace hkv
