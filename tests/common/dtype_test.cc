#include <gtest/gtest.h>

#include <hkv/common/dtype.h>

namespace hkv {
namespace {

TEST(DTypeTest, SizesAndNamesRoundTrip) {
  for (DType d : {DType::kBF16, DType::kFP16, DType::kFP32, DType::kFP8}) {
    EXPECT_EQ(*ParseDType(DTypeName(d)), d);
  }
  EXPECT_EQ(DTypeBytes(DType::kBF16), 2);
  EXPECT_EQ(DTypeBytes(DType::kFP16), 2);
  EXPECT_EQ(DTypeBytes(DType::kFP32), 4);
  EXPECT_EQ(DTypeBytes(DType::kFP8), 1);
}

TEST(DTypeTest, AcceptsHuggingFaceSpellings) {
  EXPECT_EQ(*ParseDType("bfloat16"), DType::kBF16);
  EXPECT_EQ(*ParseDType("float16"), DType::kFP16);
  EXPECT_EQ(*ParseDType("Float32"), DType::kFP32);
  EXPECT_EQ(*ParseDType("fp8_e4m3"), DType::kFP8);
}

TEST(DTypeTest, RejectsUnknownNames) {
  const Result<DType> r = ParseDType("int3");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'int3'"), std::string::npos);
  EXPECT_NE(r.status().message().find("bf16, fp16, fp32, fp8"), std::string::npos);
}

}  // namespace
}  // namespace hkv
