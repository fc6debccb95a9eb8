#include <fmt/format.h>

#include <hkv/connector/block_memory_view.h>

// Inline the whole of xxHash (header only): nothing to link, and the fingerprint is hashed once.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace hkv {
namespace {

void PutU64(std::vector<unsigned char>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<unsigned char>(v >> (8 * i)));  // little endian
}

// Every field that decides what the bytes of a block mean, length-prefixed so that different
// geometries never serialise to the same bytes. Buffer offsets and strides are left out on
// purpose: they differ between layouts while the block's meaning does not.
uint64_t FingerprintOf(const GroupRefs& g) {
  std::vector<unsigned char> bytes;
  PutU64(bytes, g.is_state ? 1 : 0);
  PutU64(bytes, static_cast<uint64_t>(g.block_tokens));
  PutU64(bytes, g.tensors.size());
  for (const TensorRef& t : g.tensors) {
    PutU64(bytes, static_cast<uint64_t>(t.layer));
    PutU64(bytes, t.name.size());
    bytes.insert(bytes.end(), t.name.begin(), t.name.end());
    PutU64(bytes, static_cast<uint64_t>(t.dtype));
    PutU64(bytes, static_cast<uint64_t>(t.bytes));
    PutU64(bytes, t.block_shape.size());
    for (int64_t d : t.block_shape)
      PutU64(bytes, static_cast<uint64_t>(d));
  }
  return XXH3_64bits(bytes.data(), bytes.size());
}

}  // namespace

Result<BlockMemoryView> BlockMemoryView::Create(const Plan& plan,
                                                std::span<const std::span<unsigned char>> buffers) {
  const bool two_level = plan.arena.enabled();
  const size_t want = two_level ? 1 : plan.page_classes.size();
  if (buffers.size() != want) {
    return Status::InvalidArgument(
        fmt::format("block memory view: {} buffers given, the plan ({} strategy) needs {}",
                    buffers.size(), PageStrategyName(plan.strategy), want));
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    const int64_t need =
        two_level ? plan.arena.buffer_bytes() : plan.page_classes[i].buffer_bytes();
    if (static_cast<int64_t>(buffers[i].size()) < need) {
      return Status::InvalidArgument(
          fmt::format("block memory view: buffer {} has {} bytes, the plan lays out {}", i,
                      buffers[i].size(), need));
    }
  }
  BlockMemoryView view;
  view.layout_ = plan.layout.kind;
  view.slab_bytes_ = two_level ? plan.arena.slab_bytes : 0;
  for (const PageClass& c : plan.page_classes) {
    view.pools_.push_back(Pool{two_level ? 1 : 0, c.num_pages, c.page_bytes});
  }
  // The layout lists tensors sorted by layer; a group's canonical order is its layers in group
  // order, each with its tensors in the order the layout keeps them.
  std::vector<std::vector<const TensorView*>> of_layer(plan.model.layers.size());
  for (const TensorView& v : plan.layout.tensors)
    of_layer[static_cast<size_t>(v.layer)].push_back(&v);
  for (const KvGroup& g : plan.groups) {
    Group group;
    group.refs.group = g.id;
    group.refs.pool = g.page_class;
    group.refs.is_state = g.is_state();
    group.refs.block_tokens = g.block_tokens;
    group.pages_per_slab = plan.page_classes[static_cast<size_t>(g.page_class)].pages_per_slab;
    unsigned char* buffer = buffers[two_level ? 0 : static_cast<size_t>(g.page_class)].data();
    for (int32_t layer : g.layers) {
      for (const TensorView* v : of_layer[static_cast<size_t>(layer)]) {
        group.refs.tensors.push_back(TensorRef{v->layer, v->name, group.refs.image_bytes, v->bytes,
                                               v->block_shape, v->dtype});
        group.refs.image_bytes += v->bytes;
        group.tensors.push_back(Tensor{buffer + v->offset, v->block_stride, v->bytes});
      }
    }
    group.refs.fingerprint = FingerprintOf(group.refs);
    view.groups_.push_back(std::move(group));
  }
  return view;
}

bool BlockMemoryView::ValidBlock(int32_t pool, int64_t block) const {
  if (pool < 0 || pool >= num_pools()) return false;
  const Pool& p = pools_[static_cast<size_t>(pool)];
  return block >= p.first && block < p.first + p.num_blocks;
}

Status BlockMemoryView::Regions(int32_t group, int64_t block, std::vector<BlockRegion>& out) const {
  if (group < 0 || group >= num_groups()) {
    return Status::InvalidArgument(fmt::format(
        "block memory view: group {} does not exist (the plan has {})", group, num_groups()));
  }
  const Group& g = groups_[static_cast<size_t>(group)];
  if (!ValidBlock(g.refs.pool, block)) {
    const Pool& p = pools_[static_cast<size_t>(g.refs.pool)];
    return Status::InvalidArgument(
        fmt::format("block memory view: block {} of group {} is outside pool {} (ids {}..{})",
                    block, group, g.refs.pool, p.first, p.first + p.num_blocks - 1));
  }
  out.clear();
  for (const Tensor& t : g.tensors) {
    unsigned char* data =
        t.base + (g.pages_per_slab == 0
                      ? block * t.block_stride
                      : SlabPageOffset(block, g.pages_per_slab, slab_bytes_, t.block_stride));
    // Canonical pages pack a group's tensors back to back: merging makes them one region.
    if (!out.empty() && out.back().data + out.back().bytes == data) {
      out.back().bytes += t.bytes;
    } else {
      out.push_back(BlockRegion{data, t.bytes});
    }
  }
  return Status::Ok();
}

}  // namespace hkv
