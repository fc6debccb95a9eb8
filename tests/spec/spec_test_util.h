// Helpers shared by the spec tests.
#pragma once

#include <algorithm>
#include <string>

#include <gtest/gtest.h>

#include <hkv/spec/config_loader.h>

namespace hkv::testing {

inline ModelSpec MustParse(std::string_view json, const LoadOptions& options = {}) {
  Result<ModelSpec> r = ParseModelConfig(json, "test.json", options);
  if (!r.ok()) ADD_FAILURE() << r.status().ToString();
  return r.ok() ? *r : ModelSpec{};
}

inline ModelSpec MustLoad(const std::string& model_dir, const LoadOptions& options = {}) {
  Result<ModelSpec> r = LoadModelConfig(std::string(HKV_MODELS_DIR) + "/" + model_dir, options);
  if (!r.ok()) ADD_FAILURE() << r.status().ToString();
  return r.ok() ? *r : ModelSpec{};
}

inline int CountKind(const ModelSpec& m, LayerKind kind) {
  return static_cast<int>(std::count_if(m.layers.begin(), m.layers.end(),
                                        [kind](const LayerSpec& l) { return l.kind == kind; }));
}

inline int CountOwners(const ModelSpec& m, LayerKind kind) {
  return static_cast<int>(
      std::count_if(m.layers.begin(), m.layers.end(),
                    [kind](const LayerSpec& l) { return l.kind == kind && l.owns_kv(); }));
}

}  // namespace hkv::testing
