// Model configs, plans, allocator modes and the manager's configuration.
#include <string>
#include <vector>

#include <fmt/format.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <hkv/common/byte_size.h>
#include <hkv/manager/allocator_mode.h>
#include <hkv/manager/manager_config.h>
#include <hkv/plan/plan.h>
#include <hkv/spec/config_loader.h>
#include <hkv/spec/token_rule.h>

#include "bindings.h"
#include "status_error.h"

namespace py = pybind11;

namespace hkv::python {

int64_t ToBytes(const ByteSize& size, const char* what) {
  if (const int64_t* n = std::get_if<int64_t>(&size)) {
    if (*n < 0)
      throw StatusError(Status::InvalidArgument(fmt::format("{} {}: expected >= 0", what, *n)));
    return *n;
  }
  Result<int64_t> parsed = ParseByteSize(std::get<std::string>(size));
  if (!parsed.ok()) {
    throw StatusError(
        Status::InvalidArgument(fmt::format("{}: {}", what, parsed.status().message())));
  }
  return *parsed;
}

namespace {

void BindModelSpec(py::module_& m) {
  py::class_<ModelSpec>(m, "Model", "A model's cache-relevant structure, read from a config.json.")
      .def_readonly("model_type", &ModelSpec::model_type)
      .def_readonly("source", &ModelSpec::source)
      .def_readonly("num_layers", &ModelSpec::num_layers)
      .def_readonly("max_position_embeddings", &ModelSpec::max_position_embeddings)
      .def_readonly("max_encoder_tokens", &ModelSpec::max_encoder_tokens)
      .def_readonly("warnings", &ModelSpec::warnings)
      .def_property_readonly("layer_kinds", &ModelSpec::LayerKindNames,
                             "Per layer, its mixers' kinds joined by '+'.")
      .def_property_readonly("kv_bytes_per_token", &ModelSpec::bytes_per_token_full,
                             "KV bytes per token over the layers that keep every token.")
      .def_property_readonly("state_bytes_per_sequence", &ModelSpec::state_bytes_per_sequence)
      .def("__repr__", [](const ModelSpec& s) {
        return fmt::format("<hybridkv.Model {} ({} layers) from {}>", s.model_type, s.num_layers,
                           s.source);
      });

  m.def(
      "load_model",
      [](const std::filesystem::path& path) {
        py::gil_scoped_release release;
        return Value(LoadModelConfig(path));
      },
      py::arg("path"),
      "Reads a Hugging Face config.json (or the folder holding one). Raises NotFoundError, "
      "ParseError or InvalidArgumentError naming the file, field and value.");
}

void BindConfigs(py::module_& m) {
  py::class_<GroupConfig>(m, "GroupConfig",
                          "One group of layers sharing a token rule, block size and pool.")
      .def(py::init([](const std::string& kind, int32_t block_tokens, int32_t pool, int32_t span,
                       int32_t sinks) {
             GroupConfig g;
             const TokenRuleKind k = Value(ParseTokenRuleKind(kind));
             if (k == TokenRuleKind::kNothing) {
               throw StatusError(Status::InvalidArgument(
                   "group kind 'nothing': a group must keep tokens or a state"));
             }
             g.rule = {k, span, sinks};
             g.block_tokens = block_tokens;
             g.pool = pool;
             return g;
           }),
           py::arg("kind"), py::arg("block_tokens") = 0, py::arg("pool") = 0, py::arg("span") = 0,
           py::arg("sinks") = 0)
      .def_property_readonly(
          "kind", [](const GroupConfig& g) { return std::string(TokenRuleKindName(g.rule.kind)); })
      .def_property_readonly("span", [](const GroupConfig& g) { return g.rule.span; })
      .def_property_readonly("sinks", [](const GroupConfig& g) { return g.rule.sinks; })
      .def_readonly("block_tokens", &GroupConfig::block_tokens)
      .def_readonly("pool", &GroupConfig::pool)
      .def("__repr__", [](const GroupConfig& g) {
        return fmt::format("<hybridkv.GroupConfig {}, {} tokens/block, pool {}>", g.rule.Describe(),
                           g.block_tokens, g.pool);
      });

  py::class_<ManagerConfig>(m, "ManagerConfig",
                            "Pools, groups and policies of a KvCacheManager. Build one with "
                            "make_allocator / ManagerConfig.from_plan, or by hand.")
      .def(py::init<>())
      .def_static(
          "from_plan", [](const Plan& plan) { return Value(ManagerConfig::FromPlan(plan)); },
          py::arg("plan"))
      .def_readwrite("pool_blocks", &ManagerConfig::pool_blocks,
                     "Blocks per pool, the null block (id 0) included.")
      .def_readwrite("groups", &ManagerConfig::groups)
      .def_property(
          "num_slabs", [](const ManagerConfig& c) { return c.arena.num_slabs; },
          [](ManagerConfig& c, int64_t n) { c.arena.num_slabs = n; },
          "Two-level memory: shared slabs (0: every pool owns its blocks). Pool p then has "
          "num_slabs * pages_per_slab[p] + 1 blocks.")
      .def_property(
          "pages_per_slab", [](const ManagerConfig& c) { return c.arena.pages_per_slab; },
          [](ManagerConfig& c, const std::vector<int32_t>& v) { c.arena.pages_per_slab = v; })
      .def_readwrite("max_model_len", &ManagerConfig::max_model_len)
      .def_readwrite("max_encoder_tokens", &ManagerConfig::max_encoder_tokens)
      .def_readwrite("state_align_tokens", &ManagerConfig::state_align_tokens)
      .def_readwrite("checkpoint_interval", &ManagerConfig::checkpoint_interval)
      .def_readwrite("demote_superseded_checkpoints", &ManagerConfig::demote_superseded_checkpoints)
      .def_readwrite("max_interval_checkpoints", &ManagerConfig::max_interval_checkpoints)
      .def_readwrite("enable_prefix_caching", &ManagerConfig::enable_prefix_caching)
      .def_readwrite("drop_last_hit_block", &ManagerConfig::drop_last_hit_block)
      .def_readwrite("coherent_eviction", &ManagerConfig::coherent_eviction)
      .def_readwrite("publish_at_allocate", &ManagerConfig::publish_at_allocate)
      .def_readwrite("evict_uncovered", &ManagerConfig::evict_uncovered)
      .def_readwrite("prompt_checkpoints", &ManagerConfig::prompt_checkpoints)
      .def_readwrite("rolling_stride_after_give_back",
                     &ManagerConfig::rolling_stride_after_give_back)
      .def_readwrite("branch_memory_entries", &ManagerConfig::branch_memory_entries)
      .def_readwrite("branch_bonus", &ManagerConfig::branch_bonus)
      .def_readwrite("admission_headroom_steps", &ManagerConfig::admission_headroom_steps)
      .def_readwrite("branch_bonus_levels", &ManagerConfig::branch_bonus_levels)
      .def_readwrite("thrash_guard", &ManagerConfig::thrash_guard)
      .def_readwrite("thrash_keep_share", &ManagerConfig::thrash_keep_share)
      .def_readwrite("record_events", &ManagerConfig::record_events)
      .def(
          "validate", [](const ManagerConfig& c) { Check(c.Validate()); },
          "Raises InvalidArgumentError naming the first thing wrong.")
      .def_property_readonly("hash_tokens", &ManagerConfig::hash_tokens)
      .def_property_readonly("align_tokens", &ManagerConfig::align_tokens);
}

void BindPlan(py::module_& m) {
  py::class_<Plan>(m, "Plan", "How a model's cache is laid out in a memory budget.")
      .def_property_readonly("model", [](const Plan& p) { return p.model; })
      .def_property_readonly(
          "strategy", [](const Plan& p) { return std::string(PageStrategyName(p.strategy)); })
      .def_property_readonly("block_tokens", [](const Plan& p) { return p.options.block_tokens; })
      .def_property_readonly("max_model_len", [](const Plan& p) { return p.options.max_model_len; })
      .def_property_readonly("num_groups", [](const Plan& p) { return p.groups.size(); })
      .def_property_readonly("num_page_classes",
                             [](const Plan& p) { return p.page_classes.size(); })
      .def_property_readonly("num_pages", &Plan::num_pages)
      .def_readonly("warnings", &Plan::warnings)
      .def("max_sequences", &Plan::MaxSequences, py::arg("tokens"), py::arg("encoder_tokens") = 0,
           "Most identical sequences of this length that fit at once.")
      .def("max_sequences_uniform", &Plan::MaxSequencesUniform, py::arg("tokens"),
           py::arg("encoder_tokens") = 0)
      .def("manager_config", [](const Plan& p) { return Value(ManagerConfig::FromPlan(p)); });

  m.def(
      "make_plan",
      [](const ModelSpec& model, const ByteSize& memory, int32_t block_tokens,
         int64_t max_model_len, int64_t seq_tokens, int64_t encoder_tokens) {
        PlanOptions o;
        o.memory_bytes = ToBytes(memory, "memory");
        o.block_tokens = block_tokens;
        o.max_model_len = max_model_len;
        o.seq_tokens = seq_tokens;
        o.encoder_tokens = encoder_tokens;
        py::gil_scoped_release release;
        return Value(MakePlan(model, o));
      },
      py::arg("model"), py::arg("memory") = ByteSize{std::string("16GiB")},
      py::arg("block_tokens") = 16, py::arg("max_model_len") = 0, py::arg("seq_tokens") = 0,
      py::arg("encoder_tokens") = -1,
      "Plans the model's cache in `memory` (bytes or text like '16GiB'). max_model_len 0: the "
      "config's; seq_tokens 0: max_model_len; encoder_tokens -1: the model's largest input.");
}

void BindAllocator(py::module_& m) {
  py::class_<Allocator>(m, "Allocator", "One allocator mode's pools and groups for a model.")
      .def_property_readonly(
          "mode", [](const Allocator& a) { return std::string(AllocatorModeName(a.mode)); })
      .def_readonly("config", &Allocator::config)
      .def_readonly("block_tokens", &Allocator::block_tokens)
      .def_readonly("state_page_bytes", &Allocator::state_page_bytes)
      .def_readonly("pool_block_bytes", &Allocator::pool_block_bytes)
      .def_readonly("slab_bytes", &Allocator::slab_bytes)
      .def_readonly("summary", &Allocator::summary)
      .def("bytes_per_sequence", &Allocator::BytesPerSequence, py::arg("tokens"),
           py::arg("encoder_tokens") = 0)
      .def("max_sequences", &Allocator::MaxSequences, py::arg("tokens"),
           py::arg("encoder_tokens") = 0);

  m.def(
      "make_allocator",
      [](const ModelSpec& model, const std::string& mode, const ByteSize& memory,
         int32_t block_tokens, int64_t max_model_len, int64_t planning_tokens,
         int64_t encoder_tokens) {
        const AllocatorMode parsed = Value(ParseAllocatorMode(mode));
        PlanOptions o;
        o.memory_bytes = ToBytes(memory, "memory");
        o.block_tokens = block_tokens;
        o.max_model_len = max_model_len;
        o.seq_tokens = planning_tokens;
        o.encoder_tokens = encoder_tokens;
        py::gil_scoped_release release;
        return Value(MakeAllocator(model, parsed, o));
      },
      py::arg("model"), py::arg("mode") = "hybridkv",
      py::arg("memory") = ByteSize{std::string("16GiB")}, py::arg("block_tokens") = 16,
      py::arg("max_model_len") = 16384, py::arg("planning_tokens") = 0,
      py::arg("encoder_tokens") = -1,
      "The pools and groups of allocator mode 'uniform', 'padded' or 'hybridkv' (what hkv "
      "simulate compares) in `memory`. Its .config creates a KvCacheManager.");
}

}  // namespace

void BindModel(py::module_& m) {
  BindModelSpec(m);
  BindConfigs(m);
  BindPlan(m);
  BindAllocator(m);
}

}  // namespace hkv::python
