// The hybridkv Python module: the library's KV-cache manager for engines that schedule in Python.
#include <string>

#include <pybind11/pybind11.h>

#include <hkv/common/version.h>

#include "bindings.h"
#include "status_error.h"

// The compiled part of the `hybridkv` package; python/hybridkv/__init__.py re-exports it.
PYBIND11_MODULE(_hybridkv, m) {
  m.doc() =
      "hybridkv: KV-cache memory management for hybrid LLMs (full, sliding-window, chunked, "
      "cross-attention, MLA and recurrent layers).\n\n"
      "Load a model config, plan its memory (make_plan / make_allocator), create a KvCacheManager "
      "and drive it per step: add_request, lookup, allocate, commit, append_tokens, free. Block "
      "tables and slot mappings come out as numpy arrays. Errors raise hybridkv.Error subclasses "
      "with the library's message; a failed call changes nothing.";
  m.attr("__version__") = std::string(hkv::Version());
  hkv::python::RegisterErrors(m);
  hkv::python::BindModel(m);
  hkv::python::BindManager(m);
  hkv::python::BindTrace(m);
  hkv::python::BindVllm(m);
}
