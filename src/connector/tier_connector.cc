// TierConnector: write-through offload of published blocks, background loads of external hits.
#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include <hkv/connector/block_stream.h>
#include <hkv/connector/tier_connector.h>

namespace hkv {

struct TierConnector::State {
  struct Job {
    RequestId id = 0;
    std::vector<BlockLoad> loads;
    LoadState state = LoadState::kPending;
    bool cancelled = false;
  };
  State(const BlockMemoryView& v, std::vector<Tier*> t) : view(v), tiers(std::move(t)) {}

  const BlockMemoryView& view;
  std::vector<Tier*> tiers;
  mutable std::mutex tier_mu;  // serialises tier calls

  mutable std::mutex mu;  // guards everything below
  std::condition_variable cv;
  std::deque<RequestId> queue;
  std::unordered_map<RequestId, Job> jobs;
  RequestId running = 0;
  bool busy = false;
  bool stop = false;
  TierConnectorStats stats;
  std::string last_failure;
  std::vector<ExportBlock> scratch_export;
  std::vector<size_t> scratch_event;  // per export: its event's index in the Store call
  std::vector<TierEvent> events;      // guarded by tier_mu
  std::vector<PrefixKey> scratch_dropped;
  std::thread worker;
};

TierConnector::TierConnector(const BlockMemoryView& view, std::vector<Tier*> tiers)
    : s_(std::make_unique<State>(view, std::move(tiers))) {
  for (Tier* t : s_->tiers)
    t->TrackDropped(true);
  s_->worker = std::thread([this] { Run(); });
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
    std::lock_guard lock(s_->mu);
    s_->stop = true;
    for (auto& [id, job] : s_->jobs)
      job.cancelled = true;
  }
  s_->cv.notify_all();
  s_->worker.join();
}

bool TierConnector::Has(const PrefixKey& key) const {
  std::lock_guard lock(s_->tier_mu);
  for (const Tier* t : s_->tiers) {
    if (t->Contains(key)) return true;
  }
  return false;
}

bool TierConnector::AnswersInBatches() const {
  return std::any_of(s_->tiers.begin(), s_->tiers.end(), [](const Tier* t) { return t->Remote(); });
}

void TierConnector::HasMany(std::span<const PrefixKey> keys, std::span<unsigned char> out) const {
  std::fill(out.begin(), out.end(), 0);
  std::vector<PrefixKey> ask;
  std::vector<size_t> where;
  std::vector<unsigned char> answers;
  std::lock_guard lock(s_->tier_mu);
  for (const Tier* t : s_->tiers) {
    ask.clear();
    where.clear();
    for (size_t i = 0; i < keys.size(); ++i) {
      if (out[i] != 0) continue;
      ask.push_back(keys[i]);
      where.push_back(i);
    }
    if (ask.empty()) return;
    answers.assign(ask.size(), 0);
    t->ContainsMany(ask, answers);
    for (size_t j = 0; j < ask.size(); ++j)
      out[where[j]] = answers[j];
  }
}

