// Block streams: export from one layout and import into another moves exactly each tensor's
// bytes with identities intact; corrupt, truncated or mismatched streams and bad destinations
// are refused with the destination untouched.
#include <gtest/gtest.h>

#include <hkv/connector/block_stream.h>

#include "connector_test_util.h"

namespace hkv::testing {
namespace {

PrefixKey Key(int32_t group, uint64_t n) {
  return PrefixKey{BlockHash{n * 0x9E3779B97F4A7C15ull, ~n}, group};
}

// Up to three blocks of every group of `plan`, every block id used once per pool, spread over
// the pool; keyed every other one.
std::vector<ExportBlock> SomeBlocks(const Plan& plan, const BlockMemoryView& view) {
  std::vector<ExportBlock> out;
  std::vector<int64_t> used(plan.page_classes.size(), 0);
  for (const KvGroup& g : plan.groups) {
    const int64_t first = view.first_block(g.page_class);
    const int64_t n = view.num_blocks(g.page_class);
    int64_t& k = used[static_cast<size_t>(g.page_class)];
    for (int i = 0; i < 3 && k < n; ++i, ++k) {
      ExportBlock e{g.id, first + (k * 7919) % n, std::nullopt};  // 7919 is prime: no repeats
      if (n % 7919 == 0) e.block = first + k;
      if (out.size() % 2 == 0) e.key = Key(g.id, out.size() + 1);
      out.push_back(e);
    }
  }
  return out;
}

// Destination ids: each pool's blocks from its last one down, so ids differ from the source's.
// Two-level pools share the slabs, so there pool p writes only to slab p (as if the arena had
// given it that slab) and pools never alias.
std::vector<int64_t> Destinations(const Plan& plan, const BlockMemoryView& dst,
                                  std::span<const ExportBlock> src) {
  std::vector<int64_t> out;
  std::vector<int64_t> used(static_cast<size_t>(dst.num_pools()), 0);
  for (const ExportBlock& e : src) {
    const int32_t pool = dst.group(e.group).pool;
    const int64_t k = used[static_cast<size_t>(pool)]++;
    const int64_t per = plan.page_classes[static_cast<size_t>(pool)].pages_per_slab;
    out.push_back(per > 0 ? 1 + pool * per + per - 1 - k
                          : dst.first_block(pool) + dst.num_blocks(pool) - 1 - k);
  }
  return out;
}

void RoundTrip(const Plan& src_plan, const Plan& dst_plan) {
  SCOPED_TRACE(std::string(TensorLayoutName(src_plan.layout.kind)) + " -> " +
               std::string(TensorLayoutName(dst_plan.layout.kind)) + ", " +
               std::string(PageStrategyName(dst_plan.strategy)));
  PlanMemory src(src_plan, 11), dst(dst_plan, 12);
  const BlockMemoryView src_view = src.View(src_plan);
  const BlockMemoryView dst_view = dst.View(dst_plan);
  const std::vector<ExportBlock> blocks = SomeBlocks(src_plan, src_view);
  Result<std::vector<unsigned char>> stream = ExportBlocks(src_view, blocks);
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  EXPECT_EQ(static_cast<int64_t>(stream->size()), *ExportedBytes(src_view, blocks));

  Result<std::vector<StreamBlock>> parsed = ParseBlockStream(*stream);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ASSERT_EQ(parsed->size(), blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    const StreamBlock& p = (*parsed)[i];
    EXPECT_EQ(p.group, blocks[i].group);
    EXPECT_EQ(p.pool, src_plan.groups[static_cast<size_t>(p.group)].page_class);
    EXPECT_EQ(p.key, blocks[i].key);
    EXPECT_EQ(p.checkpoint, src_plan.groups[static_cast<size_t>(p.group)].is_state());
  }

  const std::vector<int64_t> to = Destinations(dst_plan, dst_view, blocks);
  const Status imported = ImportBlocks(dst_view, std::span<const unsigned char>(*stream), to);
  ASSERT_TRUE(imported.ok()) << imported.ToString();
  // Every tensor of every moved block, addressed by each plan on its own, carries the same bytes.
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto src_views = GroupViews(src_plan, blocks[i].group);
    const auto dst_views = GroupViews(dst_plan, blocks[i].group);
    ASSERT_EQ(src_views.size(), dst_views.size());
    for (size_t t = 0; t < src_views.size(); ++t) {
      ASSERT_EQ(src.TensorBytes(src_plan, *src_views[t], blocks[i].block),
                dst.TensorBytes(dst_plan, *dst_views[t], to[i]))
          << "block " << i << " tensor " << src_views[t]->layer << src_views[t]->name;
    }
  }
}

TEST(BlockStreamTest, RoundTripsBetweenLayouts) {
  for (const ModelSpec& m : {MambaHybrid(), Gemma2Like(), FalconH1Like(), MlaModel()}) {
    const Plan canonical = PlanOf(m, TensorLayout::kCanonical, PageStrategy::kMultiClass);
    const Plan per_layer = PlanOf(m, TensorLayout::kPerLayer, PageStrategy::kMultiClass);
    RoundTrip(canonical, per_layer);
    RoundTrip(per_layer, canonical);
    RoundTrip(canonical, canonical);
  }
  const Plan two_level =
      PlanOf(MambaHybrid(), TensorLayout::kCanonical, PageStrategy::kTwoLevel, 8 * kMiB);
  const Plan per_layer = PlanOf(MambaHybrid(), TensorLayout::kPerLayer, PageStrategy::kMultiClass);
  RoundTrip(two_level, per_layer);
  RoundTrip(per_layer, two_level);
}

// A fixture holding a valid stream and a destination whose bytes must survive every refusal.
class RefusalTest : public ::testing::Test {
 protected:
  RefusalTest()
      : src_plan_(PlanOf(MambaHybrid(), TensorLayout::kCanonical, PageStrategy::kMultiClass)),
        dst_plan_(PlanOf(MambaHybrid(), TensorLayout::kPerLayer, PageStrategy::kMultiClass)),
        src_(src_plan_, 5),
        dst_(dst_plan_, 6),
        src_view_(src_.View(src_plan_)),
        dst_view_(dst_.View(dst_plan_)),
        blocks_(SomeBlocks(src_plan_, src_view_)),
        stream_(ExportBlocks(src_view_, blocks_).value()),
        to_(Destinations(dst_plan_, dst_view_, blocks_)),
        before_(dst_.bytes) {}

