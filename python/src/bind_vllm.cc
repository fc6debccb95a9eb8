// VllmCore: vllm::KvCacheManager (vLLM v1's manager restated in C++) with the request records an
// engine adapter needs, in plain ints, lists and bytes. `hybridkv.vllm` wraps it in vLLM's own
// classes; nothing here imports vLLM.
//
// Calls keep the GIL: each is a few microseconds, which is less than releasing and retaking it
// would cost, and holding it serialises Python threads on the manager without a lock.
#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <hkv/vllm/kv_cache_manager.h>

#include "bindings.h"
#include "status_error.h"

namespace py = pybind11;

namespace hkv::python {
namespace {

using vllm::RequestId;

// One group as the adapter reads it off vLLM's KVCacheSpec.
struct GroupSpec {
  std::string kind;  // full_attention, mla, sliding_window, chunked_local, mamba
  int32_t block_size = 0;
  int32_t sliding_window = 0;
  int32_t attention_chunk_size = 0;
  std::string mamba_cache_mode = "all";
};

Result<vllm::KvCacheSpec> ToSpec(const GroupSpec& g) {
  vllm::KvCacheSpec s;
  s.block_size = g.block_size;
  if (g.kind == "full_attention") {
    s.type = vllm::SpecType::kFullAttention;
  } else if (g.kind == "mla") {
    s.type = vllm::SpecType::kMla;
  } else if (g.kind == "sliding_window") {
    s.type = vllm::SpecType::kSlidingWindow;
    s.sliding_window = g.sliding_window;
    if (g.sliding_window < 1)
      return Status::InvalidArgument(
          fmt::format("sliding window {}; at least 1", g.sliding_window));
  } else if (g.kind == "chunked_local") {
    s.type = vllm::SpecType::kChunkedLocal;
    s.attention_chunk_size = g.attention_chunk_size;
    if (g.attention_chunk_size < 1) {
      return Status::InvalidArgument(
          fmt::format("attention chunk size {}; at least 1", g.attention_chunk_size));
    }
  } else if (g.kind == "mamba") {
    s.type = vllm::SpecType::kMamba;
    HKV_ASSIGN_OR_RETURN(s.mamba_cache_mode, vllm::ParseMambaCacheMode(g.mamba_cache_mode));
    if (s.mamba_cache_mode == vllm::MambaCacheMode::kAuto) {
      return Status::InvalidArgument("a mamba group needs mamba_cache_mode 'all' or 'align'");
    }
  } else {
    return Status::Unsupported(fmt::format(
        "group kind '{}': expected full_attention, mla, sliding_window, chunked_local or mamba",
        g.kind));
  }
  return s;
}

py::tuple ToTuple(const vllm::GroupBlocks& b) {
  py::tuple t(b.groups.size());
  for (size_t g = 0; g < b.groups.size(); ++g)
    t[g] = py::cast(b.groups[g]);
  return t;
}

// A prefix hit's block ids kept in C++: get_computed_blocks' result is usually only handed back
// to allocate_slots, so its Python lists (one int object per block) are built only if read.
struct HitIds {
  vllm::GroupBlocks blocks;
};

class VllmCore {
 public:
  VllmCore(const std::vector<GroupSpec>& groups, int32_t num_blocks, int32_t hash_block_size,
           int64_t max_model_len, int64_t max_num_batched_tokens, bool enable_caching,
           bool enable_events, vllm::EvictionPolicy policy) {
    vllm::KvCacheConfig c;
    for (size_t i = 0; i < groups.size(); ++i) {
      Result<vllm::KvCacheSpec> s = ToSpec(groups[i]);
      if (!s.ok()) {
        Check(Status(s.status().code(),
                     fmt::format("vllm core: group {}: {}", i, s.status().message())));
      }
      if (s->type == vllm::SpecType::kMamba) {
        c.has_mamba = true;
        c.mamba_cache_mode = s->mamba_cache_mode;
      }
      c.groups.push_back({*s, {static_cast<int32_t>(i)}});
    }
    c.num_blocks = num_blocks;
    c.hash_block_size = hash_block_size;
    c.cache_block_size = c.scheduler_block_size = groups.empty() ? 0 : groups[0].block_size;
    c.max_model_len = max_model_len;
    c.max_num_batched_tokens = max_num_batched_tokens;
    m_.emplace(Value(vllm::KvCacheManager::Create(
        c, {.enable_caching = enable_caching, .record_events = enable_events, .policy = policy})));
  }

