// Byte sizes as people write them: "16GiB", "512 MiB", "1.5GB", "4096".
//
// Contract: ParseByteSize accepts a non-negative decimal number with an optional binary (KiB, MiB,
// GiB, TiB) or decimal (KB, MB, GB, TB) unit, case-insensitive, and rejects anything else or a
// value that does not fit in int64 with a message naming the text. FormatBytes renders a byte
// count with a binary unit and two decimals for humans.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <hkv/common/result.h>

namespace hkv {

Result<int64_t> ParseByteSize(std::string_view text);
std::string FormatBytes(int64_t bytes);

// Ceiling division for non-negative sizes; the planner's block rounding.
constexpr int64_t CeilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace hkv
