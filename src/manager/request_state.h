// Request: what the manager knows about one request apart from the blocks its groups hold (each
// group manager keeps those in its own per-slot records, indexed by Request::slot).
//
// Private to src/manager.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <hkv/manager/manager_config.h>
#include <hkv/manager/request.h>
#include <hkv/pool/block_hash.h>

namespace hkv::manager_internal {

struct Request {
  static constexpr int64_t kNoLimit = INT64_MAX;
  RequestId id = 0;
  int32_t slot = 0;               // index of this request in every group's per-slot records
  std::vector<int32_t> tokens;    // known tokens
  std::vector<BlockHash> hashes;  // hashes[i]: chain digest of tokens [0, (i+1) * hash_tokens)
  uint64_t adapter = 0;
  std::string salt;
  std::vector<PromptItem> items;  // by position
  int64_t encoder_tokens = 0;
  BlockHash encoder_input;
  std::vector<BlockHash> encoder_hashes;  // per encoder block
  Retention retention = Retention::kNormal;
  int64_t prompt_len = 0;
  // Where the cached attention prefix went further than any cached state at the first Allocate:
  // the state there is checkpointed, so the next request sharing that prefix hits it.
  int64_t divergence = 0;
  // A point where this request's prefix branches from another's, found at the first Allocate:
  // where the cached full-attention prefix went further than the hit (the window or chunk blocks
  // there were evicted, the full-attention ones not), or the hit's end if another running request
  // holds it. The window and chunk blocks needed to continue there are kept until the request
  // ends, so the next request sharing that prefix hits it. 0: none.
  int64_t window_branch = 0;
  // Checkpoints at positions after this one were published by this request (before it: by the
  // request it hit or forked from), so its retention rules may demote them.
  int64_t own_from = 0;
  // The first Allocate's hit reached the end of a chain the thrash guard remembered (the request
  // continues a conversation the cache kept): its blocks keep their place when it is freed.
  bool continued = false;
  // Positions at or past this hold KV and state computed after the request evicted tokens
  // (Evict): they are not a function of the tokens alone, so they are never published.
  int64_t publish_until = kNoLimit;
  // Positions the rolling state is kept at are multiples of this (0: of the hit alignment); set
  // to ManagerConfig::rolling_stride_after_give_back once the request gave its rolling state back.
  int64_t rolling_stride = 0;
  int64_t computed = 0;
  int64_t reserved = 0;  // token tables cover [0, reserved)
  bool started = false;  // the first Allocate happened
  bool step_open = false;
  bool encoder_ready = false;  // the encoder's blocks hold its KV
  int64_t step_begin = 0, step_end = 0;
  // Impl::FreeStepsUntil's answer, valid while free_epoch is the manager's fast_epoch: steps
  // ending (lookahead included) at or before it, and their commits, touch no group.
  int64_t free_until = 0;
  uint64_t free_epoch = 0;
  // The last Lookup's hit (-1: none, or one with an external store) and the sum of the pools'
  // identity epochs then: while that sum stands, every block the hit needs is still indexed.
  int64_t lookup_tokens = -1;
  uint64_t lookup_epochs = 0;
  std::vector<BlockCopy> copies;
  // First step of a hit with external blocks, until FinishLoad: the blocks to fill. Each is in
  // the group's table (token groups) or is its live state (state groups), and has no identity.
  std::vector<BlockLoad> loads;

  int64_t known() const { return static_cast<int64_t>(tokens.size()); }
  // What Free and a failed load both forget: the open step, copies, loads and the points found
  // at the first Allocate.
  void ResetProgress() {
    copies.clear();
    loads.clear();
    step_open = false;
    free_until = 0;
    started = false;
    divergence = 0;
    window_branch = 0;
    own_from = 0;
    continued = false;
    publish_until = kNoLimit;
    rolling_stride = 0;
  }
};

// Blocks [lo, hi) plus sink blocks [0, sinks) of a token group that hold the positions a group
// needs in order to continue computing at position x.
struct NeededBlocks {
  int64_t lo = 0, hi = 0, sinks = 0;
  // The next needed block after j: past the sinks it jumps over the released middle to lo, so a
  // walk over a long prompt's window visits the window, not every block before it.
  int64_t Next(int64_t j) const { return j + 1 == sinks ? std::max(lo, j + 1) : j + 1; }
  int64_t First() const { return Next(-1); }
};

inline bool ReleasesTokens(const GroupConfig& gc) {
  return gc.rule.kind == TokenRuleKind::kWindow || gc.rule.kind == TokenRuleKind::kChunk;
}

// Groups whose tables follow decoder positions (the encoder group's follow encoder positions).
inline bool IsDecoderTokens(const GroupConfig& gc) {
  return gc.rule.kind == TokenRuleKind::kAll || ReleasesTokens(gc);
}

}  // namespace hkv::manager_internal
