// Plan: how a model's KV cache and recurrent state are grouped, paged, sized and laid out.
//
// Contract (see docs/ARCHITECTURE.md, "plan"):
// - Cache-owning layers with equal TokenRules form groups; all layers of a group share one block
//   table. Recurrent layers form one state group whose page holds the state of every recurrent
//   layer, so one page id is one checkpoint of the whole model's recurrence.
// - A group's page is one block of every layer in it (block_tokens tokens each; for the state
//   group one state), so page_bytes = block_tokens * sum of kv_bytes_per_token (+ padding layers),
//   or the sum of state bytes.
// - Groups with equal page_bytes share a page class. With the single-class strategy groups are
//   split into subgroups of equal layer count and padded, RFC milestone 1, and the class is one
//   buffer; with multi-class every distinct page size is its own class and buffer, the budget
//   split between them in proportion to one planning-point sequence's demand; with two-level
//   (RFC milestone 2) the classes share one buffer of `arena.num_slabs` slabs, each carved into
//   pages of whichever class needs memory (the manager's SlabArena), so no split is fixed.
// - Capacity figures are exact functions of the plan: see Footprint() and MaxSequences().
// MakePlan never returns a plan that cannot hold one sequence at the planning point.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/plan/plan_options.h>
#include <hkv/spec/model_spec.h>
#include <hkv/spec/token_rule.h>

namespace hkv {

struct KvGroup {
  int32_t id = 0;
  TokenRule rule;
  std::vector<int32_t> layers;  // indices into ModelSpec::layers
  int32_t padding_layers = 0;   // layer slots added so that single-class groups are equal
  int32_t block_tokens = 0;     // tokens per block; 0 for the state group (a page is one state)
  int64_t page_bytes = 0;       // bytes of one page of this group
  int32_t page_class = 0;       // index into Plan::page_classes

  bool is_state() const { return rule.kind == TokenRuleKind::kState; }
};

struct PageClass {
  int32_t id = 0;
  int64_t page_bytes = 0;       // bytes one page occupies in this class's buffer
  int64_t num_pages = 0;        // pages in the buffer (two-level: if it had every slab)
  int32_t pages_per_slab = 0;   // two-level: pages one slab holds; 0 otherwise
  std::vector<int32_t> groups;  // groups drawing pages from this class

  // A two-level class has no buffer of its own (its pages live in the plan's slabs).
  int64_t buffer_bytes() const { return pages_per_slab > 0 ? 0 : page_bytes * num_pages; }
};

// Two-level memory: one buffer of num_slabs slabs of slab_bytes. The slab size is the largest
// page times the smallest k <= 64 whose slab leaves every class at most 0.5% unused tail (else
// the k with the least), as long as the budget still has 16 slabs.
struct ArenaPlan {
  int64_t slab_bytes = 0;
  int64_t num_slabs = 0;

  bool enabled() const { return num_slabs > 0; }
  int64_t buffer_bytes() const { return slab_bytes * num_slabs; }
};

// Two-level memory: where block `block` (>= 1) of a class with `pages_per_slab` pages of
// `page_stride` bytes per slab starts, from the start of the slab buffer.
inline int64_t SlabPageOffset(int64_t block, int64_t pages_per_slab, int64_t slab_bytes,
                              int64_t page_stride) {
  return (block - 1) / pages_per_slab * slab_bytes + (block - 1) % pages_per_slab * page_stride;
}

// One tensor of one layer inside a class buffer. The bytes of block b are
// [offset + b * block_stride, offset + b * block_stride + bytes); with two-level memory the one
// shared buffer holds them at Plan::BlockOffset (offset is then within the page).
struct TensorView {
  int32_t layer = 0;  // index into ModelSpec::layers
  std::string name;   // "k", "v", "latent", "conv", "ssm"
  int32_t page_class = 0;
  int64_t offset = 0;
  int64_t block_stride = 0;
  int64_t bytes = 0;
  std::vector<int64_t> block_shape;  // element shape of one block of this tensor
  DType dtype = DType::kBF16;
};

struct MemoryLayout {
  TensorLayout kind = TensorLayout::kCanonical;
  std::vector<TensorView> tensors;  // every tensor of every cache-owning layer
};

// What one sequence costs, and what it would cost under the pre-hybrid uniform layout.
struct Footprint {
  int64_t tokens = 0;
  int64_t encoder_tokens = 0;
  int64_t ideal_bytes = 0;     // bytes the model truly needs resident
  int64_t hybridkv_bytes = 0;  // pages this plan allocates for it, in bytes
  int64_t uniform_bytes = 0;   // every token (decoder and encoder) in every layer, block-rounded
  std::vector<int64_t> pages_per_group;  // indexed by group id
  double hybridkv_waste() const;         // (hybridkv - ideal) / hybridkv
  double uniform_waste() const;          // (uniform - ideal) / uniform
};

// One page-size candidate the planner weighed.
struct PageCandidate {
  PageStrategy strategy = PageStrategy::kAuto;
  bool feasible = false;
  std::string why_not;         // when infeasible
  int64_t wasted_bytes = 0;    // hybridkv_bytes - ideal_bytes for one planning-point sequence
  int64_t sequence_bytes = 0;  // hybridkv_bytes of that sequence
  int32_t num_groups = 0;
  int32_t num_classes = 0;
};

struct Plan {
  ModelSpec model;
  PlanOptions options;                                 // with every "unset" value resolved
  PageStrategy strategy = PageStrategy::kSingleClass;  // the one chosen
  std::vector<PageCandidate> candidates;
  std::vector<KvGroup> groups;
  std::vector<PageClass> page_classes;
  ArenaPlan arena;  // two-level strategy only
  MemoryLayout layout;
  int64_t uniform_bytes_per_token = 0;  // every cache-owning layer treated as full attention
  std::vector<std::string> warnings;

  int64_t num_pages() const;  // over all classes (two-level: each as if it had every slab)
  // Byte offset of block `block` (>= 1 with two-level memory) of tensor view `v` in its buffer.
  int64_t BlockOffset(const TensorView& v, int64_t block) const;
  Footprint FootprintOf(int64_t tokens, int64_t encoder_tokens) const;
  Footprint PlanningFootprint() const {
    return FootprintOf(options.seq_tokens, options.encoder_tokens);
  }
  // Largest number of identical sequences that fit at once in this plan's pages.
  int64_t MaxSequences(int64_t tokens, int64_t encoder_tokens) const;
  // The same under the uniform layout with the same memory budget and block size.
  int64_t MaxSequencesUniform(int64_t tokens, int64_t encoder_tokens) const;
};

Result<Plan> MakePlan(const ModelSpec& model, const PlanOptions& options);

// Bytes one token costs when every cache-owning layer is treated as full attention and every
// recurrent layer is charged like the first attention layer: the pre-hybrid uniform layout.
int64_t UniformBytesPerToken(const ModelSpec& model);

// Bytes one sequence of `tokens` decoder and `encoder_tokens` encoder tokens truly needs
// resident: every cache-owning layer's TokenRule ideal tokens times its bytes per token, plus the
// recurrent state (Footprint::ideal_bytes). Negative counts are taken as 0.
int64_t IdealBytes(const ModelSpec& model, int64_t tokens, int64_t encoder_tokens);

}  // namespace hkv
