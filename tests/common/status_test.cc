#include <gtest/gtest.h>

#include <hkv/common/result.h>
#include <hkv/common/status.h>

namespace hkv {
namespace {

Status FailWhenNegative(int x) {
  if (x < 0) return Status::InvalidArgument("x is negative");
  return Status::Ok();
}

Status Chain(int x, int* calls) {
  HKV_RETURN_IF_ERROR(FailWhenNegative(x));
  ++*calls;
  return Status::Ok();
}

Result<int> Half(int x) {
  if (x % 2 != 0) return Status::InvalidArgument("odd");
  return x / 2;
}

Result<int> Quarter(int x) {
  HKV_ASSIGN_OR_RETURN(int h, Half(x));
  HKV_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(StatusTest, OkAndErrorsRenderTheirCodeAndMessage) {
  EXPECT_TRUE(Status::Ok().ok());
  EXPECT_EQ(Status::Ok().ToString(), "OK");
  const Status s = Status::NotFound("request 7");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.ToString(), "not found: request 7");
}

TEST(StatusTest, ReturnIfErrorStopsAtTheFirstFailure) {
  int calls = 0;
  EXPECT_TRUE(Chain(1, &calls).ok());
  EXPECT_EQ(calls, 1);
  const Status s = Chain(-1, &calls);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(calls, 1);
}

TEST(ResultTest, AssignOrReturnPropagatesValuesAndErrors) {
  ASSERT_TRUE(Quarter(12).ok());
  EXPECT_EQ(*Quarter(12), 3);
  EXPECT_EQ(Quarter(6).status().message(), "odd");
  EXPECT_EQ(Quarter(5).status().code(), StatusCode::kInvalidArgument);
}

TEST(ResultDeathTest, ValueOfAFailedResultAbortsWithTheMessage) {
  EXPECT_DEATH((void)Half(3).value(), "odd");
}

}  // namespace
}  // namespace hkv
