// Which layers share a block table: equal token rules group, recurrent layers form one state
// group, layers that own nothing are left out.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_models.h"

namespace hkv::testing {
namespace {

using ::testing::ElementsAre;

TEST(GroupingTest, AlternatingSlidingAndFullFormTwoGroupsInOrderOfAppearance) {
  const Plan plan = MustPlan(Gemma2Like(), Options());
  ASSERT_EQ(plan.groups.size(), 2u);
  EXPECT_EQ(plan.groups[0].rule, (TokenRule{TokenRuleKind::kWindow, 32, 0}));
  EXPECT_THAT(plan.groups[0].layers, ElementsAre(0, 2));
  EXPECT_EQ(plan.groups[1].rule, (TokenRule{TokenRuleKind::kAll, 0, 0}));
  EXPECT_THAT(plan.groups[1].layers, ElementsAre(1, 3));
  for (size_t i = 0; i < plan.groups.size(); ++i) {
    EXPECT_EQ(plan.groups[i].id, static_cast<int32_t>(i));
    EXPECT_EQ(plan.groups[i].block_tokens, 16);
    EXPECT_EQ(plan.groups[i].page_bytes, 2 * kLayerBlockBytes);
    EXPECT_EQ(plan.groups[i].padding_layers, 0);
  }
}

TEST(GroupingTest, DifferentWindowsAndSinksAreDifferentRules) {
  const ModelSpec m = Model(
      "windows", {Sliding(0, 32), Sliding(1, 32, 4), Sliding(2, 64), Full(3), Sliding(4, 32)});
  PlanOptions o = Options();
  o.strategy = PageStrategy::kMultiClass;  // the single class would cut groups to one layer each
  const Plan plan = MustPlan(m, o);
  ASSERT_EQ(plan.groups.size(), 4u);
  EXPECT_THAT(plan.groups[0].layers, ElementsAre(0, 4));
  EXPECT_EQ(plan.groups[1].rule, (TokenRule{TokenRuleKind::kWindow, 32, 4}));
  EXPECT_EQ(plan.groups[2].rule, (TokenRule{TokenRuleKind::kWindow, 64, 0}));
  EXPECT_THAT(plan.groups[3].layers, ElementsAre(3));
}

TEST(GroupingTest, RecurrentLayersFormOneStateGroupHoldingEveryState) {
  const Plan plan = MustPlan(MambaHybrid(), Options());
  ASSERT_EQ(plan.groups.size(), 2u);
  const KvGroup& state = plan.groups[0];
  EXPECT_TRUE(state.is_state());
  EXPECT_THAT(state.layers, ElementsAre(0, 1, 2, 4, 5, 6));
  EXPECT_EQ(state.block_tokens, 0);
  EXPECT_EQ(state.page_bytes, 6 * kMambaStateBytes);
  EXPECT_THAT(plan.groups[1].layers, ElementsAre(3, 7));
  EXPECT_EQ(plan.groups[1].page_bytes, 2 * kLayerBlockBytes);
}

TEST(GroupingTest, ParallelHybridSplitsOneModelLayerBetweenTwoGroups) {
  const Plan plan = MustPlan(FalconH1Like(), Options());
  ASSERT_EQ(plan.groups.size(), 2u);
  EXPECT_EQ(plan.groups[0].rule.kind, TokenRuleKind::kAll);
  EXPECT_THAT(plan.groups[0].layers, ElementsAre(0, 2, 4));  // indices into ModelSpec::layers
  EXPECT_TRUE(plan.groups[1].is_state());
  EXPECT_THAT(plan.groups[1].layers, ElementsAre(1, 3, 5));
  EXPECT_EQ(plan.groups[1].page_bytes, 3 * kMambaStateBytes);
}

TEST(GroupingTest, KvSharedAndMlpLayersAreInNoGroup) {
  const Plan plan = MustPlan(KvSharedModel(), Options());
  ASSERT_EQ(plan.groups.size(), 2u);
  EXPECT_THAT(plan.groups[0].layers, ElementsAre(0, 2));
  EXPECT_THAT(plan.groups[1].layers, ElementsAre(1, 3));
}

TEST(GroupingTest, MlaKeepsEveryTokenInOneLatent) {
  const Plan plan = MustPlan(MlaModel(), Options());
  ASSERT_EQ(plan.groups.size(), 1u);
  EXPECT_EQ(plan.groups[0].rule.kind, TokenRuleKind::kAll);
  EXPECT_EQ(plan.groups[0].page_bytes, 3 * 16 * 48);
}

TEST(GroupingTest, CrossAttentionAndChunkedLayersGetTheirOwnRules) {
  const Plan chunked = MustPlan(ChunkedModel(), Options(kMiB, 100));
  EXPECT_EQ(chunked.groups.front().rule, (TokenRule{TokenRuleKind::kChunk, 64, 0}));
  const Plan mllama = MustPlan(MllamaLike(), Options());
  EXPECT_EQ(mllama.groups.back().rule.kind, TokenRuleKind::kEncoder);
  EXPECT_THAT(mllama.groups.back().layers, ElementsAre(3, 8));
}

TEST(GroupingTest, AWindowOrChunkAsLongAsTheLongestRequestIsFullAttention) {
  // Windows of 32 and 64 and a chunk of 64 tokens: with requests of at most 64 tokens the 64s
  // keep everything and join full attention; the 32-token window stays a window.
  const ModelSpec m = Model(
      "long-windows", {Sliding(0, 32), Sliding(1, 64), Full(2), Chunked(3, 64), Sliding(4, 32)});
  PlanOptions o = Options();
  o.strategy = PageStrategy::kMultiClass;
  o.max_model_len = 64;
  const Plan plan = MustPlan(m, o);
  ASSERT_EQ(plan.groups.size(), 2u);
  EXPECT_EQ(plan.groups[0].rule, (TokenRule{TokenRuleKind::kWindow, 32, 0}));
  EXPECT_THAT(plan.groups[0].layers, ElementsAre(0, 4));
  EXPECT_EQ(plan.groups[1].rule, (TokenRule{TokenRuleKind::kAll, 0, 0}));
  EXPECT_THAT(plan.groups[1].layers, ElementsAre(1, 2, 3));
  // One token longer and both are windows again.
  o.max_model_len = 65;
  const Plan longer = MustPlan(m, o);
  ASSERT_EQ(longer.groups.size(), 4u);
  EXPECT_EQ(longer.groups[1].rule, (TokenRule{TokenRuleKind::kWindow, 64, 0}));
  EXPECT_EQ(longer.groups[3].rule, (TokenRule{TokenRuleKind::kChunk, 64, 0}));
}

}  // namespace
}  // namespace hkv::testing