  // A request is known from its first call on; `hashes` are its block hashes past those already
  // given (bytes, any length).
  vllm::Request& Sync(RequestId id, int64_t num_tokens, const py::list& hashes) {
    auto it = requests_.find(id);
    if (it == requests_.end()) {
      it =
          requests_.emplace(id, vllm::Request::Hashed(id, num_tokens, m_->config().hash_block_size))
              .first;
    }
    vllm::Request& r = it->second;
    const size_t known = r.block_hashes().size();
    const auto n = static_cast<size_t>(PyList_GET_SIZE(hashes.ptr()));
    if (n < known) {
      Check(Status::InvalidArgument(
          fmt::format("vllm core: request {} had {} block hashes, now {}: hashes are append-only",
                      id, known, n)));
    }
    scratch_.clear();
    for (size_t i = known; i < n; ++i) {
      PyObject* h = PyList_GET_ITEM(hashes.ptr(), static_cast<Py_ssize_t>(i));
      char* data = nullptr;
      Py_ssize_t size = 0;
      if (PyBytes_AsStringAndSize(h, &data, &size) != 0) throw py::error_already_set();
      scratch_.push_back(
          DigestOf({reinterpret_cast<const unsigned char*>(data), static_cast<size_t>(size)}));
    }
    r.Extend(num_tokens, scratch_);
    return r;
  }

  // free: the blocks go back and the request's record is forgotten.
  void Free(RequestId id) {
    m_->Free(id);
    requests_.erase(id);
  }

  vllm::ComputedBlocks HitOf(RequestId id, int64_t num_tokens, const py::list& hashes) {
    return Value(m_->GetComputedBlocks(Sync(id, num_tokens, hashes)));
  }

  py::tuple GetComputedBlocks(RequestId id, int64_t num_tokens, const py::list& hashes) {
    const vllm::ComputedBlocks hit = HitOf(id, num_tokens, hashes);
    if (hit.blocks.empty()) return py::make_tuple(py::tuple(), 0);
    return py::make_tuple(ToTuple(hit.blocks), hit.num_tokens);
  }

  py::object AllocateSlots(RequestId id, int64_t num_tokens, const py::list& hashes,
                           int64_t num_computed_tokens, int64_t num_new_tokens,
                           int64_t num_new_computed_tokens,
                           const std::optional<std::vector<std::vector<int32_t>>>& new_computed,
                           int64_t num_lookahead_tokens, int64_t num_external_computed_tokens,
                           bool delay_cache_blocks, bool full_sequence_must_fit) {
    vllm::AllocateArgs a;
    a.num_new_tokens = num_new_tokens;
    a.num_new_computed_tokens = num_new_computed_tokens;
    if (new_computed.has_value()) {
      hit_.blocks.groups = *new_computed;
      a.new_computed = &hit_;
    }
    a.num_lookahead_tokens = num_lookahead_tokens;
    a.num_external_computed_tokens = num_external_computed_tokens;
    a.delay_cache_blocks = delay_cache_blocks;
    a.full_sequence_must_fit = full_sequence_must_fit;
    return Allocate(id, num_tokens, hashes, num_computed_tokens, a);
  }

  // allocate_slots with the arguments prepared; `a.new_computed`, when set, may point at
  // hit_scratch(). None when the blocks do not fit, () when nothing new was allocated.
  py::object Allocate(RequestId id, int64_t num_tokens, const py::list& hashes,
                      int64_t num_computed_tokens, const vllm::AllocateArgs& a) {
    vllm::Request& r = Sync(id, num_tokens, hashes);
    r.num_computed_tokens = num_computed_tokens;
    const Status st = m_->AllocateSlots(r, a, &out_);
    if (st.code() == StatusCode::kResourceExhausted) return py::none();
    Check(st);
    if (out_.empty()) return py::tuple();  // the caller hands out its shared empty blocks
    return ToTuple(out_);
  }

  vllm::ComputedBlocks& hit_scratch() { return hit_; }

  void CacheBlocks(RequestId id, int64_t num_tokens, const py::list& hashes,
                   int64_t num_computed_tokens) {
    Check(m_->CacheBlocks(Sync(id, num_tokens, hashes), num_computed_tokens));
  }

  py::tuple BlockIds(RequestId id) const { return ToTuple(m_->GetBlockIds(id)); }

  // Events as tuples: ("stored", group, request, block_size, first, end, blocks, indices),
  // ("removed", group, block), ("cleared",).
  py::list TakeEvents() {
    py::list out;
    for (const vllm::CacheEvent& e : m_->TakeEvents()) {
      switch (e.kind) {
        case vllm::CacheEvent::Kind::kStored:
          out.append(py::make_tuple("stored", e.group, e.request, e.block_size, e.first_block,
                                    e.end_block, e.blocks, e.indices));
          break;
        case vllm::CacheEvent::Kind::kRemoved:
          out.append(py::make_tuple("removed", e.group, e.blocks.front()));
          break;
        case vllm::CacheEvent::Kind::kAllCleared:
          out.append(py::make_tuple("cleared"));
          break;
      }
    }
    return out;
  }

  vllm::KvCacheManager& m() { return *m_; }
  const vllm::KvCacheManager& m() const { return *m_; }
  size_t num_requests() const { return requests_.size(); }

