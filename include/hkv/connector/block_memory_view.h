// BlockMemoryView: the planned KV memory as a connector sees it - blocks of bytes, not tensors.
//
// Contract: Create takes a Plan and the buffers its memory lives in (one per page class, or the
// one slab buffer of a two-level plan, as PagedKvCache allocates them), each at least as large
// as the plan lays out; it refuses a wrong count or a short buffer and names which. The view
// never owns or changes memory; it only answers where a block's bytes are.
// - A pool is a page class: block ids of a fixed pool run [0, num_pages), of a two-level pool
//   [1, num_pages] (the null block owns no page there), bytes_per_block is the class's page.
//   Two-level pools share the slabs: ids of different pools alias unless the manager's arena gave
//   their slabs to those classes, which the view cannot know; callers pass ids the arena owns.
// - A block holds the data of one group at a time (the manager decides which), so regions are
//   asked per (group, block): the contiguous byte ranges holding every tensor of every layer of
//   that group for that block, in canonical order (the group's layers in order, each layer's
//   tensors packed), adjacent ranges merged. Canonical layout: exactly one region per block;
//   per-layer layout: one per tensor. Their concatenation is the block's canonical image, the same
//   bytes whichever layout the plan chose, which is what export and import move.
// - GroupRefs tell which bytes of that image belong to which layer and tensor.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <hkv/common/dtype.h>
#include <hkv/common/result.h>
#include <hkv/plan/plan.h>

namespace hkv {

// One contiguous range of bytes of a block inside a plan buffer.
struct BlockRegion {
  unsigned char* data = nullptr;
  int64_t bytes = 0;
};

// One tensor of one layer within a group's canonical block image.
struct TensorRef {
  int32_t layer = 0;         // index into ModelSpec::layers
  std::string name;          // "k", "v", "latent", "conv", "ssm"
  int64_t image_offset = 0;  // where it starts in the block's canonical image
  int64_t bytes = 0;
  std::vector<int64_t> block_shape;
  DType dtype = DType::kBF16;
};

struct GroupRefs {
  int32_t group = 0;
  int32_t pool = 0;       // page class
  bool is_state = false;  // a block of this group is one recurrent-state checkpoint
  int32_t block_tokens = 0;
  int64_t image_bytes = 0;  // bytes of one block's canonical image (sum of tensor bytes)
  // Digest of the geometry (layers, tensor names, shapes, dtypes, kind, block tokens): two
  // views can exchange blocks of a group only when their fingerprints agree.
  uint64_t fingerprint = 0;
  std::vector<TensorRef> tensors;  // canonical order
};

class BlockMemoryView {
 public:
  static Result<BlockMemoryView> Create(const Plan& plan,
                                        std::span<const std::span<unsigned char>> buffers);

  TensorLayout layout() const { return layout_; }
  int32_t num_pools() const { return static_cast<int32_t>(pools_.size()); }
  int64_t num_blocks(int32_t pool) const { return pools_[static_cast<size_t>(pool)].num_blocks; }
  int64_t first_block(int32_t pool) const { return pools_[static_cast<size_t>(pool)].first; }
  int64_t bytes_per_block(int32_t pool) const {
    return pools_[static_cast<size_t>(pool)].bytes_per_block;
  }
  bool ValidBlock(int32_t pool, int64_t block) const;

  int32_t num_groups() const { return static_cast<int32_t>(groups_.size()); }
  const GroupRefs& group(int32_t g) const { return groups_[static_cast<size_t>(g)].refs; }

  // Replaces `out` with the regions of block `block` of group `group`; refuses an unknown group
  // or a block outside its pool (naming which), leaving `out` unchanged.
  Status Regions(int32_t group, int64_t block, std::vector<BlockRegion>& out) const;

 private:
  struct Pool {
    int64_t first = 0;
    int64_t num_blocks = 0;
    int64_t bytes_per_block = 0;
  };
  struct Tensor {
    unsigned char* base = nullptr;  // buffer + offset
    int64_t block_stride = 0;
    int64_t bytes = 0;
  };
  struct Group {
    GroupRefs refs;
    std::vector<Tensor> tensors;  // canonical order
    int64_t pages_per_slab = 0;   // two-level only
  };

  TensorLayout layout_ = TensorLayout::kCanonical;
  int64_t slab_bytes_ = 0;  // two-level only
  std::vector<Pool> pools_;
  std::vector<Group> groups_;
};

}  // namespace hkv
