// The defaults every kind inherits, and the one place that maps a rule to its group manager.
#include "group_manager.h"

#include <fmt/format.h>

#include "encoder_group.h"
#include "state_group.h"
#include "token_group.h"

namespace hkv::manager_internal {

GroupManager::GroupManager(CacheCore& core, int32_t group) : core_(core), group_(group) {}
GroupManager::~GroupManager() = default;

void GroupManager::ExternalCandidates(const Request&, int64_t, std::vector<PrefixKey>&) const {}

bool GroupManager::EncoderCached(const Request&) const {
  return true;
}

int64_t GroupManager::TruncateBound(const Request&, int64_t x, int64_t) const {
  return x;
}

bool GroupManager::BranchReach(const Request&, int64_t, int64_t, int64_t&, bool&) const {
  return false;
}

bool GroupManager::StepIsFree(const Request&, const StepPlan&) const {
  return false;
}
void GroupManager::ApplyFreeStep(Request&) {}

int64_t GroupManager::FreeUntil(const Request&) const {
  return -1;
}

int64_t GroupManager::FreshNeed(const Request&, const StepPlan&) const {
  return -1;
}
void GroupManager::PlaceLoad(Request&, int64_t, int32_t) {}
void GroupManager::EndPreviousStep(Request&) {}

Status GroupManager::CheckCommit(const Request&, int64_t) const {
  return Status::Ok();
}

void GroupManager::CollectForRelease(Request&, std::vector<std::pair<int64_t, int32_t>>&) {}
void GroupManager::PublishAhead(Request&, int64_t) {}

bool GroupManager::LentPast(const Request&, int64_t, int64_t&) const {
  return false;
}

void GroupManager::WithdrawAhead(Request&, int64_t) {}

void GroupManager::GiveBackBranch(Request&, std::vector<GivenBack>&) {}
void GroupManager::GiveBackRolling(Request&, bool, std::vector<GivenBack>&) {}
void GroupManager::RestoreGivenBack(const GivenBack&) {}
void GroupManager::KeepGivenBack(const Request&, const GivenBack&) {}

Result<EvictResult> GroupManager::Evict(Request& r, int64_t, int64_t) {
  return Status::InvalidArgument(
      fmt::format("evict: request {}: group {} keeps tokens by its {} rule; only full-attention "
                  "groups evict by policy",
                  r.id, group_, TokenRuleKindName(config().rule.kind)));
}

std::span<const int32_t> GroupManager::Table(int32_t) const {
  return {};
}
int64_t GroupManager::Evicted(int32_t) const {
  return 0;
}
std::span<const int32_t> GroupManager::TableAndEvicted(int32_t slot, int64_t& evicted) const {
  evicted = Evicted(slot);
  return Table(slot);
}
bool GroupManager::TakeDelta(int32_t, TableDelta&) {
  return false;
}
StateStep GroupManager::StepState(int32_t) const {
  return {};
}
void GroupManager::TakeInputs(const Request& r, size_t g, StepInputs& out, size_t&) {
  out.tables[g] = {};
  TakeDelta(r.slot, out.tables[g]);
  out.states[g] = StepState(r.slot);
}

Status GroupManager::Fail(const Request& r, const std::string& what) const {
  return Status::FailedPrecondition(fmt::format("invariant: request {}: {}", r.id, what));
}

Status GroupManager::Hold(const Request& r, std::vector<int32_t>& refs, int32_t block,
                          const char* what) const {
  if (block <= 0 || block >= block_pool().num_blocks()) {
    return Fail(r, fmt::format("group {} {} is block {}", group_, what, block));
  }
  ++refs[static_cast<size_t>(block)];
  return Status::Ok();
}

Status GroupManager::StaleHit(const Request& r, const char* what) {
  return Status::FailedPrecondition(fmt::format(
      "allocate: request {}: the prefix hit went stale ({} evicted since Lookup); look up again",
      r.id, what));
}

std::unique_ptr<GroupManager> MakeGroupManager(CacheCore& core, int32_t group) {
  switch (core.config.groups[static_cast<size_t>(group)].rule.kind) {
    case TokenRuleKind::kAll:
      return std::make_unique<FullAttentionGroup>(core, group);
    case TokenRuleKind::kWindow:
    case TokenRuleKind::kChunk:
      return std::make_unique<WindowGroup>(core, group);
    case TokenRuleKind::kEncoder:
      return std::make_unique<EncoderGroup>(core, group);
    case TokenRuleKind::kState:
      return std::make_unique<StateGroup>(core, group);
    case TokenRuleKind::kNothing:
      break;
  }
  return nullptr;  // ManagerConfig::Validate refuses a group that keeps nothing
}

}  // namespace hkv::manager_internal
