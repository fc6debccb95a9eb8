#include <fstream>
#include <sstream>
#include <system_error>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <hkv/spec/config_loader.h>

#include "config_reader.h"
#include "layer_pattern.h"
#include "model_families.h"

namespace hkv {

using spec_internal::ConfigReader;

Result<ModelSpec> ParseModelConfig(std::string_view json_text, std::string_view source,
                                   const LoadOptions& options) {
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::parse_error& e) {
    return Status::ParseError(
        fmt::format("{}: invalid JSON at byte {}: {}", source, e.byte, e.what()));
  } catch (const nlohmann::json::exception& e) {
    // e.g. a number literal too large for any numeric type (found by fuzzing).
    return Status::ParseError(fmt::format("{}: invalid JSON: {}", source, e.what()));
  }
  if (!root.is_object()) {
    return Status::InvalidArgument(
        fmt::format("{}: top level is {}: expected a JSON object", source, root.type_name()));
  }
  const ConfigReader top(&root, std::string(source), "");
  // Multimodal configs keep the language model in text_config; its fields win over the top's.
  HKV_ASSIGN_OR_RETURN(std::optional<ConfigReader> text_config, top.Object("text_config"));
  const ConfigReader& text = text_config ? *text_config : top;

  std::string model_type;
  if (top.Has("model_type")) {
    HKV_ASSIGN_OR_RETURN(model_type, top.String("model_type"));
  } else if (text_config && text.Has("model_type")) {
    HKV_ASSIGN_OR_RETURN(model_type, text.String("model_type"));
  } else if (!text.Has("layer_types")) {
    return top.Missing("model_type",
                       "a model_type naming a supported family, or an explicit layer_types list");
  }
  return spec_internal::BuildModelSpec(top, text, model_type, options);
}

Result<ModelSpec> LoadModelConfig(const std::filesystem::path& path, const LoadOptions& options) {
  std::error_code ec;
  std::filesystem::path file = path;
  if (std::filesystem::is_directory(path, ec)) file = path / "config.json";
  if (!std::filesystem::exists(file, ec)) {
    return Status::NotFound(
        fmt::format("{}: no such file (expected a config.json or a folder "
                    "holding one)",
                    file.string()));
  }
  if (!std::filesystem::is_regular_file(file, ec)) {
    return Status::IoError(fmt::format("{}: not a regular file, cannot read it", file.string()));
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) return Status::IoError(fmt::format("{}: cannot open for reading", file.string()));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Status::IoError(fmt::format("{}: read failed", file.string()));
  return ParseModelConfig(text.str(), file.string(), options);
}

const std::vector<std::string_view>& SupportedModelTypes() {
  return spec_internal::FamilyModelTypes();
}

}  // namespace hkv
