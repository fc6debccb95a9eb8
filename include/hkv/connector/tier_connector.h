// TierConnector: offloads the blocks a KvCacheManager publishes into tiers (host, disk, remote)
// and loads them back, in the background, for hits the manager finds there after a local miss.
//
// Contract:
// - It is the manager's ExternalBlocks: Has(key) is true when some tier contains the key (asked
//   in tier order, fastest first). Pass it to KvCacheManager::Lookup(id, connector).
// - Store(events) exports every block a kStored event names, from the memory view, and puts it
//   into every tier that lacks it - per tier one ContainsMany and one PutMany for the whole
//   call, so a remote tier costs two round trips per step however many blocks it publishes. Call it
//   right after the manager call that published them, before the next call that allocates: a
//   published block is never written again, but once freed it can be reused. A tier that refuses a
//   Put (full of pins, a server down) only costs that copy (counted); Store fails only on a bad
//   event (a group or block the view lacks).
// - StartLoad(id, loads) queues the first step's loads (StepInfo::loads) for a worker thread,
//   which fetches every block's stream from the first tier that returns it (one GetMany per
//   tier for the whole job: one round trip on a remote tier), checks that it carries
//   exactly the key, group and kind the manager asked for, and imports it into the block in one
//   pass that verifies the checksums as it copies (ImportBlocksVerifying: a damaged image leaves
//   the target written, which is harmless - the targets are discarded when a load fails). The
//   engine keeps running other requests; the load targets are the request's private blocks, so
//   nobody else reads or writes those bytes meanwhile. Poll says whether the job is pending, loaded
//   or failed; Wait blocks until it is not pending. Then the engine calls
//   KvCacheManager::FinishLoad(id, state == kLoaded) and Forget(id). Any miss, damaged stream or
//   tier error fails the whole job: the manager turns that into a recompute.
// - Cancel(id) stops a job (waiting for the block being imported) so its blocks may be freed;
//   the destructor cancels everything and joins the worker. Tiers and the memory must outlive
//   the connector. Tier calls are serialised by one mutex (tiers are not thread-safe); the
//   worker holds it only while fetching bytes, not while checking or copying them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include <hkv/common/result.h>
#include <hkv/connector/block_memory_view.h>
#include <hkv/connector/block_stream.h>
#include <hkv/connector/tier.h>
#include <hkv/manager/kv_cache_manager.h>

namespace hkv {

// A tier's store or removal, for KV events: `event` as the manager reported the block (stored) or
// naming the key (removed), under the tier's medium.
struct TierEvent {
  std::string_view medium;
  ManagerEvent event;
};

struct TierConnectorStats {
  int64_t blocks_stored = 0;   // blocks exported and put into at least one tier
  int64_t bytes_stored = 0;    // stream bytes put, summed over tiers
  int64_t store_refusals = 0;  // Puts a tier refused
  int64_t loads_started = 0;   // jobs
  int64_t loads_failed = 0;    // jobs that failed (a miss, damage, a tier error)
  int64_t blocks_loaded = 0;
  int64_t bytes_loaded = 0;
};

class TierConnector final : public ExternalBlocks {
 public:
  enum class LoadState { kPending, kLoaded, kFailed };

  // `tiers` in lookup order; at least one; none null.
  static Result<std::unique_ptr<TierConnector>> Create(const BlockMemoryView& view,
                                                       std::vector<Tier*> tiers);
  ~TierConnector() override;
  TierConnector(const TierConnector&) = delete;
  TierConnector& operator=(const TierConnector&) = delete;

  bool Has(const PrefixKey& key) const override;
  // Each tier is asked, in order, about the keys no earlier tier has, in one batch
  // (Tier::ContainsMany: one round trip on a remote tier).
  void HasMany(std::span<const PrefixKey> keys, std::span<unsigned char> out) const override;
  // True when some tier is remote: then a lookup's keys are worth asking in one batch.
  bool AnswersInBatches() const override;
  Status Store(std::span<const ManagerEvent> events);

  // kInvalidArgument (nothing queued) for an id with a job already, no loads, or a load whose
  // group or block the view lacks.
  Status StartLoad(RequestId id, std::span<const BlockLoad> loads);
  // kFailed also for an id without a job (never started, or forgotten).
  LoadState Poll(RequestId id) const;
  LoadState Wait(RequestId id);
  void Forget(RequestId id);
  void Cancel(RequestId id);
  bool HasJob(RequestId id) const;

  TierConnectorStats stats() const;
  // Appends what the tiers stored (each block a Store put, per tier) and dropped (evictions,
  // damage found, entries gone) since the last call, and forgets them.
  void TakeEvents(std::vector<TierEvent>& out);
  // Why the last failed job failed (empty if none did): the tier's or the check's message.
  std::string last_failure() const;

 private:
  struct State;  // the worker, its queue and jobs, the tiers' lock: tier_connector.cc
  TierConnector(const BlockMemoryView& view, std::vector<Tier*> tiers);
  void Run();
  // The bytes of every load, each from the first tier that returns it (one GetMany per tier).
  void Fetch(std::span<const BlockLoad> loads,
             std::vector<Result<std::vector<unsigned char>>>& fetched);
  // Checks the fetched stream and imports it into the load's block; the reason on failure.
  Status ImportOne(const BlockLoad& load, std::span<const unsigned char> bytes,
                   std::vector<StreamBlock>& parsed);

  std::unique_ptr<State> s_;
};

}  // namespace hkv
