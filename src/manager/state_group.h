// StateGroup: recurrent state (Mamba, linear attention). A request holds one live state (the state
// after its computed tokens), a rolling state (the newest aligned one, published when it ends) and,
// between steps, the speculative states Truncate may return to. A hit is a cached checkpoint at
// exactly the hit position; a step reads one state, writes one (in place when the request alone
// holds an unpublished live state) and snapshots the state after each planned position.
//
// Reference counts: `live` (if not null), `rolling.block`, every `held` snapshot, and during an
// open step `write` (when it differs from `live`) and every step snapshot hold one reference
// each. `rolling` may name the live block: it then holds a second reference, which is what makes
// the next step write its state elsewhere and keeps the rolling state intact.
//
// Private to src/manager.
#pragma once

#include <cstdint>
#include <vector>

#include "group_manager.h"

namespace hkv::manager_internal {

struct HeldState {
  int64_t position = 0;
  int32_t block = 0;  // 0: none
};

struct StateSlot {
  int32_t live = 0;             // the state after `computed` tokens; null when computed == 0
  HeldState rolling;            // newest aligned state reached, published when the request ends
  std::vector<HeldState> held;  // speculative states kept for Truncate, by position
  int32_t read = 0, write = 0;  // open step
  std::vector<StateSnapshot> snaps;  // open step, by position

  void Clear() {
    live = 0;
    rolling = {};
    held.clear();
    read = write = 0;
    snaps.clear();
  }
};

class StateGroup final : public GroupManager {
 public:
  using GroupManager::GroupManager;

  void AddSlot() override { slots_.emplace_back(); }
  void ClearSlot(int32_t slot) override { slot_at(slot).Clear(); }
  int SearchPass() const override { return 2; }
  int64_t LookupBound(const Request& r, int64_t x, int64_t cap) override;
  // Every aligned position up to `cap` whose checkpoint the pools do not cache.
  void ExternalCandidates(const Request& r, int64_t cap,
                          std::vector<PrefixKey>& out) const override;
  int32_t CountLoads(const Request& r, int64_t tokens) const override;
  int64_t TruncateBound(const Request& r, int64_t x, int64_t new_known) const override;
  Status PlanStep(const Request& r, const StepPlan& s, HitPlan& hp, int64_t& need) const override;
  void ApplyHit(Request& r, const StepPlan& s, HitPlan& hp) override;
  void PlaceLoad(Request& r, int64_t index, int32_t block) override;
  void ApplyStep(Request& r, const StepPlan& s) override;
  // A step without snapshots that updates the live state in place, with nothing kept from the
  // previous step: every decode step of a request that keeps no rolling state there.
  bool StepIsFree(const Request& r, const StepPlan& s) const override;
  bool WorksOnFreeStep() const override { return true; }
  void ApplyFreeStep(Request& r) override;
  bool KeepsPreviousStep() const override { return true; }
  void EndPreviousStep(Request& r) override;
  bool RestrictsCommit() const override { return true; }
  Status CheckCommit(const Request& r, int64_t computed) const override;
  void Commit(Request& r, int64_t computed, int64_t publish_limit) override;
  void Truncate(Request& r, int64_t x, int64_t new_known) override;
  void Fork(const Request& parent, int32_t child_slot) override;
  void Free(Request& r) override;
  void Abandon(Request& r) override;
  void GiveBackRolling(Request& q, bool allocating, std::vector<GivenBack>& out) override;
  void RestoreGivenBack(const GivenBack& g) override;
  void KeepGivenBack(const Request& q, const GivenBack& g) override;
  void Remap(int32_t slot, std::span<const int32_t> moved_to) override;
  Status CheckRequest(const Request& r, std::vector<int32_t>& refs) const override;
  bool HoldsLoadTarget(const Request& r, const BlockLoad& l) const override;
  StateStep StepState(int32_t slot) const override;

 private:
  StateSlot& slot_at(int32_t slot) { return slots_[static_cast<size_t>(slot)]; }
  const StateSlot& slot_at(int32_t slot) const { return slots_[static_cast<size_t>(slot)]; }
  PrefixKey Key(const Request& r, int64_t position) const {
    return core_.StateKey(r, group_, position);
  }
  // The state ending the step: the write slot at the step's end, else the snapshot at `c`.
  int32_t LiveAfter(const StateSlot& ss, const Request& r, int64_t c) const;
  // Commit: sorts the step's snapshots into published checkpoints, the rolling state, states
  // kept for Truncate and releases.
  void SettleSnapshots(StateSlot& ss, const Request& r, int64_t c, int64_t publish_limit,
                       int32_t live);
  // The step may write the live state in place: the request alone holds it and nobody can hit it.
  bool InPlace(const StateSlot& ss, bool started) const;
  // Retention (manager_config.h): demotes the cached, unheld checkpoint at p; whether there was
  // one.
  bool DemoteCheckpoint(const Request& r, int64_t position);
  // Commit: demotes the interval checkpoints that those published in (begin, end] push beyond
  // the request's cap.
  void DemoteBeyondCap(const Request& r, int64_t begin, int64_t end);
  // Free: demotes the request's checkpoints that its final state supersedes (`live_position`:
  // where Free published the live state, 0 if it did not).
  void DemoteSupersededCheckpoints(const Request& r, int64_t live_position,
                                   int64_t rolling_position);

  std::vector<StateSlot> slots_;
};

}  // namespace hkv::manager_internal
