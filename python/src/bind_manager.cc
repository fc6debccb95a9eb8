// KvCacheManager for Python: per-request calls, batched per-step calls, numpy views.
//
// Every call takes the manager's mutex with the GIL released, so Python threads may share a
// manager and other Python threads run while a long call (Free of a long request, Compact) works.
// Errors leave the manager unchanged (the library's guarantee) and raise hybridkv.Error subclasses.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <hkv/manager/kv_cache_manager.h>
#include <hkv/manager/manager_probe.h>

#include "bindings.h"
#include "manager_handle.h"
#include "status_error.h"

namespace py = pybind11;

namespace hkv::python {
namespace {

using I32Array = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;
using U64Array = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>;
using I64Array = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

// A 128-bit digest from a Python int (the caller's hash of an image, an encoder input).
BlockHash ToHash(const py::int_& value) {
  const py::int_ mask((uint64_t{1} << 63) * 2 - 1);  // 2^64 - 1
  if (value < py::int_(0) || value > ((mask << py::int_(64)) | mask)) {
    throw StatusError(Status::InvalidArgument("digest: expected an int in [0, 2^128)"));
  }
  BlockHash h;
  h.lo = (value & mask).cast<uint64_t>();
  h.hi = (value >> py::int_(64)).cast<uint64_t>();
  return h;
}

py::int_ FromHash(const BlockHash& h) {
  return (py::int_(h.hi) << py::int_(64)) | py::int_(h.lo);
}

template <typename T>
std::span<const T> Span(const py::array_t<T, py::array::c_style | py::array::forcecast>& a,
                        const char* what) {
  if (a.ndim() != 1) {
    throw StatusError(Status::InvalidArgument(
        fmt::format("{}: expected a 1-d sequence, got {} dimensions", what, a.ndim())));
  }
  return {a.data(), static_cast<size_t>(a.shape(0))};
}

// A caller's output buffer: exactly dtype T, C-contiguous, writeable, `ndim` dimensions. Anything
// else is refused rather than converted, since a converted copy would receive the result.
template <typename T>
py::array_t<T, py::array::c_style> OutArray(const py::object& out, int ndim, const char* what) {
  using Exact = py::array_t<T, py::array::c_style>;
  const std::string dtype = py::str(py::dtype::of<T>()).cast<std::string>();
  const auto refuse = [&](const std::string& why) {
    return StatusError(Status::InvalidArgument(fmt::format("{}: out {}", what, why)));
  };
  if (py::isinstance<Exact>(out)) {  // dtype and contiguity, no conversion
    auto a = py::reinterpret_borrow<Exact>(out);
    if (a.ndim() != ndim) {
      throw refuse(fmt::format("has {} dimension(s): expected {}", a.ndim(), ndim));
    }
    if (!a.writeable()) throw refuse("is read-only: expected a writeable array");
    return a;
  }
  if (!py::isinstance<py::array>(out)) {
    throw refuse(
        fmt::format("is a {}: expected a numpy array of {}", Py_TYPE(out.ptr())->tp_name, dtype));
  }
  // The isinstance above is what decides; this only picks which of its conditions to name.
  const auto a = py::reinterpret_borrow<py::array>(out);
  const bool contiguous = (a.flags() & py::array::c_style) != 0;
  if (contiguous || !a.dtype().equal(py::dtype::of<T>())) {
    throw refuse(
        fmt::format("has dtype {}: expected {}", py::str(a.dtype()).cast<std::string>(), dtype));
  }
  throw refuse("is not C-contiguous: expected a C-contiguous array");
}

// Usage and FreeListOrder take a pool index without returning a Status.
void CheckPool(const KvCacheManager& mgr, int32_t pool, const char* call) {
  const auto pools = static_cast<int32_t>(mgr.config().pool_blocks.size());
  if (pool < 0 || pool >= pools) {
    throw StatusError(Status::InvalidArgument(
        fmt::format("{}: pool {} is out of range: expected 0 to {}", call, pool, pools - 1)));
  }
}

const char* KindName(KvEvent::Kind k) {
  switch (k) {
    case KvEvent::Kind::kStored:
      return "stored";
    case KvEvent::Kind::kRemoved:
      return "removed";
    case KvEvent::Kind::kCleared:
      return "cleared";
  }
  return "cleared";
}

// ExternalBlocks answered by a Python callable (digest, group) -> bool. An exception stops the
// answers (every later block is "absent") and is raised again once Lookup returns.
class PythonBlocks final : public ExternalBlocks {
 public:
  explicit PythonBlocks(py::object has) : has_(std::move(has)) {}
  bool Has(const PrefixKey& key) const override {
    if (error_) return false;
    try {
      return has_(FromHash(key.hash), key.group).cast<bool>();
    } catch (py::error_already_set& e) {
      error_ = std::make_unique<py::error_already_set>(std::move(e));
    } catch (const py::cast_error&) {
      error_ = std::make_unique<py::error_already_set>(
          (PyErr_SetString(PyExc_TypeError, "lookup: external must return a bool"),
           py::error_already_set()));
    }
    return false;
  }
  void Rethrow() {
    if (error_) throw std::move(*error_);
  }

