#include "slab_sizing.h"

#include <algorithm>
#include <climits>

#include <fmt/format.h>

#include <hkv/common/byte_size.h>

#include "capacity.h"

namespace hkv {
namespace {

constexpr int64_t kMaxSlabPages = 64;  // slab = k * largest page, k <= this
constexpr int64_t kMinSlabs = 16;      // memory must move in steps no coarser than 1/16
constexpr double kTailGoal = 0.005;    // unused slab tail per class, fraction of the slab

double WorstTail(const std::vector<PageClass>& classes, int64_t slab) {
  double worst = 0.0;
  for (const PageClass& c : classes) {
    worst = std::max(worst, static_cast<double>(slab % c.page_bytes) / static_cast<double>(slab));
  }
  return worst;
}

}  // namespace

int64_t ChooseSlabBytes(const std::vector<PageClass>& classes, int64_t memory_bytes) {
  int64_t largest = 1;
  for (const PageClass& c : classes)
    largest = std::max(largest, c.page_bytes);
  int64_t best = largest;
  double best_tail = WorstTail(classes, largest);
  for (int64_t k = 1; k <= kMaxSlabPages; ++k) {
    const int64_t slab = k * largest;
    if (k > 1 && memory_bytes / slab < kMinSlabs) break;
    const double tail = WorstTail(classes, slab);
    if (tail <= kTailGoal) return slab;
    if (tail < best_tail) {
      best = slab;
      best_tail = tail;
    }
  }
  return best;
}

void CarveClasses(int64_t slab_bytes, int64_t num_slabs, std::vector<PageClass>& classes) {
  for (PageClass& c : classes) {
    c.pages_per_slab = static_cast<int32_t>(slab_bytes / c.page_bytes);
    c.num_pages = num_slabs * c.pages_per_slab;
  }
}

Status SizeArena(const PlanOptions& o, const std::vector<KvGroup>& groups,
                 std::vector<PageClass>& classes, ArenaPlan& arena) {
  arena.slab_bytes = ChooseSlabBytes(classes, o.memory_bytes);
  arena.num_slabs = o.memory_bytes / arena.slab_bytes;
  CarveClasses(arena.slab_bytes, arena.num_slabs, classes);
  // Block ids of a class run to num_slabs * pages_per_slab; they must fit the manager's int32.
  for (const PageClass& c : classes) {
    if (c.num_pages >= INT32_MAX) {
      return Status::ResourceExhausted(fmt::format(
          "two-level: page class {} would have {} pages over the {} slabs, beyond 2^31 - 1; "
          "use larger blocks or less memory",
          c.id, c.num_pages, arena.num_slabs));
    }
  }
  const std::vector<int64_t> need =
      ClassDemand(groups, classes.size(), o.seq_tokens, o.encoder_tokens);
  int64_t slabs = 0;
  for (size_t c = 0; c < classes.size(); ++c)
    slabs += CeilDiv(need[c], classes[c].pages_per_slab);
  if (slabs > arena.num_slabs) {
    return Status::ResourceExhausted(fmt::format(
        "memory_bytes = {} buys {} slab(s) of {}, but one sequence at the planning point "
        "(seq_tokens = {}, encoder_tokens = {}) needs {}",
        FormatBytes(o.memory_bytes), arena.num_slabs, FormatBytes(arena.slab_bytes), o.seq_tokens,
        o.encoder_tokens, slabs));
  }
  return Status::Ok();
}

}  // namespace hkv
