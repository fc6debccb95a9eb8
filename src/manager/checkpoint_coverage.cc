// CheckpointCoverage: covered prefix digests with counts and parent links, found through a
// PrefixIndex.
#include "checkpoint_coverage.h"

#include <fmt/format.h>

namespace hkv::manager_internal {

CheckpointCoverage::CheckpointCoverage() = default;

int32_t CheckpointCoverage::Add(const BlockHash& d, const BlockHash& parent) {
  int32_t e;
  if (!free_.empty()) {
    e = free_.back();
    free_.pop_back();
  } else {
    e = static_cast<int32_t>(entries_.size());
    entries_.emplace_back();
  }
  entries_[static_cast<size_t>(e)] = {d, parent, 0, 0, false};
  index_.Reserve(index_.size() + 1);
  index_.Insert({d, 0}, e);
  return e;
}

void CheckpointCoverage::Remove(int32_t e) {
  Entry& x = entries_[static_cast<size_t>(e)];
  index_.Erase({x.digest, 0});
  x.count = 0;
  free_.push_back(e);
}

void CheckpointCoverage::Cover(std::span<const BlockHash> chain, bool branch) {
  int32_t parent = -1;
  for (size_t k = 0; k < chain.size(); ++k) {
    int32_t e = Find(chain[k]);
    if (e < 0) {
      e = Add(chain[k], k == 0 ? kRootHash : chain[k - 1]);
      if (parent >= 0) ++entries_[static_cast<size_t>(parent)].children;
    }
    Entry& x = entries_[static_cast<size_t>(e)];
    ++x.count;
    if (branch && k + 1 == chain.size()) x.branch = true;
    parent = e;
  }
}

void CheckpointCoverage::Uncover(const BlockHash& end, std::vector<BlockHash>& uncovered) {
  // A checkpoint never covered has no entry at its end; nothing of its prefix was counted for it.
  int32_t e = Find(end);
  bool child_gone = false;
  while (e >= 0) {
    Entry& x = entries_[static_cast<size_t>(e)];
    const BlockHash parent = x.parent;
    if (child_gone) --x.children;
    child_gone = --x.count == 0;
    if (child_gone) {
      uncovered.push_back(x.digest);
      Remove(e);
    }
    e = parent == kRootHash ? -1 : Find(parent);
  }
}

int32_t CheckpointCoverage::Count(const BlockHash& digest) const {
  const int32_t e = Find(digest);
  return e < 0 ? 0 : entries_[static_cast<size_t>(e)].count;
}

int32_t CheckpointCoverage::Children(const BlockHash& digest) const {
  const int32_t e = Find(digest);
  return e < 0 ? 0 : entries_[static_cast<size_t>(e)].children;
}

bool CheckpointCoverage::IsBranch(const BlockHash& digest) const {
  const int32_t e = Find(digest);
  return e >= 0 && entries_[static_cast<size_t>(e)].branch;
}

void CheckpointCoverage::Clear() {
  index_.Clear();
  entries_.clear();
  free_.clear();
}

Status CheckpointCoverage::CheckInvariants() const {
  int64_t n = 0;
  std::vector<int32_t> children(entries_.size(), 0);
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& x = entries_[i];
    if (x.count == 0) continue;
    ++n;
    if (x.count < 0) return Status::FailedPrecondition("checkpoint coverage: negative count");
    if (Find(x.digest) != static_cast<int32_t>(i)) {
      return Status::FailedPrecondition("checkpoint coverage: an entry the index does not name");
    }
    if (x.parent == kRootHash) continue;
    const int32_t p = Find(x.parent);
    if (p < 0 || entries_[static_cast<size_t>(p)].count < x.count) {
      return Status::FailedPrecondition(
          fmt::format("checkpoint coverage: a digest covered {} time(s) has a parent covered {}",
                      x.count, p < 0 ? 0 : entries_[static_cast<size_t>(p)].count));
    }
    ++children[static_cast<size_t>(p)];
  }
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].count != 0 && entries_[i].children != children[i]) {
      return Status::FailedPrecondition(
          fmt::format("checkpoint coverage: an entry counts {} children, {} name it their parent",
                      entries_[i].children, children[i]));
    }
  }
  if (n != index_.size() ||
      n + static_cast<int64_t>(free_.size()) != static_cast<int64_t>(entries_.size())) {
    return Status::FailedPrecondition(
        fmt::format("checkpoint coverage: {} live entries, {} indexed, {} free of {}", n,
                    index_.size(), free_.size(), entries_.size()));
  }
  return Status::Ok();
}

}  // namespace hkv::manager_internal
