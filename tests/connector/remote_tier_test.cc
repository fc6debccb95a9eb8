// RemoteTier against a real redis-server on loopback: two tiers (two engines) share entries
// through one server, which owns them (or one tier does, when told); damaged and forged values on
// the server are misses; AUTH with a password or an ACL user, over TCP or a Unix socket; a killed
// server fails every call quickly and a restarted one is reconnected to; bad options are refused
// by name.
#include <chrono>
#include <filesystem>
#include <string>
#include <utility>

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <hkv/connector/remote_tier.h>

#include "redis_server.h"
#include "tier_test_util.h"

namespace hkv {
namespace {

using testing::Bytes;
using testing::FreshNamespace;
using testing::K;
using testing::RedisServer;
using testing::SharedRedisServer;

std::unique_ptr<RemoteTier> Connect(const RemoteTierOptions& o) {
  auto t = RemoteTier::Connect(o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::move(t).value();
}

// Raw access to the server behind the tier's back.
class Raw {
 public:
  explicit Raw(int port) : c_(redisConnect("127.0.0.1", port)) {}
  ~Raw() { redisFree(c_); }
  std::string Get(const std::string& key) {
    auto* r = static_cast<redisReply*>(redisCommand(c_, "GET %b", key.data(), key.size()));
    std::string v = r->type == REDIS_REPLY_STRING ? std::string(r->str, r->len) : "";
    freeReplyObject(r);
    return v;
  }
  void Set(const std::string& key, const std::string& value) {
    freeReplyObject(
        redisCommand(c_, "SET %b %b", key.data(), key.size(), value.data(), value.size()));
  }
  bool Exists(const std::string& key) {
    auto* r = static_cast<redisReply*>(redisCommand(c_, "EXISTS %b", key.data(), key.size()));
    const bool e = r->integer > 0;
    freeReplyObject(r);
    return e;
  }

 private:
  redisContext* c_;
};

TEST(RemoteTierTest, TwoTiersShareEntriesThroughOneServer) {
  const std::string ns = FreshNamespace("share");
  auto a = Connect(SharedRedisServer().Options(ns));
  auto b = Connect(SharedRedisServer().Options(ns));
  auto other = Connect(SharedRedisServer().Options(FreshNamespace("elsewhere")));
  ASSERT_TRUE(a->Put(K(1), Bytes(1000, 7)).ok());
  EXPECT_TRUE(b->Contains(K(1)));
  EXPECT_FALSE(other->Contains(K(1)));  // namespaces keep engines apart
  EXPECT_EQ(b->Get(K(1)).value(), Bytes(1000, 7));
  EXPECT_EQ(b->hits(), 1);
  // b's budget, LRU and pins cover only what b put.
  EXPECT_TRUE(b->LruOrder().empty());
  EXPECT_EQ(b->used_bytes(), 0);
  EXPECT_EQ(b->Evict(K(1)).code(), StatusCode::kNotFound);
  EXPECT_EQ(b->Pin(K(1)).code(), StatusCode::kNotFound);
  // A Put of what the server holds keeps the stored value (content-named).
  ASSERT_TRUE(b->Put(K(1), Bytes(1000, 7)).ok());
  EXPECT_EQ(b->LruOrder().size(), 1u);
  // a evicts its entry: a forgets it, but the entry is the server's, and b still finds it.
  ASSERT_TRUE(a->Evict(K(1)).ok());
  EXPECT_TRUE(a->LruOrder().empty());
  EXPECT_EQ(b->Get(K(1)).value(), Bytes(1000, 7));
  EXPECT_EQ(other->Get(K(2)).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(other->misses(), 1);
}

// Budget evictions: by default the server owns the entries (a tier's budget bounds only its own
// index; nothing is deleted that another engine may use); with kTier the tier deletes its own.
TEST(RemoteTierTest, EvictionDeletesOnlyWhenTheTierOwnsItsEntries) {
  for (const auto ownership :
       {RemoteTierOptions::Ownership::kServer, RemoteTierOptions::Ownership::kTier}) {
    const bool owns = ownership == RemoteTierOptions::Ownership::kTier;
    SCOPED_TRACE(owns ? "tier" : "server");
    RemoteTierOptions o = SharedRedisServer().Options(FreshNamespace("own"), 200);
    o.ownership = ownership;
    auto a = Connect(o);
    auto b = Connect(o);
    Raw raw(SharedRedisServer().port());
    ASSERT_TRUE(a->Put(K(1), Bytes(100, 1)).ok());
    ASSERT_TRUE(a->Put(K(2), Bytes(100, 2)).ok());
    ASSERT_TRUE(a->Put(K(3), Bytes(100, 3)).ok());  // evicts K(1) from a's budget
    EXPECT_EQ(a->LruOrder(), (std::vector<PrefixKey>{K(2), K(3)}));
    EXPECT_EQ(raw.Exists(a->ServerKey(K(1))), !owns);
    EXPECT_EQ(b->Get(K(1)).ok(), !owns);
    ASSERT_TRUE(a->Evict(K(2)).ok());
    EXPECT_EQ(raw.Exists(a->ServerKey(K(2))), !owns);
  }
}

// An operator's view of a namespace: which models have entries, and dropping one model's entries
// leaves the other's.
TEST(RemoteTierTest, ModelsInANamespaceAreListedAndDroppedOneByOne) {
  const std::string ns = FreshNamespace("models");
  RemoteTierOptions o1 = SharedRedisServer().Options(ns);
  RemoteTierOptions o2 = o1;
  o2.model = testing::TestModel(2);
  auto a = Connect(o1);
  auto b = Connect(o2);
  for (uint64_t k = 0; k < 5; ++k)
    ASSERT_TRUE(a->Put(K(k), Bytes(10, 1)).ok());
  for (uint64_t k = 0; k < 3; ++k)
    ASSERT_TRUE(b->Put(K(k), Bytes(10, 2)).ok());
  auto models = a->ListModels().value();
  ASSERT_EQ(models.size(), 2u);
  for (const auto& [m, n] : models)
    EXPECT_EQ(n, m == testing::TestModel(1) ? 5 : 3) << m.Hex();
  EXPECT_EQ(a->DropModel(testing::TestModel(1)).value(), 5);
  EXPECT_TRUE(a->LruOrder().empty());
  EXPECT_FALSE(a->Contains(K(1)));
  EXPECT_EQ(b->Get(K(1)).value(), Bytes(10, 2));
  models = b->ListModels().value();
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0].first, testing::TestModel(2));
  EXPECT_EQ(a->DropModel(testing::TestModel(1)).value(), 0);
}

// A value larger than the tier's limit is a miss, never read in full, and left for tiers with a
// larger limit; one at the limit is read.
TEST(RemoteTierTest, ValuesOverTheLimitAreMisses) {
  const std::string ns = FreshNamespace("limit");
  RemoteTierOptions big = SharedRedisServer().Options(ns);
  RemoteTierOptions small = big;
  small.max_value_bytes = 64 + 100;  // header + 100 payload bytes
  auto writer = Connect(big);
  auto reader = Connect(small);
  Raw raw(SharedRedisServer().port());
  ASSERT_TRUE(writer->Put(K(1), Bytes(100, 1)).ok());
  ASSERT_TRUE(writer->Put(K(2), Bytes(101, 2)).ok());
  EXPECT_EQ(reader->Get(K(1)).value(), Bytes(100, 1));
  const auto over = reader->Get(K(2));
  EXPECT_EQ(over.status().code(), StatusCode::kNotFound);
  EXPECT_NE(over.status().message().find("larger than this tier's limit of 164 bytes"),
            std::string::npos)
      << over.status().message();
  EXPECT_TRUE(raw.Exists(writer->ServerKey(K(2))));
  EXPECT_EQ(reader->corruptions_detected(), 0);
  EXPECT_EQ(writer->Get(K(2)).value(), Bytes(101, 2));
  // A server holding a 64 MiB value for a key: the reader stops at its limit.
  raw.Set(writer->ServerKey(K(3)), std::string(size_t{64} << 20, 'x'));
  EXPECT_EQ(reader->Get(K(3)).status().code(), StatusCode::kNotFound);
}

// A writer without the secret plants values under real keys: unsigned ones (which pass every
// other check), ones signed with another secret, a signed value moved to another key. Each is
// refused, counted, deleted; the honest entry can then be stored again. A tier without the secret
// misses signed values and leaves them for those that have it.
TEST(RemoteTierTest, SignedTiersRefuseWhatTheirSecretDidNotSign) {
  const std::string ns = FreshNamespace("signed");
  RemoteTierOptions o = SharedRedisServer().Options(ns);
  o.secret = "the shared secret";
  auto honest = Connect(o);
  RemoteTierOptions forger_options = o;
  forger_options.secret = "a guess";
  auto forger = Connect(forger_options);
  RemoteTierOptions plain_options = o;
  plain_options.secret = "";
  auto plain = Connect(plain_options);
  Raw raw(SharedRedisServer().port());

  ASSERT_TRUE(honest->Put(K(1), Bytes(100, 1)).ok());
  EXPECT_EQ(honest->Get(K(1)).value(), Bytes(100, 1));
  const std::string signed_value = raw.Get(honest->ServerKey(K(1)));
  ASSERT_EQ(signed_value.size(), 64u + 32u + 100u);
  // Read without the secret: a miss, the value stays.
  const auto unsigned_read = plain->Get(K(1));
  EXPECT_EQ(unsigned_read.status().code(), StatusCode::kNotFound);
  EXPECT_NE(unsigned_read.status().message().find("no secret"), std::string::npos);
  EXPECT_TRUE(raw.Exists(honest->ServerKey(K(1))));
  EXPECT_EQ(plain->corruptions_detected() + plain->forgeries_refused(), 0);

  int64_t forged = 0;
  const auto expect_refused = [&](const PrefixKey& k, const std::string& what) {
    const auto got = honest->Get(k);
    ++forged;
    ASSERT_EQ(got.status().code(), StatusCode::kNotFound) << what;
    EXPECT_NE(got.status().message().find(what), std::string::npos) << got.status().message();
    EXPECT_EQ(honest->forgeries_refused(), forged);
    EXPECT_FALSE(raw.Exists(honest->ServerKey(k)));
  };
  // Planted unsigned, with a valid checksum.
  ASSERT_TRUE(plain->Put(K(2), Bytes(100, 0xee)).ok());
  expect_refused(K(2), "unsigned value");
  // Signed with the wrong secret.
  ASSERT_TRUE(forger->Put(K(3), Bytes(100, 0xee)).ok());
  expect_refused(K(3), "signature is not this tier's secret's");
  // A value the secret did sign, but for another name (the same key in another namespace): its
  // header and checksum fit, the signature binds it to where it was written.
  RemoteTierOptions other_ns = o;
  other_ns.name_space = FreshNamespace("signed-elsewhere");
  ASSERT_TRUE(Connect(other_ns)->Put(K(4), Bytes(100, 0xee)).ok());
  raw.Set(honest->ServerKey(K(4)), raw.Get(Connect(other_ns)->ServerKey(K(4))));
  expect_refused(K(4), "signature is not this tier's secret's");
  EXPECT_EQ(honest->corruptions_detected(), 0);
  // The honest writer restores a refused entry.
  ASSERT_TRUE(honest->Put(K(2), Bytes(100, 2)).ok());
  EXPECT_EQ(honest->Get(K(2)).value(), Bytes(100, 2));
}

// AUTH: a server with a password for its default user and an ACL user limited to its own keys;
// the right credentials connect (over TCP and over a Unix socket), a wrong password is refused
// naming the user, and a user whose ACL forbids the namespace gets errors, not wrong data.
TEST(RemoteTierTest, AuthenticatesWithAPasswordOrAnAclUser) {
  testing::ScopedTempDir tmp;
  std::filesystem::create_directories(tmp.path());
  RedisServer server;
  server.AddArgs({"--requirepass", "default-pw", "--user", "engine", "on", ">engine-pw",
                  "~hkv-acl:*", "+@all"});
  server.SetCredentials("", "default-pw");
  server.SetUnixSocket(tmp.path() / "redis.sock");
  ASSERT_TRUE(server.Start().ok());

  RemoteTierOptions o = server.Options("hkv-acl");
  EXPECT_TRUE(Connect(o)->Put(K(1), Bytes(10, 1)).ok());
  o.username = "engine";
  o.password = "engine-pw";
  auto acl = Connect(o);
  EXPECT_EQ(acl->Get(K(1)).value(), Bytes(10, 1));
  o.unix_socket = server.unix_socket().string();
  auto unix_socket = Connect(o);
  EXPECT_EQ(unix_socket->Get(K(1)).value(), Bytes(10, 1));
  EXPECT_EQ(unix_socket->server(), server.unix_socket().string());

  o.password = "wrong";
  Status s = RemoteTier::Connect(o).status();
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("refuses AUTH as user 'engine'"), std::string::npos) << s.message();
  o = server.Options("hkv-acl");
  o.password = "";
  s = RemoteTier::Connect(o).status();
  EXPECT_EQ(s.code(), StatusCode::kIoError);  // NOAUTH on PING
  // The ACL user outside its key pattern: every call fails cleanly.
  o = server.Options("elsewhere");
  o.username = "engine";
  o.password = "engine-pw";
  auto fenced = Connect(o);
  EXPECT_EQ(fenced->Put(K(1), Bytes(10, 1)).code(), StatusCode::kIoError);
  EXPECT_EQ(fenced->Get(K(1)).status().code(), StatusCode::kIoError);
  EXPECT_FALSE(fenced->Contains(K(1)));
  EXPECT_GT(fenced->server_errors(), 0);
}

TEST(RemoteTierTest, DamagedValuesOnTheServerAreMissesNeverWrongBytes) {
  const std::string ns = FreshNamespace("damage");
  auto tier = Connect(SharedRedisServer().Options(ns));
  Raw raw(SharedRedisServer().port());
  const std::vector<unsigned char> payload = Bytes(300, 0x42);
  int64_t expected = 0;
  // Every byte of the value flipped in turn, truncations at several lengths, another key's value,
  // garbage: each a miss that drops the entry and deletes the value.
  ASSERT_TRUE(tier->Put(K(2), payload).ok());
  const std::string other = raw.Get(tier->ServerKey(K(2)));
  ASSERT_EQ(other.size(), 64u + 300u);
  std::vector<std::string> damaged;
  for (size_t i = 0; i < other.size(); i += 7) {
    std::string v = other;
    v[i] = static_cast<char>(v[i] ^ 0x10);
    damaged.push_back(v);
  }
  for (size_t n : {size_t{0}, size_t{10}, size_t{63}, size_t{64}, size_t{200}, other.size() - 1})
    damaged.push_back(other.substr(0, n));
  damaged.push_back(other + "x");
  damaged.push_back("not a value at all");
  for (const std::string& v : damaged) {
    ASSERT_TRUE(tier->Put(K(1), payload).ok());
    raw.Set(tier->ServerKey(K(1)), v);
    auto got = tier->Get(K(1));
    ++expected;
    ASSERT_EQ(got.status().code(), StatusCode::kNotFound) << v.size();
    EXPECT_NE(got.status().message().find("lost"), std::string::npos);
    EXPECT_FALSE(raw.Exists(tier->ServerKey(K(1))));
    EXPECT_FALSE(tier->Contains(K(1)));
  }
  // Key 2's intact value under key 1's name: another key's value.
  raw.Set(tier->ServerKey(K(1)), other);
  const auto foreign = tier->Get(K(1));
  EXPECT_EQ(foreign.status().code(), StatusCode::kNotFound);
  EXPECT_NE(foreign.status().message().find("another key's value"), std::string::npos)
      << foreign.status().message();
  ++expected;
  // Key 1's own value, each header field damaged in turn, names that field (64-byte header:
  // magic, version at 8, key, model at 32, length at 48).
  ASSERT_TRUE(tier->Put(K(1), payload).ok());
  const std::string own = raw.Get(tier->ServerKey(K(1)));
  ASSERT_EQ(own.size(), 64u + 300u);
  const std::pair<std::string, std::string> named[] = {
      {own.substr(0, 200), "a truncated value: its header says 300 payload bytes, it has 136"},
      {own + "x", "a padded value: its header says 300 payload bytes, it has 301"},
      {std::string(1, static_cast<char>(own[0] ^ 0x10)) + own.substr(1), "not a remote tier value"},
      {own.substr(0, 8) + static_cast<char>(own[8] ^ 0x02) + own.substr(9),
       "a version 0 value; expected version 2"},
      {own.substr(0, 32) + static_cast<char>(own[32] ^ 0x01) + own.substr(33), "a value of model"},
  };
  for (const auto& [value, what] : named) {
    ASSERT_TRUE(tier->Put(K(1), payload).ok());
    raw.Set(tier->ServerKey(K(1)), value);
    const auto got = tier->Get(K(1));
    ++expected;
    EXPECT_EQ(got.status().code(), StatusCode::kNotFound) << what;
    EXPECT_NE(got.status().message().find(what), std::string::npos) << got.status().message();
  }
  EXPECT_EQ(tier->corruptions_detected(), expected);
  EXPECT_EQ(tier->Get(K(2)).value(), payload);
}

TEST(RemoteTierTest, AKilledServerFailsFastAndARestartedOneIsReconnected) {
  RedisServer server;
  ASSERT_TRUE(server.Start().ok());
  auto tier = Connect(server.Options("kill"));
  ASSERT_TRUE(tier->Put(K(1), Bytes(100, 1)).ok());
  ASSERT_TRUE(tier->Put(K(2), Bytes(100, 2)).ok());
  server.Kill();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 50; ++i) {
    EXPECT_FALSE(tier->Contains(K(3)));
    const auto got = tier->Get(K(1));
    EXPECT_EQ(got.status().code(), StatusCode::kIoError);
    EXPECT_NE(got.status().message().find(tier->server()), std::string::npos);
    EXPECT_EQ(tier->Put(K(4), Bytes(10, 4)).code(), StatusCode::kIoError);
  }
  // 150 calls against a dead server: connection refused or failing fast, never a timeout each.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_GT(tier->server_errors(), 0);
  EXPECT_EQ(tier->LruOrder().size(), 2u);  // failed Puts changed nothing
  EXPECT_EQ(tier->used_bytes(), 200);
  ASSERT_TRUE(server.Restart().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(60));  // past the retry interval
  // The restarted server lost everything: our entries are misses, and the tier forgets them.
  EXPECT_EQ(tier->Get(K(1)).status().code(), StatusCode::kNotFound);
  EXPECT_GE(tier->reconnects(), 1);
  ASSERT_TRUE(tier->Put(K(5), Bytes(100, 5)).ok());
  EXPECT_EQ(tier->Get(K(5)).value(), Bytes(100, 5));
}