 private:
  std::optional<vllm::KvCacheManager> m_;
  std::unordered_map<RequestId, vllm::Request> requests_;
  std::vector<BlockHash> scratch_;
  vllm::GroupBlocks out_;
  vllm::ComputedBlocks hit_;  // new computed blocks of the call in progress (capacity kept)
};

// The hot calls, as C functions: vLLM's scheduler calls allocate_slots once per running request
// per step (and get_computed_blocks once per step for a request waiting for memory), and the
// adapter's Python frame plus pybind11's argument conversion cost more than the manager's own
// work. `MakeFastCalls` returns builtins taking vLLM's exact signatures; they serve the common
// cases and hand every other call (and every refusal) to the adapter's Python implementation,
// unchanged, which raises the library's exceptions with their messages.
struct FastState {
  py::object core;  // VllmCore (kept alive by this reference)
  VllmCore* raw = nullptr;
  py::object ids;            // dict: vLLM request id -> int id (the adapter's own)
  py::object empty;          // the adapter's empty KVCacheBlocks
  py::object wrap;           // ids tuple -> KVCacheBlocks
  py::object slow_allocate;  // the adapter's Python allocate_slots
  py::object slow_computed;  // the adapter's Python get_computed_blocks
  py::object wrap_hit;       // HitIds -> KVCacheBlocks whose ids stay in C++ until read
  py::object hit_type;       // the class wrap_hit makes
  // A request class whose num_tokens is len(_all_token_ids) (vLLM's Request, checked by the
  // adapter), or None: the list's length is read without running the property's frame.
  py::object direct_type;
  py::object name_request_id, name_num_tokens, name_block_hashes, name_num_computed,
      name_all_token_ids, name_ids, name_skip_reading, name_hit;
  // The argument names, interned: keyword names from Python code are interned too, so a
  // pointer comparison finds them without a string compare.
  std::array<py::object, 9> arg_names;
  int64_t next_id = 1;  // the next request's int id
};

constexpr const char* kAllocateArgs[] = {"request",
                                         "num_new_tokens",
                                         "num_new_computed_tokens",
                                         "new_computed_blocks",
                                         "num_lookahead_tokens",
                                         "num_external_computed_tokens",
                                         "delay_cache_blocks",
                                         "num_encoder_tokens",
                                         "full_sequence_must_fit"};
constexpr Py_ssize_t kNumAllocateArgs = 9;

// Reads an int64 that must be a Python int; false (no exception) when it is not one.
bool ReadInt(PyObject* o, int64_t* out) {
  if (!PyLong_Check(o)) return false;
  const long long v = PyLong_AsLongLong(o);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  *out = v;
  return true;
}

PyObject* CallSlow(FastState& f, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  return PyObject_Vectorcall(f.slow_allocate.ptr(), args, nargsf, kwnames);
}

// The adapter's int id for a vLLM request id, assigned on first sight (new reference; nullptr
// with an exception set on failure).
PyObject* AssignId(FastState& f, PyObject* request_id) {
  PyObject* rid = PyDict_GetItemWithError(f.ids.ptr(), request_id);  // borrowed
  if (rid != nullptr) return Py_NewRef(rid);
  if (PyErr_Occurred()) return nullptr;
  PyObject* fresh = PyLong_FromLongLong(f.next_id);
  if (fresh == nullptr) return nullptr;
  if (PyDict_SetItem(f.ids.ptr(), request_id, fresh) != 0) {
    Py_DECREF(fresh);
    return nullptr;
  }
  ++f.next_id;
  return fresh;
}

// What the core needs of a vLLM request: its int id, token count, computed tokens and block
// hashes. kOk, kError (an exception is set), or kOther (a shape these builtins do not serve; no
// exception). With `assign` an unknown request gets an id; without, it is kOther.
enum class ReadResult : unsigned char { kOk, kError, kOther };
struct RequestView {
  int64_t rid = 0, num_tokens = 0, num_computed = 0;
  py::object hashes;
};

ReadResult ReadRequest(FastState& f, PyObject* request, bool assign, RequestView* out) {
  py::object req_id =
      py::reinterpret_steal<py::object>(PyObject_GetAttr(request, f.name_request_id.ptr()));
  if (!req_id) return ReadResult::kError;
  py::object rid_obj;
  if (assign) {
    rid_obj = py::reinterpret_steal<py::object>(AssignId(f, req_id.ptr()));
    if (!rid_obj) return ReadResult::kError;
  } else {
    PyObject* known = PyDict_GetItemWithError(f.ids.ptr(), req_id.ptr());  // borrowed
    if (known == nullptr) return PyErr_Occurred() ? ReadResult::kError : ReadResult::kOther;
    rid_obj = py::reinterpret_borrow<py::object>(known);
  }
  ReadInt(rid_obj.ptr(), &out->rid);
  bool have_tokens = false;
  if (reinterpret_cast<PyObject*>(Py_TYPE(request)) == f.direct_type.ptr()) {
    py::object all =
        py::reinterpret_steal<py::object>(PyObject_GetAttr(request, f.name_all_token_ids.ptr()));
    if (!all) return ReadResult::kError;
    if (PyList_Check(all.ptr())) {
      out->num_tokens = PyList_GET_SIZE(all.ptr());
      have_tokens = true;
    }
  }
  if (!have_tokens) {
    py::object nt =
        py::reinterpret_steal<py::object>(PyObject_GetAttr(request, f.name_num_tokens.ptr()));
    if (!nt) return ReadResult::kError;
    if (!ReadInt(nt.ptr(), &out->num_tokens)) return ReadResult::kOther;
  }
  py::object nc =
      py::reinterpret_steal<py::object>(PyObject_GetAttr(request, f.name_num_computed.ptr()));
  out->hashes =
      py::reinterpret_steal<py::object>(PyObject_GetAttr(request, f.name_block_hashes.ptr()));
  if (!nc || !out->hashes) return ReadResult::kError;
  if (!ReadInt(nc.ptr(), &out->num_computed) || !PyList_Check(out->hashes.ptr()))
    return ReadResult::kOther;
  return ReadResult::kOk;
}

// The block ids of the adapter's own KVCacheBlocks (its `_ids`: one list or tuple of ints per
// group) into `out`, keeping its lists' capacity; false for anything else.
bool ReadComputedIds(const FastState& f, PyObject* blocks, vllm::GroupBlocks& out) {
  if (reinterpret_cast<PyObject*>(Py_TYPE(blocks)) == f.hit_type.ptr()) {
    // Ids still in C++ unless something read (and so may have replaced) `_ids`.
    PyObject** dict = _PyObject_GetDictPtr(blocks);
    PyObject* read = dict != nullptr && *dict != nullptr
                         ? PyDict_GetItemWithError(*dict, f.name_ids.ptr())
                         : nullptr;
    if (read == nullptr && PyErr_Occurred()) return false;
    if (read == nullptr) {
      py::object hit =
          py::reinterpret_steal<py::object>(PyObject_GetAttr(blocks, f.name_hit.ptr()));
      if (!hit || !py::isinstance<HitIds>(hit)) return false;
      const vllm::GroupBlocks& src = hit.cast<const HitIds&>().blocks;
      out.groups.resize(src.groups.size());
      for (size_t g = 0; g < src.groups.size(); ++g)
        out.groups[g].assign(src.groups[g].begin(), src.groups[g].end());
      return true;
    }
  }
  py::object ids = py::reinterpret_steal<py::object>(PyObject_GetAttr(blocks, f.name_ids.ptr()));
  if (!ids || !PyTuple_Check(ids.ptr())) return false;
  const Py_ssize_t groups = PyTuple_GET_SIZE(ids.ptr());
  out.groups.resize(static_cast<size_t>(groups));
  for (Py_ssize_t g = 0; g < groups; ++g) {
    PyObject* seq = PyTuple_GET_ITEM(ids.ptr(), g);
    const bool list = PyList_Check(seq);
    if (!list && !PyTuple_Check(seq)) return false;
    const Py_ssize_t n = list ? PyList_GET_SIZE(seq) : PyTuple_GET_SIZE(seq);
    std::vector<int32_t>& dst = out.groups[static_cast<size_t>(g)];
    dst.resize(static_cast<size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* item = list ? PyList_GET_ITEM(seq, i) : PyTuple_GET_ITEM(seq, i);
      int64_t v = 0;
      if (!ReadInt(item, &v) || v < 0 || v > INT32_MAX) return false;
      dst[static_cast<size_t>(i)] = static_cast<int32_t>(v);
    }
  }
  return true;
}

PyObject* FastAllocateCall(PyObject* self, PyObject* const* args, size_t nargsf,
                           PyObject* kwnames) {
  auto& f = *static_cast<FastState*>(PyCapsule_GetPointer(self, nullptr));
  const Py_ssize_t npos = PyVectorcall_NARGS(nargsf);
  PyObject* a[kNumAllocateArgs] = {};
  if (npos > kNumAllocateArgs) return CallSlow(f, args, nargsf, kwnames);
  for (Py_ssize_t i = 0; i < npos; ++i)
    a[i] = args[i];
  if (kwnames != nullptr) {
    const Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nkw; ++k) {
      PyObject* key = PyTuple_GET_ITEM(kwnames, k);
      Py_ssize_t slot = -1;
      for (Py_ssize_t i = 0; i < kNumAllocateArgs && slot < 0; ++i) {
        if (key == f.arg_names[static_cast<size_t>(i)].ptr()) slot = i;
      }
      if (slot < 0) {
        const char* name = PyUnicode_AsUTF8(key);
        for (Py_ssize_t i = 0; name != nullptr && i < kNumAllocateArgs && slot < 0; ++i) {
          if (std::strcmp(name, kAllocateArgs[i]) == 0) slot = i;
        }
        if (name == nullptr) PyErr_Clear();
      }
      if (slot < 0 || a[slot] != nullptr) return CallSlow(f, args, nargsf, kwnames);
      a[slot] = args[npos + k];
    }
  }
  if (a[0] == nullptr || a[1] == nullptr) return CallSlow(f, args, nargsf, kwnames);
  // Served here: ints for the counts, no encoder tokens, bools for the flags, and no new
  // computed blocks or the adapter's own blocks. Anything else (and every refusal) goes to the
  // Python implementation, which raises the library's exceptions with their messages.
  int64_t counts[kNumAllocateArgs] = {};
  for (const int i : {1, 2, 4, 5, 7}) {
    if (a[i] != nullptr && !ReadInt(a[i], &counts[i])) return CallSlow(f, args, nargsf, kwnames);
  }
  if (counts[7] != 0) return CallSlow(f, args, nargsf, kwnames);
  bool flags[kNumAllocateArgs] = {};
  for (const int i : {6, 8}) {
    if (a[i] == nullptr || a[i] == Py_False) continue;
    if (a[i] != Py_True) return CallSlow(f, args, nargsf, kwnames);
    flags[i] = true;
  }
  vllm::AllocateArgs args_in;
  args_in.num_new_tokens = counts[1];
  args_in.num_new_computed_tokens = counts[2];
  args_in.num_lookahead_tokens = counts[4];
  args_in.num_external_computed_tokens = counts[5];
  args_in.delay_cache_blocks = flags[6];
  args_in.full_sequence_must_fit = flags[8];
  if (a[3] != nullptr && a[3] != Py_None && a[3] != f.empty.ptr()) {
    if (!ReadComputedIds(f, a[3], f.raw->hit_scratch().blocks)) {
      if (PyErr_Occurred()) PyErr_Clear();
      return CallSlow(f, args, nargsf, kwnames);
    }
    args_in.new_computed = &f.raw->hit_scratch();
  }
  RequestView r;
  switch (ReadRequest(f, a[0], /*assign=*/false, &r)) {
    case ReadResult::kOk:
      break;
    case ReadResult::kError:
      return nullptr;
    case ReadResult::kOther:  // first sight among them: the slow path assigns the id
      return CallSlow(f, args, nargsf, kwnames);
  }
  try {
    py::object ids = f.raw->Allocate(
        r.rid, r.num_tokens, py::reinterpret_borrow<py::list>(r.hashes), r.num_computed, args_in);
    if (ids.is_none()) return ids.release().ptr();
    if (PyTuple_GET_SIZE(ids.ptr()) == 0) return f.empty.inc_ref().ptr();
    return f.wrap(ids).release().ptr();
  } catch (...) {
    // A refused call changes nothing, so the Python implementation can make it again and raise
    // the library's own exception class with its message.
    PyErr_Clear();
    return CallSlow(f, args, nargsf, kwnames);
  }
}

PyMethodDef kFastAllocateDef = {
    "allocate_slots",
    reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&FastAllocateCall)),
    METH_FASTCALL | METH_KEYWORDS,
    "allocate_slots (vLLM's signature), served in C for running "
    "requests."};

