// Connector export/import of N blocks of a real model's plan, side by side in one run: from the
// canonical layout (one region per block), from the per-layer layout (one region per tensor),
// and a plain memcpy of the same bytes. Counters: regions_per_block, and bytes_per_second over
// the blocks' image bytes, so export and import read directly as a fraction of memcpy.
// Blocks are spread over the pool (every 7919th page, modulo its size) as a cache's would be.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include <hkv/common/splitmix64.h>
#include <hkv/connector/block_stream.h>
#include <hkv/plan/plan.h>
#include <hkv/spec/config_loader.h>

namespace hkv {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

struct Setup {
  Plan plan;
  std::vector<std::vector<unsigned char>> buffers;
  std::unique_ptr<BlockMemoryView> view;
};

// One model and layout at a time: the buffers are GiBs, so the last one built is kept and
// replaced when a benchmark asks for another.
Setup* SetupOf(const std::string& model, TensorLayout layout) {
  static std::string key;
  static std::unique_ptr<Setup> held;
  const std::string want = model + "/" + std::string(TensorLayoutName(layout));
  if (held && key == want) return held.get();
  held.reset();
  Result<ModelSpec> spec = LoadModelConfig(std::string(HKV_MODELS_DIR) + "/" + model, {});
  if (!spec.ok()) return nullptr;
  PlanOptions o;
  o.memory_bytes = 3 * kGiB;
  o.seq_tokens = 4096;
  o.layout = layout;
  o.strategy = PageStrategy::kMultiClass;  // a fixed split exists for both layouts
  Result<Plan> plan = MakePlan(*spec, o);
  if (!plan.ok()) return nullptr;
  auto s = std::make_unique<Setup>();
  s->plan = std::move(plan).value();
  std::vector<std::span<unsigned char>> spans;
  SplitMix64 rng(1);
  for (const PageClass& c : s->plan.page_classes) {
    s->buffers.emplace_back(static_cast<size_t>(c.buffer_bytes()));
    auto& b = s->buffers.back();
    for (size_t i = 0; i + 8 <= b.size(); i += 4096) {
      const uint64_t v = rng.Next();
      std::memcpy(&b[i], &v, 8);
    }
    spans.emplace_back(b);
  }
  Result<BlockMemoryView> view = BlockMemoryView::Create(s->plan, spans);
  if (!view.ok()) return nullptr;
  s->view = std::make_unique<BlockMemoryView>(std::move(view).value());
  held = std::move(s);
  key = want;
  return held.get();
}

int32_t GroupOf(const Plan& plan, bool state) {
  for (const KvGroup& g : plan.groups) {
    if (g.is_state() == state) return g.id;
  }
  return -1;
}

// N blocks of the model's first attention group (or its state group), spread over the pool.
std::vector<ExportBlock> BlocksOf(const BlockMemoryView& view, int32_t group, int64_t n) {
  const int32_t pool = view.group(group).pool;
  std::vector<ExportBlock> out;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t b = view.first_block(pool) + (k * 7919) % view.num_blocks(pool);
    out.push_back(ExportBlock{group, b, PrefixKey{BlockHash{static_cast<uint64_t>(k), 1}, group}});
  }
  return out;
}

enum class Op { kMemcpy, kExport, kImport, kCopyIn, kImportOnePass };

void Run(benchmark::State& state, const std::string& model, bool state_group, TensorLayout layout,
         Op op) {
  const int64_t n = state.range(0);
  Setup* s = SetupOf(model, layout);
  if (s == nullptr) {
    state.SkipWithError("model or plan unavailable");
    return;
  }
  const int32_t group = GroupOf(s->plan, state_group);
  if (group < 0 || s->view->num_blocks(s->view->group(group).pool) < n) {
    state.SkipWithError("the pool has fewer blocks than asked");
    return;
  }
  const std::vector<ExportBlock> blocks = BlocksOf(*s->view, group, n);
  const int64_t image = s->view->group(group).image_bytes;
  std::vector<unsigned char> stream(static_cast<size_t>(ExportedBytes(*s->view, blocks).value()));
  if (!ExportBlocks(*s->view, blocks, stream).ok()) {
    state.SkipWithError("export failed");
    return;
  }
  std::vector<BlockRegion> regions;
  (void)s->view->Regions(group, blocks[0].block, regions);
  std::vector<int64_t> to;  // the pool's first n blocks
  for (int64_t i = 0; i < n; ++i)
    to.push_back(s->view->first_block(s->view->group(group).pool) + i);
  const std::vector<StreamBlock> parsed = ParseBlockStream(stream).value();
  std::vector<unsigned char> plain(op == Op::kMemcpy ? static_cast<size_t>(n * image) : 0);
  for (auto _ : state) {
    switch (op) {
      case Op::kMemcpy:
        std::memcpy(plain.data(), stream.data(), plain.size());
        break;
      case Op::kExport:
        if (!ExportBlocks(*s->view, blocks, stream).ok()) state.SkipWithError("export failed");
        break;
      case Op::kImport:  // parse and verify every checksum, then copy
        if (!ImportBlocks(*s->view, std::span<const unsigned char>(stream), to).ok()) {
          state.SkipWithError("import failed");
        }
        break;
      case Op::kCopyIn:  // the copy alone, of a stream parsed (verified) once before
        if (!ImportBlocks(*s->view, parsed, to).ok()) state.SkipWithError("import failed");
        break;
      case Op::kImportOnePass: {  // headers, then verify while copying (the connector's load)
        auto headers = ParseBlockStreamHeaders(stream);
        if (!headers.ok() || !ImportBlocksVerifying(*s->view, *headers, to).ok()) {
          state.SkipWithError("import failed");
        }
        break;
      }
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * image);
  state.counters["regions_per_block"] =
      op == Op::kMemcpy ? 1.0 : static_cast<double>(regions.size());
  state.counters["block_bytes"] = static_cast<double>(image);
}

void Register(const std::string& model, bool state_group, std::vector<int64_t> ns) {
  const std::string name = model.substr(model.find("--") + 2) + (state_group ? "/state" : "/kv");
  struct Case {
    const char* label;
    TensorLayout layout;
    Op op;
  };
  const Case cases[] = {
      {"memcpy", TensorLayout::kCanonical, Op::kMemcpy},
      {"export/canonical", TensorLayout::kCanonical, Op::kExport},
      {"import/canonical", TensorLayout::kCanonical, Op::kImport},
      {"copy_in/canonical", TensorLayout::kCanonical, Op::kCopyIn},
      {"import_one_pass/canonical", TensorLayout::kCanonical, Op::kImportOnePass},
      {"export/per_layer", TensorLayout::kPerLayer, Op::kExport},
      {"import/per_layer", TensorLayout::kPerLayer, Op::kImport},
      {"copy_in/per_layer", TensorLayout::kPerLayer, Op::kCopyIn},
      {"import_one_pass/per_layer", TensorLayout::kPerLayer, Op::kImportOnePass},
  };
  for (const Case& c : cases) {
    auto* b = benchmark::RegisterBenchmark(
        (name + "/" + c.label).c_str(),
        [=](benchmark::State& st) { Run(st, model, state_group, c.layout, c.op); });
    for (int64_t n : ns)
      b->Arg(n);
    b->Unit(benchmark::kMillisecond)->UseRealTime();
  }
}

const int kRegistered = [] {
  Register("ibm-ai-platform--Bamba-9B", false, {64, 512});
  Register("ibm-ai-platform--Bamba-9B", true, {4});
  Register("google--gemma-2-9b", false, {64, 512});
  return 0;
}();

}  // namespace
}  // namespace hkv