  // Import must fail with `code` and a message containing `what`, writing nothing.
  void ExpectRefused(std::span<const unsigned char> stream, std::span<const int64_t> to,
                     StatusCode code, const std::string& what) {
    const Status s = ImportBlocks(dst_view_, stream, to);
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
    EXPECT_TRUE(dst_.bytes == before_) << "a refused import wrote to the destination";
  }

  Plan src_plan_, dst_plan_;
  PlanMemory src_, dst_;
  BlockMemoryView src_view_, dst_view_;
  std::vector<ExportBlock> blocks_;
  std::vector<unsigned char> stream_;
  std::vector<int64_t> to_;
  std::vector<std::vector<unsigned char>> before_;
};

TEST_F(RefusalTest, AnyFlippedByteIsRefused) {
  // Every byte of the stream matters: header fields, block headers, checksums and images.
  SplitMix64 rng(99);
  for (int trial = 0; trial < 400; ++trial) {
    std::vector<unsigned char> bad = stream_;
    const size_t at = trial < 96 ? static_cast<size_t>(trial) : rng.Next() % bad.size();
    bad[at] ^= static_cast<unsigned char>(1u << (rng.Next() % 8));
    const Status s = ImportBlocks(dst_view_, std::span<const unsigned char>(bad), to_);
    ASSERT_FALSE(s.ok()) << "flipped byte " << at << " was accepted";
    ASSERT_TRUE(dst_.bytes == before_) << "byte " << at;
  }
  ExpectRefused(std::span(stream_).subspan(0, 0), to_, StatusCode::kParseError, "shorter");
}

// The one-pass import: the same bytes land as with ImportBlocks; every flipped byte is still
// refused - structural damage before anything is written; damage the checksum covers (an image,
// a key, the checksum itself) once found while copying, after which the destinations are the
// caller's to discard.
TEST_F(RefusalTest, TheOnePassImportCopiesTheSameAndCatchesEveryFlippedByte) {
  PlanMemory other(dst_plan_, 6);
  const BlockMemoryView other_view = other.View(dst_plan_);
  ASSERT_TRUE(ImportBlocks(other_view, std::span<const unsigned char>(stream_), to_).ok());
  const std::vector<StreamBlock> parsed = ParseBlockStreamHeaders(stream_).value();
  ASSERT_TRUE(ImportBlocksVerifying(dst_view_, parsed, to_).ok());
  EXPECT_TRUE(dst_.bytes == other.bytes);
  SplitMix64 rng(7);
  int written = 0;
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<unsigned char> bad = stream_;
    const size_t at = trial < 96 ? static_cast<size_t>(trial) : rng.Next() % bad.size();
    bad[at] ^= static_cast<unsigned char>(1u << (rng.Next() % 8));
    std::vector<std::vector<unsigned char>> before = dst_.bytes;
    auto headers = ParseBlockStreamHeaders(bad);
    const Status s =
        headers.ok() ? ImportBlocksVerifying(dst_view_, *headers, to_) : headers.status();
    ASSERT_FALSE(s.ok()) << "flipped byte " << at << " was accepted";
    // Only a checksum failure - found while copying - may have written the destinations.
    if (dst_.bytes != before) {
      ++written;
      ASSERT_NE(s.message().find("fails its checksum"), std::string::npos)
          << "byte " << at << ": " << s.ToString();
    }
  }
  EXPECT_GT(written, 0);  // image damage is found while copying
  // Destinations are checked before anything is written, as ImportBlocks does.
  std::vector<int64_t> outside = to_;
  outside.back() = int64_t{1} << 40;
  const std::vector<std::vector<unsigned char>> before = dst_.bytes;
  EXPECT_EQ(ImportBlocksVerifying(dst_view_, parsed, outside).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(dst_.bytes == before);
}

TEST_F(RefusalTest, CorruptImageNamesItsBlock) {
  std::vector<unsigned char> bad = stream_;
  bad[bad.size() - 1] ^= 0x10;  // the last block's image
  ExpectRefused(bad, to_, StatusCode::kParseError,
                "block " + std::to_string(blocks_.size() - 1) + " fails its checksum");
}

TEST_F(RefusalTest, TruncatedOrPaddedStreamIsRefused) {
  for (size_t cut : {size_t{1}, size_t{64}, stream_.size() / 2, stream_.size() - 40}) {
    ExpectRefused(std::span(stream_).first(stream_.size() - cut), to_, StatusCode::kParseError,
                  "truncated");
  }
  std::vector<unsigned char> padded = stream_;
  padded.push_back(0);
  ExpectRefused(padded, to_, StatusCode::kParseError, "truncated or padded");
}

TEST_F(RefusalTest, WrongDestinationsAreRefused) {
  ExpectRefused(stream_, std::span(to_).first(to_.size() - 1), StatusCode::kInvalidArgument,
                "destination blocks for a stream of");
  std::vector<int64_t> out_of_range = to_;
  out_of_range.back() = dst_view_.num_blocks(dst_view_.group(blocks_.back().group).pool);
  ExpectRefused(stream_, out_of_range, StatusCode::kInvalidArgument, "outside pool");
  std::vector<int64_t> twice = to_;
  twice[1] = twice[0];  // blocks 0 and 1 are of the same group
  ASSERT_EQ(blocks_[0].group, blocks_[1].group);
  ExpectRefused(stream_, twice, StatusCode::kInvalidArgument, "destination of two stream blocks");
}

TEST_F(RefusalTest, OtherGeometryIsRefused) {
  // Same group structure, other head count: the images have other sizes and meanings.
  ModelSpec wider = MambaHybrid();
  for (LayerSpec& l : wider.layers) {
    if (l.kind == LayerKind::kFullAttention) l.num_kv_heads = 4;
  }
  const Plan other = PlanOf(wider, TensorLayout::kCanonical, PageStrategy::kMultiClass);
  PlanMemory mem(other, 8);
  const BlockMemoryView other_view = mem.View(other);
  const std::vector<ExportBlock> blocks = SomeBlocks(other, other_view);
  const std::vector<unsigned char> stream = ExportBlocks(other_view, blocks).value();
  ExpectRefused(stream, Destinations(dst_plan_, dst_view_, blocks), StatusCode::kInvalidArgument,
                "does not match the destination's geometry");
}

// Stream header 32 bytes, then block 0's header: flags at +8, a reserved field at +48.
TEST_F(RefusalTest, UnknownFlagsAndReservedFieldsAreNamedApart) {
  std::vector<unsigned char> flags = stream_;
  flags[32 + 8] |= 0x80;
  ExpectRefused(flags, to_, StatusCode::kParseError, "block 0 has unknown flags 0x");
  std::vector<unsigned char> reserved = stream_;
  reserved[32 + 48] = 1;
  ExpectRefused(reserved, to_, StatusCode::kParseError,
                "block 0 has reserved field 0x1: expected 0");
}

// Headers that parse but describe a block of another pool, kind, size or origin than the
// destination group's: each difference is named on its own, before anything is written.
TEST_F(RefusalTest, EachGeometryMismatchIsNamed) {
  const std::vector<StreamBlock> parsed = ParseBlockStreamHeaders(stream_).value();
  const auto refused = [&](void (*edit)(StreamBlock&), const std::string& what) {
    std::vector<StreamBlock> bad = parsed;
    edit(bad[0]);
    const Status s = ImportBlocksVerifying(dst_view_, bad, to_);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << what;
    EXPECT_NE(s.message().find("block 0 of group"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
    EXPECT_TRUE(dst_.bytes == before_) << what;
  };
  refused([](StreamBlock& b) { ++b.pool; }, "the group's blocks are of pool");
  refused([](StreamBlock& b) { b.checkpoint = !b.checkpoint; },
          parsed[0].checkpoint ? "it holds tokens" : "it is a state checkpoint");
  refused([](StreamBlock& b) { b.image = b.image.first(b.image.size() - 1); },
          "image bytes, the group's blocks have");
  refused([](StreamBlock& b) { b.fingerprint ^= 1; }, "other layers or tensor shapes");
}

TEST_F(RefusalTest, BadExportsAreRefusedAndWriteNothing) {
  std::vector<unsigned char> out(stream_.size(), 0xAB);
  const std::vector<unsigned char> untouched = out;
  std::vector<ExportBlock> bad = blocks_;
  bad.back().group = src_view_.num_groups();
  Status s = ExportBlocks(src_view_, bad, out);
  EXPECT_NE(s.message().find("names group"), std::string::npos) << s.ToString();
  bad = blocks_;
  bad.back().block = -3;
  s = ExportBlocks(src_view_, bad, out);
  EXPECT_NE(s.message().find("outside pool"), std::string::npos) << s.ToString();
  bad = blocks_;
  bad.front().key = Key(bad.front().group + 1, 1);
  s = ExportBlocks(src_view_, bad, out);
  EXPECT_NE(s.message().find("prefix key of group"), std::string::npos) << s.ToString();
  s = ExportBlocks(src_view_, blocks_, std::span(out).first(out.size() - 1));
  EXPECT_NE(s.message().find("the output has"), std::string::npos) << s.ToString();
  EXPECT_EQ(out, untouched);
  // The right size exports the same stream as the allocating form.
  ASSERT_TRUE(ExportBlocks(src_view_, blocks_, out).ok());
  EXPECT_EQ(out, stream_);
}

}  // namespace
}  // namespace hkv::testing