PyObject* FastNewStepStarts(PyObject* self, PyObject* /*unused*/) {
  static_cast<FastState*>(PyCapsule_GetPointer(self, nullptr))->raw->m().NewStepStarts();
  Py_RETURN_NONE;
}

PyObject* ToList(const std::vector<int32_t>& v) {
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(v.size()));
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < v.size(); ++i)
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), PyLong_FromLong(v[i]));
  return list;
}

PyObject* FastTakeNewBlockIds(PyObject* self, PyObject* /*unused*/) {
  auto& f = *static_cast<FastState*>(PyCapsule_GetPointer(self, nullptr));
  return ToList(f.raw->m().TakeNewBlockIds());
}

PyObject* FastCommonPrefix(PyObject* self, PyObject* request_id) {
  auto& f = *static_cast<FastState*>(PyCapsule_GetPointer(self, nullptr));
  PyObject* rid_obj = PyDict_GetItemWithError(f.ids.ptr(), request_id);  // borrowed
  int64_t rid = 0;
  if (rid_obj == nullptr) {
    if (PyErr_Occurred()) return nullptr;
    // A request vLLM's manager never saw answers 0 for every group.
    return ToList(std::vector<int32_t>(f.raw->m().config().groups.size(), 0));
  }
  ReadInt(rid_obj, &rid);
  return ToList(f.raw->m().NumCommonPrefixBlocks(rid));
}

