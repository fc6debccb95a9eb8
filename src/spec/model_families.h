// Building a ModelSpec from the language-model part of a config: pattern, then geometry.
//
// Contract: BuildModelSpec turns the language-model part of a config (`text`, which is the root
// for flat configs and `text_config` for nested ones) into a valid ModelSpec, or fails with a
// ConfigReader-style message. `root` is the whole file (vision fields, top-level model_type).
// The field names and defaults per family are documented in docs/config-families.md. Private to
// src/spec.
#pragma once

#include <string_view>

#include <hkv/common/result.h>
#include <hkv/spec/config_loader.h>
#include <hkv/spec/model_spec.h>

#include "config_reader.h"

namespace hkv::spec_internal {

Result<ModelSpec> BuildModelSpec(const ConfigReader& root, const ConfigReader& text,
                                 std::string_view model_type, const LoadOptions& options);

}  // namespace hkv::spec_internal
