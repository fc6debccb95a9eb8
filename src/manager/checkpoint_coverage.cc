// CheckpointCoverage: an open-addressing table of covered prefix digests with parent links.
#include "checkpoint_coverage.h"

#include <fmt/format.h>

namespace hkv::manager_internal {

CheckpointCoverage::CheckpointCoverage() : slots_(64), mask_(63) {}

size_t CheckpointCoverage::Probe(const BlockHash& d) const {
  size_t i = Home(d);
  while (slots_[i].count != 0 && !(slots_[i].digest == d))
    i = (i + 1) & mask_;
  return i;
}

void CheckpointCoverage::Grow() {
  std::vector<Entry> old(slots_.size() * 2);
  old.swap(slots_);
  mask_ = slots_.size() - 1;
  for (const Entry& e : old) {
    if (e.count != 0) slots_[Probe(e.digest)] = e;
  }
}

void CheckpointCoverage::Cover(std::span<const BlockHash> chain, bool branch) {
  for (size_t k = 0; k < chain.size(); ++k) {
    if (2 * (size_ + 1) > static_cast<int64_t>(slots_.size())) Grow();
    Entry& e = slots_[Probe(chain[k])];
    if (e.count == 0) {
      e = {chain[k], k == 0 ? kRootHash : chain[k - 1], 0, 0, false};
      ++size_;
      if (k > 0) ++slots_[Probe(chain[k - 1])].children;
    }
    ++e.count;
    if (branch && k + 1 == chain.size()) e.branch = true;
  }
}

void CheckpointCoverage::Erase(size_t hole) {
  // Backward shift, as PrefixIndex does: no tombstones.
  for (size_t j = (hole + 1) & mask_; slots_[j].count != 0; j = (j + 1) & mask_) {
    const size_t home = Home(slots_[j].digest);
    const bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
    if (movable) {
      slots_[hole] = slots_[j];
      hole = j;
    }
  }
  slots_[hole].count = 0;
  --size_;
}

void CheckpointCoverage::Uncover(const BlockHash& end, std::vector<BlockHash>& uncovered) {
  // A checkpoint never covered has no entry at its end; nothing of its prefix was counted for it.
  if (slots_[Probe(end)].count == 0) return;
  BlockHash d = end;
  bool child_gone = false;
  while (!(d == kRootHash)) {
    const size_t i = Probe(d);
    if (slots_[i].count == 0) break;  // unreachable while the invariants hold
    const BlockHash parent = slots_[i].parent;
    if (child_gone) --slots_[i].children;
    child_gone = --slots_[i].count == 0;
    if (child_gone) {
      uncovered.push_back(d);
      Erase(i);
    }
    d = parent;
  }
}

int32_t CheckpointCoverage::Count(const BlockHash& digest) const {
  return slots_[Probe(digest)].count;
}

int32_t CheckpointCoverage::Children(const BlockHash& digest) const {
  const Entry& e = slots_[Probe(digest)];
  return e.count == 0 ? 0 : e.children;
}

bool CheckpointCoverage::IsBranch(const BlockHash& digest) const {
  const Entry& e = slots_[Probe(digest)];
  return e.count != 0 && e.branch;
}

void CheckpointCoverage::Clear() {
  for (Entry& e : slots_)
    e.count = 0;
  size_ = 0;
}

Status CheckpointCoverage::CheckInvariants() const {
  int64_t n = 0;
  std::vector<int32_t> children(slots_.size(), 0);
  for (const Entry& e : slots_) {
    if (e.count == 0) continue;
    ++n;
    if (e.count < 0) return Status::FailedPrecondition("checkpoint coverage: negative count");
    if (e.parent == kRootHash) continue;
    const size_t p = Probe(e.parent);
    if (slots_[p].count < e.count) {
      return Status::FailedPrecondition(
          fmt::format("checkpoint coverage: a digest covered {} time(s) has a parent covered {}",
                      e.count, slots_[p].count));
    }
    ++children[p];
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].count != 0 && slots_[i].children != children[i]) {
      return Status::FailedPrecondition(
          fmt::format("checkpoint coverage: an entry counts {} children, {} name it their parent",
                      slots_[i].children, children[i]));
    }
  }
  if (n != size_) {
    return Status::FailedPrecondition(
        fmt::format("checkpoint coverage: {} entries, size says {}", n, size_));
  }
  return Status::Ok();
}

}  // namespace hkv::manager_internal
