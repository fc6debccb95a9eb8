#include "request_table.h"

namespace hkv::manager_internal {

RequestTable::RequestTable() : ids_(64), slots_(64, -1), mask_(63) {}

size_t RequestTable::Home(uint64_t id) const {
  // Engines often number requests consecutively; a multiplicative mix spreads them anyway.
  uint64_t h = id * 0x9E3779B97F4A7C15ull;
  h ^= h >> 29;
  return static_cast<size_t>(h) & mask_;
}

int32_t RequestTable::Find(uint64_t id) const {
  for (size_t i = Home(id);; i = (i + 1) & mask_) {
    if (slots_[i] < 0) return -1;
    if (ids_[i] == id) return slots_[i];
  }
}

void RequestTable::Insert(uint64_t id, int32_t slot) {
  if (static_cast<size_t>(size_ + 1) * 2 > slots_.size()) Grow();
  size_t i = Home(id);
  while (slots_[i] >= 0)
    i = (i + 1) & mask_;
  ids_[i] = id;
  slots_[i] = slot;
  ++size_;
}

void RequestTable::Erase(uint64_t id) {
  size_t i = Home(id);
  while (ids_[i] != id || slots_[i] < 0)
    i = (i + 1) & mask_;
  slots_[i] = -1;
  --size_;
  // Backward-shift: move later members of the probe run into the hole when their home position
  // does not lie cyclically within (hole, their position].
  for (size_t j = (i + 1) & mask_; slots_[j] >= 0; j = (j + 1) & mask_) {
    const size_t home = Home(ids_[j]);
    const bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
    if (stays) continue;
    ids_[i] = ids_[j];
    slots_[i] = slots_[j];
    slots_[j] = -1;
    i = j;
  }
}

void RequestTable::Grow() {
  std::vector<uint64_t> old_ids;
  std::vector<int32_t> old_slots;
  old_ids.swap(ids_);
  old_slots.swap(slots_);
  ids_.assign(old_ids.size() * 2, 0);
  slots_.assign(old_slots.size() * 2, -1);
  mask_ = slots_.size() - 1;
  size_ = 0;
  for (size_t k = 0; k < old_slots.size(); ++k) {
    if (old_slots[k] >= 0) Insert(old_ids[k], old_slots[k]);
  }
}

}  // namespace hkv::manager_internal
