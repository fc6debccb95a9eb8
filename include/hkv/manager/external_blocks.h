// ExternalBlocks: a store outside the manager's pools (a connector's host, disk or remote tier, or
// blocks received from another process) that the manager may consult after a local miss.
//
// Contract: Has answers whether the store believes it can supply the block named by a prefix
// identity, cheaply and without side effects; the manager asks it only inside
// KvCacheManager::Lookup(id, external). A yes is a promise the store may fail to keep (a remote
// server dies, a file turns out corrupt): the manager never publishes a loaded block before the
// engine reports the load complete (FinishLoad), and a failed load returns the request to where
// it was before its first Allocate, so a broken store costs a recomputation, never a wrong
// output.
// HasMany answers a batch (out[i] = 1 when the store has keys[i]), as Has would one by one. A
// store behind a network says so (AnswersInBatches) and answers HasMany in one round trip; Lookup
// then lists every key its hit rules may ask about up front and asks HasMany once, then Has only
// for keys it did not list. For other stores Lookup asks Has as its hit rules go, stopping at the
// first miss, which costs less than listing every key.
#pragma once

#include <span>

#include <hkv/pool/block_hash.h>

namespace hkv {

class ExternalBlocks {
 public:
  virtual ~ExternalBlocks() = default;
  virtual bool Has(const PrefixKey& key) const = 0;
  virtual bool AnswersInBatches() const { return false; }
  virtual void HasMany(std::span<const PrefixKey> keys, std::span<unsigned char> out) const {
    for (size_t i = 0; i < keys.size(); ++i)
      out[i] = Has(keys[i]) ? 1 : 0;
  }
};

}  // namespace hkv
