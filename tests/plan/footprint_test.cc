// Capacity: one sequence's ideal, hybridkv and uniform bytes, and how many sequences fit.
#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_models.h"

namespace hkv::testing {
namespace {

using ::testing::ElementsAre;

TEST(FootprintTest, SlidingWindowAgainstUniformAtThreeLengths) {
  const Plan plan = MustPlan(Gemma2Like(), Options());
  EXPECT_EQ(plan.uniform_bytes_per_token, 4 * kLayerTokenBytes);

  const Footprint f = plan.PlanningFootprint();  // T = 128
  EXPECT_EQ(f.tokens, 128);
  EXPECT_EQ(f.encoder_tokens, 0);
  EXPECT_EQ(f.ideal_bytes, 2 * 32 * 128 + 2 * 32 * 32);
  EXPECT_EQ(f.hybridkv_bytes, 10 * 1024);
  EXPECT_EQ(f.uniform_bytes, 128 * 128);
  EXPECT_THAT(f.pages_per_group, ElementsAre(2, 8));
  EXPECT_DOUBLE_EQ(f.uniform_waste(), 0.375);
  EXPECT_DOUBLE_EQ(f.hybridkv_waste(), 0.0);

  const Footprint at64 = plan.FootprintOf(64, 0);
  EXPECT_EQ(at64.ideal_bytes, 6144);
  EXPECT_EQ(at64.hybridkv_bytes, 6144);
  EXPECT_EQ(at64.uniform_bytes, 8192);

  // 20 tokens: blocks round up to 32 in both layouts.
  const Footprint at20 = plan.FootprintOf(20, 0);
  EXPECT_EQ(at20.ideal_bytes, 4 * 32 * 20);
  EXPECT_EQ(at20.hybridkv_bytes, 4 * 1024);
  EXPECT_EQ(at20.uniform_bytes, 32 * 128);
  EXPECT_DOUBLE_EQ(at20.hybridkv_waste(), 0.375);
}

TEST(FootprintTest, EncoderTokensTakeASlotInEveryLayerUnderUniform) {
  const Plan plan = MustPlan(MllamaLike(), Options(kMiB, 10));
  EXPECT_EQ(plan.options.encoder_tokens, 100);
  EXPECT_EQ(plan.uniform_bytes_per_token, 10 * 32);
  const Footprint f = plan.PlanningFootprint();
  EXPECT_EQ(f.ideal_bytes, 8 * 32 * 10 + 2 * 32 * 100);
  EXPECT_EQ(f.hybridkv_bytes, (4 * 1 + 7) * 1024);
  EXPECT_EQ(f.uniform_bytes, 112 * 320);  // 110 tokens rounded to 7 blocks
  EXPECT_DOUBLE_EQ(f.uniform_waste(), 0.75);
}

TEST(FootprintTest, RecurrentLayersCountAsFullAttentionUnderUniform) {
  PlanOptions o = Options();
  o.strategy = PageStrategy::kMultiClass;  // pages at their own size, no slab tails
  const Plan plan = MustPlan(MambaHybrid(), o);
  EXPECT_EQ(plan.uniform_bytes_per_token, 8 * kLayerTokenBytes);
  const Footprint f = plan.PlanningFootprint();
  EXPECT_EQ(f.ideal_bytes, 2 * 32 * 128 + 6 * kMambaStateBytes);
  EXPECT_EQ(f.hybridkv_bytes, f.ideal_bytes);
  EXPECT_EQ(f.uniform_bytes, 128 * 256);
  EXPECT_THAT(f.pages_per_group, ElementsAre(1, 8));
  // No tokens still means one state.
  EXPECT_EQ(plan.FootprintOf(0, 0).hybridkv_bytes, 6 * kMambaStateBytes);
  EXPECT_EQ(plan.MaxSequences(0, 0), plan.page_classes[0].num_pages);
}

TEST(FootprintTest, ParallelHybridCountsBothMixersOfALayer) {
  PlanOptions o = Options();
  o.strategy = PageStrategy::kMultiClass;
  const Plan plan = MustPlan(FalconH1Like(), o);
  EXPECT_EQ(plan.uniform_bytes_per_token, 6 * kLayerTokenBytes);
  const Footprint f = plan.PlanningFootprint();
  EXPECT_EQ(f.ideal_bytes, 3 * 32 * 128 + 3 * kMambaStateBytes);
  EXPECT_EQ(f.hybridkv_bytes, 8 * 1536 + 3 * kMambaStateBytes);
}

TEST(FootprintTest, SharedAndMlpLayersCostNothingAnywhere) {
  const Plan plan = MustPlan(KvSharedModel(), Options());
  EXPECT_EQ(plan.uniform_bytes_per_token, 4 * kLayerTokenBytes);
  const Footprint f = plan.PlanningFootprint();
  EXPECT_EQ(f.ideal_bytes, 2 * 32 * 32 + 2 * 32 * 128);
  EXPECT_EQ(f.hybridkv_bytes, f.ideal_bytes);
}

TEST(FootprintTest, ChunkedLayersKeepOnlyTheCurrentChunk) {
  // T = 100 with chunks of 64: tokens 64..99 (36) in 3 blocks (64..111).
  const Plan plan = MustPlan(ChunkedModel(), Options(kMiB, 100));
  const Footprint f = plan.PlanningFootprint();
  EXPECT_EQ(f.ideal_bytes, 3 * 32 * 36 + 32 * 100);
  EXPECT_EQ(f.hybridkv_bytes, (3 * 3 + 7) * 512);
  EXPECT_EQ(plan.MaxSequences(100, 0), plan.num_pages() / 16);
}

TEST(FootprintTest, OnlyRecurrentLayersKeepTheirStateOnceUnderUniform) {
  const ModelSpec m = Model("pure-mamba", {Mamba(0), Mamba(1)});
  const Plan plan = MustPlan(m, Options());
  EXPECT_EQ(plan.uniform_bytes_per_token, 0);
  const Footprint f = plan.PlanningFootprint();
  EXPECT_EQ(f.uniform_bytes, 2 * kMambaStateBytes);
  EXPECT_EQ(f.ideal_bytes, 2 * kMambaStateBytes);
  EXPECT_EQ(plan.num_pages(), kMiB / (2 * kMambaStateBytes));
  EXPECT_EQ(plan.MaxSequences(128, 0), kMiB / (2 * kMambaStateBytes));
  EXPECT_EQ(plan.MaxSequencesUniform(128, 0), kMiB / (2 * kMambaStateBytes));
}

TEST(FootprintTest, MaxSequencesAgainstUniform) {
  const Plan plan = MustPlan(Gemma2Like(), Options());
  EXPECT_EQ(plan.MaxSequences(128, 0), 1024 / 10);
  EXPECT_EQ(plan.MaxSequencesUniform(128, 0), kMiB / (16 * 128) / 8);
  EXPECT_EQ(plan.MaxSequences(64, 0), 1024 / 6);
  EXPECT_EQ(plan.MaxSequencesUniform(64, 0), 512 / 4);
  EXPECT_EQ(plan.MaxSequences(0, 0), std::numeric_limits<int64_t>::max());
}

TEST(FootprintTest, TwoLevelChargesEachPageItsShareOfASlab) {
  // Slab 37920 bytes = 5 states (no tail) or 37 pages of 1024 (32 bytes of tail): a page costs
  // 37920 / 37 bytes, so 8 pages cost 8198 bytes instead of 8192.
  const Plan plan = MustPlan(MambaHybrid(), Options());
  const Footprint f = plan.PlanningFootprint();
  EXPECT_EQ(f.hybridkv_bytes, 6 * kMambaStateBytes + 8 * 37920 / 37);
  EXPECT_LE(f.hybridkv_bytes, f.ideal_bytes + f.ideal_bytes / 100);
}

TEST(FootprintTest, MultiClassCapacityIsTheScarcestClass) {
  PlanOptions o = Options();
  o.strategy = PageStrategy::kMultiClass;
  const Plan plan = MustPlan(Gemma3Like(), o);  // 97 sliding pages, 390 full pages
  EXPECT_EQ(plan.MaxSequences(128, 0), 48);
  EXPECT_EQ(plan.MaxSequences(32, 0), 97 / 2);  // 2 pages of each class
  EXPECT_EQ(plan.MaxSequences(16, 0), 97);      // 1 page of each class
  EXPECT_EQ(plan.MaxSequencesUniform(128, 0), kMiB / (16 * 15 * 32) / 8);
}

TEST(FootprintTest, WasteOfNothingIsZero) {
  EXPECT_EQ(Footprint{}.hybridkv_waste(), 0.0);
  EXPECT_EQ(Footprint{}.uniform_waste(), 0.0);
}

}  // namespace
}  // namespace hkv::testing
