#include <gtest/gtest.h>

#include <hkv/common/byte_size.h>

namespace hkv {
namespace {

TEST(ByteSizeTest, ParsesBinaryAndDecimalUnits) {
  EXPECT_EQ(*ParseByteSize("4096"), 4096);
  EXPECT_EQ(*ParseByteSize("16GiB"), int64_t{16} << 30);
  EXPECT_EQ(*ParseByteSize("16gib"), int64_t{16} << 30);
  EXPECT_EQ(*ParseByteSize("512 MiB"), int64_t{512} << 20);
  EXPECT_EQ(*ParseByteSize("1.5KiB"), 1536);
  EXPECT_EQ(*ParseByteSize("40GB"), int64_t{40'000'000'000});
  EXPECT_EQ(*ParseByteSize("2T"), int64_t{2} << 40);
  EXPECT_EQ(*ParseByteSize("0"), 0);
}

TEST(ByteSizeTest, RejectsMalformedTextNamingIt) {
  for (const char* bad : {"", "GiB", "-1GiB", "12 parsecs", "1.2.3", "1e3", "9999999999TiB"}) {
    const Result<int64_t> r = ParseByteSize(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(std::string("'") + bad + "'"), std::string::npos)
        << r.status().message();
  }
}

TEST(ByteSizeTest, FormatsWithBinaryUnits) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(int64_t{16} << 30), "16.00 GiB");
}

TEST(ByteSizeTest, CeilDiv) {
  EXPECT_EQ(CeilDiv(0, 16), 0);
  EXPECT_EQ(CeilDiv(1, 16), 1);
  EXPECT_EQ(CeilDiv(16, 16), 1);
  EXPECT_EQ(CeilDiv(17, 16), 2);
}

}  // namespace
}  // namespace hkv
