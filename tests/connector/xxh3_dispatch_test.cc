// The checksum path chosen at run time (AVX2 XXH3 where the CPU has it) gives XXH3's digest
// exactly: one-shot and streamed over any chunking, for every length around the vector and stripe
// sizes - so what one machine wrote, another (or the SSE2 build of this test) reads back.
#include "../../src/connector/xxh3_dispatch.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include <hkv/common/splitmix64.h>
#include <hkv/connector/block_stream.h>

#include "connector_test_util.h"

namespace hkv {
namespace {

using connector_format::Xxh3Update;
using connector_format::Xxh3WithSeed;

TEST(Xxh3DispatchTest, DigestsEqualTheBaselineBuildForEveryLengthAndChunking) {
  SplitMix64 rng(42);
  std::vector<unsigned char> data(300000);
  for (unsigned char& b : data)
    b = static_cast<unsigned char>(rng.Next());
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 300; ++n)
    lengths.push_back(n);
  for (size_t n : {1023, 1024, 1025, 4095, 4096, 65536, 131071, 131072, 131073, 299999})
    lengths.push_back(n);
  for (size_t n : lengths) {
    const uint64_t seed = rng.Next();
    // This file is built for the baseline: XXH3_* here is the SSE2 code.
    const uint64_t want = XXH3_64bits_withSeed(data.data(), n, seed);
    ASSERT_EQ(Xxh3WithSeed(data.data(), n, seed), want) << n;
    XXH3_state_t state;
    // A state on the stack must be initialised before its first seeded reset: the reset skips
    // deriving the secret when the old contents happen to name the same seed.
    XXH3_INITSTATE(&state);
    XXH3_64bits_reset_withSeed(&state, seed);
    for (size_t done = 0; done < n;) {
      const size_t step = std::min<size_t>(n - done, 1 + rng.Below(70000));
      Xxh3Update(&state, data.data() + done, step);
      done += step;
    }
    ASSERT_EQ(XXH3_64bits_digest(&state), want) << n;
  }
  RecordProperty("avx2", connector_format::Xxh3UsesAvx2() ? "yes" : "no");
}

// A stream's checksums, recomputed here with the baseline XXH3 from the format's definition
// (XXH3 of the header's first 56 bytes seeds the image's XXH3).
TEST(Xxh3DispatchTest, StreamChecksumsAreXxh3OfTheFormat) {
  const Plan plan =
      testing::PlanOf(testing::MambaHybrid(), TensorLayout::kCanonical, PageStrategy::kAuto);
  testing::PlanMemory memory(plan, 5);
  const BlockMemoryView view = memory.View(plan);
  std::vector<ExportBlock> blocks;
  for (int32_t g = 0; g < view.num_groups(); ++g)
    blocks.push_back({g, view.first_block(view.group(g).pool), std::nullopt});
  const std::vector<unsigned char> stream = ExportBlocks(view, blocks).value();
  size_t at = 32;
  for (const ExportBlock& b : blocks) {
    const unsigned char* header = stream.data() + at;
    const size_t image = static_cast<size_t>(view.group(b.group).image_bytes);
    const uint64_t seed = XXH3_64bits(header, 56);
    uint64_t stored = 0;
    for (int i = 0; i < 8; ++i)
      stored |= static_cast<uint64_t>(header[56 + i]) << (8 * i);
    EXPECT_EQ(XXH3_64bits_withSeed(header + 64, image, seed), stored) << b.group;
    at += 64 + image;
  }
  EXPECT_EQ(at, stream.size());
}

TEST(Xxh3DispatchTest, StreamingCopyEqualsMemcpyForEveryAlignmentAndLength) {
  SplitMix64 rng(9);
  std::vector<unsigned char> src(5100), dst(5100), want(5100);
  for (unsigned char& b : src)
    b = static_cast<unsigned char>(rng.Next());
  for (size_t dst_off = 0; dst_off < 40; ++dst_off) {
    for (size_t len : {size_t{0}, size_t{1}, size_t{31}, size_t{63}, size_t{64}, size_t{95},
                       size_t{96}, size_t{127}, size_t{128}, size_t{1000}, size_t{4999}}) {
      const size_t src_off = (dst_off * 7) % 3;
      std::fill(dst.begin(), dst.end(), 0xee);
      want = dst;
      std::memcpy(want.data() + dst_off, src.data() + src_off, len);
      connector_format::CopyStreaming(dst.data() + dst_off, src.data() + src_off, len);
      ASSERT_EQ(dst, want) << dst_off << " " << len;  // bytes around it untouched too
    }
  }
}

}  // namespace
}  // namespace hkv
