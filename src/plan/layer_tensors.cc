#include "layer_tensors.h"

namespace hkv {
namespace {

LayerTensor Tensor(std::string name, std::vector<int64_t> shape, DType dtype) {
  int64_t elements = 1;
  for (int64_t d : shape)
    elements *= d;
  return {std::move(name), std::move(shape), dtype, elements * DTypeBytes(dtype)};
}

}  // namespace

std::vector<LayerTensor> LayerTensorsOf(const LayerSpec& layer, int32_t block_tokens) {
  std::vector<LayerTensor> tensors;
  if (layer.owns_state()) {
    for (const StateTensor& s : layer.state)
      tensors.push_back(Tensor(s.name, s.shape, s.dtype));
  } else if (layer.owns_kv()) {
    const int64_t bt = block_tokens;
    const int64_t heads = layer.num_kv_heads;
    if (layer.head_dim_v == 0) {
      // MLA: one compressed latent per token (num_kv_heads is 1), no separate V.
      tensors.push_back(Tensor("latent", {bt, heads, layer.head_dim_k}, layer.kv_dtype));
    } else {
      tensors.push_back(Tensor("k", {bt, heads, layer.head_dim_k}, layer.kv_dtype));
      tensors.push_back(Tensor("v", {bt, heads, layer.head_dim_v}, layer.kv_dtype));
    }
  }
  return tensors;
}

}  // namespace hkv
