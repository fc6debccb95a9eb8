#include "thrash_guard.h"

#include <algorithm>
#include <cmath>

namespace hkv::manager_internal {

ThrashGuard::ThrashGuard(double fixed_share, int32_t hash_tokens)
    : look_back_(std::max<int64_t>(1, kLookBackTokens / std::max<int32_t>(1, hash_tokens))),
      ring_(kRemembered),
      index_(kRemembered),
      share_(fixed_share > 0 ? fixed_share : 1.0),
      fixed_(fixed_share > 0) {}

int32_t ThrashGuard::BinOf(double age) {
  if (!(age >= 1)) return 0;
  const double bin = std::floor(kBinsPerOctave * std::log2(age)) + 1;
  return static_cast<int32_t>(std::min<double>(bin, kBins - 1));
}

void ThrashGuard::Outcome(int32_t bin) {
  bins_[static_cast<size_t>(bin)] += 1;
  outcomes_ += 1;
  if (outcomes_ >= kWindow) {
    // Halving keeps the shape and lets the recent past weigh most.
    for (double& b : bins_)
      b *= 0.5;
    outcomes_ *= 0.5;
  }
}

void ThrashGuard::Forget(int32_t slot, bool returned) {
  End& e = ring_[static_cast<size_t>(slot)];
  index_.Erase(e.key);
  e.live = false;
  if (!returned && !e.preempted) {
    ++forgotten_;
    Outcome(kBins);
  }
}

void ThrashGuard::Freed(const BlockHash& end, uint64_t now, uint64_t residence, bool preempted,
                        bool continued) {
  const PrefixKey key{end, 0};
  // The same end freed again (a preempted request, an identical prompt): the newer tick stands.
  const int32_t present = index_.Find(key);
  if (present >= 0) {
    index_.Erase(key);
    ring_[static_cast<size_t>(present)].live = false;
  }
  // Ends older than the horizon would only come back to a cache kept for a share below the
  // smallest candidate: they count as never, and their slots stop costing probes. The ring holds
  // ends in the order freed, so the walk stops at the first one still young.
  horizon_residence_ = std::max(horizon_residence_, residence);
  const double horizon = kHorizon * static_cast<double>(horizon_residence_);
  while (held_ > 0) {
    const End& e = ring_[static_cast<size_t>(oldest_)];
    if (e.live && static_cast<double>(now - e.tick) <= horizon && held_ < kRemembered) break;
    if (e.live) Forget(oldest_, false);
    oldest_ = (oldest_ + 1) % kRemembered;
    --held_;
  }
  const int32_t slot = (oldest_ + held_) % kRemembered;
  ring_[static_cast<size_t>(slot)] = {key, now, true, preempted, continued};
  index_.Insert(key, slot);
  ++held_;
}

bool ThrashGuard::Started(std::span<const BlockHash> hashes, int64_t hit_blocks, uint64_t now) {
  const auto n = static_cast<int64_t>(hashes.size());
  const int64_t stop = std::max<int64_t>(0, n - look_back_);
  constexpr int64_t kAhead = 8;
  for (int64_t j = n - 1; j >= stop && j > n - 1 - kAhead; --j)
    index_.Prefetch({hashes[static_cast<size_t>(j)], 0});
  for (int64_t j = n - 1; j >= stop; --j) {
    if (j - kAhead >= stop) index_.Prefetch({hashes[static_cast<size_t>(j - kAhead)], 0});
    const int32_t slot = index_.Find({hashes[static_cast<size_t>(j)], 0});
    if (slot < 0) continue;
    const End& e = ring_[static_cast<size_t>(slot)];
    if (e.preempted) {
      const bool continued = e.continued;
      Forget(slot, true);
      return continued;
    }
    Outcome(BinOf(static_cast<double>(now - e.tick)));
    ++returns_;
    Forget(slot, true);
    return j < hit_blocks;
  }
  return false;
}

bool ThrashGuard::Keep(bool continued) {
  return continued || share_ >= 1 || rng_.Unit() < share_;
}

void ThrashGuard::Tick(uint64_t residence) {
  // A chain lives through many frees: what keeps it is the residence over that time, not at one
  // moment (with many requests running it swings by several times as they come and go).
  const auto r = static_cast<double>(residence);
  smoothed_ = smoothed_ < 0 ? r : smoothed_ + (r - smoothed_) * kSmoothing;
  if (++since_choice_ < kChooseEvery) return;
  since_choice_ = 0;
  Choose(static_cast<uint64_t>(smoothed_));
}

void ThrashGuard::Cumulate(Cdf& cdf) const {
  double sum = 0;
  for (int32_t b = 0; b <= kBins; ++b) {
    cdf[static_cast<size_t>(b)] = sum;
    sum += bins_[static_cast<size_t>(b)];
  }
}

double ThrashGuard::Within(const Cdf& cdf, double age) const {
  if (outcomes_ <= 0) return 0;
  const auto top = static_cast<size_t>(BinOf(age));
  // The bin the age falls in counts half: ages within a bin are not told apart.
  return (cdf[top] + 0.5 * bins_[top]) / outcomes_;
}

double ThrashGuard::ExpectedWith(const Cdf& cdf, double p, double residence) const {
  // The kept share q solves q = p / (1 - F(R(q)) * (1 - p)). The right side falls as q grows (a
  // larger kept share holds each chain for less time), so there is one crossing: bisect, and
  // stay on its side where the right side is at least q.
  const auto kept = [&](double q) {
    return p / (1 - Within(cdf, Lifetime(residence, q)) * (1 - p));
  };
  double lo = p, hi = 1;
  for (int i = 0; i < 30 && hi - lo > 1e-6; ++i) {
    const double mid = 0.5 * (lo + hi);
    if (kept(mid) >= mid) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo * Within(cdf, Lifetime(residence, lo));
}

double ThrashGuard::Lifetime(double residence, double q) const {
  // The queue of kept blocks drains as fast as kept blocks are freed: the ends of kept chains (a
  // share q of what finished requests free) and everything freed otherwise (window blocks left
  // behind, states superseded, preempted requests: a share `churn` of the ticks), which no
  // probation shortens.
  const double total = churn_ticks_ + end_ticks_;
  const double churn = total > 0 ? churn_ticks_ / total : 0;
  return residence / (churn + (1 - churn) * q);
}

void ThrashGuard::Freeing(uint64_t now) {
  churn_ticks_ += static_cast<double>(now - last_free_);
  freeing_ = now;
}

void ThrashGuard::Released(uint64_t now, bool finished) {
  (finished ? end_ticks_ : churn_ticks_) += static_cast<double>(now - freeing_);
  last_free_ = now;
  if (churn_ticks_ + end_ticks_ > kTickWindow) {
    churn_ticks_ *= 0.5;
    end_ticks_ *= 0.5;
  }
}

double ThrashGuard::ReturnedWithin(double age) const {
  Cdf cdf;
  Cumulate(cdf);
  return Within(cdf, age);
}

double ThrashGuard::Expected(double p, double residence) const {
  Cdf cdf;
  Cumulate(cdf);
  return ExpectedWith(cdf, p, residence);
}

void ThrashGuard::Choose(uint64_t residence) {
  if (fixed_ || returns_ + forgotten_ < kMinOutcomes) return;
  Cumulate(cdf_);
  const auto c = static_cast<double>(std::max<uint64_t>(residence, 1));
  // Recency also hits the prefixes of chains it evicted from the tail, which the model does not
  // count: it must lose by kMargin, and by kMinGain of all requests, before a share below 1
  // replaces it. (Under overload the residence is a few requests' blocks, every estimate is near
  // 0, and their ratio means nothing.)
  const double recency = ExpectedWith(cdf_, 1.0, c);
  double best = 1.0, best_value = recency;
  for (double p : kShares) {
    if (p >= 1) continue;
    const double v = ExpectedWith(cdf_, p, c);
    if (v > best_value && v > recency * kMargin && v > recency + kMinGain) {
      best = p;
      best_value = v;
    }
  }
  const double current = ExpectedWith(cdf_, share_, c);
  if (best == 1.0 || best_value > current * kHysteresis || current <= recency * kMargin ||
      current <= recency + kMinGain) {
    share_ = best;
  }
}

bool ThrashGuard::CheckInvariants() const {
  if (held_ < 0 || held_ > kRemembered || oldest_ < 0 || oldest_ >= kRemembered) return false;
  // Every end the index names lies in the ring's held window and is indexed at its own slot.
  int32_t live = 0;
  for (int32_t n = 0; n < held_; ++n) {
    const int32_t slot = (oldest_ + n) % kRemembered;
    const End& e = ring_[static_cast<size_t>(slot)];
    if (!e.live) continue;
    ++live;
    if (index_.Find(e.key) != slot) return false;
  }
  return live == index_.size();
}

}  // namespace hkv::manager_internal
