#include <array>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include <hkv/common/byte_size.h>

namespace hkv {
namespace {

struct Unit {
  std::string_view name;
  double scale;
};

constexpr double kKi = 1024.0;
constexpr std::array<Unit, 14> kUnits{{
    {"", 1.0},
    {"b", 1.0},
    {"kib", kKi},
    {"mib", kKi* kKi},
    {"gib", kKi* kKi* kKi},
    {"tib", kKi* kKi* kKi* kKi},
    {"kb", 1e3},
    {"mb", 1e6},
    {"gb", 1e9},
    {"tb", 1e12},
    {"k", kKi},
    {"m", kKi* kKi},
    {"g", kKi* kKi* kKi},
    {"t", kKi* kKi* kKi* kKi},
}};

}  // namespace

Result<int64_t> ParseByteSize(std::string_view text) {
  auto fail = [&] {
    return Status::InvalidArgument(
        fmt::format("invalid byte size '{}': expected a non-negative number with an optional unit "
                    "(B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), e.g. 16GiB",
                    text));
  };
  size_t pos = 0;
  while (pos < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[pos])) || text[pos] == '.'))
    ++pos;
  if (pos == 0) return fail();
  const std::string number(text.substr(0, pos));
  char* end = nullptr;
  const double value = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !std::isfinite(value) || value < 0) return fail();

  size_t unit_begin = pos;
  while (unit_begin < text.size() && text[unit_begin] == ' ')
    ++unit_begin;
  std::string unit(text.substr(unit_begin));
  for (char& c : unit)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const Unit& u : kUnits) {
    if (u.name != unit) continue;
    const double bytes = std::round(value * u.scale);
    if (bytes >= 9.2e18) {
      return Status::InvalidArgument(fmt::format("byte size '{}' is too large", text));
    }
    return static_cast<int64_t>(bytes);
  }
  return fail();
}

std::string FormatBytes(int64_t bytes) {
  constexpr std::array<std::string_view, 5> kNames{"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  while (std::abs(value) >= 1024.0 && unit + 1 < kNames.size()) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) return fmt::format("{} B", bytes);
  return fmt::format("{:.2f} {}", value, kNames[unit]);
}

}  // namespace hkv
