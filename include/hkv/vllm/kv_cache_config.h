// vLLM KV cache configuration: how vLLM v1 (at the commit pinned by ../shared/vllm_reference)
// turns a model into KV cache groups, block sizes and a block count.
//
// Contract: MakeKvCacheConfig restates vLLM's rules for a ModelSpec and a memory budget, so that
// hkv's `vllm` allocator mode works on the same groups and blocks as the real engine:
// - one spec per cache-owning layer: full attention and MLA (FullAttentionSpec family), sliding
//   window, chunked local attention, and Mamba-1/2 / gated-DeltaNet states (MambaSpec);
//   KV-shared and MLP-only layers own nothing;
// - hybrid attention + recurrent models: the attention block grows until one attention page
//   holds the recurrent state (platform `_align_hybrid_block_size`: mamba cache mode `all`
//   rounds to the model's mamba chunk size, `align` to the kernel alignment of 16 tokens) and
//   the state page is padded to the attention page;
// - grouping: identical specs form one group; otherwise pages are unified by growing the block
//   size of smaller pages, layers are bucketed by spec and cut into groups of the smallest
//   bucket's size (the largest's when it is under 1.5x the smallest);
// - num_blocks = memory / page / group size (or memory / sum of pages when every layer is full
//   attention with the same block size but different pages), and the memory must hold one
//   request of max_model_len (vLLM's own refusal);
// - hash block size: the gcd of group block sizes (the common block size otherwise).
// What vLLM does not support with prefix caching on (cross attention, attention sinks as
// tokens) and models without attention layers are refused by name.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/spec/model_spec.h>

namespace hkv::vllm {

enum class SpecType : unsigned char {
  kFullAttention,
  kMla,  // vLLM's MLAAttentionSpec, a FullAttentionSpec: one latent per token
  kSlidingWindow,
  kChunkedLocal,
  kMamba,  // MambaSpec: Mamba-1, Mamba-2 and gated DeltaNet states
};

enum class MambaCacheMode : unsigned char {
  kAuto,   // vLLM's default: `all` for Mamba-1/2 models, `align` for gated DeltaNet
  kAll,    // a state is cached at every block boundary the prefill passes
  kAlign,  // states only at block boundaries the scheduler aligns chunks to
};

std::string_view SpecTypeName(SpecType type);
std::string_view MambaCacheModeName(MambaCacheMode mode);
Result<MambaCacheMode> ParseMambaCacheMode(std::string_view text);

struct KvCacheSpec {
  SpecType type = SpecType::kFullAttention;
  int32_t block_size = 0;
  // Attention geometry (bytes per token = num_kv_heads * (head_size + head_size_v) * dtype_bytes;
  // MLA: num_kv_heads * head_size * dtype_bytes).
  int32_t num_kv_heads = 0, head_size = 0, head_size_v = 0, dtype_bytes = 0;
  int32_t sliding_window = 0;
  int32_t attention_chunk_size = 0;
  // Recurrent state: bytes of each state tensor, and the page it is padded to (0: unpadded).
  std::vector<int64_t> state_tensor_bytes;
  int64_t page_size_padded = 0;
  int32_t mamba_type = 0;  // LayerKind of the recurrence, so Mamba-1 and Mamba-2 never merge
  MambaCacheMode mamba_cache_mode = MambaCacheMode::kAuto;

  int64_t page_size_bytes() const;
  // isinstance(spec, FullAttentionSpec) in vLLM: full attention and MLA.
  bool is_full_attention() const {
    return type == SpecType::kFullAttention || type == SpecType::kMla;
  }
  bool operator==(const KvCacheSpec&) const = default;
};

struct KvCacheGroup {
  KvCacheSpec spec;
  std::vector<int32_t> layers;  // indices into ModelSpec::layers, in vLLM's group order
};

struct KvCacheOptions {
  int64_t memory_bytes = int64_t{16} << 30;
  int32_t block_size = 16;  // cache_config.block_size (the user's --block-size)
  int64_t max_model_len = 16384;
  int64_t max_num_batched_tokens = 8192;
  MambaCacheMode mamba_cache_mode = MambaCacheMode::kAuto;
};

struct KvCacheConfig {
  std::vector<KvCacheGroup> groups;
  int32_t num_blocks = 0;        // including the null block
  int32_t cache_block_size = 0;  // cache_config.block_size after hybrid alignment
  int32_t hash_block_size = 0;   // granularity of request block hashes
  int32_t scheduler_block_size = 0;
  int64_t page_size_bytes = 0;  // common page (0 when pages differ: uniform-type full attention)
  int32_t group_size = 0;       // layers per group slot (tensors per block)
  int64_t max_model_len = 0;
  int64_t max_num_batched_tokens = 0;
  MambaCacheMode mamba_cache_mode = MambaCacheMode::kAuto;  // resolved; kAuto without recurrence
  bool has_mamba = false;
  // The scheduler splits prefill chunks at block boundaries (`_mamba_block_aligned_split`).
  bool mamba_block_aligned_split() const {
    return has_mamba && mamba_cache_mode == MambaCacheMode::kAlign;
  }
  // Blocks a pool of num_blocks hands out (the null block is never free).
  int32_t usable_blocks() const { return num_blocks - 1; }
};

// Errors: kUnsupported for layer kinds vLLM does not prefix-cache (cross attention, sink
// tokens) and models without attention; kInvalidArgument for options out of range;
// kResourceExhausted when the memory cannot hold one max_model_len request or a single block.
Result<KvCacheConfig> MakeKvCacheConfig(const ModelSpec& model, const KvCacheOptions& options);

// The groups in one line for reports: "10 mamba groups (29 layers, 768-token blocks), 1
// full_attention group (3 layers, 768-token blocks); 909 blocks of 3145728 bytes per layer slot,
// 3 slots".
std::string DescribeGroups(const KvCacheConfig& config);

}  // namespace hkv::vllm
