// Page sizing: single class (equal groups, padded) against multi class, chosen by wasted bytes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_models.h"

namespace hkv::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const PageCandidate& CandidateOf(const Plan& plan, PageStrategy s) {
  for (const PageCandidate& c : plan.candidates) {
    if (c.strategy == s) return c;
  }
  ADD_FAILURE() << "no candidate";
  return plan.candidates.front();
}

TEST(PageStrategyTest, EqualGroupsTieAndTheSingleClassWins) {
  const Plan plan = MustPlan(Gemma2Like(), Options());
  ASSERT_EQ(plan.candidates.size(), 3u);
  EXPECT_FALSE(CandidateOf(plan, PageStrategy::kTwoLevel).feasible);  // one page size
  const PageCandidate& single = CandidateOf(plan, PageStrategy::kSingleClass);
  const PageCandidate& multi = CandidateOf(plan, PageStrategy::kMultiClass);
  EXPECT_TRUE(single.feasible);
  EXPECT_TRUE(multi.feasible);
  EXPECT_EQ(single.wasted_bytes, 0);
  EXPECT_EQ(multi.wasted_bytes, 0);
  EXPECT_EQ(single.num_groups, 2);
  EXPECT_EQ(single.num_classes, 1);
  EXPECT_EQ(multi.num_classes, 1);  // equal pages share a class even with multi class
  EXPECT_EQ(plan.strategy, PageStrategy::kSingleClass);
  ASSERT_EQ(plan.page_classes.size(), 1u);
  EXPECT_THAT(plan.page_classes[0].groups, ElementsAre(0, 1));
}

TEST(PageStrategyTest, SmallPaddingKeepsOnePool) {
  // 13 sliding + 2 full layers at T = 128: single class cuts the sliding group into 7 pairs, the
  // last padded by one layer that wastes 2 blocks of 512 bytes, 4.5% of the 22528-byte sequence.
  // Two level wastes nothing, but one pool is worth up to 5%: eviction keeps every group of a
  // prefix together there, and a freed block serves any group.
  const Plan plan = MustPlan(Gemma3Like(), Options());
  EXPECT_EQ(CandidateOf(plan, PageStrategy::kSingleClass).wasted_bytes, 2 * kLayerBlockBytes);
  EXPECT_EQ(CandidateOf(plan, PageStrategy::kSingleClass).sequence_bytes, 44 * kLayerBlockBytes);
  EXPECT_EQ(CandidateOf(plan, PageStrategy::kSingleClass).num_groups, 8);
  EXPECT_EQ(CandidateOf(plan, PageStrategy::kMultiClass).wasted_bytes, 0);
  EXPECT_EQ(CandidateOf(plan, PageStrategy::kMultiClass).num_classes, 2);
  EXPECT_EQ(CandidateOf(plan, PageStrategy::kTwoLevel).wasted_bytes, 0);
  EXPECT_EQ(plan.strategy, PageStrategy::kSingleClass);
  ASSERT_EQ(plan.page_classes.size(), 1u);
  EXPECT_FALSE(plan.arena.enabled());
}

TEST(PageStrategyTest, LargePaddingLosesToTwoLevel) {
  // 3 sliding + 2 full layers at T = 128: single class pairs the layers, and the second sliding
  // pair is padded by a layer holding 2 blocks of 512 bytes, 8.3% of the sequence.
  const ModelSpec m =
      Model("three-two", {Sliding(0, 32), Full(1), Sliding(2, 32), Full(3), Sliding(4, 32)});
  const Plan plan = MustPlan(m, Options());
  const PageCandidate& single = CandidateOf(plan, PageStrategy::kSingleClass);
  EXPECT_EQ(single.wasted_bytes, 2 * kLayerBlockBytes);
  EXPECT_EQ(single.sequence_bytes, 24 * kLayerBlockBytes);
  // Pages of 1536 and 1024 bytes: two of the larger make a 3072-byte slab with no tail, so
  // sharing slabs costs nothing here and auto takes it.
  EXPECT_EQ(CandidateOf(plan, PageStrategy::kTwoLevel).wasted_bytes, 0);
  EXPECT_EQ(plan.strategy, PageStrategy::kTwoLevel);
  EXPECT_EQ(plan.arena.slab_bytes, 6 * kLayerBlockBytes);
  ASSERT_EQ(plan.page_classes.size(), 2u);
  EXPECT_EQ(plan.page_classes[0].page_bytes, 3 * kLayerBlockBytes);
  EXPECT_EQ(plan.page_classes[1].page_bytes, 2 * kLayerBlockBytes);
  EXPECT_EQ(plan.groups[0].page_class, 0);
  EXPECT_EQ(plan.groups[1].page_class, 1);
}

