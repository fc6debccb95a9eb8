#include <algorithm>

#include <fmt/format.h>

#include <hkv/common/splitmix64.h>
#include <hkv/engine/transformer.h>
#include <hkv/engine/verify.h>
#include <hkv/manager/allocator_mode.h>
#include <hkv/plan/plan.h>

namespace hkv {
namespace {

std::vector<int32_t> Tokens(SplitMix64& rng, int32_t n, int32_t vocab) {
  std::vector<int32_t> t;
  for (int32_t i = 0; i < n; ++i)
    t.push_back(rng.Below(vocab));
  return t;
}

constexpr int64_t kMaxModelLen = 192;

Status CheckOptions(const VerifyOptions& o) {
  if (o.requests < 1) {
    return Status::InvalidArgument(fmt::format("verify: requests = {}: expected >= 1", o.requests));
  }
  if (o.max_steps < 1) {
    return Status::InvalidArgument(
        fmt::format("verify: max_steps = {}: expected >= 1", o.max_steps));
  }
  return Status::Ok();
}

// About three sequences of 96 tokens: enough to run, too little to run everything admitted at
// once.
Result<int64_t> DefaultMemory(const ModelSpec& spec, const PlanOptions& po) {
  PlanOptions probe = po;
  probe.memory_bytes = int64_t{64} << 20;
  HKV_ASSIGN_OR_RETURN(const Plan sizing, MakePlan(spec, probe));
  int64_t memory = 3 * sizing.FootprintOf(96, spec.max_encoder_tokens).hybridkv_bytes;
  // A class shared by states and tokens also needs room for each sequence's spare states.
  for (const PageClass& pc : sizing.page_classes) {
    bool states = false, tokens = false;
    for (int32_t g : pc.groups) {
      const bool st = sizing.groups[static_cast<size_t>(g)].rule.kind == TokenRuleKind::kState;
      states = states || st;
      tokens = tokens || !st;
    }
    if (states && tokens) memory += 3 * 6 * pc.page_bytes;
  }
  return memory;
}

Result<PlanOptions> VerifyPlanOptions(const ModelSpec& spec, const VerifyOptions& o) {
  PlanOptions po;
  po.block_tokens = o.block_tokens;
  po.max_model_len = kMaxModelLen;
  po.memory_bytes = o.memory_bytes;
  po.seq_tokens = 96;  // size page classes for this workload's sequences
  if (po.memory_bytes == 0) {
    HKV_ASSIGN_OR_RETURN(po.memory_bytes, DefaultMemory(spec, po));
  }
  // Wherever classes of different page sizes exist, run them from shared slabs: the budget
  // here is a few sequences, where auto would keep a fixed split to save slab tails, and the
  // point is to prove memory moving between classes exact.
  HKV_ASSIGN_OR_RETURN(const Plan probe, MakePlan(spec, po));
  for (const PageCandidate& c : probe.candidates) {
    if (c.strategy == PageStrategy::kTwoLevel && c.feasible) po.strategy = c.strategy;
  }
  return po;
}

// The plan splits memory between page classes in proportion to one sequence's needs: one
// state per sequence. A request here holds up to ~6 (live, write, rolling, draft snapshots,
// checkpoints), so a class holding only states gets at least 8 per sequence of the budget.
// Safe with the canonical layout, where a page is one contiguous block of the buffer.
void GrowStateOnlyClasses(Plan& plan) {
  for (PageClass& pc : plan.page_classes) {
    bool states_only = true;
    for (int32_t g : pc.groups) {
      states_only =
          states_only && plan.groups[static_cast<size_t>(g)].rule.kind == TokenRuleKind::kState;
    }
    bool canonical = true;
    for (const TensorView& v : plan.layout.tensors) {
      if (v.page_class == pc.id) {
        canonical =
            canonical && v.block_stride == pc.page_bytes && v.offset + v.bytes <= pc.page_bytes;
      }
    }
    if (states_only && canonical && !plan.arena.enabled())
      pc.num_pages = std::max<int64_t>(pc.num_pages, 24);
  }
}

// The plan the engine runs; po.memory_bytes grows with the room given to shared slabs' states.
Result<Plan> VerifyPlan(const ModelSpec& spec, const VerifyOptions& o, PlanOptions& po) {
  HKV_ASSIGN_OR_RETURN(Plan plan, MakePlan(spec, po));
  if (plan.arena.enabled() && o.memory_bytes == 0) {
    // Shared slabs: a request here holds up to ~8 states (live, write, rolling, draft snapshots,
    // checkpoints) where the planning point counts one; the default budget gets room for them,
    // which tokens use whenever states do not. A budget the caller gave is kept as given.
    for (const PageClass& pc : plan.page_classes) {
      for (int32_t g : pc.groups) {
        if (plan.groups[static_cast<size_t>(g)].is_state())
          po.memory_bytes += 3 * 8 * pc.page_bytes;
      }
    }
    HKV_ASSIGN_OR_RETURN(plan, MakePlan(spec, po));
  }
  GrowStateOnlyClasses(plan);
  return plan;
}

EngineOptions VerifyEngineOptions(const VerifyOptions& o) {
  EngineOptions eo;
  eo.token_budget = 48;
  eo.chunk = 12;
  eo.draft_tokens = 2;
  eo.poison_free_blocks = true;
  eo.lookahead = 2;
  eo.compact = o.compact;
  eo.batched = o.batched;
  if (o.sparse) {
    eo.draft_tokens = 0;
    eo.sparse = o.sparse;
    eo.sparse->record_steps = true;
  }
  eo.offload = o.offload;
  return eo;
}

// The KV-event publisher the options ask for (none: null), once its subscriber is there.
Result<std::unique_ptr<KvEventPublisher>> BindPublisher(const VerifyOptions& o, const Plan& plan) {
  std::unique_ptr<KvEventPublisher> publisher;
  if (!o.kv_events) return publisher;
  HKV_ASSIGN_OR_RETURN(publisher, KvEventPublisher::Bind(*o.kv_events, KvEventGroupsOf(plan)));
  if (o.kv_events_wait_ms > 0 && !publisher->WaitForSubscriber(o.kv_events_wait_ms)) {
    return Status::FailedPrecondition(
        fmt::format("verify: no KV-event subscriber on {} within {} ms", publisher->endpoint(),
                    o.kv_events_wait_ms));
  }
  return publisher;
}

// The workload of one verify run and the engines serving it: a restart replaces the engine,
// keeping the random stream and the sequences finished so far.
struct VerifyRun {
  // Cross-attention models: a few images, so that requests share encoder K/V.
  EncoderInput Image(uint64_t id) const {
    return EncoderInput{id, spec.max_encoder_tokens - static_cast<int64_t>(id % 3)};
  }

