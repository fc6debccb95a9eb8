// Shared by the connector tests: plans of small hand-built models and buffers filled with
// seeded bytes, owned by the test, that a BlockMemoryView can address.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include <hkv/common/splitmix64.h>
#include <hkv/connector/block_memory_view.h>

#include "../plan/test_models.h"

namespace hkv::testing {

inline Plan PlanOf(const ModelSpec& model, TensorLayout layout, PageStrategy strategy,
                   int64_t memory = kMiB) {
  PlanOptions o = Options(memory, 64);
  o.layout = layout;
  o.strategy = strategy;
  return MustPlan(model, o);
}

// The buffers a plan lays out (one per class, or the slab buffer), filled from `seed`.
struct PlanMemory {
  std::vector<std::vector<unsigned char>> bytes;
  std::vector<std::span<unsigned char>> spans;

  PlanMemory(const Plan& plan, uint64_t seed) {
    std::vector<int64_t> sizes;
    if (plan.arena.enabled()) {
      sizes.push_back(plan.arena.buffer_bytes());
    } else {
      for (const PageClass& c : plan.page_classes)
        sizes.push_back(c.buffer_bytes());
    }
    SplitMix64 rng(seed);
    for (int64_t s : sizes) {
      bytes.emplace_back(static_cast<size_t>(s));
      for (unsigned char& b : bytes.back())
        b = static_cast<unsigned char>(rng.Next());
    }
    for (auto& b : bytes)
      spans.emplace_back(b);
  }
  PlanMemory(const PlanMemory&) = delete;
  PlanMemory& operator=(const PlanMemory&) = delete;

  BlockMemoryView View(const Plan& plan) const {
    Result<BlockMemoryView> v = BlockMemoryView::Create(plan, spans);
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    return std::move(v).value();
  }
  // The bytes of tensor view `v` of block `block`, addressed by the plan itself.
  std::vector<unsigned char> TensorBytes(const Plan& plan, const TensorView& v,
                                         int64_t block) const {
    const auto& buffer = bytes[plan.arena.enabled() ? 0 : static_cast<size_t>(v.page_class)];
    const auto at = static_cast<size_t>(plan.BlockOffset(v, block));
    return {buffer.begin() + static_cast<std::ptrdiff_t>(at),
            buffer.begin() + static_cast<std::ptrdiff_t>(at + static_cast<size_t>(v.bytes))};
  }
};

// The plan's tensor views of group `g`, in group layer order.
inline std::vector<const TensorView*> GroupViews(const Plan& plan, int32_t g) {
  std::vector<const TensorView*> out;
  for (int32_t layer : plan.groups[static_cast<size_t>(g)].layers) {
    for (const TensorView& v : plan.layout.tensors) {
      if (v.layer == layer) out.push_back(&v);
    }
  }
  return out;
}

}  // namespace hkv::testing
