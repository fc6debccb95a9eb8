#include "pool_sizing.h"

#include <fmt/format.h>

#include <hkv/common/byte_size.h>

#include "capacity.h"

namespace hkv {
namespace {

// floor(a * b / c) without overflow; every factor is a non-negative byte or page count.
int64_t MulDiv(int64_t a, int64_t b, int64_t c) {
  __extension__ using Wide = __int128;
  return static_cast<int64_t>(static_cast<Wide>(a) * b / c);
}

std::string Budget(int64_t bytes) {
  return fmt::format("{} ({} bytes)", FormatBytes(bytes), bytes);
}

}  // namespace

Status SizePools(const PlanOptions& o, const std::vector<KvGroup>& groups,
                 std::vector<PageClass>& classes, std::vector<std::string>& warnings) {
  for (const PageClass& c : classes) {
    if (o.memory_bytes < c.page_bytes) {
      return Status::ResourceExhausted(
          fmt::format("memory_bytes = {} is smaller than one page of class {} ({})",
                      Budget(o.memory_bytes), c.id, Budget(c.page_bytes)));
    }
  }
  const std::vector<int64_t> need =
      ClassDemand(groups, classes.size(), o.seq_tokens, o.encoder_tokens);
  int64_t sequence_bytes = 0;
  for (size_t c = 0; c < classes.size(); ++c)
    sequence_bytes += need[c] * classes[c].page_bytes;
  if (sequence_bytes == 0) {
    return Status::InvalidArgument(
        fmt::format("seq_tokens = {}, encoder_tokens = {}: the planning point keeps nothing in any "
                    "layer, so there is no demand to size the pools by",
                    o.seq_tokens, o.encoder_tokens));
  }
  const int64_t sequences = o.memory_bytes / sequence_bytes;
  if (sequences == 0) {
    return Status::ResourceExhausted(fmt::format(
        "memory_bytes = {} cannot hold one sequence at the planning point (seq_tokens = {}, "
        "encoder_tokens = {}), which needs {}",
        Budget(o.memory_bytes), o.seq_tokens, o.encoder_tokens, Budget(sequence_bytes)));
  }
  const int64_t leftover = o.memory_bytes - sequences * sequence_bytes;
  for (size_t c = 0; c < classes.size(); ++c) {
    // Leftover share of class c is leftover * need_c * page_c / sequence_bytes bytes, i.e.
    // leftover * need_c / sequence_bytes pages.
    classes[c].num_pages = sequences * need[c] + MulDiv(leftover, need[c], sequence_bytes);
    if (need[c] == 0) {
      warnings.push_back(fmt::format(
          "page class {} gets no pages: no sequence at the planning point (seq_tokens = {}, "
          "encoder_tokens = {}) uses it",
          classes[c].id, o.seq_tokens, o.encoder_tokens));
    }
  }
  return Status::Ok();
}

}  // namespace hkv
