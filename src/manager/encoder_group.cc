// EncoderGroup: the encoder's blocks, taken whole at the first step and shared by input digest.
#include "encoder_group.h"

#include <algorithm>

#include <fmt/format.h>

namespace hkv::manager_internal {

bool EncoderGroup::EncoderCached(const Request& r) const {
  const BlockPool& bp = block_pool();
  const int64_t blocks = Blocks(r);
  for (int64_t i = 0; i < blocks; ++i) {
    if (bp.Find(Key(r, i)) < 0) return false;
  }
  return true;
}

Status EncoderGroup::PlanStep(const Request& r, const StepPlan& s, HitPlan& hp,
                              int64_t& need) const {
  if (s.started) return Status::Ok();
  const int64_t blocks = Blocks(r);
  if (!s.hit.encoder) {
    need += blocks;
    return Status::Ok();
  }
  const BlockPool& bp = block_pool();
  for (int64_t i = 0; i < blocks; ++i) {
    const int32_t b = bp.Find(Key(r, i));
    if (b < 0) return StaleHit(r, "an encoder block");
    if (bp.ref_count(b) == 0) {
      ++need;
      core_.hit_keep.push_back({pool(), b});
    }
    hp.blocks.push_back(b);
  }
  return Status::Ok();
}

void EncoderGroup::ApplyHit(Request& r, const StepPlan& s, HitPlan& hp) {
  if (!s.hit.encoder) return;
  const int64_t blocks = Blocks(r);
  dirty(r.slot) = 0;
  for (int64_t i = 0; i < blocks; ++i) {
    const int32_t b = hp.blocks[hp.next++];
    core_.AcquireHeld(pool(), b);
    table(r.slot).push_back(b);
  }
}

void EncoderGroup::ApplyStep(Request& r, const StepPlan& s) {
  if (s.started || s.hit.encoder) return;
  const std::span<const int32_t> fresh = core_.AllocateReserved(pool(), Blocks(r));
  table(r.slot).assign(fresh.begin(), fresh.end());
  dirty(r.slot) = 0;
}

void EncoderGroup::Commit(Request& r, int64_t, int64_t) {
  if (r.encoder_ready) return;
  const std::vector<int32_t>& t = table(r.slot);
  for (size_t i = 0; i < t.size(); ++i)
    core_.PublishBlock(pool(), t[i], Key(r, static_cast<int64_t>(i)), r);
}

void EncoderGroup::Fork(const Request& parent, int32_t child_slot) {
  std::vector<int32_t>& t = table(child_slot);
  t = table(parent.slot);
  dirty(child_slot) = 0;
  for (int32_t b : t) {
    if (b != BlockPool::kNullBlock) core_.AcquireHeld(pool(), b);
  }
}

void EncoderGroup::Free(Request& r) {
  std::vector<int32_t>& t = table(r.slot);
  std::vector<int32_t>& to_release = core_.to_release;
  to_release.clear();
  for (auto it = t.rbegin(); it != t.rend(); ++it) {
    if (*it != BlockPool::kNullBlock) to_release.push_back(*it);
  }
  core_.Release(pool(), to_release, r.retention);
  t.clear();
  dirty(r.slot) = 0;
}

void EncoderGroup::Remap(int32_t slot, std::span<const int32_t> moved_to) {
  std::vector<int32_t>& t = table(slot);
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] != BlockPool::kNullBlock &&
        moved_to[static_cast<size_t>(t[i])] != BlockPool::kNullBlock) {
      t[i] = moved_to[static_cast<size_t>(t[i])];
      dirty(slot) = std::min(dirty(slot), static_cast<int32_t>(i));
    }
  }
}

bool EncoderGroup::TakeDelta(int32_t slot, TableDelta& out) {
  const std::vector<int32_t>& t = table(slot);
  out.size = static_cast<int32_t>(t.size());
  out.from = std::min(dirty(slot), out.size);
  out.blocks = std::span<const int32_t>(t).subspan(static_cast<size_t>(out.from));
  dirty(slot) = out.size;
  return true;
}

Status EncoderGroup::CheckRequest(const Request& r, std::vector<int32_t>& refs) const {
  const std::vector<int32_t>& t = tables_[static_cast<size_t>(r.slot)];
  const BlockPool& bp = block_pool();
  const int64_t want = r.started ? Blocks(r) : 0;
  if (static_cast<int64_t>(t.size()) != want) {
    return Fail(
        r, fmt::format("encoder group {} holds {} blocks, expected {}", group_, t.size(), want));
  }
  for (size_t i = 0; i < t.size(); ++i) {
    HKV_RETURN_IF_ERROR(Hold(r, refs, t[i], "encoder block"));
    if (bp.has_identity(t[i]) && bp.identity(t[i]) != Key(r, static_cast<int64_t>(i))) {
      return Fail(r, fmt::format("encoder block {} has a foreign identity", i));
    }
  }
  return Status::Ok();
}

}  // namespace hkv::manager_internal