// get_computed_blocks(request) -> (KVCacheBlocks, hit tokens); installed only with caching on
// and prefix-cache statistics off.
PyObject* FastGetComputed(PyObject* self, PyObject* request) {
  auto& f = *static_cast<FastState*>(PyCapsule_GetPointer(self, nullptr));
  auto slow = [&] { return PyObject_CallOneArg(f.slow_computed.ptr(), request); };
  PyObject* skip = PyObject_GetAttr(request, f.name_skip_reading.ptr());
  if (skip == nullptr) return nullptr;
  Py_DECREF(skip);
  if (skip != Py_False) return slow();
  RequestView r;
  switch (ReadRequest(f, request, /*assign=*/true, &r)) {
    case ReadResult::kOk:
      break;
    case ReadResult::kError:
      return nullptr;
    case ReadResult::kOther:
      return slow();
  }
  try {
    vllm::ComputedBlocks hit =
        f.raw->HitOf(r.rid, r.num_tokens, py::reinterpret_borrow<py::list>(r.hashes));
    if (hit.blocks.empty()) return py::make_tuple(f.empty, 0).release().ptr();
    py::object ids = py::cast(HitIds{std::move(hit.blocks)});
    return py::make_tuple(f.wrap_hit(ids), hit.num_tokens).release().ptr();
  } catch (...) {
    PyErr_Clear();
    return slow();
  }
}

