#include "memory_layout.h"

#include <algorithm>

#include "layer_tensors.h"

namespace hkv {
namespace {

using SlotStrides = std::vector<std::vector<int64_t>>;  // [layer slot][tensor index] -> bytes

// Per-layer region strides of one class: the largest tensor any of its groups keeps in that slot.
SlotStrides StridesOf(const ModelSpec& model, const std::vector<KvGroup>& groups,
                      const PageClass& page_class) {
  SlotStrides strides;
  for (int32_t gi : page_class.groups) {
    const KvGroup& g = groups[static_cast<size_t>(gi)];
    if (strides.size() < g.layers.size()) strides.resize(g.layers.size());
    for (size_t j = 0; j < g.layers.size(); ++j) {
      const auto tensors =
          LayerTensorsOf(model.layers[static_cast<size_t>(g.layers[j])], g.block_tokens);
      std::vector<int64_t>& slot = strides[j];
      if (slot.size() < tensors.size()) slot.resize(tensors.size(), 0);
      for (size_t t = 0; t < tensors.size(); ++t)
        slot[t] = std::max(slot[t], tensors[t].bytes);
    }
  }
  return strides;
}

TensorView ViewOf(int32_t layer, int32_t page_class, LayerTensor tensor, int64_t offset,
                  int64_t block_stride) {
  TensorView v;
  v.layer = layer;
  v.name = std::move(tensor.name);
  v.page_class = page_class;
  v.offset = offset;
  v.block_stride = block_stride;
  v.bytes = tensor.bytes;
  v.block_shape = std::move(tensor.block_shape);
  v.dtype = tensor.dtype;
  return v;
}

void AddCanonicalViews(const ModelSpec& model, const KvGroup& g, const PageClass& c,
                       std::vector<TensorView>& out) {
  int64_t offset = 0;
  for (int32_t layer : g.layers) {
    for (LayerTensor& t :
         LayerTensorsOf(model.layers[static_cast<size_t>(layer)], g.block_tokens)) {
      const int64_t bytes = t.bytes;
      out.push_back(ViewOf(layer, c.id, std::move(t), offset, c.page_bytes));
      offset += bytes;
    }
  }
}

void AddPerLayerViews(const ModelSpec& model, const std::vector<KvGroup>& groups,
                      const PageClass& c, std::vector<TensorView>& out) {
  const SlotStrides strides = StridesOf(model, groups, c);
  SlotStrides bases(strides.size());
  int64_t base = 0;
  for (size_t j = 0; j < strides.size(); ++j) {
    for (int64_t stride : strides[j]) {
      bases[j].push_back(base);
      base += stride * c.num_pages;
    }
  }
  for (int32_t gi : c.groups) {
    const KvGroup& g = groups[static_cast<size_t>(gi)];
    for (size_t j = 0; j < g.layers.size(); ++j) {
      const int32_t layer = g.layers[j];
      auto tensors = LayerTensorsOf(model.layers[static_cast<size_t>(layer)], g.block_tokens);
      for (size_t t = 0; t < tensors.size(); ++t) {
        out.push_back(ViewOf(layer, c.id, std::move(tensors[t]), bases[j][t], strides[j][t]));
      }
    }
  }
}

}  // namespace

void SetClassPageBytes(const ModelSpec& model, TensorLayout kind,
                       const std::vector<KvGroup>& groups, std::vector<PageClass>& classes) {
  for (PageClass& c : classes) {
    c.page_bytes = 0;
    if (kind == TensorLayout::kCanonical) {
      // Groups share a class because their pages are equal; max() is only defensive.
      for (int32_t gi : c.groups) {
        c.page_bytes = std::max(c.page_bytes, groups[static_cast<size_t>(gi)].page_bytes);
      }
    } else {
      for (const auto& slot : StridesOf(model, groups, c)) {
        for (int64_t stride : slot)
          c.page_bytes += stride;
      }
    }
  }
}

MemoryLayout BuildLayout(const ModelSpec& model, TensorLayout kind,
                         const std::vector<KvGroup>& groups,
                         const std::vector<PageClass>& classes) {
  MemoryLayout layout;
  layout.kind = kind;
  for (const PageClass& c : classes) {
    if (kind == TensorLayout::kCanonical) {
      for (int32_t gi : c.groups) {
        AddCanonicalViews(model, groups[static_cast<size_t>(gi)], c, layout.tensors);
      }
    } else {
      AddPerLayerViews(model, groups, c, layout.tensors);
    }
  }
  std::stable_sort(layout.tensors.begin(), layout.tensors.end(),
                   [](const TensorView& a, const TensorView& b) { return a.layer < b.layer; });
  return layout;
}

}  // namespace hkv
