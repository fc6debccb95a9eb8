// Memory layout: every (tensor, block) byte range of a group lies inside its class buffer and
// none overlaps another; in the canonical layout one block of a group is one contiguous range.
#include <algorithm>
#include <utility>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_models.h"

namespace hkv::testing {
namespace {

using ::testing::ElementsAre;

struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  bool operator<(const Range& o) const { return begin < o.begin; }
};

std::vector<const TensorView*> ViewsOfLayer(const Plan& plan, int32_t layer) {
  std::vector<const TensorView*> out;
  for (const TensorView& v : plan.layout.tensors) {
    if (v.layer == layer) out.push_back(&v);
  }
  return out;
}

// Checks the layout of `plan` exhaustively over every page of every class.
void CheckLayout(const Plan& plan) {
  SCOPED_TRACE(plan.model.source);
  size_t expected_views = 0;
  for (const TensorView& v : plan.layout.tensors) {
    int64_t elements = 1;
    for (int64_t d : v.block_shape)
      elements *= d;
    EXPECT_EQ(v.bytes, elements * DTypeBytes(v.dtype)) << v.layer << v.name;
    EXPECT_LE(v.bytes, v.block_stride);
  }
  EXPECT_TRUE(
      std::is_sorted(plan.layout.tensors.begin(), plan.layout.tensors.end(),
                     [](const TensorView& a, const TensorView& b) { return a.layer < b.layer; }));
  for (const KvGroup& g : plan.groups) {
    const PageClass& c = plan.page_classes[static_cast<size_t>(g.page_class)];
    std::vector<const TensorView*> views;
    for (int32_t layer : g.layers) {
      for (const TensorView* v : ViewsOfLayer(plan, layer)) {
        EXPECT_EQ(v->page_class, c.id);
        views.push_back(v);
      }
    }
    expected_views += views.size();
    std::vector<Range> ranges;
    int64_t real_bytes = 0;  // the group's page without padding layers
    for (const TensorView* v : views)
      real_bytes += v->bytes;
    EXPECT_EQ(
        real_bytes * static_cast<int64_t>(g.layers.size() + static_cast<size_t>(g.padding_layers)),
        g.page_bytes * static_cast<int64_t>(g.layers.size()));
    for (int64_t b = 0; b < c.num_pages; ++b) {
      std::vector<Range> block;
      for (const TensorView* v : views) {
        const int64_t begin = v->offset + b * v->block_stride;
        block.push_back({begin, begin + v->bytes});
      }
      std::sort(block.begin(), block.end());
      if (plan.layout.kind == TensorLayout::kCanonical) {
        // One block of the group is [b * page, b * page + real_bytes), tensors back to back.
        EXPECT_EQ(block.front().begin, b * c.page_bytes);
        for (size_t i = 1; i < block.size(); ++i)
          EXPECT_EQ(block[i].begin, block[i - 1].end);
        EXPECT_EQ(block.back().end, b * c.page_bytes + real_bytes);
      }
      ranges.insert(ranges.end(), block.begin(), block.end());
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 0; i < ranges.size(); ++i) {
      EXPECT_GE(ranges[i].begin, 0);
      EXPECT_LE(ranges[i].end, c.buffer_bytes());
      if (i > 0) {
        EXPECT_LE(ranges[i - 1].end, ranges[i].begin) << "group " << g.id << " overlaps";
      }
    }
  }
  EXPECT_EQ(expected_views, plan.layout.tensors.size());  // no view outside a group
}

TEST(LayoutTest, EveryModelEveryStrategyAndLayoutIsDisjointAndInBounds) {
  for (const ModelSpec& m : {Gemma2Like(), Gemma3Like(), MllamaLike(), MambaHybrid(), MlaModel(),
                             ChunkedModel(), KvSharedModel(), FalconH1Like()}) {
    for (TensorLayout kind : {TensorLayout::kCanonical, TensorLayout::kPerLayer}) {
      for (PageStrategy s :
           {PageStrategy::kAuto, PageStrategy::kSingleClass, PageStrategy::kMultiClass}) {
        PlanOptions o = Options(96 * 1024, 32);
        o.layout = kind;
        o.strategy = s;
        const Result<Plan> plan = MakePlan(m, o);
        if (!plan.ok()) {
          EXPECT_EQ(s, PageStrategy::kSingleClass) << plan.status().ToString();
          continue;
        }
        EXPECT_EQ(plan->layout.kind, kind);
        CheckLayout(*plan);
      }
    }
  }
}

TEST(LayoutTest, CanonicalPacksAGroupsLayersIntoOnePage) {
  const Plan plan = MustPlan(Gemma2Like(), Options());
  ASSERT_EQ(plan.layout.tensors.size(), 8u);
  const TensorView& k2 = plan.layout.tensors[4];
  EXPECT_EQ(k2.layer, 2);
  EXPECT_EQ(k2.name, "k");
  EXPECT_EQ(k2.offset, 512);
  EXPECT_EQ(k2.block_stride, 1024);
  EXPECT_EQ(k2.bytes, 256);
  EXPECT_THAT(k2.block_shape, ElementsAre(16, 2, 4));
  EXPECT_EQ(plan.layout.tensors[5].name, "v");
  EXPECT_EQ(plan.layout.tensors[5].offset, 768);
  EXPECT_EQ(plan.layout.tensors[2].layer, 1);  // first layer of the other group starts at 0
  EXPECT_EQ(plan.layout.tensors[2].offset, 0);
}

TEST(LayoutTest, PerLayerGivesEachSlotAndTensorItsOwnRegion) {
  PlanOptions o = Options();
  o.layout = TensorLayout::kPerLayer;
  const Plan plan = MustPlan(Gemma2Like(), o);
  const int64_t n = plan.page_classes[0].num_pages;
  EXPECT_EQ(plan.page_classes[0].page_bytes, 1024);  // equal slots: same page as canonical
  // Slot 0 of both groups is layers 0 and 1, slot 1 layers 2 and 3.
  const auto offset = [&](int32_t layer, size_t t) { return ViewsOfLayer(plan, layer)[t]->offset; };
  EXPECT_EQ(offset(0, 0), 0);
  EXPECT_EQ(offset(1, 0), 0);
  EXPECT_EQ(offset(0, 1), 256 * n);
  EXPECT_EQ(offset(2, 0), 512 * n);
  EXPECT_EQ(offset(3, 1), 768 * n);
  EXPECT_EQ(ViewsOfLayer(plan, 3)[1]->block_stride, 256);
}

TEST(LayoutTest, PerLayerPageGrowsWhenSlotsDifferAndPoolSizingUsesIt) {
  // Two 32 B/token sliding layers and one 64 B/token full layer: equal 1024-byte pages, one class,
  // but slot 0 must fit a 512-byte K and V, slot 1 a 256-byte K and V.
  const ModelSpec m = Model("unequal-slots", {Sliding(0, 32), Sliding(1, 32),
                                              Attention(2, LayerKind::kFullAttention, 4)});
  const Plan canonical = MustPlan(m, Options());
  ASSERT_EQ(canonical.page_classes.size(), 1u);
  EXPECT_EQ(canonical.page_classes[0].page_bytes, 1024);
  EXPECT_EQ(canonical.num_pages(), 1024);

  PlanOptions o = Options();
  o.layout = TensorLayout::kPerLayer;
  const Plan per_layer = MustPlan(m, o);
  ASSERT_EQ(per_layer.page_classes.size(), 1u);
  EXPECT_EQ(per_layer.page_classes[0].page_bytes, 512 + 512 + 256 + 256);
  EXPECT_EQ(per_layer.num_pages(), kMiB / 1536);
  EXPECT_EQ(per_layer.PlanningFootprint().hybridkv_bytes, 10 * 1536);
  // Ideal at T = 128: 2 sliding layers x 32 tokens x 32 bytes + 128 tokens x 64 bytes = 10240.
  EXPECT_EQ(per_layer.candidates[1].wasted_bytes, 10 * 1536 - 10240);
  CheckLayout(per_layer);
}

TEST(LayoutTest, MlaKeepsOneLatentPerLayer) {
  const Plan plan = MustPlan(MlaModel(), Options());
  ASSERT_EQ(plan.layout.tensors.size(), 3u);
  const TensorView& v = plan.layout.tensors[1];
  EXPECT_EQ(v.name, "latent");
  EXPECT_THAT(v.block_shape, ElementsAre(16, 1, 24));
  EXPECT_EQ(v.bytes, 768);
  EXPECT_EQ(v.offset, 768);
}

TEST(LayoutTest, StateTensorsKeepTheirNamesShapesAndDtypes) {
  const Plan plan = MustPlan(MambaHybrid(), Options());
  const auto views = ViewsOfLayer(plan, 1);
  ASSERT_EQ(views.size(), 2u);
  EXPECT_EQ(views[0]->name, "conv");
  EXPECT_THAT(views[0]->block_shape, ElementsAre(3, 40));
  EXPECT_EQ(views[0]->offset, kMambaStateBytes);
  EXPECT_EQ(views[1]->name, "ssm");
  EXPECT_THAT(views[1]->block_shape, ElementsAre(4, 8, 16));
  EXPECT_EQ(views[1]->offset, kMambaStateBytes + 240);
  EXPECT_EQ(views[1]->block_stride, 6 * kMambaStateBytes);
  EXPECT_EQ(views[1]->page_class, 0);
}

TEST(LayoutTest, SharedAndMlpLayersHaveNoTensors) {
  const Plan plan = MustPlan(KvSharedModel(), Options());
  EXPECT_EQ(plan.layout.tensors.size(), 8u);
  EXPECT_TRUE(ViewsOfLayer(plan, 4).empty());
  EXPECT_TRUE(ViewsOfLayer(plan, 5).empty());
  EXPECT_TRUE(ViewsOfLayer(plan, 6).empty());
}

}  // namespace
}  // namespace hkv::testing
