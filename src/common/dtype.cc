#include <algorithm>
#include <array>
#include <string>

#include <fmt/format.h>

#include <hkv/common/dtype.h>

namespace hkv {
namespace {

struct Spelling {
  std::string_view text;
  DType dtype;
};

// HF configs say "bfloat16"/"float16"/"float32"; people on a command line say "bf16"/"fp16".
constexpr std::array<Spelling, 12> kSpellings{{
    {"bf16", DType::kBF16},
    {"bfloat16", DType::kBF16},
    {"fp16", DType::kFP16},
    {"float16", DType::kFP16},
    {"half", DType::kFP16},
    {"fp32", DType::kFP32},
    {"float32", DType::kFP32},
    {"float", DType::kFP32},
    {"fp8", DType::kFP8},
    {"fp8_e4m3", DType::kFP8},
    {"fp8_e5m2", DType::kFP8},
    {"float8_e4m3fn", DType::kFP8},
}};

}  // namespace

int64_t DTypeBytes(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
    case DType::kFP16:
      return 2;
    case DType::kFP32:
      return 4;
    case DType::kFP8:
      return 1;
  }
  return 0;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return "bf16";
    case DType::kFP16:
      return "fp16";
    case DType::kFP32:
      return "fp32";
    case DType::kFP8:
      return "fp8";
  }
  return "?";
}

Result<DType> ParseDType(std::string_view text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const Spelling& s : kSpellings) {
    if (s.text == lower) return s.dtype;
  }
  return Status::InvalidArgument(
      fmt::format("unknown dtype '{}': expected one of bf16, fp16, fp32, fp8", text));
}

}  // namespace hkv
