// BlockMemoryView: every block's regions hold exactly the bytes the plan lays out for its group,
// one region per block in the canonical layout, one per tensor in the per-layer layout, and the
// slab addressing of two-level plans; bad buffers, groups and block ids are refused.
#include <gtest/gtest.h>

#include <hkv/connector/block_memory_view.h>

#include "connector_test_util.h"

namespace hkv::testing {
namespace {

// The concatenated regions of (g, block) equal the plan's tensors of g in group order, and the
// references describe where each of them sits in that image.
void CheckEveryBlock(const Plan& plan, size_t regions_per_block_canonical) {
  SCOPED_TRACE(plan.model.source);
  PlanMemory mem(plan, 7);
  const BlockMemoryView view = mem.View(plan);
  ASSERT_EQ(view.num_groups(), static_cast<int32_t>(plan.groups.size()));
  ASSERT_EQ(view.num_pools(), static_cast<int32_t>(plan.page_classes.size()));
  std::vector<BlockRegion> regions;
  for (const KvGroup& g : plan.groups) {
    const GroupRefs& refs = view.group(g.id);
    const auto views = GroupViews(plan, g.id);
    EXPECT_EQ(refs.pool, g.page_class);
    EXPECT_EQ(refs.is_state, g.is_state());
    ASSERT_EQ(refs.tensors.size(), views.size());
    int64_t at = 0;
    for (size_t t = 0; t < views.size(); ++t) {
      EXPECT_EQ(refs.tensors[t].layer, views[t]->layer);
      EXPECT_EQ(refs.tensors[t].name, views[t]->name);
      EXPECT_EQ(refs.tensors[t].image_offset, at);
      at += views[t]->bytes;
    }
    EXPECT_EQ(refs.image_bytes, at);
    const int64_t first = view.first_block(g.page_class);
    for (int64_t b = first; b < first + view.num_blocks(g.page_class); ++b) {
      ASSERT_TRUE(view.Regions(g.id, b, regions).ok());
      const size_t want =
          plan.layout.kind == TensorLayout::kCanonical ? regions_per_block_canonical : views.size();
      ASSERT_EQ(regions.size(), want) << "group " << g.id << " block " << b;
      std::vector<unsigned char> image;
      for (const BlockRegion& r : regions)
        image.insert(image.end(), r.data, r.data + r.bytes);
      std::vector<unsigned char> expected;
      for (const TensorView* v : views) {
        const auto t = mem.TensorBytes(plan, *v, b);
        expected.insert(expected.end(), t.begin(), t.end());
      }
      ASSERT_EQ(image, expected) << "group " << g.id << " block " << b;
    }
  }
}

TEST(BlockMemoryViewTest, CanonicalBlockIsOneRegion) {
  CheckEveryBlock(PlanOf(MambaHybrid(), TensorLayout::kCanonical, PageStrategy::kMultiClass), 1);
  CheckEveryBlock(PlanOf(Gemma2Like(), TensorLayout::kCanonical, PageStrategy::kSingleClass), 1);
  CheckEveryBlock(PlanOf(FalconH1Like(), TensorLayout::kCanonical, PageStrategy::kMultiClass), 1);
}

TEST(BlockMemoryViewTest, PerLayerBlockIsOneRegionPerTensor) {
  CheckEveryBlock(PlanOf(MambaHybrid(), TensorLayout::kPerLayer, PageStrategy::kMultiClass), 0);
  CheckEveryBlock(PlanOf(Gemma2Like(), TensorLayout::kPerLayer, PageStrategy::kSingleClass), 0);
  CheckEveryBlock(PlanOf(MlaModel(), TensorLayout::kPerLayer, PageStrategy::kMultiClass), 0);
}

TEST(BlockMemoryViewTest, TwoLevelBlocksLiveInTheirSlabs) {
  const Plan plan =
      PlanOf(MambaHybrid(), TensorLayout::kCanonical, PageStrategy::kTwoLevel, 8 * kMiB);
  ASSERT_TRUE(plan.arena.enabled());
  CheckEveryBlock(plan, 1);
  PlanMemory mem(plan, 3);
  const BlockMemoryView view = mem.View(plan);
  for (int32_t p = 0; p < view.num_pools(); ++p) {
    EXPECT_EQ(view.first_block(p), 1);
    EXPECT_FALSE(view.ValidBlock(p, 0));  // the null block has no page with two-level memory
    EXPECT_TRUE(view.ValidBlock(p, view.num_blocks(p)));
    EXPECT_FALSE(view.ValidBlock(p, view.num_blocks(p) + 1));
  }
}

TEST(BlockMemoryViewTest, RefusesWrongBuffers) {
  const Plan plan = PlanOf(MambaHybrid(), TensorLayout::kCanonical, PageStrategy::kMultiClass);
  ASSERT_EQ(plan.page_classes.size(), 2u);
  PlanMemory mem(plan, 1);
  std::vector<std::span<unsigned char>> one = {mem.spans[0]};
  Result<BlockMemoryView> r = BlockMemoryView::Create(plan, one);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("1 buffers given"), std::string::npos);
  std::vector<std::span<unsigned char>> short_one = mem.spans;
  short_one[1] = short_one[1].first(short_one[1].size() - 1);
  r = BlockMemoryView::Create(plan, short_one);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("buffer 1"), std::string::npos);
}

TEST(BlockMemoryViewTest, RefusesUnknownGroupOrBlockAndKeepsOutput) {
  const Plan plan = PlanOf(MambaHybrid(), TensorLayout::kCanonical, PageStrategy::kMultiClass);
  PlanMemory mem(plan, 1);
  const BlockMemoryView view = mem.View(plan);
  std::vector<BlockRegion> out = {BlockRegion{nullptr, 42}};
  Status s = view.Regions(view.num_groups(), 0, out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("group"), std::string::npos);
  const int32_t pool = view.group(0).pool;
  s = view.Regions(0, view.num_blocks(pool), out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("outside pool"), std::string::npos);
  s = view.Regions(0, -1, out);
  EXPECT_FALSE(s.ok());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].bytes, 42);
}

}  // namespace
}  // namespace hkv::testing
