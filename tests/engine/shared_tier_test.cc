// Tiers as a shared, lasting store, through the reference engine: a disk tier outlives an engine
// process killed with SIGKILL mid-run (the next process reloads every complete entry, drops the
// torn one and stays exact); models of identical geometry sharing one disk directory or one Redis
// namespace never load each other's blocks; blocks planted on the server by a writer without the
// secret are all refused and recomputed.
#include <chrono>
#include <csignal>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hkv/connector/disk_tier.h>
#include <hkv/connector/remote_tier.h>
#include <hkv/engine/verify.h>
#include <hkv/spec/config_loader.h>

#include "../connector/forwarding_tier.h"
#include "../connector/redis_server.h"
#include "../connector/tier_test_util.h"
#include "engine_test_util.h"

namespace hkv {
namespace {

ModelSpec Load(const std::string& name) {
  return LoadModelConfig(std::string(HKV_MODELS_DIR) + "/" + name + "/config.json").value();
}

DiskTierOptions DiskFor(const ModelSpec& model, const VerifyOptions& o) {
  DiskTierOptions d;
  d.capacity_bytes = int64_t{256} << 20;
  d.model = VerifyModelIdentity(model, o).value();
  return d;
}

void ExpectExact(const VerifyReport& r) {
  EXPECT_TRUE(r.completed);
  EXPECT_GT(r.requests, 0);
  EXPECT_EQ(r.mismatches, 0) << "max logit diff " << r.max_logit_diff;
  EXPECT_LE(r.max_logit_diff, 1e-4f);
}

// A child process serves the workload through a disk tier and is killed with SIGKILL part way
// (at a random point: the steps after the signal are slowed so that the kill lands among them,
// possibly inside a write). One entry file is then torn, as a power loss can leave it. A new
// process - here the parent - opens the directory: it reloads the complete entries, removes the
// torn one, and serves the same workload exactly, loading the dead process's blocks.
TEST(SharedTier, DiskTierOutlivesAKilledEngineProcess) {
  for (const char* name : {"ibm-ai-platform--Bamba-9B", "meta-llama--Llama-3.1-8B"}) {
    SCOPED_TRACE(name);
    testing::ScopedTempDir tmp;
    const ModelSpec model = Load(name);
    VerifyOptions o;
    o.requests = 16;
    o.seed = 5;
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::close(ready[0]);
      Result<DiskTier> disk = DiskTier::Open(tmp.path(), DiskFor(model, o));
      if (!disk.ok()) ::_exit(1);
      VerifyOptions c = o;
      c.offload = OffloadOptions{{&*disk}};
      c.after_step = [&](int32_t, const EngineCounters& counters) {
        if (counters.steps == 12) {
          const char go = 'y';
          (void)!::write(ready[1], &go, 1);
        }
        if (counters.steps >= 12) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      };
      (void)RunVerify(model, c);
      for (;;)
        ::pause();  // finished before the kill: wait for it all the same
    }
    ::close(ready[1]);
    char go = 0;
    ASSERT_EQ(::read(ready[0], &go, 1), 1);
    ::close(ready[0]);
    std::this_thread::sleep_for(std::chrono::milliseconds(15));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status));

    // Tear one entry: what a power loss does to a file whose data had not reached the disk.
    const std::filesystem::path model_dir = tmp.path() / DiskFor(model, o).model.Hex();
    int64_t files = 0;
    std::filesystem::path torn;
    for (const auto& f : std::filesystem::directory_iterator(model_dir)) {
      if (f.path().extension() != ".hkv") continue;
      ++files;
      torn = f.path();
    }
    ASSERT_GT(files, 1);
    std::filesystem::resize_file(torn, std::filesystem::file_size(torn) / 2);

    DiskTier disk = DiskTier::Open(tmp.path(), DiskFor(model, o)).value();
    EXPECT_EQ(disk.open_stats().entries_loaded, files - 1);
    EXPECT_EQ(disk.open_stats().damaged_removed, 1);
    EXPECT_LE(disk.open_stats().partial_removed, 1);
    EXPECT_FALSE(std::filesystem::exists(torn));
    o.offload = OffloadOptions{{&disk}};
    const VerifyReport r = RunVerify(model, o).value();
    ExpectExact(r);
    EXPECT_GT(r.external_hits, 0);  // the dead process's blocks served this one
    EXPECT_GT(r.loads_completed, 0);
    EXPECT_EQ(r.loads_failed, 0);
    EXPECT_EQ(disk.corruptions_detected(), 0);
  }
}

// Passes every call to `inner` and checks each block a Get returns against what this wrapper's
// own Puts stored under that key: a block it never stored is another writer's.
class OwnBlocksOnly final : public testing::ForwardingTier {
 public:
  explicit OwnBlocksOnly(Tier& inner) : ForwardingTier(inner) {}
  Status Put(const PrefixKey& key, std::span<const unsigned char> bytes) override {
    put_[key].assign(bytes.begin(), bytes.end());
    return inner_.Put(key, bytes);
  }
  Result<std::vector<unsigned char>> Get(const PrefixKey& key) override {
    HKV_ASSIGN_OR_RETURN(std::vector<unsigned char> bytes, inner_.Get(key));
    auto it = put_.find(key);
    ++(it != put_.end() && it->second == bytes ? own_ : foreign_);
    return bytes;
  }
  int64_t own() const { return own_; }
  int64_t foreign() const { return foreign_; }

 private:
  std::unordered_map<PrefixKey, std::vector<unsigned char>, PrefixKeyHash> put_;
  int64_t own_ = 0, foreign_ = 0;
};

