#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include <hkv/vllm/kv_cache_config.h>

namespace hkv::vllm {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// vLLM's FlashAttention/Triton backends take blocks in multiples of 16 tokens.
constexpr int32_t kKernelBlockAlignment = 16;
// ModelConfig.get_mamba_chunk_size's fallback for recurrences without a chunk (Mamba-1).
constexpr int32_t kDefaultMambaChunk = 2048;
// Most blocks one pool may have: its metadata and prefix map (about 100 bytes a block) stay
// under 2 GiB. 80 GiB of 16-token Llama-8B pages is 1.3 M blocks.
constexpr int64_t kMaxBlocks = int64_t{1} << 24;

struct LayerEntry {
  int32_t layer;  // index into ModelSpec::layers
  KvCacheSpec spec;
};

Result<KvCacheSpec> AttentionSpecOf(const LayerSpec& l, int32_t block_size) {
  KvCacheSpec s;
  s.block_size = block_size;
  s.num_kv_heads = l.num_kv_heads;
  s.head_size = l.head_dim_k;
  s.head_size_v = l.head_dim_v;
  s.dtype_bytes = static_cast<int32_t>(DTypeBytes(l.kv_dtype));
  if (l.sink_tokens > 0) {
    return Status::Unsupported(fmt::format(
        "vllm: layer {} keeps {} sink tokens; vLLM's prefix-cached managers have no sink-token "
        "window",
        l.layer, l.sink_tokens));
  }
  switch (l.kind) {
    case LayerKind::kFullAttention:
      s.type = SpecType::kFullAttention;
      break;
    case LayerKind::kMla:
      s.type = SpecType::kMla;
      s.head_size_v = 0;
      break;
    case LayerKind::kSlidingWindow:
      s.type = SpecType::kSlidingWindow;
      s.sliding_window = l.window;
      break;
    case LayerKind::kChunkedLocal:
      s.type = SpecType::kChunkedLocal;
      s.attention_chunk_size = l.chunk;
      break;
    case LayerKind::kCrossAttention:
      return Status::Unsupported(fmt::format(
          "vllm: layer {} is cross attention; vLLM serves encoder-decoder models without prefix "
          "caching, which the vllm allocator mode does not model",
          l.layer));
    default:
      return Status::Unsupported(fmt::format("vllm: layer {} of kind {} has no vLLM attention spec",
                                             l.layer, LayerKindName(l.kind)));
  }
  return s;
}

// is_kv_cache_spec_uniform: every layer merges with the first. FullAttentionSpec.merge compares
// the AttentionSpec fields (not head_size_v); MLAAttentionSpec.merge takes the first layer's
// geometry; the other specs must be equal.
bool Mergeable(const KvCacheSpec& a, const KvCacheSpec& b) {
  if (a.type == SpecType::kFullAttention && b.type == SpecType::kFullAttention) {
    return a.block_size == b.block_size && a.num_kv_heads == b.num_kv_heads &&
           a.head_size == b.head_size && a.dtype_bytes == b.dtype_bytes &&
           a.page_size_padded == b.page_size_padded;
  }
  if (a.type == SpecType::kMla && b.type == SpecType::kMla) return true;
  return a == b;
}

// UniformTypeKVCacheSpecs.is_uniform_type: one block size, and every layer full attention
// (MLA included), or sliding window with one window, or chunked with one chunk, or Mamba.
bool IsUniformType(const std::vector<LayerEntry>& layers) {
  const KvCacheSpec& first = layers[0].spec;
  return std::all_of(layers.begin(), layers.end(), [&](const LayerEntry& e) {
    const KvCacheSpec& s = e.spec;
    if (s.block_size != first.block_size) return false;
    if (first.is_full_attention()) return s.is_full_attention();
    if (s.type != first.type) return false;
    if (s.type == SpecType::kSlidingWindow) return s.sliding_window == first.sliding_window;
    if (s.type == SpecType::kChunkedLocal)
      return s.attention_chunk_size == first.attention_chunk_size;
    return true;
  });
}

// Bytes the groups need for one request of max_model_len (_max_memory_usage_bytes_from_groups),
// so that a budget vLLM would refuse is refused here too.
int64_t MaxUsageBytes(const KvCacheSpec& s, const KvCacheOptions& o) {
  const int64_t page = s.page_size_bytes();
  switch (s.type) {
    case SpecType::kFullAttention:
    case SpecType::kMla:
      return CeilDiv(o.max_model_len, s.block_size) * page;
    case SpecType::kSlidingWindow:
      return (CeilDiv(std::min<int64_t>(s.sliding_window - 1 + o.max_num_batched_tokens,
                                        o.max_model_len),
                      s.block_size) +
              1) *
             page;
    case SpecType::kChunkedLocal:
      return CeilDiv(std::min<int64_t>(s.attention_chunk_size + o.max_num_batched_tokens,
                                       o.max_model_len),
                     s.block_size) *
             page;
    case SpecType::kMamba:
      return s.mamba_cache_mode == MambaCacheMode::kAll
                 ? CeilDiv(o.max_model_len, s.block_size) * page
                 : 2 * page;
  }
  return 0;
}

Status CheckKvCacheOptions(const KvCacheOptions& o) {
  if (o.block_size < 1 || o.block_size > (1 << 20)) {
    return Status::InvalidArgument(
        fmt::format("vllm: block size {}: expected 1 to {}", o.block_size, 1 << 20));
  }
  if (o.max_model_len < 2 || o.max_model_len > (int64_t{1} << 31)) {
    return Status::InvalidArgument(
        fmt::format("vllm: max model len {}: expected 2 to 2^31", o.max_model_len));
  }
  if (o.max_num_batched_tokens < 1) {
    return Status::InvalidArgument(
        fmt::format("vllm: max batched tokens {}: expected at least 1", o.max_num_batched_tokens));
  }
  if (o.memory_bytes < 1) {
    return Status::InvalidArgument(
        fmt::format("vllm: memory {} bytes: expected at least 1", o.memory_bytes));
  }
  return Status::Ok();
}

// The block sizes of a hybrid model's groups: attention blocks grow until their page holds a
// recurrent state.
struct BlockSizes {
  int32_t block_size = 0;  // attention groups' (the cache block size)
  int32_t mamba_block = 0;
  int64_t mamba_padded = 0;  // the recurrent page padded to the attention page; 0: not padded
  MambaCacheMode mode = MambaCacheMode::kAuto;
};

Result<BlockSizes> SizeMambaBlocks(const ModelSpec& model, const KvCacheOptions& o,
                                   const LayerSpec& attention, LayerKind recurrence) {
  BlockSizes b;
  b.block_size = o.block_size;
  MambaCacheMode mode = o.mamba_cache_mode;
  if (mode == MambaCacheMode::kAuto) {
    // Mamba-1/2 model classes support mamba prefix caching, and prefix caching then picks
    // `all`; gated-DeltaNet models (Qwen3-Next) do not, and get `align`.
    mode = recurrence == LayerKind::kGatedDeltaNet ? MambaCacheMode::kAlign : MambaCacheMode::kAll;
  }
  if (mode == MambaCacheMode::kAll && recurrence == LayerKind::kGatedDeltaNet) {
    return Status::Unsupported(
        "vllm: gated-DeltaNet models (Qwen3-Next) do not support mamba cache mode `all` in "
        "vLLM; use align");
  }
  b.mode = mode;
  int64_t mamba_page = 0;
  for (const LayerSpec& l : model.layers) {
    if (l.owns_state()) mamba_page = std::max(mamba_page, l.state_bytes());
  }
  HKV_ASSIGN_OR_RETURN(KvCacheSpec one, AttentionSpecOf(attention, 1));
  const int64_t attn_page_1 = one.page_size_bytes();
  const int32_t kernel_align = std::max(kKernelBlockAlignment, o.block_size);
  int64_t attn_block = 0;
  if (mode == MambaCacheMode::kAll) {
    const int32_t base = model.mamba_chunk_size > 0 ? model.mamba_chunk_size : kDefaultMambaChunk;
    const int64_t chunk = std::lcm(int64_t{base}, int64_t{kernel_align});
    attn_block = chunk * CeilDiv(CeilDiv(mamba_page, attn_page_1), chunk);
  } else {
    attn_block = kernel_align * CeilDiv(mamba_page, kernel_align * attn_page_1);
  }
  if (attn_block > (int64_t{1} << 24)) {
    return Status::Unsupported(
        fmt::format("vllm: the recurrent state ({} bytes) needs {}-token attention blocks",
                    mamba_page, attn_block));
  }
  b.block_size = std::max(b.block_size, static_cast<int32_t>(attn_block));
  b.mamba_block = mode == MambaCacheMode::kAll ? static_cast<int32_t>(attn_block) : b.block_size;
  const int64_t padded = int64_t{b.block_size} * attn_page_1;
  b.mamba_padded = padded != mamba_page ? padded : 0;
  return b;
}

// Every layer that owns a cache, with its spec.
Result<std::vector<LayerEntry>> LayerEntries(const ModelSpec& model, const BlockSizes& b,
                                             MambaCacheMode mode) {
  std::vector<LayerEntry> layers;
  for (size_t i = 0; i < model.layers.size(); ++i) {
    const LayerSpec& l = model.layers[i];
    LayerEntry e{static_cast<int32_t>(i), {}};
    if (l.owns_kv()) {
      HKV_ASSIGN_OR_RETURN(e.spec, AttentionSpecOf(l, b.block_size));
    } else if (l.owns_state()) {
      e.spec.type = SpecType::kMamba;
      e.spec.block_size = b.mamba_block;
      for (const StateTensor& t : l.state)
        e.spec.state_tensor_bytes.push_back(t.bytes());
      e.spec.page_size_padded = b.mamba_padded;
      e.spec.mamba_type = static_cast<int32_t>(l.kind);
      e.spec.mamba_cache_mode = mode;
    } else if (l.kind == LayerKind::kCrossAttention) {
      HKV_ASSIGN_OR_RETURN(e.spec, AttentionSpecOf(l, b.block_size));  // refused by name
    } else {
      continue;  // MLP-only and KV-shared layers own no cache
    }
    layers.push_back(std::move(e));
  }
  return layers;
}

// unify_kv_cache_spec_page_size: smaller pages get proportionally larger blocks.
Status UnifyPageSizes(std::vector<LayerEntry>& layers) {
  int64_t max_page = 0;
  for (const LayerEntry& e : layers)
    max_page = std::max(max_page, e.spec.page_size_bytes());
  for (LayerEntry& e : layers) {
    const int64_t page = e.spec.page_size_bytes();
    if (page == max_page) continue;
    if (max_page % page != 0) {
      return Status::Unsupported(fmt::format(
          "vllm: layer {}'s page ({} bytes) does not divide the largest page ({} bytes); "
          "vLLM cannot unify the page sizes",
          e.layer, page, max_page));
    }
    if (e.spec.type == SpecType::kMamba) {
      return Status::Unsupported(fmt::format(
          "vllm: layer {} is recurrent and its page ({} bytes) is smaller than the largest "
          "page ({} bytes); vLLM cannot unify the page sizes by a larger recurrent block",
          e.layer, page, max_page));
    }
    e.spec.block_size = static_cast<int32_t>(e.spec.block_size * (max_page / page));
  }
  return Status::Ok();
}

// _get_kv_cache_groups_uniform_page_size: buckets of equal specs in first-seen order, split into
// groups of about the same number of layers.
void GroupsOfUniformPageSize(const std::vector<LayerEntry>& layers, KvCacheConfig& config) {
  std::vector<std::pair<KvCacheSpec, std::vector<int32_t>>> buckets;
  for (const LayerEntry& e : layers) {
    auto it = std::find_if(buckets.begin(), buckets.end(),
                           [&](const auto& b) { return b.first == e.spec; });
    if (it == buckets.end()) {
      buckets.push_back({e.spec, {}});
      it = buckets.end() - 1;
    }
    it->second.push_back(e.layer);
  }
  size_t min_layers = SIZE_MAX, max_layers = 0;
  for (const auto& b : buckets) {
    min_layers = std::min(min_layers, b.second.size());
    max_layers = std::max(max_layers, b.second.size());
  }
  size_t group_size = min_layers;
  if (static_cast<double>(max_layers) < static_cast<double>(min_layers) * 1.5) {
    group_size = max_layers;
  }
  for (const auto& b : buckets) {
    const size_t num_groups = (b.second.size() + group_size - 1) / group_size;
    for (size_t i = 0; i < num_groups; ++i) {
      KvCacheGroup g{b.first, {}};
      for (size_t k = i; k < b.second.size(); k += num_groups)
        g.layers.push_back(b.second[k]);
      config.groups.push_back(std::move(g));
    }
  }
}

// The KV cache groups; `uniform`: every layer's spec merges into one.
Status GroupLayers(std::vector<LayerEntry>& layers, bool uniform, KvCacheConfig& config) {
  if (uniform) {
    KvCacheGroup g{layers[0].spec, {}};
    for (const LayerEntry& e : layers)
      g.layers.push_back(e.layer);
    config.groups.push_back(std::move(g));
  } else if (IsUniformType(layers)) {
    // UniformTypeKVCacheSpecs: one group whose block spans every layer's page.
    KvCacheGroup g{layers[0].spec, {}};
    for (const LayerEntry& e : layers)
      g.layers.push_back(e.layer);
    config.groups.push_back(std::move(g));
  } else {
    HKV_RETURN_IF_ERROR(UnifyPageSizes(layers));
    GroupsOfUniformPageSize(layers, config);
  }
  return Status::Ok();
}

// Memory: one request of max_model_len must fit, then the block count.
Status SizeMemory(const std::vector<LayerEntry>& layers, bool uniform, const KvCacheOptions& o,
                  KvCacheConfig& config) {
  size_t group_size = 0;
  for (const KvCacheGroup& g : config.groups)
    group_size = std::max(group_size, g.layers.size());
  config.group_size = static_cast<int32_t>(group_size);
  int64_t needed = 0;
  int64_t num_blocks = 0;
  if (config.groups.size() == 1 && !uniform) {
    int64_t pages = 0;
    for (const int32_t li : config.groups[0].layers) {
      const auto it = std::find_if(layers.begin(), layers.end(),
                                   [&](const LayerEntry& e) { return e.layer == li; });
      pages += it->spec.page_size_bytes();
      needed += MaxUsageBytes(it->spec, o);
    }
    num_blocks = o.memory_bytes / pages;
  } else {
    const int64_t page = config.groups[0].spec.page_size_bytes();
    config.page_size_bytes = page;
    int64_t blocks_needed = 0;
    for (const KvCacheGroup& g : config.groups)
      blocks_needed += CeilDiv(MaxUsageBytes(g.spec, o), page);
    needed = static_cast<int64_t>(group_size) * page * blocks_needed;
    num_blocks = o.memory_bytes / page / static_cast<int64_t>(group_size);
  }
  if (needed > o.memory_bytes) {
    return Status::ResourceExhausted(fmt::format(
        "vllm: one request of max model len {} needs {} bytes of KV cache, more than the {} "
        "bytes given (vLLM refuses to start)",
        o.max_model_len, needed, o.memory_bytes));
  }
  if (num_blocks < 2) {
    return Status::ResourceExhausted(
        fmt::format("vllm: {} bytes make {} blocks; at least 2 are needed (one is the null block)",
                    o.memory_bytes, num_blocks));
  }
  if (num_blocks > kMaxBlocks) {
    return Status::InvalidArgument(fmt::format(
        "vllm: {} bytes make {} blocks, more than the {} one pool may have (their metadata "
        "would not fit in memory)",
        o.memory_bytes, num_blocks, kMaxBlocks));
  }
  config.num_blocks = static_cast<int32_t>(num_blocks);
  return Status::Ok();
}

// resolve_kv_cache_block_sizes with prefix caching on.
Status ResolveBlockSizes(int32_t block_size, KvCacheConfig& config) {
  int32_t lcm = 1, gcd = 0;
  for (const KvCacheGroup& g : config.groups) {
    lcm = std::lcm(lcm, g.spec.block_size);
    gcd = std::gcd(gcd, g.spec.block_size);
  }
  for (const KvCacheGroup& g : config.groups) {
    if (g.spec.type == SpecType::kChunkedLocal && g.spec.block_size != lcm) {
      // vLLM's ChunkedLocalAttentionManager asserts this on the first lookup.
      return Status::Unsupported(fmt::format(
          "vllm: chunked local attention with {}-token blocks beside groups that align hits to "
          "{} tokens; vLLM does not support groups of different block sizes with chunked local "
          "attention",
          g.spec.block_size, lcm));
    }
  }
  config.scheduler_block_size = config.groups.size() <= 1 ? block_size : lcm;
  config.hash_block_size = config.scheduler_block_size;
  if (config.groups.size() > 1) {
    const bool mamba_diverges =
        std::any_of(config.groups.begin(), config.groups.end(), [&](const KvCacheGroup& g) {
          return g.spec.type == SpecType::kMamba && g.spec.block_size != block_size;
        });
    if (!mamba_diverges) config.hash_block_size = gcd;
  }
  return Status::Ok();
}

}  // namespace