TEST(PageStrategyTest, ForcedSingleClassSplitsIntoConsecutiveRunsAndPadsTheLast) {
  PlanOptions o = Options();
  o.strategy = PageStrategy::kSingleClass;
  const Plan plan = MustPlan(Gemma3Like(), o);
  EXPECT_EQ(plan.strategy, PageStrategy::kSingleClass);
  ASSERT_EQ(plan.groups.size(), 8u);
  EXPECT_THAT(plan.groups[0].layers, ElementsAre(0, 1));
  EXPECT_THAT(plan.groups[2].layers, ElementsAre(4, 6));
  EXPECT_THAT(plan.groups[5].layers, ElementsAre(12, 13));
  EXPECT_THAT(plan.groups[6].layers, ElementsAre(14));
  EXPECT_EQ(plan.groups[6].padding_layers, 1);
  EXPECT_THAT(plan.groups[7].layers, ElementsAre(5, 11));
  for (const KvGroup& g : plan.groups) {
    EXPECT_EQ(g.page_bytes, 2 * kLayerBlockBytes);  // padding layers included
    EXPECT_EQ(g.page_class, 0);
    EXPECT_EQ(g.id, &g - plan.groups.data());
  }
  EXPECT_EQ(plan.groups[0].rule, plan.groups[6].rule);
  ASSERT_EQ(plan.page_classes.size(), 1u);
  EXPECT_EQ(plan.page_classes[0].groups.size(), 8u);
  // The padding shows in the footprint: 7 runs x 2 blocks + 8 full blocks, 1024 bytes each.
  const Footprint f = plan.PlanningFootprint();
  EXPECT_EQ(f.hybridkv_bytes, (7 * 2 + 8) * 2 * kLayerBlockBytes);
  EXPECT_EQ(f.hybridkv_bytes - f.ideal_bytes, 2 * kLayerBlockBytes);
}

TEST(PageStrategyTest, RecurrentStateRulesOutTheSingleClass) {
  const Plan plan = MustPlan(MambaHybrid(), Options());
  EXPECT_TRUE(CandidateOf(plan, PageStrategy::kTwoLevel).feasible);
  const PageCandidate& single = CandidateOf(plan, PageStrategy::kSingleClass);
  EXPECT_FALSE(single.feasible);
  EXPECT_THAT(single.why_not, HasSubstr("recurrent state"));
  EXPECT_EQ(plan.strategy, PageStrategy::kTwoLevel);
  ASSERT_EQ(plan.page_classes.size(), 2u);
  EXPECT_EQ(plan.page_classes[0].page_bytes, 6 * kMambaStateBytes);
  EXPECT_EQ(plan.page_classes[1].page_bytes, 2 * kLayerBlockBytes);

  PlanOptions o = Options();
  o.strategy = PageStrategy::kSingleClass;
  const Result<Plan> forced = MakePlan(MambaHybrid(), o);
  ASSERT_FALSE(forced.ok());
  EXPECT_EQ(forced.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(forced.status().message(), HasSubstr("strategy = single_class"));
  EXPECT_THAT(forced.status().message(), HasSubstr("recurrent state"));
}

TEST(PageStrategyTest, UnequalBytesPerTokenRulesOutTheSingleClass) {
  ModelSpec m = Model("wide-global", {Sliding(0, 32), Attention(1, LayerKind::kFullAttention, 4)});
  const Plan plan = MustPlan(m, Options());
  EXPECT_FALSE(CandidateOf(plan, PageStrategy::kSingleClass).feasible);
  EXPECT_THAT(CandidateOf(plan, PageStrategy::kSingleClass).why_not,
              HasSubstr("different KV bytes per token (model layer 0: 32, model layer 1: 64)"));
  EXPECT_EQ(plan.strategy, PageStrategy::kTwoLevel);
}

TEST(PageStrategyTest, CrossAttentionTieAtTheRfcPointKeepsOneClass) {
  // T = 10, E = 100: 8 self layers hold 1 block, 2 cross layers 7 blocks, either way.
  const Plan plan = MustPlan(MllamaLike(), Options(kMiB, 10));
  EXPECT_EQ(CandidateOf(plan, PageStrategy::kSingleClass).wasted_bytes, 2304);
  EXPECT_EQ(CandidateOf(plan, PageStrategy::kMultiClass).wasted_bytes, 2304);
  EXPECT_EQ(plan.strategy, PageStrategy::kSingleClass);
  ASSERT_EQ(plan.groups.size(), 5u);
  EXPECT_THAT(plan.groups[1].layers, ElementsAre(2, 4));
  EXPECT_THAT(plan.groups[4].layers, ElementsAre(3, 8));
}

TEST(PageStrategyTest, ExplicitMultiClassIsHonouredEvenOnATie) {
  PlanOptions o = Options();
  o.strategy = PageStrategy::kMultiClass;
  const Plan plan = MustPlan(ChunkedModel(), o);
  EXPECT_EQ(plan.strategy, PageStrategy::kMultiClass);
  ASSERT_EQ(plan.groups.size(), 2u);
  EXPECT_EQ(plan.page_classes.size(), 2u);
  EXPECT_EQ(plan.candidates.size(), 3u);
}

TEST(PageStrategyTest, TwoLevelNeedsTheCanonicalLayoutAndIsNotTakenWhenItsTailsCostMore) {
  PlanOptions o = Options();
  o.layout = TensorLayout::kPerLayer;
  const Plan per_layer = MustPlan(MambaHybrid(), o);
  EXPECT_FALSE(CandidateOf(per_layer, PageStrategy::kTwoLevel).feasible);
  EXPECT_THAT(CandidateOf(per_layer, PageStrategy::kTwoLevel).why_not, HasSubstr("per-layer"));
  EXPECT_EQ(per_layer.strategy, PageStrategy::kMultiClass);
  o.strategy = PageStrategy::kTwoLevel;
  EXPECT_EQ(MakePlan(MambaHybrid(), o).status().code(), StatusCode::kInvalidArgument);
  // The explicit strategy is parsed by its name.
  EXPECT_EQ(ParsePageStrategy("two_level").value(), PageStrategy::kTwoLevel);
  EXPECT_EQ(PageStrategyName(PageStrategy::kTwoLevel), "two_level");
}

}  // namespace
}  // namespace hkv::testing
