// Pool sizing: whole planning-point sequences first, the rest split by demand, in whole pages.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_models.h"

namespace hkv::testing {
namespace {

using ::testing::HasSubstr;

int64_t BytesUsed(const Plan& plan) {
  int64_t total = 0;
  for (const PageClass& c : plan.page_classes)
    total += c.buffer_bytes();
  return total;
}

TEST(PoolSizingTest, SingleClassTakesWholePagesOfTheBudget) {
  const Plan plan = MustPlan(Gemma2Like(), Options(kMiB + 1000));
  ASSERT_EQ(plan.page_classes.size(), 1u);
  EXPECT_EQ(plan.page_classes[0].num_pages, 1024);
  EXPECT_EQ(plan.num_pages(), 1024);
  EXPECT_EQ(plan.page_classes[0].buffer_bytes(), kMiB);
}

TEST(PoolSizingTest, MultiClassSplitsByOneSequencesDemand) {
  // Per 128-token sequence: 2 pages of 6656 bytes (sliding) + 8 of 1024 (full) = 21504 bytes.
  // 1 MiB buys 48 sequences and leaves 16384 bytes: 16384 * 2 / 21504 -> 1 more sliding page,
  // 16384 * 8 / 21504 -> 6 more full pages.
  PlanOptions o = Options();
  o.strategy = PageStrategy::kMultiClass;
  const Plan plan = MustPlan(Gemma3Like(), o);
  ASSERT_EQ(plan.page_classes.size(), 2u);
  EXPECT_EQ(plan.page_classes[0].num_pages, 97);
  EXPECT_EQ(plan.page_classes[1].num_pages, 390);
  EXPECT_EQ(BytesUsed(plan), 97 * 6656 + 390 * 1024);
  EXPECT_LE(BytesUsed(plan), kMiB);
  EXPECT_EQ(plan.MaxSequences(128, 0), 48);
}

TEST(PoolSizingTest, StatePagesAreSizedNextToAttentionPages) {
  // Per sequence: 1 state page of 7584 bytes + 8 attention pages of 1024 = 15776 bytes.
  // 1 MiB buys 66 and leaves 7360: 0 more state pages, 7360 * 8 / 15776 -> 3 attention pages.
  PlanOptions o = Options();
  o.strategy = PageStrategy::kMultiClass;
  const Plan plan = MustPlan(MambaHybrid(), o);
  EXPECT_EQ(plan.page_classes[0].num_pages, 66);
  EXPECT_EQ(plan.page_classes[1].num_pages, 531);
  EXPECT_EQ(plan.MaxSequences(128, 0), 66);
}

TEST(PoolSizingTest, TwoLevelCarvesEveryClassFromOneSetOfSlabs) {
  // State pages of 7584 bytes, attention pages of 1024. k * 7584 for k = 1..4 leaves a tail of
  // 416, 832, 224, 640 bytes (> 0.5%); k = 5 leaves 32 of 37920 (0.08%): 5 states or 37 pages.
  // 1 MiB buys 27 slabs.
  const Plan plan = MustPlan(MambaHybrid(), Options());
  ASSERT_EQ(plan.strategy, PageStrategy::kTwoLevel);
  EXPECT_EQ(plan.arena.slab_bytes, 37920);
  EXPECT_EQ(plan.arena.num_slabs, 27);
  EXPECT_EQ(plan.page_classes[0].pages_per_slab, 5);
  EXPECT_EQ(plan.page_classes[1].pages_per_slab, 37);
  EXPECT_EQ(plan.page_classes[0].num_pages, 27 * 5);
  EXPECT_EQ(plan.page_classes[1].num_pages, 27 * 37);
  // 128 tokens: 1 state + 8 pages. n sequences need ceil(n / 5) + ceil(8n / 37) slabs: 64 fit
  // (13 + 14 = 27). At 16 tokens (1 + 1 page) the fixed split would stop at its state pages;
  // here ceil(n / 5) + ceil(n / 37) <= 27 gives 115 (23 + 4 slabs).
  EXPECT_EQ(plan.MaxSequences(128, 0), 64);
  EXPECT_EQ(plan.MaxSequences(16, 0), 115);
  // Block b >= 1 of a class sits at slab (b - 1) / per, page (b - 1) % per of the one buffer.
  for (const TensorView& v : plan.layout.tensors) {
    const int64_t per = plan.page_classes[static_cast<size_t>(v.page_class)].pages_per_slab;
    const int64_t page = plan.page_classes[static_cast<size_t>(v.page_class)].page_bytes;
    EXPECT_EQ(plan.BlockOffset(v, 1), v.offset);
    EXPECT_EQ(plan.BlockOffset(v, per), (per - 1) * page + v.offset);
    EXPECT_EQ(plan.BlockOffset(v, per + 1), 37920 + v.offset);
    EXPECT_LE(plan.BlockOffset(v, 27 * per) + v.bytes, plan.arena.buffer_bytes());
  }
  EXPECT_LE(plan.arena.buffer_bytes(), kMiB);
}

TEST(PoolSizingTest, TwoLevelRefusesABudgetBelowOneSequencesSlabs) {
  // 20000 bytes buy fewer than 16 slabs, so the slab is one state page (7584 bytes, 7 attention
  // pages): 2 slabs, while one 128-token sequence needs 1 + ceil(8 / 7) = 3. (Auto would not
  // take two-level here: its 416-byte tails cost 3% of a sequence.)
  PlanOptions o = Options(20000);
  o.strategy = PageStrategy::kTwoLevel;
  const Result<Plan> r = MakePlan(MambaHybrid(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(), HasSubstr("slab"));
}

TEST(PoolSizingTest, ABudgetOfExactlyOneSequenceIsEnough) {
  const Plan plan = MustPlan(Gemma2Like(), Options(10 * 1024));
  EXPECT_EQ(plan.num_pages(), 10);
  EXPECT_EQ(plan.MaxSequences(128, 0), 1);
}

TEST(PoolSizingTest, NeverOverspendsAndLeavesLessThanOneSequencePlusAPagePerClass) {
  for (const ModelSpec& m : {Gemma3Like(), MambaHybrid(), FalconH1Like(), MllamaLike()}) {
    PlanOptions o = Options(0, 64);
    o.strategy = PageStrategy::kMultiClass;
    for (int64_t memory = 40000; memory < 3 * kMiB; memory = memory * 7 / 5 + 13) {
      o.memory_bytes = memory;
      const Plan plan = MustPlan(m, o);
      const Footprint f = plan.PlanningFootprint();
      int64_t slack = f.hybridkv_bytes;
      for (const PageClass& c : plan.page_classes)
        slack += c.page_bytes;
      EXPECT_LE(BytesUsed(plan), memory) << m.source << " " << memory;
      EXPECT_LT(memory - BytesUsed(plan), slack) << m.source << " " << memory;
      EXPECT_GE(plan.MaxSequences(64, o.encoder_tokens == -1 ? m.max_encoder_tokens : 0), 1);
    }
  }
}

TEST(PoolSizingTest, AClassThePlanningPointNeverUsesGetsNoPagesAndAWarning) {
  PlanOptions o = Options(kMiB, 10, 0);
  o.strategy = PageStrategy::kMultiClass;
  const Plan plan = MustPlan(MllamaLike(), o);
  ASSERT_EQ(plan.page_classes.size(), 2u);
  EXPECT_EQ(plan.page_classes[1].num_pages, 0);  // cross attention, no image at this point
  EXPECT_EQ(plan.page_classes[0].num_pages, kMiB / 4096);
  ASSERT_FALSE(plan.warnings.empty());
  EXPECT_THAT(plan.warnings.back(), HasSubstr("page class 1 gets no pages"));
}

TEST(PoolSizingTest, BudgetBelowOnePageIsResourceExhausted) {
  const Result<Plan> r = MakePlan(Gemma2Like(), Options(1000));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(), HasSubstr("memory_bytes"));
  EXPECT_THAT(r.status().message(), HasSubstr("smaller than one page"));
}

TEST(PoolSizingTest, BudgetBelowOneSequenceNamesWhatOneSequenceNeeds) {
  const Result<Plan> r = MakePlan(Gemma2Like(), Options(10 * 1024 - 1));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(), HasSubstr("memory_bytes"));
  EXPECT_THAT(r.status().message(), HasSubstr("(10240 bytes)"));
  EXPECT_THAT(r.status().message(), HasSubstr("seq_tokens = 128"));
}

}  // namespace
}  // namespace hkv::testing
