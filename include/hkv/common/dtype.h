// DType: the element types a KV cache or recurrent state can be stored in.
//
// Contract: the planner only needs element sizes; names round-trip through DTypeName/ParseDType
// using the spellings users type on the command line and HF configs use ("bf16"/"bfloat16", ...).
#pragma once

#include <cstdint>
#include <string_view>

#include <hkv/common/result.h>

namespace hkv {

enum class DType : unsigned char { kBF16, kFP16, kFP32, kFP8 };

int64_t DTypeBytes(DType dtype);
std::string_view DTypeName(DType dtype);  // canonical short name: bf16, fp16, fp32, fp8
Result<DType> ParseDType(std::string_view text);

}  // namespace hkv
