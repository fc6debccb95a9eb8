// Tensor layout inside the page-class buffers. Private to the plan part.
//
// Canonical: a buffer is block-major; page p of any group of the class is the byte range
// [p * page_bytes, (p + 1) * page_bytes), holding the group's layers in group order, each layer's
// tensors packed in order. Connectors move one page as one range.
// Per layer: a buffer is cut into regions, one per (layer slot within the group, tensor); each
// region holds that tensor for every page, like the classic per-layer KV tensors. Groups sharing a
// class share the regions, so a region's stride is the largest tensor any group puts in that slot,
// and a page occupies the sum of the strides, which exceeds the canonical page when slots differ.
#pragma once

#include <vector>

#include <hkv/plan/plan.h>

namespace hkv {

// Sets each class's page_bytes to what one page occupies in its buffer under `kind`.
void SetClassPageBytes(const ModelSpec& model, TensorLayout kind,
                       const std::vector<KvGroup>& groups, std::vector<PageClass>& classes);

// Every tensor of every group's layers, ordered by index into ModelSpec::layers. Needs the classes'
// page_bytes (SetClassPageBytes) and num_pages.
MemoryLayout BuildLayout(const ModelSpec& model, TensorLayout kind,
                         const std::vector<KvGroup>& groups, const std::vector<PageClass>& classes);

}  // namespace hkv
