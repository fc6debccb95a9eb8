// libFuzzer target: any byte string handed to the config loader and, when it is accepted, to the
// planner. Neither may crash, leak, overflow or produce a layout that leaves its buffers.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include <hkv/plan/plan.h>
#include <hkv/spec/config_loader.h>

namespace {

void Require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "config_fuzz: violated: %s\n", what);
    std::abort();
  }
}

void CheckPlan(const hkv::Plan& plan) {
  for (const hkv::TensorView& t : plan.layout.tensors) {
    const hkv::PageClass& c = plan.page_classes.at(static_cast<size_t>(t.page_class));
    if (c.num_pages == 0) continue;
    // Block ids run 0..num_pages-1 in a class buffer, 1..num_pages over two-level slabs.
    const int64_t last = plan.arena.enabled() ? c.num_pages : c.num_pages - 1;
    const int64_t last_end = plan.BlockOffset(t, last) + t.bytes;
    const int64_t buffer = plan.arena.enabled() ? plan.arena.buffer_bytes() : c.buffer_bytes();
    Require(t.offset >= 0 && t.bytes >= 0, "tensor view has a negative offset or size");
    Require(last_end <= buffer, "tensor view leaves its buffer");
  }
  const hkv::Footprint f = plan.PlanningFootprint();
  Require(f.ideal_bytes <= f.hybridkv_bytes, "hybridkv allocates less than the ideal");
  Require(plan.MaxSequences(f.tokens, f.encoder_tokens) >= 1, "plan cannot hold its sequence");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  hkv::Result<hkv::ModelSpec> spec = hkv::ParseModelConfig(text, "fuzz.json");
  if (!spec.ok()) return 0;
  Require(spec->Validate().ok(), "the loader returned an invalid spec");
  hkv::PlanOptions options;
  options.memory_bytes = int64_t{1} << 30;
  options.max_model_len = 4096;
  options.seq_tokens = 1000;
  options.encoder_tokens = spec->has_cross_attention() ? 100 : 0;
  for (hkv::TensorLayout layout : {hkv::TensorLayout::kCanonical, hkv::TensorLayout::kPerLayer}) {
    options.layout = layout;
    hkv::Result<hkv::Plan> plan = hkv::MakePlan(*spec, options);
    if (plan.ok()) CheckPlan(*plan);
  }
  return 0;
}
