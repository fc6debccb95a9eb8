// ThrashGuard: which finished requests' blocks keep their place in the eviction order when the
// cache cannot hold every conversation until it comes back (ManagerConfig::thrash_guard).
//
// Least recently freed first keeps every conversation for the same time: about as many ticks of
// the eviction clock as the cache has cached blocks queued (its residence). When most
// conversations come back later than that, each is evicted just before its next turn and the
// cache keeps nothing that is used again. Keeping only a share p of the chains freed - the rest
// go on probation (Retention::kProbation: evicted before anything freed normally) - stretches
// the residence of the kept ones to about residence / q, q being the share of freed chains kept,
// so that a kept chain lives until it returns. A request that hit the chain end of the request it
// continues is kept again: its conversation has shown that it returns within that time.
//
// Contract:
// - Ticks are the eviction clock's: one per cached block freed, kept or on probation, so ages do
//   not depend on p.
// - Freed(end, now, ...) remembers a freed request's chain end (the digest of its last whole hash
//   block) with the clock's tick; up to kRemembered ends, forgotten oldest first, or once older
//   than kHorizon times the largest residence seen. A preempted request's end is remembered to
//   hand its `continued` back when it resumes; it is no outcome either way.
// - Started(hashes, hit_blocks, now) looks from a new request's last hash block back over at
//   most kLookBackTokens tokens (a follow-up message's length; in hash blocks of the size given
//   to the constructor) for the latest end it remembers: the conversation came back after
//   now - tick ticks, whether the cache still held its blocks or not. That age goes into a
//   histogram (halved every kWindow outcomes so that it follows the workload); an end forgotten
//   without coming back counts as never. Returns whether the hit reached that end (hit_blocks:
//   the hash blocks it covers; 0 for no hit), or, for a resumed preempted request, what its
//   first start returned.
// - Keep(continued) says whether a request freed now keeps its place: always when it continued
//   a kept chain (Started said so), else with probability p (a fixed-seed generator, so replays
//   repeat).
// - Every kChooseEvery frees (Tick), p is chosen again: the candidate that maximises the share
//   of requests expected to hit the chain they continue, q * F(L(q)), where F is the measured
//   distribution of return ages, q solves q = p + (1 - p) * q * F (kept: the share p drawn, plus
//   those that came back while kept), and L(q) = residence / (c + (1 - c) * q) is how long a kept
//   chain lives: the residence averaged over frees, stretched by what probation takes off the
//   kept queue, c being the share of ticks freed otherwise than by finished requests (Freeing /
//   Released bracket each release). p = 1 is least recently freed first, which a share below 1
//   replaces only when it wins by kMargin and by kMinGain of all requests (recency's hits on the
//   prefixes of chains it evicted from the tail are not in the model); between shares below 1 p
//   moves for a gain above kHysteresis; nothing before kMinOutcomes outcomes.
// Allocates only in its constructor.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include <hkv/common/splitmix64.h>
#include <hkv/pool/block_hash.h>
#include <hkv/pool/prefix_index.h>

namespace hkv::manager_internal {

class ThrashGuard {
 public:
  static constexpr int32_t kRemembered = 4096;
  static constexpr int32_t kLookBackTokens = 2048;
  static constexpr double kHorizon = 16;
  static constexpr int32_t kWindow = 4096;
  static constexpr int32_t kChooseEvery = 32;
  static constexpr int32_t kMinOutcomes = 256;
  static constexpr double kHysteresis = 1.02;
  static constexpr double kMargin = 1.25;
  static constexpr double kMinGain = 0.05;
  static constexpr double kSmoothing = 1.0 / 64;
  static constexpr double kTickWindow = 1 << 22;
  static constexpr std::array<double, 8> kShares = {1.0,     1.0 / 2, 1.0 / 3,  1.0 / 4,
                                                    1.0 / 6, 1.0 / 8, 1.0 / 12, 1.0 / 16};

  // fixed_share in (0, 1]: that share always (Choose changes nothing); 0: learned.
  // `hash_tokens`: tokens per hash block, so that Started looks back kLookBackTokens tokens
  // whatever the block size.
  explicit ThrashGuard(double fixed_share = 0, int32_t hash_tokens = 16);

  // `preempted`: the request comes back to resume, not as a new turn; its return is no outcome,
  // and Started hands back `continued`, what its first start found.
  void Freed(const BlockHash& end, uint64_t now, uint64_t residence, bool preempted = false,
             bool continued = false);
  bool Started(std::span<const BlockHash> hashes, int64_t hit_blocks, uint64_t now);
  bool Keep(bool continued);
  // Brackets a request's release: Freeing before its blocks go back, Released after, with the
  // clock then. What the clock gained in between is the request's own ticks (`finished`: subject
  // to probation; a preempted request's are not); what it gained since the last release is churn.
  void Freeing(uint64_t now);
  void Released(uint64_t now, bool finished);
  // Called once per free; picks p again every kChooseEvery calls.
  void Tick(uint64_t residence);
  void Choose(uint64_t residence);

  double keep_share() const { return share_; }
  // The expected share of requests hitting the chain they continue, with keep share p, for a
  // cache of `residence` ticks (Choose's objective; exposed for tests and docs).
  double Expected(double p, double residence) const;
  // How long a kept chain lives, in ticks, when a share q of finished chains is kept and the
  // cache queues `residence` blocks by recency.
  double Lifetime(double residence, double q) const;
  // The measured share of chain ends that came back within `age` ticks.
  double ReturnedWithin(double age) const;
  int64_t returns_seen() const { return returns_; }
  int64_t ends_forgotten() const { return forgotten_; }
  // Every remembered end is indexed once, at its slot in the ring's held window, and the index
  // holds nothing else. O(ends held).
  bool CheckInvariants() const;

 private:
  static constexpr int32_t kBinsPerOctave = 8;
  static constexpr int32_t kBins = 64 * kBinsPerOctave;
  static int32_t BinOf(double age);
  // Outcomes in the bins below each bin: one pass makes every F(age) O(1).
  using Cdf = std::array<double, kBins + 1>;
  void Cumulate(Cdf& cdf) const;
  double Within(const Cdf& cdf, double age) const;
  double ExpectedWith(const Cdf& cdf, double p, double residence) const;
  void Forget(int32_t slot, bool returned);
  void Outcome(int32_t bin);

  struct End {
    PrefixKey key;
    uint64_t tick = 0;
    bool live = false;
    bool preempted = false, continued = false;
  };
  // Ends in the order freed: held_ slots from oldest_ on (some no longer live: they came back).
  int64_t look_back_;  // hash blocks Started looks back: kLookBackTokens of them
  std::vector<End> ring_;
  int32_t oldest_ = 0, held_ = 0;
  PrefixIndex index_;                     // end -> ring slot
  std::array<double, kBins + 1> bins_{};  // the last bin: never came back
  Cdf cdf_{};
  double outcomes_ = 0;
  int64_t returns_ = 0, forgotten_ = 0;
  int32_t since_choice_ = 0;
  uint64_t horizon_residence_ = 1;  // the largest residence seen: warm-up does not shorten it
  double share_ = 1.0;
  double smoothed_ = -1;  // the residence, averaged over frees (Tick)
  // Ticks of finished requests' own releases and of everything else, halved past kTickWindow.
  double churn_ticks_ = 0, end_ticks_ = 0;
  uint64_t last_free_ = 0, freeing_ = 0;
  bool fixed_ = false;
  SplitMix64 rng_{0x7e5a11ce};
};

}  // namespace hkv::manager_internal
