#include "status_error.h"

#include <string>

#include <Python.h>

namespace hkv::python {
namespace {

// Owned for the interpreter's life: the module holds a reference to each class too.
struct ErrorClasses {
  PyObject* base = nullptr;
  PyObject* by_code[16] = {};
};
ErrorClasses g_errors;

// A new exception class deriving from `a` (and `b`, unless null), added to the module.
PyObject* NewClass(pybind11::module_& m, const char* name, PyObject* a, PyObject* b,
                   const char* doc) {
  const std::string qualified = std::string("hybridkv.") + name;
  PyObject* bases = b == nullptr ? PyTuple_Pack(1, a) : PyTuple_Pack(2, a, b);
  if (bases == nullptr) throw pybind11::error_already_set();
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  Py_DECREF(bases);
  if (cls == nullptr) throw pybind11::error_already_set();
  m.add_object(name, pybind11::handle(cls));  // the module takes its own reference
  return cls;
}

}  // namespace

void RegisterErrors(pybind11::module_& m) {
  g_errors.base = NewClass(m, "Error", PyExc_RuntimeError, nullptr,
                           "Base class of every error hybridkv raises; str() is the library's "
                           "message, naming what was wrong.");
  struct Spec {
    StatusCode code;
    const char* name;
    PyObject* also;
    const char* doc;
  };
  const Spec specs[] = {
      {StatusCode::kInvalidArgument, "InvalidArgumentError", PyExc_ValueError,
       "A value passed in is out of range or malformed."},
      {StatusCode::kNotFound, "NotFoundError", PyExc_LookupError,
       "A named thing (file, request, field) does not exist."},
      {StatusCode::kIoError, "IoError", PyExc_OSError, "The operating system refused a read."},
      {StatusCode::kParseError, "ParseError", PyExc_ValueError, "Input text is not valid."},
      {StatusCode::kUnsupported, "UnsupportedError", nullptr,
       "Well-formed input this version cannot handle."},
      {StatusCode::kResourceExhausted, "ResourceExhaustedError", nullptr,
       "Not enough blocks (or memory) for the call; nothing changed."},
      {StatusCode::kFailedPrecondition, "FailedPreconditionError", nullptr,
       "The object is not in a state that allows the call; nothing changed."},
  };
  for (const Spec& s : specs) {
    g_errors.by_code[static_cast<int>(s.code)] = NewClass(m, s.name, g_errors.base, s.also, s.doc);
  }
  pybind11::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      PyObject* cls = g_errors.by_code[static_cast<int>(e.status().code())];
      PyErr_SetString(cls != nullptr ? cls : g_errors.base, e.what());
    }
  });
}

}  // namespace hkv::python
