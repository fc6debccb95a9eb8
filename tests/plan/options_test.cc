// Option resolution and the errors of MakePlan: each names the option, the value and what was
// expected.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_models.h"

namespace hkv::testing {
namespace {

using ::testing::HasSubstr;

void ExpectError(const ModelSpec& m, const PlanOptions& o, StatusCode code,
                 std::string_view fragment) {
  const Result<Plan> r = MakePlan(m, o);
  ASSERT_FALSE(r.ok()) << fragment;
  EXPECT_EQ(r.status().code(), code) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr(std::string(fragment)));
}

TEST(PlanOptionsTest, UnsetValuesResolveFromTheModel) {
  const Plan plan = MustPlan(MllamaLike(), PlanOptions{.memory_bytes = kMiB});
  EXPECT_EQ(plan.options.max_model_len, 256);
  EXPECT_EQ(plan.options.seq_tokens, 256);
  EXPECT_EQ(plan.options.encoder_tokens, 100);
  EXPECT_EQ(plan.options.block_tokens, 16);
  const Plan text_only = MustPlan(Gemma2Like(), Options());
  EXPECT_EQ(text_only.options.encoder_tokens, 0);
  EXPECT_EQ(text_only.PlanningFootprint().tokens, 128);
}

TEST(PlanOptionsTest, ExplicitValuesAreKept) {
  PlanOptions o = Options(kMiB, 40, 7);
  o.max_model_len = 64;
  o.block_tokens = 8;
  const Plan plan = MustPlan(MllamaLike(), o);
  EXPECT_EQ(plan.options.max_model_len, 64);
  EXPECT_EQ(plan.options.seq_tokens, 40);
  EXPECT_EQ(plan.options.encoder_tokens, 7);
  EXPECT_EQ(plan.groups[0].block_tokens, 8);
  EXPECT_EQ(plan.groups[0].page_bytes, 2 * 8 * kLayerTokenBytes);
}

TEST(PlanOptionsTest, ContextBeyondTheConfigIsAWarningNotAnError) {
  PlanOptions o = Options(4 * kMiB);
  o.max_model_len = 512;
  const Plan plan = MustPlan(Gemma2Like(), o);
  EXPECT_EQ(plan.options.seq_tokens, 512);
  ASSERT_EQ(plan.warnings.size(), 1u);
  EXPECT_THAT(plan.warnings[0], HasSubstr("max_model_len = 512"));
  EXPECT_THAT(plan.warnings[0], HasSubstr("max_position_embeddings = 128"));
}

TEST(PlanOptionsTest, ModelWarningsAreCarriedIntoThePlan) {
  ModelSpec m = Gemma2Like();
  m.warnings = {"sliding_window ignored"};
  const Plan plan = MustPlan(m, Options());
  EXPECT_EQ(plan.warnings, m.warnings);
}

TEST(PlanOptionsTest, MissingContextLengthAsksForMaxModelLen) {
  const ModelSpec m = Model("no-context", {Full(0)}, 0);
  ExpectError(m, Options(), StatusCode::kInvalidArgument, "--max-model-len");
  PlanOptions o = Options();
  o.max_model_len = 64;
  EXPECT_EQ(MustPlan(m, o).options.seq_tokens, 64);
}

TEST(PlanOptionsTest, OutOfRangeValuesAreInvalidArguments) {
  const ModelSpec m = Gemma2Like();
  PlanOptions o = Options();
  o.max_model_len = -1;
  ExpectError(m, o, StatusCode::kInvalidArgument, "max_model_len = -1");

  ExpectError(m, Options(kMiB, 129), StatusCode::kInvalidArgument,
              "seq_tokens = 129: expected 0 (max_model_len) or decoder tokens in [1, "
              "max_model_len = 128]");
  ExpectError(m, Options(kMiB, -5), StatusCode::kInvalidArgument, "seq_tokens = -5");
  ExpectError(m, Options(kMiB, 0, -2), StatusCode::kInvalidArgument, "encoder_tokens = -2");
  ExpectError(m, Options(kMiB, 0, 5), StatusCode::kInvalidArgument,
              "encoder_tokens = 5: gemma2-like has no cross-attention layers");
  ExpectError(m, Options(0), StatusCode::kInvalidArgument, "memory_bytes = 0");
  ExpectError(m, Options(-1), StatusCode::kInvalidArgument, "memory_bytes = -1");

  for (int32_t bad : {0, -16, (1 << 20) + 1}) {
    o = Options();
    o.block_tokens = bad;
    ExpectError(m, o, StatusCode::kInvalidArgument, "block_tokens = " + std::to_string(bad));
  }
  o = Options();
  o.block_tokens = 1 << 20;
  ExpectError(m, o, StatusCode::kResourceExhausted, "memory_bytes");  // a valid, huge block
}

TEST(PlanOptionsTest, InvalidModelsAreRejectedBeforeAnythingElse) {
  ModelSpec m = Gemma2Like();
  m.layers[1].num_kv_heads = 0;
  ExpectError(m, Options(0), StatusCode::kInvalidArgument, "num_kv_heads = 0");
}

TEST(PlanOptionsTest, AModelThatKeepsNothingHasNothingToPlan) {
  ExpectError(Model("mlp-only", {Mlp(0), Mlp(1)}), Options(), StatusCode::kInvalidArgument,
              "nothing to plan");
}

TEST(PlanOptionsTest, AnEmptyPlanningPointHasNoDemand) {
  // Only cross attention and no image: one sequence keeps nothing.
  ModelSpec m = Model("cross-only", {Cross(0)});
  ExpectError(m, Options(kMiB, 0, 0), StatusCode::kInvalidArgument, "keeps nothing");
}

}  // namespace
}  // namespace hkv::testing

namespace hkv {
namespace {

TEST(PlanOptionNamesTest, NamesRoundTripAndShortFormsParse) {
  for (TensorLayout l : {TensorLayout::kCanonical, TensorLayout::kPerLayer}) {
    EXPECT_EQ(*ParseTensorLayout(TensorLayoutName(l)), l);
  }
  for (PageStrategy s :
       {PageStrategy::kAuto, PageStrategy::kSingleClass, PageStrategy::kMultiClass}) {
    EXPECT_EQ(*ParsePageStrategy(PageStrategyName(s)), s);
  }
  EXPECT_EQ(*ParsePageStrategy("single"), PageStrategy::kSingleClass);
  EXPECT_EQ(*ParsePageStrategy("multi"), PageStrategy::kMultiClass);
  EXPECT_EQ(*ParseTensorLayout("per_layer"), TensorLayout::kPerLayer);
  EXPECT_NE(ParseTensorLayout("diagonal").status().message().find("'diagonal'"), std::string::npos);
  EXPECT_NE(ParsePageStrategy("best").status().message().find("'best'"), std::string::npos);
}

}  // namespace
}  // namespace hkv
