// Loading a ModelSpec from a Hugging Face config.json.
//
// Contract: LoadModelConfig accepts the path of a config.json or of the folder holding one.
// Nested multimodal configs (text_config) are read for the language model; vision fields are used
// only to size encoder inputs. The layer pattern is read from an explicit `layer_types` list when
// present, otherwise from the family's own fields (see docs/config-families.md). Element types of
// the cache come from LoadOptions, never from torch_dtype. On failure the Status names the file,
// the field (dotted path), the value found and what was expected; nothing is partially returned.
#pragma once

#include <filesystem>
#include <string_view>
#include <vector>

#include <hkv/common/dtype.h>
#include <hkv/common/result.h>
#include <hkv/spec/model_spec.h>

namespace hkv {

struct LoadOptions {
  DType kv_dtype = DType::kBF16;     // attention K/V and MLA latents
  DType conv_dtype = DType::kBF16;   // recurrent conv state
  DType state_dtype = DType::kBF16;  // recurrent ssm / delta-rule state
};

Result<ModelSpec> LoadModelConfig(const std::filesystem::path& path,
                                  const LoadOptions& options = {});

// Parses config JSON text; `source` names it in error messages.
Result<ModelSpec> ParseModelConfig(std::string_view json_text, std::string_view source,
                                   const LoadOptions& options = {});

// The model_type values with a dedicated reader (configs with `layer_types` need none).
const std::vector<std::string_view>& SupportedModelTypes();

}  // namespace hkv
