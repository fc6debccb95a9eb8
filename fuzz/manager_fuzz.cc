// libFuzzer target: bytes become a small manager config (full attention, windows, chunks,
// recurrent state, cross attention, mixes, and two-level memory with compaction) and a sequence of
// engine calls on request ids 0..7, so unknown ids, double frees, open steps and out-of-range
// counts come up as often as valid calls. The calls go through the content-tracking FakeEngine,
// which checks after every one CheckInvariants, success or refusal as the contract demands, nothing
// changed on refusal, and the exact content every step reads. Any violation is printed with the
// calls before it and traps.
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include <fuzzer/FuzzedDataProvider.h>

#include <hkv/manager/kv_cache_manager.h>

#include "fake_engine.h"

namespace {

using hkv::GroupConfig;
using hkv::ManagerConfig;
using hkv::RequestId;
using hkv::TokenRuleKind;
using hkv::testing::EngineRequest;
using hkv::testing::FakeEngine;

GroupConfig Group(TokenRuleKind kind, int32_t block_tokens, int32_t pool, int32_t span = 0,
                  int32_t sinks = 0) {
  GroupConfig g;
  g.rule = {kind, span, sinks};
  g.block_tokens = block_tokens;
  g.pool = pool;
  return g;
}

// Small blocks and pools, so that a few dozen tokens fill blocks, windows slide and pools run
// dry.
ManagerConfig Config(int choice, uint8_t flags) {
  using K = TokenRuleKind;
  ManagerConfig c;
  c.max_model_len = 96;
  switch (choice) {
    case 0:
      c.pool_blocks = {20};
      c.groups = {Group(K::kAll, 4, 0)};
      break;
    case 1:
      c.pool_blocks = {28};
      c.groups = {Group(K::kAll, 4, 0), Group(K::kWindow, 4, 0, 6, 1)};
      break;
    case 2:
      c.pool_blocks = {16, 12};
      c.groups = {Group(K::kChunk, 4, 0, 8), Group(K::kAll, 8, 1)};
      break;
    case 3:
      c.pool_blocks = {20, 10};
      c.groups = {Group(K::kAll, 4, 0), Group(K::kState, 0, 1)};
      c.checkpoint_interval = 8;
      break;
    case 4:
      c.pool_blocks = {20, 12};
      c.groups = {Group(K::kAll, 4, 0), Group(K::kEncoder, 4, 1)};
      c.max_encoder_tokens = 16;
      break;
    case 5:
      c.pool_blocks = {28, 16, 10};
      c.groups = {Group(K::kAll, 4, 0), Group(K::kWindow, 4, 0, 5), Group(K::kChunk, 4, 1, 8),
                  Group(K::kState, 0, 2), Group(K::kEncoder, 4, 1)};
      c.checkpoint_interval = 8;
      c.max_encoder_tokens = 16;
      break;
    case 6:  // two-level memory: 6 slabs of 4 token pages or 2 states, compacted now and then
      c.arena.num_slabs = 6;
      c.arena.pages_per_slab = {4, 2};
      c.pool_blocks = {6 * 4 + 1, 6 * 2 + 1};
      c.groups = {Group(K::kAll, 4, 0), Group(K::kWindow, 4, 0, 6, 1), Group(K::kState, 0, 1)};
      c.checkpoint_interval = 8;
      break;
    default:
      c.pool_blocks = {10};
      c.groups = {Group(K::kState, 0, 0)};
      c.state_align_tokens = 4;
      c.checkpoint_interval = 8;
      break;
  }
  c.enable_prefix_caching = (flags & 1) == 0;
  c.record_events = (flags & 2) == 0;
  c.drop_last_hit_block = (flags & 4) != 0;
  if ((flags & 8) != 0) c.checkpoint_interval = 0;
  // Admissions leave the started requests a few steps of growth: refusals a fit without it would
  // not make.
  if ((flags & 16) != 0) c.admission_headroom_steps = 8;
  return c;
}

const FakeEngine* g_engine = nullptr;  // for the report of a violation

[[noreturn]] void Trap(const std::string& what) {
  std::fprintf(stderr, "manager_fuzz: %s\n", what.c_str());
  if (g_engine != nullptr) std::fprintf(stderr, "%s\n", g_engine->Report().c_str());
  __builtin_trap();
}

// Three fixed prompts over a four-token alphabet: requests share prefixes, so hits happen.
int32_t BaseToken(int base, int64_t i) {
  return static_cast<int32_t>((i * (base + 3) + base) % 4);
}

EngineRequest NewRequest(FuzzedDataProvider& in, RequestId id, bool encoder) {
  EngineRequest r;
  r.id = id;
  const int base = in.ConsumeIntegralInRange(0, 2);
  const int64_t len = in.ConsumeIntegralInRange<int64_t>(0, 100);  // 0 and > 96 are refused
  for (int64_t i = 0; i < len; ++i)
    r.prompt.push_back(BaseToken(base, i));
  for (int i = in.ConsumeIntegralInRange(0, 3); i > 0 && !r.prompt.empty(); --i)
    r.prompt.push_back(in.ConsumeIntegralInRange(0, 3));
  const uint8_t extras = in.ConsumeIntegral<uint8_t>();
  r.adapter_id = extras & 1;
  if ((extras & 2) != 0) r.cache_salt = "x";
  if ((extras & 4) != 0) {
    hkv::PromptItem item;
    item.position = in.ConsumeIntegralInRange<int64_t>(-1, 20);
    item.length = in.ConsumeIntegralInRange<int64_t>(0, 8);
    // An item's data decides its length, so equal digests come with equal lengths.
    item.content = {in.ConsumeIntegralInRange<uint64_t>(1, 2), static_cast<uint64_t>(item.length)};
    r.items.push_back(item);
  }
  if ((extras & 8) != 0) r.retention = hkv::Retention::kLow;
  // Mostly what the model expects; sometimes none, or too many.
  r.encoder_tokens = encoder ? in.ConsumeIntegralInRange<int64_t>(1, 16) : 0;
  if ((extras & 16) != 0) r.encoder_tokens = in.ConsumeIntegralInRange<int64_t>(0, 20);
  r.encoder_input = {in.ConsumeIntegralInRange<uint64_t>(1, 2), 3};
  return r;
}

// Speculative decoding as an engine does it: accept some computed drafts, drop the rest, append
// the accepted ones and a sampled token.
void Accept(FakeEngine& engine, FuzzedDataProvider& in, RequestId id) {
  const FakeEngine::Seq* q = engine.Find(id);
  if (q == nullptr || q->step || q->computed < q->known) return;
  const int64_t known = q->known, computed = q->computed;
  const int64_t accept = in.ConsumeIntegralInRange<int64_t>(0, computed - known);
  std::vector<int32_t> tokens(q->tokens.begin() + known, q->tokens.begin() + known + accept);
  if (computed > known + accept && !engine.Truncate(id, known + accept).ok()) return;
  tokens.push_back(in.ConsumeIntegralInRange(0, 3));
  (void)engine.Append(id, tokens);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const ManagerConfig config =
      Config(in.ConsumeIntegralInRange(0, 7), in.ConsumeIntegral<uint8_t>());
  hkv::Result<hkv::KvCacheManager> manager = hkv::KvCacheManager::Create(config);
  if (!manager.ok()) Trap("a fixed config was refused: " + manager.status().ToString());
  bool encoder = false;
  for (const GroupConfig& g : config.groups)
    encoder = encoder || g.is_encoder();

  hkv::testing::EngineOptions options;
  options.seed = in.ConsumeIntegral<uint8_t>();
  options.vocab = 4;  // drafts from the prompts' alphabet
  options.audit_every = 4;
  FakeEngine engine(*manager, options, Trap);
  g_engine = &engine;
  const auto id = [&] { return in.ConsumeIntegralInRange<RequestId>(0, 7); };

  for (int op = 0; op < 400 && in.remaining_bytes() > 0; ++op) {
    switch (in.ConsumeIntegralInRange(0, 14)) {
      case 0: {
        const RequestId r = id();
        (void)engine.Add(NewRequest(in, r, encoder));
        break;
      }
      case 1:
        (void)engine.Lookup(id());
        break;
      case 2: {
        const RequestId r = id();
        const int64_t n = in.ConsumeIntegralInRange<int64_t>(-1, 24);
        (void)engine.Allocate(r, n, in.ConsumeIntegralInRange<int64_t>(0, 3));
        break;
      }
      case 3: {  // a hit Lookup did not give (or gave to another request)
        const RequestId r = id();
        hkv::PrefixHit hit;
        hit.tokens = in.ConsumeIntegralInRange<int64_t>(-4, 100);
        hit.encoder = in.ConsumeBool();
        const int64_t n = in.ConsumeIntegralInRange<int64_t>(0, 24);
        (void)engine.AllocateWithHit(r, n, hit, 0);
        break;
      }
      case 4:
        engine.Run();
        break;
      case 5: {
        const RequestId r = id();
        const std::vector<int64_t> points = engine.CommitPoints(r);
        if (points.empty() || in.ConsumeIntegralInRange(0, 7) == 0) {
          (void)engine.Commit(r, in.ConsumeIntegralInRange<int64_t>(-1, 100));
        } else {
          (void)engine.Commit(r, points[in.ConsumeIntegralInRange<size_t>(0, points.size() - 1)]);
        }
        break;
      }
      case 6: {  // tokens at computed positions are the drafts; later ones anything
        const RequestId r = id();
        const FakeEngine::Seq* q = engine.Find(r);
        std::vector<int32_t> tokens;
        for (int i = in.ConsumeIntegralInRange(0, 4); i > 0; --i) {
          const int64_t p = (q != nullptr ? q->known : 0) + static_cast<int64_t>(tokens.size());
          tokens.push_back(q != nullptr && p < q->computed ? q->tokens[static_cast<size_t>(p)]
                                                           : in.ConsumeIntegralInRange(0, 3));
        }
        (void)engine.Append(r, tokens);
        break;
      }
      case 7:
        Accept(engine, in, id());
        break;
      case 8: {
        const RequestId parent = id();
        (void)engine.Fork(parent, id());
        break;
      }
      case 9: {
        const RequestId r = id();
        (void)engine.Truncate(r, in.ConsumeIntegralInRange<int64_t>(-1, 100));
        break;
      }
      case 10:
        (void)engine.Free(id());
        break;
      case 11:
        (void)engine.ResetPrefixCache();
        break;
      case 12:
        engine.AuditAll();
        break;
      case 14:  // refused with a step open or a limit of 0; a no-op without two-level memory
        (void)engine.Compact(in.ConsumeIntegralInRange<int64_t>(0, 3));
        break;
      default: {  // counts far out of range
        const RequestId r = id();
        const int64_t huge = in.ConsumeBool() ? std::numeric_limits<int64_t>::max() : 97;
        if (in.ConsumeBool()) {
          (void)engine.Allocate(r, huge, 0);
        } else {
          (void)engine.Allocate(r, 1, huge);
        }
        break;
      }
    }
  }
  // Everything ends: the pools must be whole again and the cache resettable.
  for (RequestId r : engine.Ids())
    (void)engine.Free(r);
  (void)engine.ResetPrefixCache();
  g_engine = nullptr;
  return 0;
}
