// ConfigReader: typed access to one JSON object of a config file, with errors that say where.
//
// Contract: every accessor either returns the value or a failed Status whose message is
// "<source>: field '<dotted.path>' = <value as found>: expected <what>", or for a missing required
// field "<source>: field '<path>' is missing: expected <what>". A JSON null counts as absent, as
// transformers treats it. Integer accessors reject floats with a fractional part, booleans and
// values above INT32_MAX. Private to src/spec.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <hkv/common/result.h>

namespace hkv::spec_internal {

class ConfigReader {
 public:
  ConfigReader(const nlohmann::json* object, std::string source, std::string path_prefix)
      : object_(object), source_(std::move(source)), prefix_(std::move(path_prefix)) {}

  const std::string& source() const { return source_; }
  std::string PathOf(std::string_view key) const { return prefix_ + std::string(key); }

  // True when the key exists with a non-null value.
  bool Has(std::string_view key) const;
  // True when the key exists at all, even as null (some families default differently).
  bool Contains(std::string_view key) const { return object_->contains(key); }
  // The first of `keys` that Has(); empty when none.
  std::string_view FirstPresent(std::initializer_list<std::string_view> keys) const;

  Result<int64_t> PositiveInt(std::string_view key) const;
  Result<int64_t> PositiveIntOr(std::string_view key, int64_t fallback) const;
  Result<std::optional<int64_t>> OptionalPositiveInt(std::string_view key) const;
  Result<int64_t> NonNegativeIntOr(std::string_view key, int64_t fallback) const;
  Result<bool> BoolOr(std::string_view key, bool fallback) const;
  Result<std::string> String(std::string_view key) const;
  Result<std::vector<int64_t>> IntList(std::string_view key) const;
  Result<std::vector<std::string>> StringList(std::string_view key) const;
  // A nested object, or nullopt when absent.
  Result<std::optional<ConfigReader>> Object(std::string_view key) const;

  // "<source>: field '<path>' = <value>: expected <expected>"
  Status Invalid(std::string_view key, std::string_view expected) const;
  Status Missing(std::string_view key, std::string_view expected) const;
  // Renders the raw JSON value of `key` (for messages about derived checks).
  std::string Raw(std::string_view key) const;

 private:
  const nlohmann::json* Find(std::string_view key) const;
  Result<int64_t> AsInt(std::string_view key, const nlohmann::json& v, int64_t min,
                        std::string_view expected) const;

  const nlohmann::json* object_;
  std::string source_;
  std::string prefix_;
};

}  // namespace hkv::spec_internal