TEST(RemoteTierTest, BadOptionsAndUnreachableServersAreRefusedByName) {
  const auto refused = [](const RemoteTierOptions& o, const std::string& what) {
    const Status s = RemoteTier::Connect(o).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << what;
    EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
  };
  RemoteTierOptions o;
  o.host = "";
  refused(o, "host is empty");
  o = RemoteTierOptions{};
  o.port = 70000;
  refused(o, "port 70000: expected 1..65535");
  o = SharedRedisServer().Options("a:b");
  refused(o, "namespace 'a:b' contains ':'");
  o = SharedRedisServer().Options("");
  refused(o, "namespace is empty");
  o = SharedRedisServer().Options("ok");
  o.timeout_ms = 0;
  refused(o, "timeout 0 ms: expected >= 1");
  o = SharedRedisServer().Options("ok");
  o.retry_after_ms = -1;
  refused(o, "retry interval -1 ms: expected >= 0");
  o = SharedRedisServer().Options("ok");
  o.capacity_bytes = -5;
  refused(o, "capacity -5 bytes: expected >= 0");
  // Nothing listens there (a server started and killed).
  RedisServer dead;
  ASSERT_TRUE(dead.Start().ok());
  dead.Kill();
  const Status s = RemoteTier::Connect(dead.Options("x")).status();
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find(std::to_string(dead.port())), std::string::npos) << s.ToString();
  o = SharedRedisServer().Options("ok");
  o.max_value_bytes = 0;
  refused(o, "value limit 0 bytes: expected >= 1");
  o = SharedRedisServer().Options("ok");
  o.model = ModelIdentity{};
  refused(o, "no model identity");
  o = RemoteTierOptions{};
  o.model = testing::TestModel();
  o.unix_socket = "/nonexistent/redis.sock";
  EXPECT_EQ(RemoteTier::Connect(o).status().code(), StatusCode::kIoError);
}

}  // namespace
}  // namespace hkv
