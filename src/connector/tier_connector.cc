// TierConnector: write-through offload of published blocks, background loads of external hits.
#include <string>

#include <fmt/format.h>

#include <hkv/connector/block_stream.h>
#include <hkv/connector/tier_connector.h>

namespace hkv {

TierConnector::TierConnector(const BlockMemoryView& view, std::vector<Tier*> tiers)
    : view_(view), tiers_(std::move(tiers)) {
  worker_ = std::thread([this] { Run(); });
}

Result<std::unique_ptr<TierConnector>> TierConnector::Create(const BlockMemoryView& view,
                                                             std::vector<Tier*> tiers) {
  if (tiers.empty()) return Status::InvalidArgument("tier connector: no tiers");
  for (size_t i = 0; i < tiers.size(); ++i) {
    if (tiers[i] == nullptr) {
      return Status::InvalidArgument(fmt::format("tier connector: tier {} is null", i));
    }
  }
  return std::unique_ptr<TierConnector>(new TierConnector(view, std::move(tiers)));
}

TierConnector::~TierConnector() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    for (auto& [id, job] : jobs_)
      job.cancelled = true;
  }
  cv_.notify_all();
  worker_.join();
}

bool TierConnector::Has(const PrefixKey& key) const {
  std::lock_guard lock(tier_mu_);
  for (const Tier* t : tiers_) {
    if (t->Contains(key)) return true;
  }
  return false;
}

Status TierConnector::Store(std::span<const ManagerEvent> events) {
  // Check every event first, so a bad one stores nothing.
  scratch_export_.clear();
  for (const ManagerEvent& e : events) {
    if (e.kind != KvEvent::Kind::kStored) continue;
    if (e.group < 0 || e.group >= view_.num_groups()) {
      return Status::InvalidArgument(fmt::format(
          "tier connector: stored event for block {} names group {}; the memory view has {}",
          e.block, e.group, view_.num_groups()));
    }
    if (const int32_t pool = view_.group(e.group).pool; !view_.ValidBlock(pool, e.block)) {
      return Status::InvalidArgument(fmt::format(
          "tier connector: stored event for block {} of group {}: outside pool {} (ids {}..{})",
          e.block, e.group, pool, view_.first_block(pool),
          view_.first_block(pool) + view_.num_blocks(pool) - 1));
    }
    scratch_export_.push_back({e.group, e.block, PrefixKey{e.hash, e.group}});
  }
  std::vector<unsigned char> bytes;
  int64_t stored = 0, put_bytes = 0, refused = 0;
  {
    std::lock_guard lock(tier_mu_);
    for (const ExportBlock& b : scratch_export_) {
      bool missing = false;
      for (const Tier* t : tiers_)
        missing = missing || !t->Contains(*b.key);
      if (!missing) continue;  // every tier has it: a Put would only refresh its recency
      HKV_ASSIGN_OR_RETURN(const int64_t size, ExportedBytes(view_, {&b, 1}));
      bytes.resize(static_cast<size_t>(size));
      HKV_RETURN_IF_ERROR(ExportBlocks(view_, {&b, 1}, bytes));
      bool any = false;
      for (Tier* t : tiers_) {
        if (t->Contains(*b.key)) continue;
        if (t->Put(*b.key, bytes).ok()) {
          any = true;
          put_bytes += size;
        } else {
          ++refused;
        }
      }
      stored += any ? 1 : 0;
    }
  }
  std::lock_guard lock(mu_);
  stats_.blocks_stored += stored;
  stats_.bytes_stored += put_bytes;
  stats_.store_refusals += refused;
  return Status::Ok();
}

Status TierConnector::StartLoad(RequestId id, std::span<const BlockLoad> loads) {
  if (loads.empty()) {
    return Status::InvalidArgument(fmt::format("tier connector: request {}: no loads", id));
  }
  for (const BlockLoad& l : loads) {
    if (l.group < 0 || l.group >= view_.num_groups()) {
      return Status::InvalidArgument(fmt::format(
          "tier connector: request {}: load into block {} names group {}; the memory view has {}",
          id, l.block, l.group, view_.num_groups()));
    }
    if (view_.group(l.group).pool != l.pool) {
      return Status::InvalidArgument(fmt::format(
          "tier connector: request {}: load into block {} of group {} names pool {}; the group's "
          "blocks are of pool {}",
          id, l.block, l.group, l.pool, view_.group(l.group).pool));
    }
    if (!view_.ValidBlock(l.pool, l.block)) {
      return Status::InvalidArgument(fmt::format(
          "tier connector: request {}: load into block {} of group {}: outside pool {} (ids "
          "{}..{})",
          id, l.block, l.group, l.pool, view_.first_block(l.pool),
          view_.first_block(l.pool) + view_.num_blocks(l.pool) - 1));
    }
  }
  {
    std::lock_guard lock(mu_);
    if (jobs_.count(id) > 0) {
      return Status::InvalidArgument(
          fmt::format("tier connector: request {} already has a load job", id));
    }
    Job& job = jobs_[id];
    job.id = id;
    job.loads.assign(loads.begin(), loads.end());
    queue_.push_back(id);
    ++stats_.loads_started;
  }
  cv_.notify_all();
  return Status::Ok();
}

