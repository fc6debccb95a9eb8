// Traces (replay.md): the generator, the JSONL reader, and the C++ reference loop the binding
// benchmark compares Python against.
#include <string>

#include <fmt/format.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <hkv/sim/trace.h>
#include <hkv/sim/trace_generator.h>

#include "bindings.h"
#include "manager_handle.h"
#include "status_error.h"

namespace py = pybind11;

namespace hkv::python {
namespace {

py::array_t<int32_t> ToArray(const std::vector<int32_t>& v) {
  py::array_t<int32_t> a(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

py::list ToPython(const Trace& trace) {
  py::list out;
  for (const TraceRequest& t : trace) {
    py::dict d;
    d["id"] = t.id;
    d["arrival_step"] = t.arrival_step;
    d["prompt"] = ToArray(t.prompt);
    d["output_len"] = t.output_len;
    d["output"] = ToArray(t.output);
    d["session"] = t.session;
    d["turn"] = t.turn;
    out.append(d);
  }
  return out;
}

}  // namespace

void BindTrace(py::module_& m) {
  m.def(
      "generate_trace",
      [](int64_t requests, uint64_t seed, double session_gap,
         const std::optional<std::filesystem::path>& path) {
        TraceGenOptions o;
        o.num_requests = requests;
        o.seed = seed;
        o.session_gap = session_gap;
        Trace trace;
        {
          py::gil_scoped_release release;
          trace = Value(GenerateTrace(o));
          if (path) Check(WriteTraceFile(trace, *path));
        }
        return ToPython(trace);
      },
      py::kw_only(), py::arg("requests") = 200, py::arg("seed") = 1, py::arg("session_gap") = 50.0,
      py::arg("path") = py::none(),
      "The synthetic multi-turn trace of replay.md (what `hkv trace gen` writes), as a list of "
      "dicts with int32 arrays 'prompt' and 'output'; also written as JSONL to `path` if given.");

  m.def(
      "read_trace",
      [](const std::filesystem::path& path) {
        Trace trace;
        {
          py::gil_scoped_release release;
          trace = Value(ReadTrace(path));
        }
        return ToPython(trace);
      },
      py::arg("path"), "Reads a JSONL trace (replay.md), checking it as hkv simulate does.");

  // The C++ side of the binding benchmark: `steps` decode steps of every request in `ids`, each
  // step doing per request what the batched Python calls do (allocate one token, read the block
  // table of `group` and the step's slots, commit, append a token).
  m.def(
      "_decode_steps_cpp",
      [](Manager& self, const std::vector<uint64_t>& ids, int32_t group, int64_t steps) {
        self.Locked([&](KvCacheManager& mgr) {
          std::vector<int32_t> table_copy;
          std::vector<int64_t> slots;
          for (int64_t s = 0; s < steps; ++s) {
            for (uint64_t id : ids)
              Check(mgr.Allocate(id, 1));
            for (uint64_t id : ids) {
              const std::span<const int32_t> t = Value(mgr.BlockTable(id, group));
              table_copy.assign(t.begin(), t.end());
            }
            slots.clear();
            for (uint64_t id : ids) {
              const StepInfo st = Value(mgr.Step(id));
              Check(mgr.SlotMapping(id, group, st.begin, st.end, slots));
            }
            for (uint64_t id : ids) {
              const int64_t computed = Value(mgr.NumComputed(id)) + 1;
              Check(mgr.Commit(id, computed));
              const int32_t token = static_cast<int32_t>((computed * 7919) % 32000);
              Check(mgr.AppendTokens(id, {&token, 1}));
            }
          }
        });
      },
      py::arg("manager"), py::arg("ids"), py::arg("group"), py::arg("steps"),
      "Benchmark reference only: the decode loop in C++.");
}

}  // namespace hkv::python
