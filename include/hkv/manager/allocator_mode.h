// Allocator modes: the three ways a model's KV memory can be carved up, each turned into a
// ManagerConfig so the same replay runs through the same manager and only the memory model
// differs.
//
// Contract: MakeAllocator(model, mode, options) gives the pools and groups `mode` would build in
// `options.memory_bytes`, or an error naming why the mode cannot hold this model:
// - kUniform — the pre-hybrid engine: one full-attention group over every layer (a sliding,
//   chunked or cross-attention layer keeps every token; a recurrent layer is charged like an
//   attention layer), one pool of `block_tokens`-token blocks. Per-token blocks cannot restore
//   a recurrent state, so on a model with recurrent layers prefix caching is off, as it was in
//   engines before hybrid allocators.
// - kPadded — vLLM's hybrid allocator with one page size: with recurrent layers the attention
//   block grows to block_tokens * ceil(state page / (block_tokens * attention bytes per token))
//   and the state page is padded up to the attention page; layers with smaller pages get
//   proportionally larger blocks; layers are bucketed by spec and cut into groups of equal size
//   (the smallest bucket's, or the largest's when it is under 1.5x the smallest), strided, the
//   last one padded; one pool whose block is one page of every layer slot of a group. Recurrent
//   hits fall only on the enlarged block boundaries.
// - kHybridKV — hybridkv's planner (MakePlan, PageStrategy::kAuto): groups by token rule, one
//   state group for all recurrent layers, attention blocks of `block_tokens`, one pool per page
//   class, split at the planning point `planning_tokens`.
// Every mode keeps prefix caching on and uses the manager's rules (all-or-nothing allocation,
// tail-first eviction); only pages, groups and pools differ.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/manager/manager_config.h>
#include <hkv/spec/model_spec.h>

namespace hkv {

enum class AllocatorMode : unsigned char { kUniform, kPadded, kHybridKV };

inline constexpr AllocatorMode kAllAllocatorModes[] = {
    AllocatorMode::kUniform, AllocatorMode::kPadded, AllocatorMode::kHybridKV};

std::string_view AllocatorModeName(AllocatorMode mode);  // "uniform", "padded", "hybridkv"
Result<AllocatorMode> ParseAllocatorMode(std::string_view text);

struct AllocatorOptions {
  int64_t memory_bytes = int64_t{16} << 30;
  int32_t block_tokens = 16;
  int64_t max_model_len = 16384;
  int64_t planning_tokens = 0;  // hybridkv's pool split point; 0: max_model_len
};

struct Allocator {
  AllocatorMode mode = AllocatorMode::kHybridKV;
  ManagerConfig config;                   // prefix caching on, events off
  int32_t block_tokens = 0;               // attention block the mode ends up with (0: none)
  int64_t state_page_bytes = 0;           // bytes one recurrent checkpoint occupies (0: none)
  std::vector<int64_t> pool_block_bytes;  // bytes of one block of each pool
  std::string summary;                    // one line: groups, pools, block sizes
};

Result<Allocator> MakeAllocator(const ModelSpec& model, AllocatorMode mode,
                                const AllocatorOptions& options);

}  // namespace hkv