std::string_view SpecTypeName(SpecType type) {
  switch (type) {
    case SpecType::kFullAttention:
      return "full_attention";
    case SpecType::kMla:
      return "mla_attention";
    case SpecType::kSlidingWindow:
      return "sliding_window";
    case SpecType::kChunkedLocal:
      return "chunked_local_attention";
    case SpecType::kMamba:
      return "mamba";
  }
  return "?";
}

std::string_view MambaCacheModeName(MambaCacheMode mode) {
  switch (mode) {
    case MambaCacheMode::kAuto:
      return "auto";
    case MambaCacheMode::kAll:
      return "all";
    case MambaCacheMode::kAlign:
      return "align";
  }
  return "?";
}

Result<MambaCacheMode> ParseMambaCacheMode(std::string_view text) {
  for (const MambaCacheMode m :
       {MambaCacheMode::kAuto, MambaCacheMode::kAll, MambaCacheMode::kAlign}) {
    if (text == MambaCacheModeName(m)) return m;
  }
  return Status::InvalidArgument(
      fmt::format("mamba cache mode '{}': expected auto, all or align", text));
}

int64_t KvCacheSpec::page_size_bytes() const {
  int64_t real = 0;
  switch (type) {
    case SpecType::kMamba:
      real = std::accumulate(state_tensor_bytes.begin(), state_tensor_bytes.end(), int64_t{0});
      break;
    case SpecType::kMla:
      real = int64_t{block_size} * num_kv_heads * head_size * dtype_bytes;
      break;
    case SpecType::kChunkedLocal:  // a plain AttentionSpec: K and V of head_size each
      real = 2 * int64_t{block_size} * num_kv_heads * head_size * dtype_bytes;
      break;
    default:
      real = int64_t{block_size} * num_kv_heads * (head_size + head_size_v) * dtype_bytes;
      break;
  }
  return page_size_padded > 0 ? page_size_padded : real;
}