PyObject* FastAssignId(PyObject* self, PyObject* request_id) {
  return AssignId(*static_cast<FastState*>(PyCapsule_GetPointer(self, nullptr)), request_id);
}

// IdBlocks.get_block_ids(self, allow_none=False): each group's ids as a new list, or None when
// allow_none and every group is empty. A method in C (bound like a Python function, through an
// instancemethod) because vLLM's scheduler calls it once per running request per step.
PyObject* BlocksGetBlockIds(PyObject* /*unused*/, PyObject* const* args, Py_ssize_t nargs,
                            PyObject* kwnames) {
  static PyObject* const kIds = PyUnicode_InternFromString("_ids");
  static PyObject* const kAllowNone = PyUnicode_InternFromString("allow_none");
  const Py_ssize_t nkw = kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0;
  PyObject* allow = nargs >= 2 ? args[1] : nullptr;
  bool bad = nargs < 1 || nargs > 2;
  for (Py_ssize_t k = 0; k < nkw && !bad; ++k) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, k);
    if (allow != nullptr || (key != kAllowNone && PyUnicode_Compare(key, kAllowNone) != 0)) {
      bad = true;
    } else {
      allow = args[nargs + k];
    }
  }
  if (bad) {
    PyErr_SetString(PyExc_TypeError, "get_block_ids(self, allow_none=False)");
    return nullptr;
  }
  py::object ids = py::reinterpret_steal<py::object>(PyObject_GetAttr(args[0], kIds));
  if (!ids) return nullptr;
  if (!PyTuple_Check(ids.ptr())) {
    PyErr_SetString(PyExc_TypeError, "get_block_ids: _ids is not a tuple");
    return nullptr;
  }
  const Py_ssize_t groups = PyTuple_GET_SIZE(ids.ptr());
  if (allow != nullptr) {
    const int on = PyObject_IsTrue(allow);
    if (on < 0) return nullptr;
    bool empty = true;
    for (Py_ssize_t g = 0; g < groups && empty; ++g) {
      const Py_ssize_t n = PyObject_Length(PyTuple_GET_ITEM(ids.ptr(), g));
      if (n < 0) return nullptr;
      empty = n == 0;
    }
    if (on != 0 && empty) Py_RETURN_NONE;
  }
  py::tuple out(groups);
  for (Py_ssize_t g = 0; g < groups; ++g) {
    PyObject* list = PySequence_List(PyTuple_GET_ITEM(ids.ptr(), g));
    if (list == nullptr) return nullptr;
    PyTuple_SET_ITEM(out.ptr(), g, list);
  }
  return out.release().ptr();
}

PyMethodDef kBlocksGetBlockIdsDef = {
    "get_block_ids",
    reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&BlocksGetBlockIds)),
    METH_FASTCALL | METH_KEYWORDS,
    "get_block_ids(allow_none=False): each group's block ids as a new list; None when "
    "allow_none and every group is empty."};

PyMethodDef kFastComputedDef = {"get_computed_blocks", &FastGetComputed, METH_O,
                                "get_computed_blocks(request) (vLLM's signature), in C."};
PyMethodDef kFastAssignDef = {"assign_id", &FastAssignId, METH_O,
                              "assign_id(request_id) -> the adapter's int id for it."};
PyMethodDef kFastNewStepDef = {"new_step_starts", &FastNewStepStarts, METH_NOARGS,
                               "new_step_starts"};
PyMethodDef kFastTakeNewDef = {"take_new_block_ids", &FastTakeNewBlockIds, METH_NOARGS,
                               "take_new_block_ids"};
