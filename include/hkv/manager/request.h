// The values an engine exchanges with the KvCacheManager about one request.
//
// Contract: a RequestSpec borrows its spans and strings; the manager copies what it keeps, so the
// caller's buffers may die once AddRequest returns. Positions are decoder token indices counted
// from 0; "after p tokens" means the state or KV of tokens [0, p).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include <hkv/pool/block_hash.h>
#include <hkv/pool/retention.h>

namespace hkv {

using RequestId = uint64_t;

// A multimodal input occupying prompt positions [position, position + length).
struct PromptItem {
  BlockHash content;  // digest of the item's data (which fixes its length), from the caller
  int64_t position = 0;
  int64_t length = 0;
};

struct RequestSpec {
  RequestId id = 0;
  std::span<const int32_t> prompt;  // at least one token
  uint64_t adapter_id = 0;          // LoRA/adapter; 0 is the base model
  std::string_view cache_salt;      // requests with different salts never share blocks
  std::span<const PromptItem> items;
  // Cross-attention models: the encoder's token count and a digest of its input. Requests with
  // the same digest (and adapter and salt) share the encoder's KV blocks.
  int64_t encoder_tokens = 0;
  BlockHash encoder_input;
  Retention retention = Retention::kNormal;  // kLow: this request's blocks are evicted first
};

// What Lookup found in the prefix cache. Pass it unchanged to the request's first Allocate.
// Why a request's blocks are released (KvCacheManager::Free): a preempted request comes back to
// use them, so ManagerConfig::thrash_guard never puts them on probation.
enum class FreeReason : unsigned char { kFinished, kPreempted };

struct PrefixHit {
  int64_t tokens = 0;    // decoder tokens [0, tokens) need not be computed
  bool encoder = false;  // the encoder's KV blocks are cached: the encoder need not run
  // Blocks of the hit that are not in the pools but in an external store (Lookup with
  // ExternalBlocks): the first Allocate gives each a fresh block to load into (StepInfo::loads).
  int32_t loads = 0;
};

// Fill `block` of `group` (a block of pool `pool`) with the external store's copy of `key` - a
// block of KV for every layer of the group, or a recurrent-state checkpoint when `state` - then
// report completion with KvCacheManager::FinishLoad.
struct BlockLoad {
  int32_t group = 0;
  int32_t pool = 0;
  int32_t block = 0;
  PrefixKey key;
  bool state = false;
  int64_t position = 0;  // where the block's tokens start; a checkpoint: the position it follows
};

// Copy block `src` into block `dst` of `group` before this step's forward pass (copy-on-write
// of a block that is shared or holds a published identity).
struct BlockCopy {
  int32_t group = 0;
  int32_t src = 0;
  int32_t dst = 0;
};

// During this step, once the first `position` tokens have been processed, copy the recurrent
// state into `slot`.
struct StateSnapshot {
  int64_t position = 0;
  int32_t slot = 0;
};

// A recurrent group's slots for the current step. `read` holds the state after the step's first
// computed position (0, the null block, means the zero initial state); the state after the
// step's last token goes to `write`, which may equal `read`.
struct StateStep {
  int32_t read = 0;
  int32_t write = 0;
  std::span<const StateSnapshot> snapshots;  // in position order
};

// What changed in one token or encoder group's block table since the engine last took it
// (KvCacheManager::TakeTableDelta): the table now has `size` entries, of which [from, size) are
// `blocks` and [0, from) are as last taken. An engine that keeps each request's table where its
// kernels read it copies only these.
struct TableDelta {
  int32_t size = 0;
  int32_t from = 0;
  std::span<const int32_t> blocks;
};

// What the engine must do for a request in the current step.
struct StepInfo {
  int64_t begin = 0;         // first position to compute (== computed tokens before the step)
  int64_t end = 0;           // one past the last position to compute
  int64_t reserved_end = 0;  // KV slots exist for positions [.., reserved_end) (lookahead)
  bool run_encoder = false;  // the encoder's KV must be computed in this step
  std::span<const BlockCopy> copies;
  // Before FinishLoad (first step of a hit with external blocks): blocks the engine must fill
  // from the external store before the step's forward pass; empty afterwards.
  std::span<const BlockLoad> loads;
};

// Everything an engine needs to run one request's open step, from one call
// (KvCacheManager::TakeStepInputs). The caller keeps one and passes it again every step: its
// vectors are reused, so a steady state allocates nothing. Spans stay valid until the next
// mutating call.
struct StepInputs {
  StepInfo step;
  // Per group: what changed in its block table since it was last taken (token and encoder
  // groups; empty for state groups), as TakeTableDelta reports it.
  std::vector<TableDelta> tables;
  // Per group: its state slots (state groups; {} for the others), as State reports them.
  std::vector<StateStep> states;
  // The slots of positions [step.begin, step.end) in every decoder token group, one group after
  // the other in group order, as SlotMapping gives them.
  std::vector<int64_t> slots;
};

struct TruncateResult {
  int64_t tokens = 0;     // known tokens the request now has: min(n, known tokens before)
  int64_t computed = 0;   // positions whose KV and state are still valid
  int64_t recompute = 0;  // known positions in [computed, tokens) that had been computed before
                          // and must be computed again (dropped drafts are not counted)
};

// What Evict did to a full-attention group's table (see KvCacheManager::Evict). The engine must
// write every slot in [write_from, keep) - the token it keeps there, read from where it was before
// the call - and may leave slots [0, write_from) alone: their blocks are unchanged.
struct EvictResult {
  int64_t write_from = 0;
  int64_t keep = 0;
  int32_t blocks_released = 0;  // blocks the group's table no longer holds
  int32_t blocks_replaced = 0;  // shared or published blocks replaced by private ones
};

}  // namespace hkv
