// Status -> Python exception mapping for the hybridkv module.
//
// Contract: every library error surfaces in Python as a subclass of hybridkv.Error carrying the
// library's message unchanged; the subclass follows the StatusCode (InvalidArgumentError is also a
// ValueError, NotFoundError a LookupError, IoError an OSError, so idiomatic `except` clauses
// work). Throw / Check / Value may run without the GIL: they throw a C++ exception that pybind11
// translates once the GIL is held again.
#pragma once

#include <stdexcept>
#include <utility>

#include <pybind11/pybind11.h>

#include <hkv/common/result.h>
#include <hkv/common/status.h>

namespace hkv::python {

class StatusError : public std::runtime_error {
 public:
  explicit StatusError(Status status)
      : std::runtime_error(status.message()), status_(std::move(status)) {}
  const Status& status() const { return status_; }

 private:
  Status status_;
};

inline void Check(const Status& status) {
  if (!status.ok()) throw StatusError(status);
}

template <typename T>
T Value(Result<T> result) {
  if (!result.ok()) throw StatusError(result.status());
  return std::move(result).value();
}

// Creates the exception classes in `m` and registers the translator.
void RegisterErrors(pybind11::module_& m);

}  // namespace hkv::python
