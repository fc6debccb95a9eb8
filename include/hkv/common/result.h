// Result<T>: either a value or the failed Status that explains why there is none.
//
// Contract: a Result built from a Status must be given a failed one (an OK status without a value
// is a programming error and aborts). value() on a failed Result aborts with the status message, so
// callers check ok() first; tests may call value() directly to fail loudly.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <utility>

#include <hkv/common/status.h>

namespace hkv {

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design, like expected<T>
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.ok()) Die("Result constructed from an OK status without a value");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  const T& value() const& {
    if (!ok()) Die(status_.ToString().c_str());
    return *value_;
  }
  T& value() & {
    if (!ok()) Die(status_.ToString().c_str());
    return *value_;
  }
  T&& value() && {
    if (!ok()) Die(status_.ToString().c_str());
    return std::move(*value_);
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  [[noreturn]] static void Die(const char* why) {
    std::fprintf(stderr, "hkv::Result: value() on a failed result: %s\n", why);
    std::abort();
  }

  std::optional<T> value_;
  Status status_;
};

}  // namespace hkv

// Evaluates a Result-returning expression; on failure returns its Status, otherwise assigns the
// value to `lhs` (which may be a declaration).
#define HKV_ASSIGN_OR_RETURN(lhs, expr) \
  HKV_ASSIGN_OR_RETURN_IMPL(HKV_CONCAT(hkv_res_, __LINE__), lhs, expr)
#define HKV_CONCAT_INNER(a, b) a##b
#define HKV_CONCAT(a, b) HKV_CONCAT_INNER(a, b)
#define HKV_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