PyMethodDef kFastCommonDef = {"get_num_common_prefix_blocks", &FastCommonPrefix, METH_O,
                              "get_num_common_prefix_blocks(running_request_id)"};

// The adapter's per-step calls as builtins over one shared state: (allocate_slots,
// new_step_starts, get_num_common_prefix_blocks, take_new_block_ids, get_computed_blocks,
// assign_id).
py::tuple MakeFastCalls(py::object core, py::object ids, py::object empty, py::object wrap,
                        py::object slow_allocate, py::object slow_computed, py::object wrap_hit,
                        py::object hit_type, py::object direct_type) {
  VllmCore* raw = &core.cast<VllmCore&>();
  auto intern = [](const char* name) {
    return py::reinterpret_steal<py::object>(PyUnicode_InternFromString(name));
  };
  auto* f = new FastState{std::move(core),
                          raw,
                          std::move(ids),
                          std::move(empty),
                          std::move(wrap),
                          std::move(slow_allocate),
                          std::move(slow_computed),
                          std::move(wrap_hit),
                          std::move(hit_type),
                          std::move(direct_type),
                          intern("request_id"),
                          intern("num_tokens"),
                          intern("block_hashes"),
                          intern("num_computed_tokens"),
                          intern("_all_token_ids"),
                          intern("_ids"),
                          intern("skip_reading_prefix_cache"),
                          intern("_hit"),
                          {},
                          1};
  for (size_t i = 0; i < f->arg_names.size(); ++i)
    f->arg_names[i] = intern(kAllocateArgs[i]);
  py::object capsule = py::reinterpret_steal<py::object>(PyCapsule_New(f, nullptr, [](PyObject* c) {
    delete static_cast<FastState*>(PyCapsule_GetPointer(c, nullptr));
  }));
  if (!capsule) {
    delete f;
    throw py::error_already_set();
  }
  PyMethodDef* defs[] = {&kFastAllocateDef, &kFastNewStepDef,  &kFastCommonDef,
                         &kFastTakeNewDef,  &kFastComputedDef, &kFastAssignDef};
  py::tuple out(std::size(defs));
  for (size_t i = 0; i < std::size(defs); ++i) {
    PyObject* fn = PyCFunction_NewEx(defs[i], capsule.ptr(), nullptr);
    if (fn == nullptr) throw py::error_already_set();
    out[i] = py::reinterpret_steal<py::object>(fn);
  }
  return out;
}

}  // namespace

