// EncoderGroup: cross attention. A request's encoder KV fills ceil(encoder tokens / block) blocks
// at its first step and stays until it ends; requests with the same encoder input (adapter and
// salt) share them through the prefix index, named by encoder block index, not decoder position.
//
// Private to src/manager.
#pragma once

#include <cstdint>
#include <vector>

#include "group_manager.h"

namespace hkv::manager_internal {

class EncoderGroup final : public GroupManager {
 public:
  using GroupManager::GroupManager;

  void AddSlot() override {
    tables_.emplace_back();
    dirty_from_.push_back(0);
  }
  void ClearSlot(int32_t slot) override {
    table(slot).clear();
    dirty(slot) = 0;
  }
  int SearchPass() const override { return 0; }  // never lowers x
  int64_t LookupBound(const Request&, int64_t x, int64_t) override { return x; }
  int32_t CountLoads(const Request&, int64_t) const override { return 0; }
  bool EncoderCached(const Request& r) const override;
  Status PlanStep(const Request& r, const StepPlan& s, HitPlan& hp, int64_t& need) const override;
  void ApplyHit(Request& r, const StepPlan& s, HitPlan& hp) override;
  void ApplyStep(Request& r, const StepPlan& s) override;
  void Commit(Request& r, int64_t computed, int64_t publish_limit) override;
  void Truncate(Request&, int64_t, int64_t) override {}
  void Fork(const Request& parent, int32_t child_slot) override;
  void Free(Request& r) override;
  void Abandon(Request& r) override { Free(r); }
  void Remap(int32_t slot, std::span<const int32_t> moved_to) override;
  Status CheckRequest(const Request& r, std::vector<int32_t>& refs) const override;
  bool HoldsLoadTarget(const Request&, const BlockLoad&) const override { return false; }
  std::span<const int32_t> Table(int32_t slot) const override {
    return tables_[static_cast<size_t>(slot)];
  }
  bool TakeDelta(int32_t slot, TableDelta& out) override;

 private:
  std::vector<int32_t>& table(int32_t slot) { return tables_[static_cast<size_t>(slot)]; }
  int32_t& dirty(int32_t slot) { return dirty_from_[static_cast<size_t>(slot)]; }
  int64_t Blocks(const Request& r) const {
    return CeilDiv(r.encoder_tokens, config().block_tokens);
  }
  PrefixKey Key(const Request& r, int64_t i) const {
    return {r.encoder_hashes[static_cast<size_t>(i)], group_};
  }

  std::vector<std::vector<int32_t>> tables_;  // per slot
  std::vector<int32_t> dirty_from_;           // per slot: entries before it as last taken
};

}  // namespace hkv::manager_internal