 private:
  py::object has_;
  mutable std::unique_ptr<py::error_already_set> error_;
};

struct RequestArgs {
  std::vector<PromptItem> items;
  BlockHash encoder_input;
};

// compact's answer: (moves, slabs) with moves an int32 array of rows (pool, src, dst).
py::tuple CompactionTuple(const CompactionResult& r) {
  py::array_t<int32_t> moves({static_cast<py::ssize_t>(r.moves.size()), py::ssize_t{3}});
  auto w = moves.mutable_unchecked<2>();
  for (size_t i = 0; i < r.moves.size(); ++i) {
    const auto k = static_cast<py::ssize_t>(i);
    w(k, 0) = r.moves[i].pool;
    w(k, 1) = r.moves[i].src;
    w(k, 2) = r.moves[i].dst;
  }
  return py::make_tuple(moves, r.slabs);
}

// A state group's slots for the open step. The caller holds the manager's lock.
py::dict StateDict(const StateStep& s) {
  py::list snaps;
  for (const StateSnapshot& x : s.snapshots)
    snaps.append(py::make_tuple(x.position, x.slot));
  py::dict d;
  d["read"] = s.read;
  d["write"] = s.write;
  d["snapshots"] = snaps;
  return d;
}

// step's answer. The caller holds the manager's lock: the step may point into its memory.
py::dict StepDict(const StepInfo& s) {
  py::array_t<int32_t> copies({static_cast<py::ssize_t>(s.copies.size()), py::ssize_t{3}});
  auto w = copies.mutable_unchecked<2>();
  for (size_t i = 0; i < s.copies.size(); ++i) {
    const auto k = static_cast<py::ssize_t>(i);
    w(k, 0) = s.copies[i].group;
    w(k, 1) = s.copies[i].src;
    w(k, 2) = s.copies[i].dst;
  }
  py::array_t<int32_t> loads({static_cast<py::ssize_t>(s.loads.size()), py::ssize_t{4}});
  auto l = loads.mutable_unchecked<2>();
  py::list keys;
  for (size_t i = 0; i < s.loads.size(); ++i) {
    const auto k = static_cast<py::ssize_t>(i);
    l(k, 0) = s.loads[i].group;
    l(k, 1) = s.loads[i].pool;
    l(k, 2) = s.loads[i].block;
    l(k, 3) = s.loads[i].state ? 1 : 0;
    keys.append(FromHash(s.loads[i].key.hash));
  }
  py::dict d;
  d["begin"] = s.begin;
  d["end"] = s.end;
  d["reserved_end"] = s.reserved_end;
  d["run_encoder"] = s.run_encoder;
  d["copies"] = copies;
  d["loads"] = loads;
  d["load_digests"] = keys;
  return d;
}

using ManagerClass = py::class_<Manager>;

void BindResultTypes(py::module_& m) {
  py::class_<PrefixHit>(m, "PrefixHit", "What lookup found; pass it to the first allocate.")
      .def(py::init([](int64_t tokens, bool encoder, int32_t loads) {
             return PrefixHit{tokens, encoder, loads};
           }),
           py::arg("tokens") = 0, py::arg("encoder") = false, py::arg("loads") = 0)
      .def_readonly("tokens", &PrefixHit::tokens)
      .def_readonly("encoder", &PrefixHit::encoder)
      .def_readonly("loads", &PrefixHit::loads)
      .def("__repr__", [](const PrefixHit& h) {
        return fmt::format("PrefixHit(tokens={}, encoder={}, loads={})", h.tokens,
                           h.encoder ? "True" : "False", h.loads);
      });

  py::class_<TruncateResult>(m, "TruncateResult")
      .def_readonly("tokens", &TruncateResult::tokens)
      .def_readonly("computed", &TruncateResult::computed)
      .def_readonly("recompute", &TruncateResult::recompute)
      .def("__repr__", [](const TruncateResult& t) {
        return fmt::format("TruncateResult(tokens={}, computed={}, recompute={})", t.tokens,
                           t.computed, t.recompute);
      });

  py::class_<EvictResult>(m, "EvictResult")
      .def_readonly("write_from", &EvictResult::write_from)
      .def_readonly("keep", &EvictResult::keep)
      .def_readonly("blocks_released", &EvictResult::blocks_released)
      .def_readonly("blocks_replaced", &EvictResult::blocks_replaced)
      .def("__repr__", [](const EvictResult& e) {
        return fmt::format(
            "EvictResult(write_from={}, keep={}, blocks_released={}, blocks_replaced={})",
            e.write_from, e.keep, e.blocks_released, e.blocks_replaced);
      });
}

void BindStatsTypes(py::module_& m) {
  py::class_<PoolUsage>(m, "PoolUsage")
      .def_readonly("num_blocks", &PoolUsage::num_blocks)
      .def_readonly("num_free", &PoolUsage::num_free)
      .def_readonly("num_cached", &PoolUsage::num_cached)
      .def_readonly("num_free_in_held_slabs", &PoolUsage::num_free_in_held_slabs)
      .def_readonly("num_stranded", &PoolUsage::num_stranded)
      .def_readonly("num_free_cached", &PoolUsage::num_free_cached)
      .def_property_readonly("usage", &PoolUsage::usage);

  py::class_<ArenaClassUsage>(m, "ArenaClassUsage")
      .def_readonly("slabs", &ArenaClassUsage::slabs)
      .def_readonly("held_pages", &ArenaClassUsage::held_pages)
      .def_readonly("free_pages", &ArenaClassUsage::free_pages)
      .def_readonly("cached_pages", &ArenaClassUsage::cached_pages)
      .def_readonly("empty_slabs", &ArenaClassUsage::empty_slabs)
      .def_readonly("stranded_pages", &ArenaClassUsage::stranded_pages);

  py::class_<ArenaUsage>(m, "ArenaUsage")
      .def_readonly("num_slabs", &ArenaUsage::num_slabs)
      .def_readonly("unassigned_slabs", &ArenaUsage::unassigned_slabs)
      .def_readonly("slabs_carved", &ArenaUsage::slabs_carved)
      .def_readonly("slabs_reclaimed", &ArenaUsage::slabs_reclaimed)
      .def_readonly("slabs_compacted", &ArenaUsage::slabs_compacted)
      .def_readonly("pages_moved", &ArenaUsage::pages_moved)
      .def_readonly("cached_pages_moved", &ArenaUsage::cached_pages_moved)
      .def_readonly("classes", &ArenaUsage::classes);

  py::class_<ManagerStats>(m, "ManagerStats")
      .def_readonly("lookups", &ManagerStats::lookups)
      .def_readonly("lookup_tokens", &ManagerStats::lookup_tokens)
      .def_readonly("hit_tokens", &ManagerStats::hit_tokens)
      .def_readonly("encoder_lookups", &ManagerStats::encoder_lookups)
      .def_readonly("encoder_hits", &ManagerStats::encoder_hits)
      .def_readonly("allocations_failed", &ManagerStats::allocations_failed)
      .def_readonly("recomputed_tokens", &ManagerStats::recomputed_tokens)
      .def_readonly("branch_blocks_given_back", &ManagerStats::branch_blocks_given_back)
      .def_readonly("remembered_branches_kept", &ManagerStats::remembered_branches_kept)
      .def_readonly("shared_prefixes_marked", &ManagerStats::shared_prefixes_marked)
      .def_readonly("thrash_keep_share", &ManagerStats::thrash_keep_share)
      .def_readonly("thrash_returns_seen", &ManagerStats::thrash_returns_seen)
      .def_readonly("thrash_probation_frees", &ManagerStats::thrash_probation_frees)
      .def_readonly("keys_taken_over", &ManagerStats::keys_taken_over)
      .def_readonly("admissions_held_for_headroom", &ManagerStats::admissions_held_for_headroom)
      .def_readonly("rolling_states_given_back", &ManagerStats::rolling_states_given_back)
      .def_readonly("uncovered_blocks_demoted", &ManagerStats::uncovered_blocks_demoted)
      .def_readonly("unreachable_checkpoints_demoted",
                    &ManagerStats::unreachable_checkpoints_demoted)
      .def_readonly("superseded_hits_demoted", &ManagerStats::superseded_hits_demoted)
      .def_readonly("external_hit_tokens", &ManagerStats::external_hit_tokens)
      .def_readonly("blocks_loaded", &ManagerStats::blocks_loaded)
      .def_readonly("loads_failed", &ManagerStats::loads_failed);

  py::class_<ManagerEvent>(m, "Event", "A prefix-cache change, for a connector or router.")
      .def_property_readonly("kind", [](const ManagerEvent& e) { return KindName(e.kind); })
      .def_readonly("pool", &ManagerEvent::pool)
      .def_readonly("group", &ManagerEvent::group)
      .def_property_readonly("hash", [](const ManagerEvent& e) { return FromHash(e.hash); })
      .def_readonly("block", &ManagerEvent::block)
      .def_readonly("request", &ManagerEvent::request)
      .def_readonly("position", &ManagerEvent::position)
      .def_property_readonly("parent",
                             [](const ManagerEvent& e) -> py::object {
                               if (!e.parent) return py::none();
                               return FromHash(*e.parent);
                             })
      .def_readonly("adapter", &ManagerEvent::adapter)
      .def("__repr__", [](const ManagerEvent& e) {
        return fmt::format("Event({}, pool={}, group={}, block={})", KindName(e.kind), e.pool,
                           e.group, e.block);
      });
}

void BindRequests(ManagerClass& cls) {
  cls.def(py::init([](const ManagerConfig& config) {
            return std::make_unique<Manager>(Value(KvCacheManager::Create(config)));
          }),
          py::arg("config"))
      .def(
          "add_request",
          [](Manager& self, uint64_t id, const I32Array& prompt, uint64_t adapter_id,
             const std::string& cache_salt, bool low_retention,
             const std::vector<std::tuple<py::int_, int64_t, int64_t>>& items,
             int64_t encoder_tokens, const std::optional<py::int_>& encoder_input) {
            RequestArgs args;
            for (const auto& [content, position, length] : items)
              args.items.push_back({ToHash(content), position, length});
            if (encoder_input) args.encoder_input = ToHash(*encoder_input);
            const std::span<const int32_t> tokens = Span(prompt, "add_request: prompt");
            self.Locked([&](KvCacheManager& mgr) {
              RequestSpec spec;
              spec.id = id;
              spec.prompt = tokens;
              spec.adapter_id = adapter_id;
              spec.cache_salt = cache_salt;
              spec.items = args.items;
              spec.encoder_tokens = encoder_tokens;
              spec.encoder_input = args.encoder_input;
              spec.retention = low_retention ? Retention::kLow : Retention::kNormal;
              Check(mgr.AddRequest(spec));
            });
          },
          py::arg("id"), py::arg("prompt"), py::kw_only(), py::arg("adapter_id") = 0,
          py::arg("cache_salt") = "", py::arg("low_retention") = false,
          py::arg("items") = std::vector<std::tuple<py::int_, int64_t, int64_t>>{},
          py::arg("encoder_tokens") = 0, py::arg("encoder_input") = py::none(),
          "Registers a request and its prompt (int32 tokens). items: (digest, position, length) "
          "of multimodal inputs; encoder_input: digest of a cross-attention model's encoder "
          "input.")
      .def(
          "lookup",
          [](Manager& self, uint64_t id, const py::object& external) {
            if (external.is_none()) {
              return self.Locked([&](KvCacheManager& mgr) { return Value(mgr.Lookup(id)); });
            }
            // The store is Python code: it runs with the GIL, under the manager's lock.
            PythonBlocks blocks(external);
            auto lock = self.Hold();
            Result<PrefixHit> hit = self.raw().Lookup(id, blocks);
            blocks.Rethrow();
            return Value(std::move(hit));
          },
          py::arg("id"), py::arg("external") = py::none(),
          "The longest usable cached prefix, before the first allocate. external: a callable "
          "(digest, group) -> bool saying whether an outside store (host/disk/remote tier) holds "
          "that block; it must not call this manager. hit.loads then counts the blocks to load "
          "(step()['loads']) before finish_load.")
      .def(
          "finish_load",
          [](Manager& self, uint64_t id, bool loaded) {
            self.Locked([&](KvCacheManager& mgr) { Check(mgr.FinishLoad(id, loaded)); });
          },
          py::arg("id"), py::arg("loaded"),
          "Ends the loads of a hit with external blocks: loaded=True publishes them and the step "
          "runs; False releases everything and the request starts over (look up again).");
}

void BindAllocation(ManagerClass& cls) {
  cls.def(
         "allocate",
         [](Manager& self, uint64_t id, int64_t num_new_tokens, const std::optional<PrefixHit>& hit,
            int64_t lookahead) {
           self.Locked([&](KvCacheManager& mgr) {
             Check(mgr.Allocate(id, num_new_tokens, hit.value_or(PrefixHit{}), lookahead));
           });
         },
         py::arg("id"), py::arg("num_new_tokens"), py::arg("hit") = py::none(),
         py::arg("lookahead") = 0,
         "Reserves the step's slots in every group (all or nothing). ResourceExhaustedError "
         "when blocks are short; nothing changes.")
      .def(
          "commit",
          [](Manager& self, uint64_t id, int64_t computed) {
            self.Locked([&](KvCacheManager& mgr) { Check(mgr.Commit(id, computed)); });
          },
          py::arg("id"), py::arg("computed"))
      .def(
          "append_tokens",
          [](Manager& self, uint64_t id, const I32Array& tokens) {
            const std::span<const int32_t> t = Span(tokens, "append_tokens: tokens");
            self.Locked([&](KvCacheManager& mgr) { Check(mgr.AppendTokens(id, t)); });
          },
          py::arg("id"), py::arg("tokens"))
      .def(
          "fork",
          [](Manager& self, uint64_t parent, uint64_t child) {
            self.Locked([&](KvCacheManager& mgr) { Check(mgr.Fork(parent, child)); });
          },
          py::arg("parent"), py::arg("child"))
      .def(
          "truncate",
          [](Manager& self, uint64_t id, int64_t n) {
            return self.Locked([&](KvCacheManager& mgr) { return Value(mgr.Truncate(id, n)); });
          },
          py::arg("id"), py::arg("n"))
      .def(
          "evict",
          [](Manager& self, uint64_t id, int32_t group, int64_t keep, int64_t unchanged) {
            return self.Locked(
                [&](KvCacheManager& mgr) { return Value(mgr.Evict(id, group, keep, unchanged)); });
          },
          py::arg("id"), py::arg("group"), py::arg("keep"), py::arg("unchanged"),
          "Sparse KV: keep `keep` slots of a full-attention group, the first `unchanged` in "
          "place; the engine then moves each kept row to its slot from write_from on, reading "
          "the table from before the call.")
      .def(
          "free",
          [](Manager& self, uint64_t id, bool preempted) {
            const FreeReason reason = preempted ? FreeReason::kPreempted : FreeReason::kFinished;
            self.Locked([&](KvCacheManager& mgr) { Check(mgr.Free(id, reason)); });
          },
          py::arg("id"), py::arg("preempted") = false,
          "Ends a request. preempted=True: it comes back (ManagerConfig.thrash_guard never puts "
          "its blocks on probation).")
      .def("reset_prefix_cache",
           [](Manager& self) {
             self.Locked([&](KvCacheManager& mgr) { Check(mgr.ResetPrefixCache()); });
           })
      .def(
          "compact",
          [](Manager& self, const std::variant<int64_t, std::vector<int64_t>>& limit) {
            CompactionResult r = self.Locked([&](KvCacheManager& mgr) {
              if (const int64_t* n = std::get_if<int64_t>(&limit)) return Value(mgr.Compact(*n));
              return Value(mgr.Compact(std::span<const int64_t>(std::get<1>(limit))));
            });
            return CompactionTuple(r);
          },
          py::arg("max_slabs_per_class"),
          "Two-level memory, between steps: empties sparsely held slabs. Returns (moves, slabs): "
          "moves is an int32 array of rows (pool, src, dst) whose page bytes the engine must copy "
          "before the next step.")
      .def(
          "compact_for",
          [](Manager& self, int32_t pool, const std::vector<int64_t>& limits) {
            CompactionResult r = self.Locked(
                [&](KvCacheManager& mgr) { return Value(mgr.CompactFor(pool, limits)); });
            return CompactionTuple(r);
          },
          py::arg("pool"), py::arg("max_slabs_per_class"),
          "Compaction on behalf of class `pool`, whose next page would evict its cache: only "
          "cache older than that page is dropped, and the emptied slabs go to `pool`. Returns "
          "(moves, slabs) as compact does.");
}

void BindStepViews(ManagerClass& cls) {
  cls.def(
         "step",
         [](const Manager& self, uint64_t id) {
           auto lock = self.Hold();
           return StepDict(Value(self.raw().Step(id)));
         },
         py::arg("id"),
         "The open step: {'begin', 'end', 'reserved_end', 'run_encoder', 'copies', 'loads', "
         "'load_digests'} where copies is an int32 array of rows (group, src, dst) to copy "
         "before the forward pass, and loads (before finish_load) an int32 array of rows (group, "
         "pool, block, is_state) to fill from the external store with the block whose digest is "
         "load_digests[i].")
      .def(
          "block_table",
          [](const Manager& self, uint64_t id, int32_t group) {
            // One copy of the whole table, made under the lock: a view into the manager's
            // memory would dangle once another call (or thread) grows the table.
            auto lock = self.Hold();
            const std::span<const int32_t> t = Value(self.raw().BlockTable(id, group));
            py::array_t<int32_t> a(static_cast<py::ssize_t>(t.size()));
            std::copy(t.begin(), t.end(), a.mutable_data());
            return a;
          },
          py::arg("id"), py::arg("group"),
          "The request's block ids for a token group as a new int32 array (one copy of the "
          "table, yours to keep). Released window blocks read 0, the null block. For a batch, "
          "block_tables writes every table into one matrix you provide.")
      .def(
          "slot_mapping",
          [](const Manager& self, uint64_t id, int32_t group, int64_t begin, int64_t end,
             const py::object& out) {
            if (end < begin) {
              throw StatusError(Status::InvalidArgument(
                  fmt::format("slot mapping: end {} before begin {}", end, begin)));
            }
            py::array_t<int64_t, py::array::c_style> a =
                out.is_none() ? py::array_t<int64_t, py::array::c_style>(end - begin)
                              : OutArray<int64_t>(out, 1, "slot mapping");
            std::span<int64_t> dst(a.mutable_data(), static_cast<size_t>(a.shape(0)));
            self.LockedConst([&](const KvCacheManager& mgr) {
              Check(mgr.SlotMapping(id, group, begin, end, dst));
            });
            return a;
          },
          py::arg("id"), py::arg("group"), py::arg("begin"), py::arg("end"),
          py::arg("out") = py::none(),
          "Slots (block * block_tokens + offset) of positions [begin, end) of a token group, "
          "written straight into `out` (an int64 array of end - begin) or a new array.")
      .def(
          "state",
          [](const Manager& self, uint64_t id, int32_t group) {
            auto lock = self.Hold();
            return StateDict(Value(self.raw().State(id, group)));
          },
          py::arg("id"), py::arg("group"),
          "A recurrent group's slots for the open step: {'read', 'write', 'snapshots'} with "
          "snapshots a list of (position, slot).");
}

// Per-step deltas: an engine that keeps tables on its side copies only what changed.
void BindTableDeltas(ManagerClass& cls) {
  cls.def(
         "take_table_delta",
         [](Manager& self, uint64_t id, int32_t group) {
           // Copied under the lock (which runs without the GIL); the array is made after it.
           int32_t size = 0, from = 0;
           std::vector<int32_t> changed;
           self.Locked([&](KvCacheManager& mgr) {
             const TableDelta d = Value(mgr.TakeTableDelta(id, group));
             size = d.size;
             from = d.from;
             changed.assign(d.blocks.begin(), d.blocks.end());
           });
           py::array_t<int32_t> blocks(static_cast<py::ssize_t>(changed.size()));
           std::copy(changed.begin(), changed.end(), blocks.mutable_data());
           return py::make_tuple(size, from, blocks);
         },
         py::arg("id"), py::arg("group"),
         "What changed in a token or encoder group's block table since it was last taken: "
         "(size, from, blocks) - the table now has `size` entries and entries [from, size) are "
         "`blocks` (an int32 array); the first call gives the whole table. Marks the table taken.")
      .def(
          "take_step_inputs",
          [](Manager& self, uint64_t id) {
            // Python objects are built from the manager's memory, so under Hold (GIL kept).
            auto lock = self.Hold();
            StepInputs in;
            Check(self.raw().TakeStepInputs(id, in));
            const ManagerConfig& c = self.raw().config();
            py::list tables, states;
            for (size_t g = 0; g < c.groups.size(); ++g) {
              if (c.groups[g].is_state()) {
                tables.append(py::none());
                states.append(StateDict(in.states[g]));
                continue;
              }
              const TableDelta& t = in.tables[g];
              py::array_t<int32_t> blocks(static_cast<py::ssize_t>(t.blocks.size()));
              std::copy(t.blocks.begin(), t.blocks.end(), blocks.mutable_data());
              tables.append(py::make_tuple(t.size, t.from, blocks));
              states.append(py::none());
            }
            py::array_t<int64_t> slots(static_cast<py::ssize_t>(in.slots.size()));
            std::copy(in.slots.begin(), in.slots.end(), slots.mutable_data());
            py::dict out;
            out["step"] = StepDict(in.step);
            out["tables"] = tables;
            out["states"] = states;
            out["slots"] = slots;
            return out;
          },
          py::arg("id"),
          "Everything an engine needs for a request's open step, in one call: {'step': as step(), "
          "'tables': per group (size, from, blocks) as take_table_delta (None for a state "
          "group), 'states': per group a state() dict (None for a token group), 'slots': the "
          "int64 slots of the step's positions in every decoder token group, one group after "
          "the other}. Marks the tables taken.");
}

// Batched per-step calls: one Python call per step instead of one per request.
void BindBatchCalls(ManagerClass& cls) {
  cls.def(
         "allocate_batch",
         [](Manager& self, const U64Array& ids, const I64Array& num_new_tokens) {
           const std::span<const uint64_t> id = Span(ids, "allocate_batch: ids");
           const std::span<const int64_t> n =
               Span(num_new_tokens, "allocate_batch: num_new_tokens");
           if (id.size() != n.size()) {
             throw StatusError(Status::InvalidArgument(
                 fmt::format("allocate_batch: {} ids but {} token counts", id.size(), n.size())));
           }
           return self.Locked([&](KvCacheManager& mgr) {
             for (size_t i = 0; i < id.size(); ++i) {
               const Status st = mgr.Allocate(id[i], n[i]);
               if (st.code() == StatusCode::kResourceExhausted) return i;
               Check(st);
             }
             return id.size();
           });
         },
         py::arg("ids"), py::arg("num_new_tokens"),
         "Allocate for running requests in order; stops at the first that lacks blocks and "
         "returns how many succeeded (the engine preempts and retries from there). Any other "
         "error raises; the requests before it keep their allocation.")
      .def(
          "commit_batch",
          [](Manager& self, const U64Array& ids, const I64Array& computed) {
            const std::span<const uint64_t> id = Span(ids, "commit_batch: ids");
            const std::span<const int64_t> c = Span(computed, "commit_batch: computed");
            if (id.size() != c.size()) {
              throw StatusError(Status::InvalidArgument(
                  fmt::format("commit_batch: {} ids but {} positions", id.size(), c.size())));
            }
            self.Locked([&](KvCacheManager& mgr) {
              for (size_t i = 0; i < id.size(); ++i)
                Check(mgr.Commit(id[i], c[i]));
            });
          },
          py::arg("ids"), py::arg("computed"),
          "commit(ids[i], computed[i]) in order; an error raises with the earlier ones done.")
      .def(
          "append_tokens_batch",
          [](Manager& self, const U64Array& ids, const I32Array& tokens) {
            const std::span<const uint64_t> id = Span(ids, "append_tokens_batch: ids");
            const std::span<const int32_t> t = Span(tokens, "append_tokens_batch: tokens");
            if (id.size() != t.size()) {
              throw StatusError(Status::InvalidArgument(
                  fmt::format("append_tokens_batch: {} ids but {} tokens", id.size(), t.size())));
            }
            self.Locked([&](KvCacheManager& mgr) {
              for (size_t i = 0; i < id.size(); ++i)
                Check(mgr.AppendTokens(id[i], t.subspan(i, 1)));
            });
          },
          py::arg("ids"), py::arg("tokens"), "One sampled token per request, in order.");
}

void BindBatchViews(ManagerClass& cls) {
  cls.def(
         "block_tables",
         [](const Manager& self, const U64Array& ids, int32_t group, const py::object& out) {
           const std::span<const uint64_t> id = Span(ids, "block_tables: ids");
           // One hold of the lock (GIL kept) from reading the tables to copying them: the
           // spans point into the manager's memory.
           auto lock = self.Hold();
           std::vector<std::span<const int32_t>> tables(id.size());
           size_t width = 0;
           for (size_t i = 0; i < id.size(); ++i) {
             tables[i] = Value(self.raw().BlockTable(id[i], group));
             width = std::max(width, tables[i].size());
           }
           const auto rows = static_cast<py::ssize_t>(id.size());
           py::array_t<int32_t, py::array::c_style> a =
               out.is_none() ? py::array_t<int32_t, py::array::c_style>(
                                   {rows, static_cast<py::ssize_t>(width)})
                             : OutArray<int32_t>(out, 2, "block_tables");
           if (a.shape(0) != rows) {
             throw StatusError(Status::InvalidArgument(fmt::format(
                 "block_tables: out has {} rows: expected {}, one per id", a.shape(0), rows)));
           }
           if (static_cast<size_t>(a.shape(1)) < width) {
             throw StatusError(Status::InvalidArgument(fmt::format(
                 "block_tables: out has {} columns: expected at least {}", a.shape(1), width)));
           }
           const auto cols = static_cast<size_t>(a.shape(1));
           int32_t* dst = a.mutable_data();
           for (size_t i = 0; i < tables.size(); ++i) {
             int32_t* row = dst + i * cols;
             std::copy(tables[i].begin(), tables[i].end(), row);
             std::fill(row + tables[i].size(), row + cols, 0);
           }
           return a;
         },
         py::arg("ids"), py::arg("group"), py::arg("out") = py::none(),
         "The block tables of several requests as rows of one int32 matrix (into `out` when "
         "given, e.g. a pinned buffer), padded with 0, the null block.")
      .def(
          "step_slot_mapping",
          [](const Manager& self, const U64Array& ids, int32_t group) {
            const std::span<const uint64_t> id = Span(ids, "step_slot_mapping: ids");
            auto lock = self.Hold();
            int64_t total = 0;
            for (uint64_t r : id) {
              const StepInfo st = Value(self.raw().Step(r));
              total += st.end - st.begin;
            }
            py::array_t<int64_t> a(total);
            int64_t* dst = a.mutable_data();
            for (uint64_t r : id) {
              const StepInfo st = Value(self.raw().Step(r));
              Check(self.raw().SlotMapping(
                  r, group, st.begin, st.end,
                  std::span<int64_t>(dst, static_cast<size_t>(st.end - st.begin))));
              dst += st.end - st.begin;
            }
            return a;
          },
          py::arg("ids"), py::arg("group"),
          "The slots of every listed request's open step [begin, end), concatenated in order: "
          "the slot mapping a batched kernel writes the step's K/V through.");
}

void BindQueries(ManagerClass& cls) {
  cls.def(
         "contains",
         [](const Manager& self, uint64_t id) {
           return self.LockedConst([&](const KvCacheManager& mgr) { return mgr.Contains(id); });
         },
         py::arg("id"))
      .def("__contains__",
           [](const Manager& self, uint64_t id) {
             return self.LockedConst([&](const KvCacheManager& mgr) { return mgr.Contains(id); });
           })
      .def(
          "num_tokens",
          [](const Manager& self, uint64_t id) {
            return self.LockedConst(
                [&](const KvCacheManager& mgr) { return Value(mgr.NumTokens(id)); });
          },
          py::arg("id"))
      .def(
          "num_computed",
          [](const Manager& self, uint64_t id) {
            return self.LockedConst(
                [&](const KvCacheManager& mgr) { return Value(mgr.NumComputed(id)); });
          },
          py::arg("id"))
      .def_property_readonly(
          "num_requests",
          [](const Manager& self) {
            return self.LockedConst([&](const KvCacheManager& mgr) { return mgr.num_requests(); });
          })
      .def("__len__",
           [](const Manager& self) {
             return self.LockedConst([&](const KvCacheManager& mgr) { return mgr.num_requests(); });
           })
      .def_property_readonly("config", [](const Manager& self) {
        return self.LockedConst([&](const KvCacheManager& mgr) { return mgr.config(); });
      });
}

void BindStatsAndProbe(ManagerClass& cls) {
  cls.def(
         "usage",
         [](const Manager& self, int32_t pool) {
           return self.LockedConst([&](const KvCacheManager& mgr) {
             CheckPool(mgr, pool, "usage");
             return mgr.Usage(pool);
           });
         },
         py::arg("pool"))
      .def("arena",
           [](const Manager& self) {
             return self.LockedConst([&](const KvCacheManager& mgr) { return mgr.Arena(); });
           })
      .def_property_readonly(
          "stats",
          [](const Manager& self) {
            return self.LockedConst([&](const KvCacheManager& mgr) { return mgr.stats(); });
          })
      .def("take_events",
           [](Manager& self) {
             return self.Locked([&](KvCacheManager& mgr) { return mgr.TakeEvents(); });
           })
      .def(
          "free_list_order",
          [](const Manager& self, int32_t pool) {
            return self.LockedConst([&](const KvCacheManager& mgr) {
              CheckPool(mgr, pool, "free_list_order");
              return ManagerProbe::FreeListOrder(mgr, pool);
            });
          },
          py::arg("pool"), "Free blocks of a pool in eviction order (first evicted first).")
      .def(
          "uncached_free_blocks",
          [](const Manager& self, int32_t pool) {
            return self.LockedConst([&](const KvCacheManager& mgr) {
              std::vector<int32_t> out;
              Check(ManagerProbe::UncachedFreeBlocks(mgr, pool, out));
              return out;
            });
          },
          py::arg("pool"))
      .def(
          "check_invariants",
          [](const Manager& self) {
            self.LockedConst([&](const KvCacheManager& mgr) {
              Check(mgr.CheckInvariants());
              return 0;
            });
          },
          "Raises (with what is wrong) unless ref counts, free lists, the prefix index and every "
          "request's tables agree.");
}

}  // namespace

void BindManager(py::module_& m) {
  BindResultTypes(m);
  BindStatsTypes(m);
  ManagerClass cls(m, "KvCacheManager",
                   "The manager an engine drives per step (thread-safe: one call at a time).");
  BindRequests(cls);
  BindAllocation(cls);
  BindStepViews(cls);
  BindTableDeltas(cls);
  BindBatchCalls(cls);
  BindBatchViews(cls);
  BindQueries(cls);
  BindStatsAndProbe(cls);
}

}  // namespace hkv::python