void BindVllm(py::module_& m) {
  py::class_<HitIds>(m, "VllmHitIds",
                     "A prefix hit's block ids held in C++ (get_computed_blocks' result).")
      .def(
          "to_tuple", [](const HitIds& h) { return ToTuple(h.blocks); },
          "Each group's block ids as a list.");
  {
    PyObject* fn = PyCFunction_NewEx(&kBlocksGetBlockIdsDef, nullptr, nullptr);
    if (fn == nullptr) throw py::error_already_set();
    PyObject* method = PyInstanceMethod_New(fn);
    Py_DECREF(fn);
    if (method == nullptr) throw py::error_already_set();
    m.add_object("_vllm_get_block_ids", py::reinterpret_steal<py::object>(method));
  }
  py::class_<VllmCore>(
      m, "VllmCore",
      "vLLM v1's KV cache manager restated in C++ (block for block: same ids, hits, evictions and "
      "events), driven with ints, lists and bytes. `hybridkv.vllm.KVCacheManager` wraps it in "
      "vLLM's own classes. Groups are (kind, block_size, sliding_window, attention_chunk_size, "
      "mamba_cache_mode) with kind one of full_attention, mla, sliding_window, chunked_local, "
      "mamba. Block ids index vLLM's KV tensors; 0 is the null block.")
      .def(
          py::init(
              [](const std::vector<std::tuple<std::string, int32_t, int32_t, int32_t, std::string>>&
                     groups,
                 int32_t num_blocks, int32_t hash_block_size, int64_t max_model_len,
                 int64_t max_num_batched_tokens, bool enable_caching, bool enable_events,
                 const std::string& policy) {
                std::vector<GroupSpec> specs;
                for (const auto& [kind, bs, window, chunk, mode] : groups)
                  specs.push_back({kind, bs, window, chunk, mode});
                vllm::EvictionPolicy p = vllm::EvictionPolicy::kVllm;
                if (policy == "hybridkv") {
                  p = vllm::EvictionPolicy::kHybridKV;
                } else if (policy != "vllm") {
                  Check(Status::InvalidArgument(fmt::format(
                      "vllm core: policy '{}': expected 'vllm' or 'hybridkv'", policy)));
                }
                return VllmCore(specs, num_blocks, hash_block_size, max_model_len,
                                max_num_batched_tokens, enable_caching, enable_events, p);
              }),
          py::arg("groups"), py::arg("num_blocks"), py::arg("hash_block_size"),
          py::arg("max_model_len"), py::arg("max_num_batched_tokens"),
          py::arg("enable_caching") = true, py::arg("enable_events") = false,
          py::arg("policy") = "vllm")
      .def(
          "sync",
          [](VllmCore& c, RequestId id, int64_t num_tokens, const py::list& hashes) {
            c.Sync(id, num_tokens, hashes);
          },
          py::arg("request"), py::arg("num_tokens"), py::arg("block_hashes"),
          "Creates or extends a request's record: its token count and its block hashes (a "
          "list of bytes; those past the ones already seen are read). Every call that takes a "
          "request syncs it the same way. Hashes are append-only.")
      .def("get_computed_blocks", &VllmCore::GetComputedBlocks, py::arg("request"),
           py::arg("num_tokens"), py::arg("block_hashes"),
           "get_computed_blocks: (block ids per group, hit tokens); () for no hit.")
      .def("allocate_slots", &VllmCore::AllocateSlots, py::arg("request"), py::arg("num_tokens"),
           py::arg("block_hashes"), py::arg("num_computed_tokens"), py::arg("num_new_tokens"),
           py::arg("num_new_computed_tokens") = 0, py::arg("new_computed_blocks") = py::none(),
           py::arg("num_lookahead_tokens") = 0, py::arg("num_external_computed_tokens") = 0,
           py::arg("delay_cache_blocks") = false, py::arg("full_sequence_must_fit") = false,
           "allocate_slots: the new block ids per group, () when no block was needed, None when "
           "the free blocks do not suffice (vLLM's refusal).")
      .def("free", &VllmCore::Free, py::arg("request"),
           "free: the request's blocks return to the free queue (tail first) and its record is "
           "forgotten.")
      .def("cache_blocks", &VllmCore::CacheBlocks, py::arg("request"), py::arg("num_tokens"),
           py::arg("block_hashes"), py::arg("num_computed_tokens"))
      .def(
          "remove_skipped_blocks",
          [](VllmCore& c, RequestId id, int64_t n) { c.m().RemoveSkippedBlocks(id, n); },
          py::arg("request"), py::arg("total_computed_tokens"))
      .def(
          "evict_blocks",
          [](VllmCore& c, const std::vector<int32_t>& ids) { Check(c.m().EvictBlocks(ids)); },
          py::arg("block_ids"))
      .def("reset_prefix_cache", [](VllmCore& c) { return c.m().ResetPrefixCache(); })
      .def(
          "num_common_prefix_blocks",
          [](const VllmCore& c, RequestId id) { return c.m().NumCommonPrefixBlocks(id); },
          py::arg("request"))
      .def("block_ids", &VllmCore::BlockIds, py::arg("request"))
      .def("take_new_block_ids", [](VllmCore& c) { return c.m().TakeNewBlockIds(); })
      .def("new_step_starts", [](VllmCore& c) { c.m().NewStepStarts(); })
      .def("take_events", &VllmCore::TakeEvents)
      .def(
          "is_cached", [](const VllmCore& c, int32_t block) { return c.m().IsCached(block); },
          py::arg("block_id"), "Whether the block holds a prefix identity.")
      .def("free_queue", [](const VllmCore& c) { return c.m().FreeQueue(); })
      .def("check_invariants", [](const VllmCore& c) { Check(c.m().CheckInvariants()); })
      .def_property_readonly("num_blocks",
                             [](const VllmCore& c) { return c.m().Stats().num_blocks; })
      .def_property_readonly("num_free_blocks",
                             [](const VllmCore& c) { return c.m().Stats().num_free; })
      .def_property_readonly("num_cached_blocks",
                             [](const VllmCore& c) { return c.m().Stats().num_cached; })
      .def_property_readonly("num_requests", &VllmCore::num_requests)
      .def_static("fast_calls", &MakeFastCalls, py::arg("core"), py::arg("ids"), py::arg("empty"),
                  py::arg("wrap"), py::arg("slow_allocate"), py::arg("slow_computed"),
                  py::arg("wrap_hit"), py::arg("hit_type"), py::arg("direct_type") = py::none(),
                  "Builtins for the per-step calls, with vLLM's signatures: (allocate_slots, "
                  "new_step_starts, get_num_common_prefix_blocks, take_new_block_ids, "
                  "get_computed_blocks, assign_id). allocate_slots and get_computed_blocks serve "
                  "the common cases in C and pass every other call to `slow_allocate` / "
                  "`slow_computed`; `ids` maps vLLM request ids to the core's, and assign_id "
                  "gives an unknown one the next id.")
      .def_property_readonly(
          "idle", [](const VllmCore& c) { return c.m().Idle(); },
          "No request holds a block or a caching record.");
}

}  // namespace hkv::python
