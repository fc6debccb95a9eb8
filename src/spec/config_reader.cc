#include "config_reader.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace hkv::spec_internal {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

std::string Abbreviate(const nlohmann::json& v) {
  // Replace rather than throw on strings that are not valid UTF-8: this text only feeds messages.
  std::string text = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

}  // namespace

const nlohmann::json* ConfigReader::Find(std::string_view key) const {
  auto it = object_->find(key);
  if (it == object_->end() || it->is_null()) return nullptr;
  return &*it;
}

bool ConfigReader::Has(std::string_view key) const {
  return Find(key) != nullptr;
}

std::string_view ConfigReader::FirstPresent(std::initializer_list<std::string_view> keys) const {
  for (std::string_view k : keys) {
    if (Has(k)) return k;
  }
  return {};
}

std::string ConfigReader::Raw(std::string_view key) const {
  const nlohmann::json* v = Find(key);
  return v ? Abbreviate(*v) : "null";
}

Status ConfigReader::Invalid(std::string_view key, std::string_view expected) const {
  return Status::InvalidArgument(
      fmt::format("{}: field '{}' = {}: expected {}", source_, PathOf(key), Raw(key), expected));
}

Status ConfigReader::Missing(std::string_view key, std::string_view expected) const {
  return Status::InvalidArgument(
      fmt::format("{}: field '{}' is missing: expected {}", source_, PathOf(key), expected));
}

Result<int64_t> ConfigReader::AsInt(std::string_view key, const nlohmann::json& v, int64_t min,
                                    std::string_view expected) const {
  int64_t value = 0;
  if (v.is_number_integer()) {
    value = v.get<int64_t>();
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::trunc(d) != d || std::abs(d) > 9e15) return Invalid(key, expected);
    value = static_cast<int64_t>(d);
  } else {
    return Invalid(key, expected);
  }
  // Every size a config holds fits in int32; larger values are typos or hostile input.
  if (value < min || value > kInt32Max) return Invalid(key, expected);
  return value;
}

Result<int64_t> ConfigReader::PositiveInt(std::string_view key) const {
  const nlohmann::json* v = Find(key);
  if (!v) return Missing(key, "a positive integer");
  return AsInt(key, *v, 1, "a positive integer");
}

Result<int64_t> ConfigReader::PositiveIntOr(std::string_view key, int64_t fallback) const {
  const nlohmann::json* v = Find(key);
  if (!v) return fallback;
  return AsInt(key, *v, 1, "a positive integer");
}

Result<std::optional<int64_t>> ConfigReader::OptionalPositiveInt(std::string_view key) const {
  const nlohmann::json* v = Find(key);
  if (!v) return std::optional<int64_t>{};
  HKV_ASSIGN_OR_RETURN(int64_t value, AsInt(key, *v, 1, "a positive integer or null"));
  return std::optional<int64_t>{value};
}

Result<int64_t> ConfigReader::NonNegativeIntOr(std::string_view key, int64_t fallback) const {
  const nlohmann::json* v = Find(key);
  if (!v) return fallback;
  return AsInt(key, *v, 0, "a non-negative integer");
}

Result<bool> ConfigReader::BoolOr(std::string_view key, bool fallback) const {
  const nlohmann::json* v = Find(key);
  if (!v) return fallback;
  if (!v->is_boolean()) return Invalid(key, "true or false");
  return v->get<bool>();
}

Result<std::string> ConfigReader::String(std::string_view key) const {
  const nlohmann::json* v = Find(key);
  if (!v) return Missing(key, "a string");
  if (!v->is_string()) return Invalid(key, "a string");
  return v->get<std::string>();
}

Result<std::vector<int64_t>> ConfigReader::IntList(std::string_view key) const {
  const nlohmann::json* v = Find(key);
  if (!v) return Missing(key, "a list of integers");
  if (!v->is_array()) return Invalid(key, "a list of integers");
  std::vector<int64_t> out;
  out.reserve(v->size());
  for (const nlohmann::json& item : *v) {
    if (!item.is_number_integer() || item.get<int64_t>() < 0) {
      return Invalid(key, fmt::format("a list of non-negative integers (item {} is {})", out.size(),
                                      Abbreviate(item)));
    }
    out.push_back(item.get<int64_t>());
  }
  return out;
}

Result<std::vector<std::string>> ConfigReader::StringList(std::string_view key) const {
  const nlohmann::json* v = Find(key);
  if (!v) return Missing(key, "a list of strings");
  if (!v->is_array()) return Invalid(key, "a list of strings");
  std::vector<std::string> out;
  out.reserve(v->size());
  for (const nlohmann::json& item : *v) {
    if (!item.is_string()) {
      return Invalid(
          key, fmt::format("a list of strings (item {} is {})", out.size(), Abbreviate(item)));
    }
    out.push_back(item.get<std::string>());
  }
  return out;
}

Result<std::optional<ConfigReader>> ConfigReader::Object(std::string_view key) const {
  const nlohmann::json* v = Find(key);
  if (!v) return std::optional<ConfigReader>{};
  if (!v->is_object()) return Invalid(key, "an object");
  return std::optional<ConfigReader>{ConfigReader(v, source_, PathOf(key) + ".")};
}

}  // namespace hkv::spec_internal