Status TierConnector::Store(std::span<const ManagerEvent> events) {
  // Check every event first, so a bad one stores nothing.
  s_->scratch_export.clear();
  s_->scratch_event.clear();
  for (size_t ei = 0; ei < events.size(); ++ei) {
    const ManagerEvent& e = events[ei];
    if (e.kind != KvEvent::Kind::kStored) continue;
    if (e.group < 0 || e.group >= s_->view.num_groups()) {
      return Status::InvalidArgument(fmt::format(
          "tier connector: stored event for block {} names group {}; the memory view has {}",
          e.block, e.group, s_->view.num_groups()));
    }
    if (const int32_t pool = s_->view.group(e.group).pool; !s_->view.ValidBlock(pool, e.block)) {
      return Status::InvalidArgument(fmt::format(
          "tier connector: stored event for block {} of group {}: outside pool {} (ids {}..{})",
          e.block, e.group, pool, s_->view.first_block(pool),
          s_->view.first_block(pool) + s_->view.num_blocks(pool) - 1));
    }
    s_->scratch_export.push_back({e.group, e.block, PrefixKey{e.hash, e.group}});
    s_->scratch_event.push_back(ei);
  }
  const size_t n = s_->scratch_export.size();
  int64_t stored = 0, put_bytes = 0, refused = 0;
  if (n > 0) {
    std::vector<PrefixKey> keys(n);
    for (size_t i = 0; i < n; ++i)
      keys[i] = *s_->scratch_export[i].key;
    std::lock_guard lock(s_->tier_mu);
    // Which tier lacks which block: one batch per tier.
    const size_t tiers = s_->tiers.size();
    std::vector<unsigned char> has(n * tiers, 0);
    for (size_t t = 0; t < tiers; ++t)
      s_->tiers[t]->ContainsMany(keys, std::span(has).subspan(t * n, n));
    // Export each missing block once; every tier that lacks it gets the same bytes.
    std::vector<std::vector<unsigned char>> images(n);
    for (size_t i = 0; i < n; ++i) {
      bool missing = false;
      for (size_t t = 0; t < tiers; ++t)
        missing = missing || has[t * n + i] == 0;
      if (!missing) continue;  // every tier has it: a Put would only refresh its recency
      const ExportBlock& b = s_->scratch_export[i];
      HKV_ASSIGN_OR_RETURN(const int64_t size, ExportedBytes(s_->view, {&b, 1}));
      images[i].resize(static_cast<size_t>(size));
      HKV_RETURN_IF_ERROR(ExportBlocks(s_->view, {&b, 1}, images[i]));
    }
    std::vector<unsigned char> any(n, 0);
    std::vector<PrefixKey> put_keys;
    std::vector<std::span<const unsigned char>> put_values;
    std::vector<size_t> put_index;
    std::vector<Status> results;
    for (size_t t = 0; t < tiers; ++t) {
      put_keys.clear();
      put_values.clear();
      put_index.clear();
      for (size_t i = 0; i < n; ++i) {
        if (has[t * n + i] != 0) continue;
        put_keys.push_back(keys[i]);
        put_values.emplace_back(images[i]);
        put_index.push_back(i);
      }
      if (put_keys.empty()) continue;
      results.assign(put_keys.size(), Status::Ok());
      s_->tiers[t]->PutMany(put_keys, put_values, results);
      for (size_t j = 0; j < put_keys.size(); ++j) {
        if (results[j].ok()) {
          any[put_index[j]] = 1;
          put_bytes += static_cast<int64_t>(put_values[j].size());
          s_->events.push_back({s_->tiers[t]->medium(), events[s_->scratch_event[put_index[j]]]});
        } else {
          ++refused;
        }
      }
    }
    for (unsigned char a : any)
      stored += a;
  }
  std::lock_guard lock(s_->mu);
  s_->stats.blocks_stored += stored;
  s_->stats.bytes_stored += put_bytes;
  s_->stats.store_refusals += refused;
  return Status::Ok();
}

Status TierConnector::StartLoad(RequestId id, std::span<const BlockLoad> loads) {
  if (loads.empty()) {
    return Status::InvalidArgument(fmt::format("tier connector: request {}: no loads", id));
  }
  for (const BlockLoad& l : loads) {
    if (l.group < 0 || l.group >= s_->view.num_groups()) {
      return Status::InvalidArgument(fmt::format(
          "tier connector: request {}: load into block {} names group {}; the memory view has {}",
          id, l.block, l.group, s_->view.num_groups()));
    }
    if (s_->view.group(l.group).pool != l.pool) {
      return Status::InvalidArgument(fmt::format(
          "tier connector: request {}: load into block {} of group {} names pool {}; the group's "
          "blocks are of pool {}",
          id, l.block, l.group, l.pool, s_->view.group(l.group).pool));
    }
    if (!s_->view.ValidBlock(l.pool, l.block)) {
      return Status::InvalidArgument(fmt::format(
          "tier connector: request {}: load into block {} of group {}: outside pool {} (ids "
          "{}..{})",
          id, l.block, l.group, l.pool, s_->view.first_block(l.pool),
          s_->view.first_block(l.pool) + s_->view.num_blocks(l.pool) - 1));
    }
  }
  {
    std::lock_guard lock(s_->mu);
    if (s_->jobs.count(id) > 0) {
      return Status::InvalidArgument(
          fmt::format("tier connector: request {} already has a load job", id));
    }
    State::Job& job = s_->jobs[id];
    job.id = id;
    job.loads.assign(loads.begin(), loads.end());
    s_->queue.push_back(id);
    ++s_->stats.loads_started;
  }
  s_->cv.notify_all();
  return Status::Ok();
}

TierConnector::LoadState TierConnector::Poll(RequestId id) const {
  std::lock_guard lock(s_->mu);
  auto it = s_->jobs.find(id);
  return it == s_->jobs.end() ? LoadState::kFailed : it->second.state;
}

TierConnector::LoadState TierConnector::Wait(RequestId id) {
  std::unique_lock lock(s_->mu);
  s_->cv.wait(lock, [&] {
    auto it = s_->jobs.find(id);
    return it == s_->jobs.end() || it->second.state != LoadState::kPending;
  });
  auto it = s_->jobs.find(id);
  return it == s_->jobs.end() ? LoadState::kFailed : it->second.state;
}

void TierConnector::Forget(RequestId id) {
  Cancel(id);
  std::lock_guard lock(s_->mu);
  s_->jobs.erase(id);
}