// Two models with the same geometry (the same config, other weights: a base and its fine-tune)
// serve the same prompts - so the same block keys - through one disk directory and one Redis
// namespace. Model A goes first; then B, whose two engines reload only what B stored: not one
// block of A's (every loaded block is byte-equal to one B put), and B is exact. The control opens
// B's tiers under A's identity, as a store keyed by geometry alone would: B then loads A's blocks
// and its outputs differ from dense - the harm the identity prevents, and proof the check bites.
TEST(SharedTier, ModelsOfOneGeometryNeverShareEntries) {
  const ModelSpec model = Load("ibm-ai-platform--Bamba-9B");
  testing::ScopedTempDir tmp;
  const std::string ns = testing::FreshNamespace("two-models");
  VerifyOptions a;
  a.requests = 16;
  a.seed = 9;
  a.weights_seed = 101;
  VerifyOptions b = a;
  b.weights_seed = 202;
  const ModelIdentity id_a = VerifyModelIdentity(model, a).value();
  const ModelIdentity id_b = VerifyModelIdentity(model, b).value();
  ASSERT_NE(id_a, id_b);
  struct Tiers {
    DiskTier disk;
    std::unique_ptr<RemoteTier> remote;
    OwnBlocksOnly disk_check{disk};
    OwnBlocksOnly remote_check{*remote};
  };
  const auto tiers_for = [&](const ModelIdentity& id) {
    DiskTierOptions d = DiskFor(model, a);
    d.model = id;
    RemoteTierOptions r = testing::SharedRedisServer().Options(ns);
    r.model = id;
    return std::make_unique<Tiers>(DiskTier::Open(tmp.path(), d).value(),
                                   RemoteTier::Connect(r).value());
  };
  const auto run = [&](const VerifyOptions& options, Tiers& t) {
    VerifyOptions o = options;
    o.offload = OffloadOptions{{&t.disk_check, &t.remote_check}};
    o.restarts = 1;
    return RunVerify(model, o).value();
  };
  {
    auto t = tiers_for(id_a);
    ExpectExact(run(a, *t));
    ASSERT_GT(t->disk.used_bytes(), 0);
  }
  {
    auto t = tiers_for(id_b);
    EXPECT_EQ(t->disk.open_stats().entries_loaded, 0);  // A's directory is not B's
    const VerifyReport r = run(b, *t);
    ExpectExact(r);
    EXPECT_GT(r.loads_completed, 0);
    EXPECT_GT(t->disk_check.own(), 0);
    EXPECT_EQ(t->disk_check.foreign(), 0);
    EXPECT_EQ(t->remote_check.foreign(), 0);
  }
  {
    // The control: B under A's identity.
    auto t = tiers_for(id_a);
    const VerifyReport r = run(b, *t);
    EXPECT_GT(t->disk_check.foreign() + t->remote_check.foreign(), 0);
    EXPECT_GT(r.mismatches, 0) << "loading another model's blocks went unnoticed";
  }
}

// An attacker who can write to the Redis server but lacks the secret runs the victim's prompts
// through a model of its own (same geometry, other weights) and plants the blocks under the
// victim's real keys - the model identity is no secret - unsigned, or signed with a guess. The
// victim's engine, signing with the secret, refuses every planted block (none reaches it: each
// block it loads is one it stored), counts them, recomputes, and is exact. The control: a victim
// without a secret loads the planted blocks and its outputs differ from dense.
TEST(SharedTier, PlantedBlocksAreRefusedAndRecomputed) {
  const ModelSpec model = Load("meta-llama--Llama-3.1-8B");
  VerifyOptions victim;
  victim.requests = testing::kSanitized ? 10 : 16;
  victim.seed = 21;
  victim.weights_seed = 7;
  VerifyOptions attacker = victim;
  attacker.weights_seed = 8;
  const ModelIdentity id = VerifyModelIdentity(model, victim).value();
  const auto tier = [&](const std::string& ns, const std::string& secret) {
    RemoteTierOptions r = testing::SharedRedisServer().Options(ns);
    r.model = id;
    r.secret = secret;
    return RemoteTier::Connect(r).value();
  };
  const auto plant = [&](const std::string& ns, const std::string& secret) {
    auto t = tier(ns, secret);
    VerifyOptions o = attacker;
    o.offload = OffloadOptions{{t.get()}};
    ASSERT_TRUE(RunVerify(model, o).ok());
    ASSERT_GT(t->used_bytes(), 0);
  };
  struct Served {
    VerifyReport report;
    int64_t foreign = 0;  // blocks loaded that the victim never stored
    std::unique_ptr<RemoteTier> tier;
  };
  const auto serve = [&](const std::string& ns, const std::string& secret) {
    Served s;
    s.tier = tier(ns, secret);
    OwnBlocksOnly check(*s.tier);
    VerifyOptions o = victim;
    o.offload = OffloadOptions{{&check}};
    s.report = RunVerify(model, o).value();
    s.foreign = check.foreign();
    return s;
  };
  for (const char* attacker_secret : {"", "a guess"}) {
    SCOPED_TRACE(std::string("attacker secret '") + attacker_secret + "'");
    const std::string ns = testing::FreshNamespace("planted");
    plant(ns, attacker_secret);
    const Served s = serve(ns, "the secret");
    ExpectExact(s.report);
    EXPECT_EQ(s.foreign, 0);
    EXPECT_GT(s.tier->forgeries_refused(), 0);
    EXPECT_GT(s.report.loads_failed, 0);  // the planted hits: refused, so recomputed
    EXPECT_EQ(s.tier->corruptions_detected(), 0);
  }
  const std::string ns = testing::FreshNamespace("planted-control");
  plant(ns, "");
  const Served s = serve(ns, "");
  EXPECT_GT(s.foreign, 0);
  EXPECT_GT(s.report.mismatches, 0) << "planted blocks went unnoticed";
}

}  // namespace
}  // namespace hkv
