// PlanOptions: the knobs a user turns when planning KV memory for a model.
//
// Contract: zero/negative "unset" values are resolved by MakePlan (max_model_len -> the config's
// max_position_embeddings, seq_tokens -> max_model_len, encoder_tokens -> the model's largest
// encoder input). Explicit values that are out of range are rejected by MakePlan with a message
// naming the option.
#pragma once

#include <cstdint>
#include <string_view>

#include <hkv/common/result.h>

namespace hkv {

// How every layer's K/V (or state) is laid out inside the planned buffers.
enum class TensorLayout : unsigned char {
  kCanonical,  // one buffer per page class, block-major: a block of all layers is contiguous
  kPerLayer,   // one region per layer slot inside each buffer (the classic per-layer tensors)
};

// How group pages are sized.
enum class PageStrategy : unsigned char {
  kAuto,  // single class if its padding is at most 5% of the planning point's sequence, else the
          // candidate with the fewest wasted bytes there
  kSingleClass,  // one page size: groups split/padded to equal layer counts (RFC milestone 1)
  kMultiClass,   // one page class per distinct group page size, each its own fixed buffer
  kTwoLevel,     // one page class per distinct page size, all carved from shared slabs on demand
};

// Names as the CLI and JSON spell them: "canonical"/"per-layer", "auto"/"single_class"/
// "multi_class"/"two_level". Parsing also accepts the short forms "single", "multi", "two".
std::string_view TensorLayoutName(TensorLayout layout);
std::string_view PageStrategyName(PageStrategy strategy);
Result<TensorLayout> ParseTensorLayout(std::string_view text);
Result<PageStrategy> ParsePageStrategy(std::string_view text);

struct PlanOptions {
  int64_t memory_bytes = int64_t{16} << 30;
  int32_t block_tokens = 16;
  int64_t max_model_len = 0;    // 0: the config's max_position_embeddings
  int64_t seq_tokens = 0;       // decoder tokens of the planning point; 0: max_model_len
  int64_t encoder_tokens = -1;  // encoder tokens of the planning point; -1: model's largest input
  TensorLayout layout = TensorLayout::kCanonical;
  PageStrategy strategy = PageStrategy::kAuto;
};

}  // namespace hkv