TierConnector::LoadState TierConnector::Poll(RequestId id) const {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  return it == jobs_.end() ? LoadState::kFailed : it->second.state;
}

TierConnector::LoadState TierConnector::Wait(RequestId id) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] {
    auto it = jobs_.find(id);
    return it == jobs_.end() || it->second.state != LoadState::kPending;
  });
  auto it = jobs_.find(id);
  return it == jobs_.end() ? LoadState::kFailed : it->second.state;
}

void TierConnector::Forget(RequestId id) {
  Cancel(id);
  std::lock_guard lock(mu_);
  jobs_.erase(id);
}

void TierConnector::Cancel(RequestId id) {
  std::unique_lock lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  it->second.cancelled = true;
  // The worker checks the flag between blocks; wait until it no longer writes this job's blocks.
  cv_.wait(lock, [&] { return !(busy_ && running_ == id); });
  if (it->second.state == LoadState::kPending) it->second.state = LoadState::kFailed;
  std::erase(queue_, id);
  cv_.notify_all();
}

bool TierConnector::HasJob(RequestId id) const {
  std::lock_guard lock(mu_);
  return jobs_.count(id) > 0;
}

TierConnectorStats TierConnector::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

std::string TierConnector::last_failure() const {
  std::lock_guard lock(mu_);
  return last_failure_;
}

Status TierConnector::LoadOne(const BlockLoad& load, std::vector<StreamBlock>& parsed) {
  std::vector<unsigned char> bytes;
  Status why = Status::NotFound(fmt::format("no tier holds the block of group {}", load.group));
  {
    std::lock_guard lock(tier_mu_);
    for (Tier* t : tiers_) {
      auto got = t->Get(load.key);
      if (got.ok()) {
        bytes = std::move(got).value();
        why = Status::Ok();
        break;
      }
      why = got.status();
    }
  }
  HKV_RETURN_IF_ERROR(why);
  // Identities first (nothing written if they are wrong), then one pass that verifies each
  // image as it copies it: a damaged image leaves the targets written, which is harmless - they
  // are this request's private blocks, released unpublished when the load fails.
  HKV_ASSIGN_OR_RETURN(parsed, ParseBlockStreamHeaders(bytes));
  // A stream checks itself; that it is the block the manager asked for is checked here.
  const auto foreign = [&](const std::string& what) {
    return Status::InvalidArgument(fmt::format(
        "tier connector: the stream stored for a block of group {} {}", load.group, what));
  };
  if (parsed.size() != 1) {
    return foreign(fmt::format("holds {} blocks; expected one", parsed.size()));
  }
  if (!parsed[0].key) return foreign("holds a block without a prefix identity");
  if (*parsed[0].key != load.key) return foreign("holds a block of another identity");
  if (parsed[0].group != load.group) {
    return foreign(fmt::format("holds a block of group {}", parsed[0].group));
  }
  if (parsed[0].checkpoint != load.state) {
    return foreign(parsed[0].checkpoint ? "holds a state checkpoint; expected a block of tokens"
                                        : "holds a block of tokens; expected a state checkpoint");
  }
  const int64_t dst = load.block;
  HKV_RETURN_IF_ERROR(ImportBlocksVerifying(view_, parsed, {&dst, 1}));
  std::lock_guard lock(mu_);
  ++stats_.blocks_loaded;
  stats_.bytes_loaded += static_cast<int64_t>(bytes.size());
  return Status::Ok();
}

void TierConnector::Run() {
  std::vector<StreamBlock> parsed;
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    const RequestId id = queue_.front();
    queue_.pop_front();
    running_ = id;
    busy_ = true;
    Status result = Status::Ok();
    for (size_t i = 0;; ++i) {
      Job& job = jobs_.at(id);
      if (job.cancelled || i == job.loads.size() || !result.ok()) break;
      const BlockLoad load = job.loads[i];
      lock.unlock();
      result = LoadOne(load, parsed);
      lock.lock();
    }
    Job& job = jobs_.at(id);
    if (!job.cancelled || job.state == LoadState::kPending) {
      job.state = result.ok() && !job.cancelled ? LoadState::kLoaded : LoadState::kFailed;
    }
    if (!result.ok()) {
      ++stats_.loads_failed;
      last_failure_ = result.message();
    }
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace hkv