  Status Submit(std::vector<int32_t> prompt, EncoderInput encoder) {
    GenerationRequest g;
    g.id = next_id;
    g.prompt = std::move(prompt);
    g.max_new_tokens = 4 + rng.Below(12);
    g.num_samples = rng.Below(4) == 0 ? 2 : 1;
    g.greedy = g.num_samples == 1 && rng.Below(3) != 0;
    g.seed = rng.Next();
    g.encoder = encoder;
    g.retention = rng.Below(4) == 0 ? Retention::kLow : Retention::kNormal;
    next_id += 16;  // room for forked siblings
    ++submitted;
    return engine->Submit(g);
  }

  void Retire() {
    const auto& f = engine->finished();
    done.insert(done.end(), f.begin() + static_cast<ptrdiff_t>(taken), f.end());
    taken = f.size();
  }

  void AddCounters() {
    const EngineCounters& c = engine->counters();
    report.external_hits += c.external_hits;
    report.loads_completed += c.loads_completed;
    report.loads_failed += c.loads_failed;
  }

  Status MaybeRestart();
  Status SubmitMore();
  Status Run();
  Status Check(const PlanOptions& po, const KvEventPublisher* publisher);

  const VerifyOptions& o;
  const ModelSpec& spec;
  const ModelWeights& weights;
  const Plan& plan;
  const ManagerConfig& config;
  const EngineOptions& eo;
  const int32_t vocab;
  std::unique_ptr<Engine> engine;
  SplitMix64 rng;
  std::vector<std::vector<int32_t>> system_prompts{};
  RequestId next_id = 1;
  size_t taken = 0;  // of engine->finished(), copied into `done`
  int32_t submitted = 0;
  size_t continued = 0;  // finished sequences already continued as a next turn
  // Sequences finished by every engine so far (restarts replace the engine).
  std::vector<Sequence> done{};
  int32_t part = 0;  // restarts done
  VerifyReport report{};
};

// A restart: once the engine drained its part of the workload, a fresh one (empty cache, same
// tiers) serves the next part.
Status VerifyRun::MaybeRestart() {
  const int32_t parts = o.restarts + 1;
  if (part < o.restarts && submitted >= o.requests * (part + 1) / parts && engine->idle()) {
    Retire();
    AddCounters();
    HKV_RETURN_IF_ERROR(engine->manager().CheckInvariants());
    engine.reset();
    HKV_ASSIGN_OR_RETURN(engine, Engine::Create(spec, weights, plan, config, eo));
    taken = 0;
    ++part;
  }
  return Status::Ok();
}

// Keep a few requests in flight; continue finished conversations as new turns.
Status VerifyRun::SubmitMore() {
  const int32_t limit = o.requests * (part + 1) / (o.restarts + 1);
  while (submitted < limit && submitted < 4 + report.steps / 2) {
    std::vector<int32_t> prompt;
    EncoderInput encoder;
    if (spec.max_encoder_tokens > 0) encoder = Image(1 + static_cast<uint64_t>(rng.Below(4)));
    if (continued < done.size() && rng.Below(3) == 0 &&
        static_cast<int64_t>(done[continued].tokens.size()) + 40 < kMaxModelLen - 24) {
      encoder = done[continued].encoder;
      prompt = done[continued++].tokens;
      const auto more = Tokens(rng, 4 + rng.Below(12), vocab);
      prompt.insert(prompt.end(), more.begin(), more.end());
    } else {
      prompt = system_prompts[static_cast<size_t>(rng.Below(3))];
      const auto user = Tokens(rng, 1 + rng.Below(40), vocab);
      prompt.insert(prompt.end(), user.begin(), user.end());
    }
    HKV_RETURN_IF_ERROR(Submit(std::move(prompt), encoder));
  }
  return Status::Ok();
}

Status VerifyRun::Run() {
  // One short shared instruction (5-8 tokens): recurrent hits shorter than the block a
  // one-page-size allocator would need exist only if checkpoints are that fine.
  for (int i = 0; i < 3; ++i)
    system_prompts.push_back(Tokens(rng, i == 0 ? 5 + rng.Below(4) : 16 + rng.Below(24), vocab));
  while (report.steps < o.max_steps) {
    HKV_RETURN_IF_ERROR(MaybeRestart());
    HKV_RETURN_IF_ERROR(SubmitMore());
    if (submitted >= o.requests && engine->idle()) break;
    HKV_RETURN_IF_ERROR(engine->Step());
    HKV_RETURN_IF_ERROR(engine->manager().CheckInvariants());
    Retire();
    if (o.after_step) o.after_step(part, engine->counters());
    ++report.steps;
  }
  report.completed = submitted >= o.requests && engine->idle();
  Retire();
  AddCounters();
  report.engines = part + 1;
  return Status::Ok();
}

// Compares every finished sequence with the dense (or, sparse, the masked) reference.
Status VerifyRun::Check(const PlanOptions& po, const KvEventPublisher* publisher) {
  if (publisher) report.kv_event_batches = publisher->next_sequence();
  for (const Sequence& seq : done) {
    const DenseCheck dense = CheckAgainstDense(spec, weights, seq);
    const DenseCheck c = o.sparse ? CheckAgainstMasked(spec, weights, seq) : dense;
    report.mismatches += c.mismatches;
    report.dense_mismatches += dense.mismatches;
    report.max_logit_diff = std::max(report.max_logit_diff, c.max_logit_diff);
  }
  report.requests = static_cast<int64_t>(done.size());
  report.features = engine->counters();
  report.slabs_reclaimed = engine->manager().Arena().slabs_reclaimed;
  report.two_level = engine->manager().Arena().num_slabs > 0;
  HKV_ASSIGN_OR_RETURN(const Allocator padded, MakeAllocator(spec, AllocatorMode::kPadded, po));
  if (padded.state_page_bytes > 0) report.padded_block_tokens = padded.block_tokens;
  return engine->manager().CheckInvariants();
}

}  // namespace

uint64_t VerifyWeightsSeed(const VerifyOptions& options) {
  return options.weights_seed != 0 ? options.weights_seed : options.seed ^ 0x5eed;
}

Result<ModelIdentity> VerifyModelIdentity(const ModelSpec& real, const VerifyOptions& options) {
  ModelIdentitySources sources;
  sources.weights_id = fmt::format("hkv tiny model, weight seed {}", VerifyWeightsSeed(options));
  sources.block_tokens = options.block_tokens;
  return ComputeModelIdentity(real, sources);
}

Result<VerifyReport> RunVerify(const ModelSpec& real, const VerifyOptions& o) {
  HKV_RETURN_IF_ERROR(CheckOptions(o));
  TinyModelOptions tiny_options;
  HKV_ASSIGN_OR_RETURN(const ModelSpec spec, ScaleModel(real, tiny_options));
  const ModelWeights weights = ModelWeights::Random(spec, tiny_options.vocab, VerifyWeightsSeed(o));
  HKV_ASSIGN_OR_RETURN(PlanOptions po, VerifyPlanOptions(spec, o));
  HKV_ASSIGN_OR_RETURN(const Plan plan, VerifyPlan(spec, o, po));
  HKV_ASSIGN_OR_RETURN(ManagerConfig config, ManagerConfig::FromPlan(plan));
  config.checkpoint_interval = 2 * config.align_tokens();
  config.prompt_checkpoints = o.prompt_checkpoints;
  config.eviction_rank = o.eviction_rank;
  config.branch_bonus = o.branch_bonus;
  config.thrash_guard = o.thrash_guard;
  config.thrash_keep_share = o.thrash_keep_share;
  config.admission_headroom_steps = o.admission_headroom_steps;
  config.rolling_stride_after_give_back = config.AlignUp(o.rolling_stride_after_give_back);
  config.publish_at_allocate = o.batched;
  // Every third seed runs as an EAGLE-style engine would: hits end one block early.
  config.drop_last_hit_block = o.seed % 3 == 0;
  EngineOptions eo = VerifyEngineOptions(o);
  HKV_ASSIGN_OR_RETURN(std::unique_ptr<KvEventPublisher> publisher, BindPublisher(o, plan));
  eo.kv_events = publisher.get();
  HKV_ASSIGN_OR_RETURN(auto engine, Engine::Create(spec, weights, plan, config, eo));

  VerifyRun run{.o = o,
                .spec = spec,
                .weights = weights,
                .plan = plan,
                .config = config,
                .eo = eo,
                .vocab = tiny_options.vocab,
                .engine = std::move(engine),
                .rng = SplitMix64(o.seed)};
  run.report.model = real.source;
  run.report.memory_bytes = po.memory_bytes;
  HKV_RETURN_IF_ERROR(run.Run());
  HKV_RETURN_IF_ERROR(run.Check(po, publisher.get()));
  return run.report;
}

}  // namespace hkv
