#include <fmt/format.h>

#include <hkv/plan/plan_options.h>

namespace hkv {

std::string_view TensorLayoutName(TensorLayout layout) {
  switch (layout) {
    case TensorLayout::kCanonical:
      return "canonical";
    case TensorLayout::kPerLayer:
      return "per-layer";
  }
  return "?";
}

std::string_view PageStrategyName(PageStrategy strategy) {
  switch (strategy) {
    case PageStrategy::kAuto:
      return "auto";
    case PageStrategy::kSingleClass:
      return "single_class";
    case PageStrategy::kMultiClass:
      return "multi_class";
    case PageStrategy::kTwoLevel:
      return "two_level";
  }
  return "?";
}

Result<TensorLayout> ParseTensorLayout(std::string_view text) {
  if (text == "canonical") return TensorLayout::kCanonical;
  if (text == "per-layer" || text == "per_layer") return TensorLayout::kPerLayer;
  return Status::InvalidArgument(fmt::format("layout '{}': expected canonical or per-layer", text));
}

Result<PageStrategy> ParsePageStrategy(std::string_view text) {
  if (text == "auto") return PageStrategy::kAuto;
  if (text == "single" || text == "single_class") return PageStrategy::kSingleClass;
  if (text == "multi" || text == "multi_class") return PageStrategy::kMultiClass;
  if (text == "two" || text == "two_level") return PageStrategy::kTwoLevel;
  return Status::InvalidArgument(
      fmt::format("strategy '{}': expected auto, single, multi or two_level", text));
}

}  // namespace hkv
