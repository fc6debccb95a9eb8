// libFuzzer target: any byte string as a block stream (parsed, and imported into a hybrid model's
// planned memory when it parses), as a tier-transfer message (put into a host tier) and as a disk
// tier entry file found at Open. None may crash, overflow or write outside the destination
// blocks; an import that is refused leaves the memory as it was, every entry a message puts is one
// whole entry of the message, and an entry file is either indexed - and then a Get returns its
// payload exactly or misses - or removed.
// HKV_FUZZ_WRITE_SEEDS=DIR writes a valid stream, message and entry file there and exits.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <hkv/connector/block_memory_view.h>
#include <hkv/connector/block_stream.h>
#include <hkv/connector/disk_tier.h>
#include <hkv/connector/host_tier.h>
#include <hkv/connector/tier_transfer.h>
#include <hkv/plan/plan.h>
#include <hkv/spec/config_loader.h>

namespace {

void Require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "connector_fuzz: violated: %s\n", what);
    std::abort();
  }
}

// A small Mamba-hybrid-like model: a full-attention group, a window group, a state group.
const char* kConfig = R"({
  "model_type": "bamba", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
  "num_key_value_heads": 2, "head_dim": 16, "attn_layer_indices": [1, 3],
  "mamba_d_state": 8, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_n_heads": 8,
  "mamba_d_head": 16, "mamba_n_groups": 1, "max_position_embeddings": 256, "vocab_size": 97})";

struct Memory {
  hkv::Plan plan;
  std::vector<std::vector<unsigned char>> bytes;
  std::vector<std::span<unsigned char>> spans;
  std::unique_ptr<hkv::BlockMemoryView> view;

  Memory() {
    hkv::ModelSpec spec = hkv::ParseModelConfig(kConfig, "fuzz-model.json").value();
    hkv::PlanOptions o;
    o.block_tokens = 4;
    o.max_model_len = 256;
    o.memory_bytes = 1 << 20;
    plan = hkv::MakePlan(spec, o).value();
    for (const hkv::PageClass& c : plan.page_classes)
      bytes.emplace_back(static_cast<size_t>(c.buffer_bytes()), 0x5a);
    if (plan.arena.enabled()) {
      bytes.clear();
      bytes.emplace_back(static_cast<size_t>(plan.arena.buffer_bytes()), 0x5a);
    }
    for (auto& b : bytes)
      spans.emplace_back(b);
    view =
        std::make_unique<hkv::BlockMemoryView>(hkv::BlockMemoryView::Create(plan, spans).value());
  }
};

Memory& Mem() {
  static Memory m;
  return m;
}

const hkv::PrefixKey kDiskKey{{0x1234, 0x5678}, 1};

hkv::DiskTierOptions DiskOptions() {
  hkv::DiskTierOptions o;
  o.capacity_bytes = 1 << 24;
  o.model = hkv::ModelIdentity{0xf022, 0xdead};
  return o;
}

const std::filesystem::path& DiskDir() {
  static const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("hkv-connector-fuzz-" + std::to_string(::getpid()));
  return dir;
}

// The input as the entry file of kDiskKey, found by the next Open.
void CheckDiskEntry(std::span<const unsigned char> input) {
  std::filesystem::path file;
  {
    hkv::DiskTier probe = hkv::DiskTier::Open(DiskDir(), DiskOptions()).value();
    file = probe.PathOf(kDiskKey);
  }
  std::ofstream(file, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(input.data()),
             static_cast<std::streamsize>(input.size()));
  hkv::DiskTier tier = hkv::DiskTier::Open(DiskDir(), DiskOptions()).value();
  if (tier.Contains(kDiskKey)) {
    Require(input.size() >= 64, "a file shorter than a header was indexed");
    hkv::Result<std::vector<unsigned char>> got = tier.Get(kDiskKey);
    Require(!got.ok() || std::equal(got->begin(), got->end(), input.begin() + 64, input.end()),
            "a Get returned bytes other than the file's payload");
  } else {
    Require(!std::filesystem::exists(file), "an entry file Open refused was left behind");
  }
  (void)tier.Evict(kDiskKey);
}

void WriteSeeds(const char* dir) {
  Memory& m = Mem();
  std::vector<hkv::ExportBlock> blocks;
  for (int32_t g = 0; g < m.view->num_groups(); ++g) {
    const int32_t pool = m.view->group(g).pool;
    blocks.push_back({g, m.view->first_block(pool), hkv::PrefixKey{{7, 9}, g}});
  }
  const std::vector<unsigned char> stream = hkv::ExportBlocks(*m.view, blocks).value();
  hkv::HostTier tier(1 << 20);
  (void)tier.Put(hkv::PrefixKey{{1, 2}, 0}, stream);
  (void)tier.Put(hkv::PrefixKey{{3, 4}, 1}, std::vector<unsigned char>(40, 3));
  const std::vector<unsigned char> message = hkv::SerializeTierEntries(tier).value();
  std::ofstream(std::string(dir) + "/stream.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(stream.data()),
             static_cast<std::streamsize>(stream.size()));
  std::ofstream(std::string(dir) + "/message.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(message.data()),
             static_cast<std::streamsize>(message.size()));
  {
    hkv::DiskTier disk = hkv::DiskTier::Open(DiskDir(), DiskOptions()).value();
    (void)disk.Put(kDiskKey, stream);
    std::filesystem::copy_file(disk.PathOf(kDiskKey), std::string(dir) + "/disk_entry.bin",
                               std::filesystem::copy_options::overwrite_existing);
  }
  std::filesystem::remove_all(DiskDir());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("HKV_FUZZ_WRITE_SEEDS")) {
    WriteSeeds(dir);
    std::exit(0);
  }
  (void)Mem();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const unsigned char> input(data, size);
  Memory& m = Mem();
  hkv::Result<std::vector<hkv::StreamBlock>> parsed = hkv::ParseBlockStream(input);
  if (parsed.ok()) {
    // Import every block into the first block(s) of its pool, distinct per pool.
    std::vector<int64_t> dst;
    std::vector<int64_t> next(static_cast<size_t>(m.view->num_pools()), 0);
    for (const hkv::StreamBlock& b : *parsed) {
      const int32_t pool = b.pool >= 0 && b.pool < m.view->num_pools() ? b.pool : 0;
      dst.push_back(m.view->first_block(pool) + next[static_cast<size_t>(pool)]++);
    }
    const std::vector<std::vector<unsigned char>> before = m.bytes;
    const hkv::Status s = hkv::ImportBlocks(*m.view, *parsed, dst);
    if (!s.ok()) Require(m.bytes == before, "a refused import changed the memory");
  }
  hkv::HostTier tier(1 << 24);
  hkv::Result<int64_t> taken = hkv::DeserializeTierEntries(input, tier);
  const auto keys = tier.LruOrder();
  Require(!taken.ok() || *taken == static_cast<int64_t>(keys.size()), "entries counted wrong");
  int64_t total = 0;
  for (const hkv::PrefixKey& k : keys)
    total += static_cast<int64_t>(tier.Get(k).value().size());
  Require(total <= static_cast<int64_t>(size), "entries hold more bytes than the message");
  CheckDiskEntry(input);
  return 0;
}