void TierConnector::Cancel(RequestId id) {
  std::unique_lock lock(s_->mu);
  auto it = s_->jobs.find(id);
  if (it == s_->jobs.end()) return;
  it->second.cancelled = true;
  // The worker checks the flag between blocks; wait until it no longer writes this job's blocks.
  s_->cv.wait(lock, [&] { return !(s_->busy && s_->running == id); });
  if (it->second.state == LoadState::kPending) it->second.state = LoadState::kFailed;
  std::erase(s_->queue, id);
  s_->cv.notify_all();
}

bool TierConnector::HasJob(RequestId id) const {
  std::lock_guard lock(s_->mu);
  return s_->jobs.count(id) > 0;
}

void TierConnector::TakeEvents(std::vector<TierEvent>& out) {
  std::lock_guard lock(s_->tier_mu);
  for (Tier* t : s_->tiers) {
    s_->scratch_dropped.clear();
    t->TakeDropped(s_->scratch_dropped);
    for (const PrefixKey& k : s_->scratch_dropped) {
      ManagerEvent e;
      e.kind = KvEvent::Kind::kRemoved;
      e.group = k.group;
      e.hash = k.hash;
      s_->events.push_back({t->medium(), e});
    }
  }
  out.insert(out.end(), s_->events.begin(), s_->events.end());
  s_->events.clear();
}

TierConnectorStats TierConnector::stats() const {
  std::lock_guard lock(s_->mu);
  return s_->stats;
}

std::string TierConnector::last_failure() const {
  std::lock_guard lock(s_->mu);
  return s_->last_failure;
}

void TierConnector::Fetch(std::span<const BlockLoad> loads,
                          std::vector<Result<std::vector<unsigned char>>>& fetched) {
  fetched.clear();
  fetched.reserve(loads.size());
  for (const BlockLoad& l : loads) {
    fetched.emplace_back(
        Status::NotFound(fmt::format("no tier holds the block of group {}", l.group)));
  }
  std::vector<PrefixKey> ask;
  std::vector<size_t> where;
  std::vector<Result<std::vector<unsigned char>>> got;
  std::lock_guard lock(s_->tier_mu);
  // Tier by tier, what no earlier tier returned: one batch per tier (one round trip on Redis).
  for (Tier* t : s_->tiers) {
    ask.clear();
    where.clear();
    for (size_t i = 0; i < loads.size(); ++i) {
      if (fetched[i].ok()) continue;
      ask.push_back(loads[i].key);
      where.push_back(i);
    }
    if (ask.empty()) return;
    t->GetMany(ask, got);
    for (size_t j = 0; j < ask.size(); ++j)
      fetched[where[j]] = std::move(got[j]);
  }
}

Status TierConnector::ImportOne(const BlockLoad& load, std::span<const unsigned char> bytes,
                                std::vector<StreamBlock>& parsed) {
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
  HKV_RETURN_IF_ERROR(ImportBlocksVerifying(s_->view, parsed, {&dst, 1}));
  std::lock_guard lock(s_->mu);
  ++s_->stats.blocks_loaded;
  s_->stats.bytes_loaded += static_cast<int64_t>(bytes.size());
  return Status::Ok();
}

void TierConnector::Run() {
  std::vector<StreamBlock> parsed;
  std::vector<Result<std::vector<unsigned char>>> fetched;
  std::unique_lock lock(s_->mu);
  for (;;) {
    s_->cv.wait(lock, [&] { return s_->stop || !s_->queue.empty(); });
    if (s_->stop) return;
    const RequestId id = s_->queue.front();
    s_->queue.pop_front();
    s_->running = id;
    s_->busy = true;
    Status result = Status::Ok();
    // Every block of the job is fetched at once, then checked and imported one by one, the
    // cancel flag read between blocks.
    const std::vector<BlockLoad> loads = s_->jobs.at(id).loads;
    lock.unlock();
    Fetch(loads, fetched);
    lock.lock();
    for (size_t i = 0; i < loads.size() && result.ok(); ++i) {
      if (s_->jobs.at(id).cancelled) break;
      lock.unlock();
      result = fetched[i].ok() ? ImportOne(loads[i], *fetched[i], parsed) : fetched[i].status();
      lock.lock();
    }
    State::Job& job = s_->jobs.at(id);
    if (!job.cancelled || job.state == LoadState::kPending) {
      job.state = result.ok() && !job.cancelled ? LoadState::kLoaded : LoadState::kFailed;
    }
    if (!result.ok()) {
      ++s_->stats.loads_failed;
      s_->last_failure = result.message();
    }
    s_->busy = false;
    s_->cv.notify_all();
  }
}

}  // namespace hkv
