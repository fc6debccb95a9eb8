#include <cassert>

#include <hkv/pool/prefix_index.h>

namespace hkv {

size_t PrefixIndex::CapacityFor(int32_t max_entries) {
  // At most half full: probe runs stay short.
  size_t capacity = 8;
  while (capacity < 2 * static_cast<size_t>(max_entries > 0 ? max_entries : 1))
    capacity *= 2;
  return capacity;
}

PrefixIndex::PrefixIndex(int32_t max_entries) {
  const size_t capacity = CapacityFor(max_entries);
  slots_.resize(capacity);
  mask_ = capacity - 1;
}

void PrefixIndex::Reserve(int32_t max_entries) {
  const size_t capacity = CapacityFor(max_entries);
  if (capacity <= slots_.size()) return;
  std::vector<Slot> old(capacity);
  old.swap(slots_);
  mask_ = capacity - 1;
  for (const Slot& s : old) {
    if (s.block >= 0) slots_[Probe(s.key)] = s;
  }
}

size_t PrefixIndex::Probe(const PrefixKey& key) const {
  size_t i = Home(key);
  while (slots_[i].block >= 0 && !(slots_[i].key == key))
    i = (i + 1) & mask_;
  return i;
}

int32_t PrefixIndex::Find(const PrefixKey& key) const {
  return slots_[Probe(key)].block;
}

void PrefixIndex::Insert(const PrefixKey& key, int32_t block) {
  const size_t i = Probe(key);
  assert(slots_[i].block < 0 && "PrefixIndex::Insert of a present key");
  slots_[i] = {key, block};
  ++size_;
}

int32_t PrefixIndex::Emplace(const PrefixKey& key, int32_t block) {
  const size_t i = Probe(key);
  if (slots_[i].block >= 0) return slots_[i].block;
  slots_[i] = {key, block};
  ++size_;
  return -1;
}

bool PrefixIndex::Erase(const PrefixKey& key) {
  size_t hole = Probe(key);
  if (slots_[hole].block < 0) return false;
  // Backward shift: pull later members of the run into the hole when the hole lies between
  // their home slot and where they sit, so no tombstones are needed.
  for (size_t j = (hole + 1) & mask_; slots_[j].block >= 0; j = (j + 1) & mask_) {
    const size_t home = Home(slots_[j].key);
    const bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
    if (movable) {
      slots_[hole] = slots_[j];
      hole = j;
    }
  }
  slots_[hole].block = -1;
  --size_;
  return true;
}

void PrefixIndex::Clear() {
  for (Slot& s : slots_)
    s.block = -1;
  size_ = 0;
}

}  // namespace hkv
