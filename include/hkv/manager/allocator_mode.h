// Allocator modes: the three ways a model's KV memory can be carved up, each turned into a
// ManagerConfig so the same replay runs through the same manager and only the memory model
// differs.
//
// Contract: MakeAllocator(model, mode, options) gives the pools and groups `mode` would build in
// `options.memory_bytes`, or an error naming why the mode cannot hold this model:
// - kUniform — the pre-hybrid engine: one full-attention group over every layer (a sliding,
//   chunked or cross-attention layer keeps every token; a recurrent layer is charged like an
//   attention layer), one pool of `block_tokens`-token blocks. A model with cross attention adds
//   an encoder group in the same pool: every encoder token, too, has a slot in every layer.
//   Per-token blocks cannot restore a recurrent state, so on a model with recurrent layers prefix
//   caching is off, as it was in engines before hybrid allocators.
// - kPadded — vLLM's hybrid allocator with one page size: with recurrent layers the attention
//   block grows to block_tokens * ceil(state page / (block_tokens * attention bytes per token))
//   and the state page is padded up to the attention page; layers with smaller pages get
//   proportionally larger blocks; layers are bucketed by spec and cut into groups of equal size
//   (the smallest bucket's, or the largest's when it is under 1.5x the smallest), strided, the
//   last one padded; one pool whose block is one page of every layer slot of a group. Recurrent
//   hits fall only on the enlarged block boundaries.
// - kHybridKV — hybridkv's planner (MakePlan, with the options' layout and strategy): groups by
//   token rule, one state group for all recurrent layers, attention blocks of `block_tokens`,
//   one pool per page class, split at the planning point `seq_tokens`.
// Every mode keeps prefix caching on and uses the manager's rules (all-or-nothing allocation,
// tail-first eviction, recurrent checkpoints admitted by expected reuse: no prompt-end
// checkpoints, ManagerConfig::prompt_checkpoints off; a request that gave its rolling state back
// keeps its next ones only every kRollingStrideAfterGiveBack tokens, rounded up to the mode's hit
// alignment, ManagerConfig::rolling_stride_after_give_back); only pages, groups and pools differ,
// and eviction in padded, which frees group by group and keeps no shared prefix longer, as vLLM
// does (uniform and hybridkv: ManagerConfig::branch_bonus = kBranchBonus,
// ManagerConfig::thrash_guard on, and admissions leave kAdmissionHeadroomSteps decode steps of
// headroom, ManagerConfig::admission_headroom_steps; padded admits whatever fits, as vLLM v1).
//
// Per-sequence figures are computed from `config` and `pool_block_bytes` alone, the same way for
// every mode: a group holds TokenRule::BlocksHeld blocks of its pool for one sequence (a state
// group one), each costing its pool's block bytes. In the padded mode a group's block is one page
// of each of its layer slots, padding included; in the uniform mode one block of every layer.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/manager/manager_config.h>
#include <hkv/plan/plan_options.h>
#include <hkv/spec/model_spec.h>

namespace hkv {

enum class AllocatorMode : unsigned char { kUniform, kPadded, kHybridKV };

// Measured on the pressure grid's recurrent cells (docs/manager.md, "Rolling states under
// pressure"): 1024 to 8192 tokens all recover most of what every-block rolling lost; 4096 lost
// least across Bamba, Jamba and Qwen3-Next.
inline constexpr int64_t kRollingStrideAfterGiveBack = 4096;
// Cache turnovers a shared prefix is kept per extra continuation (docs/manager.md, "Shared
// prefixes kept longer"): measured at 0.25, 0.5 and 1 on the pressure grid's cells and one
// request at a time; 0.5 lost least.
inline constexpr double kBranchBonus = 0.5;
// Decode steps of growth an admission leaves room for (ManagerConfig::admission_headroom_steps,
// docs/manager.md, "Admission headroom"), in uniform and hybridkv; padded admits whatever fits,
// as vLLM v1 does. Tried at 2, 8, 16 and 32 on the pressure grid's cells: preemptions fell at
// every step up, and hit rates held or rose, most on the overloaded recurrent hybrids.
inline constexpr int32_t kAdmissionHeadroomSteps = 32;

inline constexpr AllocatorMode kAllAllocatorModes[] = {
    AllocatorMode::kUniform, AllocatorMode::kPadded, AllocatorMode::kHybridKV};

std::string_view AllocatorModeName(AllocatorMode mode);  // "uniform", "padded", "hybridkv"
Result<AllocatorMode> ParseAllocatorMode(std::string_view text);

struct Allocator {
  AllocatorMode mode = AllocatorMode::kHybridKV;
  ManagerConfig config;                   // prefix caching on, events off
  int32_t block_tokens = 0;               // attention block the mode ends up with (0: none)
  int64_t state_page_bytes = 0;           // bytes one recurrent checkpoint occupies (0: none)
  std::vector<int64_t> pool_block_bytes;  // bytes of one block of each pool
  int64_t slab_bytes = 0;                 // two-level (config.arena): bytes of one slab
  std::string summary;                    // one line: groups, pools, block sizes

  // Blocks of each pool one sequence of `tokens` decoder and `encoder_tokens` encoder tokens
  // holds (negative counts are taken as 0).
  std::vector<int64_t> BlocksPerSequence(int64_t tokens, int64_t encoder_tokens) const;
  // Bytes those blocks occupy.
  int64_t BytesPerSequence(int64_t tokens, int64_t encoder_tokens) const;
  // Most such sequences the pools hold at once: min over pools of (blocks - null block) / need,
  // or, with an arena, the largest n whose blocks fit the shared slabs. A sequence needing no
  // block at all is unbounded: std::numeric_limits<int64_t>::max().
  int64_t MaxSequences(int64_t tokens, int64_t encoder_tokens) const;
  // (BytesPerSequence - IdealBytes) / BytesPerSequence: the share of a sequence's memory that
  // holds nothing the model needs (0 when it holds no bytes).
  double Waste(const ModelSpec& model, int64_t tokens, int64_t encoder_tokens) const;
};

// Most blocks (over all pools, null blocks excluded) MakeAllocator hands a manager: their
// metadata and prefix index (about 100 bytes a block) stay under 2 GiB.
inline constexpr int64_t kMaxAllocatorBlocks = int64_t{1} << 24;

// `options` are a plan's: memory_bytes, block_tokens, max_model_len (0: the model's
// max_position_embeddings), the planning point seq_tokens (0: max_model_len) and encoder_tokens
// (-1: the model's largest encoder input); layout and strategy shape kHybridKV's plan only.
Result<Allocator> MakeAllocator(const ModelSpec& model, AllocatorMode mode,
                                const PlanOptions& options);

}  // namespace hkv
