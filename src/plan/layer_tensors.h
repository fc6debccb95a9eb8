// The tensors one layer keeps per page: K and V blocks, an MLA latent block, or recurrent state
// tensors. Private to the plan part.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <hkv/common/dtype.h>
#include <hkv/spec/layer_spec.h>

namespace hkv {

struct LayerTensor {
  std::string name;
  std::vector<int64_t> block_shape;
  DType dtype = DType::kBF16;
  int64_t bytes = 0;  // bytes of one block (one state for recurrent tensors)
};

// In the order they are packed into a page. Their bytes sum to block_tokens * kv_bytes_per_token
// (attention) or state_bytes (recurrent); layers that own nothing have none.
std::vector<LayerTensor> LayerTensorsOf(const LayerSpec& layer, int32_t block_tokens);

}  // namespace hkv