Result<KvCacheConfig> MakeKvCacheConfig(const ModelSpec& model, const KvCacheOptions& o) {
  HKV_RETURN_IF_ERROR(CheckKvCacheOptions(o));
  const LayerSpec* attention = nullptr;
  bool has_mamba = false;
  LayerKind recurrence = LayerKind::kMamba2;
  for (const LayerSpec& l : model.layers) {
    if (l.owns_kv() && attention == nullptr) attention = &l;
    if (l.owns_state()) {
      has_mamba = true;
      recurrence = l.kind;
    }
  }
  if (attention == nullptr) {
    return Status::Unsupported(fmt::format(
        "vllm: {} has no attention layer; the vllm allocator mode models attention and hybrid "
        "models",
        model.source));
  }
  KvCacheConfig config;
  config.max_model_len = o.max_model_len;
  config.max_num_batched_tokens = o.max_num_batched_tokens;
  config.has_mamba = has_mamba;
  BlockSizes b;
  b.block_size = o.block_size;
  if (has_mamba) {
    HKV_ASSIGN_OR_RETURN(b, SizeMambaBlocks(model, o, *attention, recurrence));
    config.mamba_cache_mode = b.mode;
  }
  config.cache_block_size = b.block_size;
  HKV_ASSIGN_OR_RETURN(std::vector<LayerEntry> layers,
                       LayerEntries(model, b, config.mamba_cache_mode));
  const bool uniform = std::all_of(layers.begin(), layers.end(), [&](const LayerEntry& e) {
    return Mergeable(layers[0].spec, e.spec);
  });
  HKV_RETURN_IF_ERROR(GroupLayers(layers, uniform, config));
  HKV_RETURN_IF_ERROR(SizeMemory(layers, uniform, o, config));
  HKV_RETURN_IF_ERROR(ResolveBlockSizes(b.block_size, config));
  return config;
}

std::string DescribeGroups(const KvCacheConfig& config) {
  // Runs of groups with the same spec read as one entry: "10 mamba groups (29 layers)".
  std::string out;
  for (size_t i = 0; i < config.groups.size();) {
    size_t j = i, layers = 0;
    while (j < config.groups.size() && config.groups[j].spec == config.groups[i].spec)
      layers += config.groups[j++].layers.size();
    const KvCacheSpec& s = config.groups[i].spec;
    out += fmt::format("{}{} {} group{} ({} layers, {}-token blocks)", out.empty() ? "" : ", ",
                       j - i, SpecTypeName(s.type), j - i == 1 ? "" : "s", layers, s.block_size);
    i = j;
  }
  return fmt::format("{}; {} blocks of {} bytes per layer slot, {} slots", out, config.num_blocks,
                     config.page_size_bytes, config.group_size);
}

}  // namespace hkv::vllm
