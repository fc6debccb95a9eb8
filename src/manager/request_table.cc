#include "request_table.h"

namespace hkv::manager_internal {

RequestTable::RequestTable() : entries_(64), mask_(63) {}

void RequestTable::Insert(uint64_t id, int32_t slot) {
  if (static_cast<size_t>(size_ + 1) * 2 > entries_.size()) Grow();
  size_t i = Home(id);
  while (entries_[i].slot >= 0)
    i = (i + 1) & mask_;
  entries_[i] = {id, slot};
  ++size_;
}

void RequestTable::Erase(uint64_t id) {
  size_t i = Home(id);
  while (entries_[i].id != id || entries_[i].slot < 0)
    i = (i + 1) & mask_;
  entries_[i].slot = -1;
  --size_;
  // Backward-shift: move later members of the probe run into the hole when their home position
  // does not lie cyclically within (hole, their position].
  for (size_t j = (i + 1) & mask_; entries_[j].slot >= 0; j = (j + 1) & mask_) {
    const size_t home = Home(entries_[j].id);
    const bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
    if (stays) continue;
    entries_[i] = entries_[j];
    entries_[j].slot = -1;
    i = j;
  }
}

void RequestTable::Grow() {
  std::vector<Entry> old;
  old.swap(entries_);
  entries_.assign(old.size() * 2, Entry{});
  mask_ = entries_.size() - 1;
  size_ = 0;
  for (const Entry& e : old) {
    if (e.slot >= 0) Insert(e.id, e.slot);
  }
}

}  // namespace hkv::manager_internal
