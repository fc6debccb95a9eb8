// The parts of the hybridkv Python module, one function per part of the library it exposes.
#pragma once

#include <cstdint>
#include <string>
#include <variant>

#include <pybind11/pybind11.h>

namespace hkv::python {

// A byte budget given as a number of bytes or as text such as "16GiB".
using ByteSize = std::variant<int64_t, std::string>;
int64_t ToBytes(const ByteSize& size, const char* what);

void BindModel(pybind11::module_& m);    // load_model, make_plan, make_allocator, ManagerConfig
void BindManager(pybind11::module_& m);  // KvCacheManager and the values it exchanges
void BindTrace(pybind11::module_& m);    // generate_trace, read_trace, ideal_hit_rate
void BindVllm(pybind11::module_& m);     // VllmCore, the core of hybridkv.vllm

}  // namespace hkv::python
