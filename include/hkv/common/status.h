// Status: the outcome of an operation that can fail.
//
// Contract: every fallible hybridkv call returns a Status (or a Result<T>, which carries one).
// An OK status has an empty message. A failed status has a code saying what class of problem it
// was and a message written for the person who must fix it: it names the input (file, field,
// request, argument), the offending value, and what was expected. A call that returns a failed
// status has not changed any state the caller can observe.
#pragma once

#include <string>
#include <string_view>
#include <utility>

namespace hkv {

enum class StatusCode : unsigned char {
  kOk = 0,
  kInvalidArgument,     // a caller-supplied value is out of range or malformed
  kNotFound,            // a named thing (file, request, field) does not exist
  kIoError,             // the operating system refused a read or write
  kParseError,          // input text is not valid for its format (e.g. JSON)
  kUnsupported,         // well-formed input that this version cannot handle
  kResourceExhausted,   // a budget (memory, blocks) cannot satisfy the request
  kFailedPrecondition,  // the object is not in a state that allows the call
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  static Status InvalidArgument(std::string msg) {
    return {StatusCode::kInvalidArgument, std::move(msg)};
  }
  static Status NotFound(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
  static Status IoError(std::string msg) { return {StatusCode::kIoError, std::move(msg)}; }
  static Status ParseError(std::string msg) { return {StatusCode::kParseError, std::move(msg)}; }
  static Status Unsupported(std::string msg) { return {StatusCode::kUnsupported, std::move(msg)}; }
  static Status ResourceExhausted(std::string msg) {
    return {StatusCode::kResourceExhausted, std::move(msg)};
  }
  static Status FailedPrecondition(std::string msg) {
    return {StatusCode::kFailedPrecondition, std::move(msg)};
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "<code name>: <message>", or "OK".
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace hkv

// Propagates a failed Status out of the enclosing function.
#define HKV_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::hkv::Status hkv_status_ = (expr);        \
    if (!hkv_status_.ok()) return hkv_status_; \
  } while (false)
