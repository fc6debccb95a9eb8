// libFuzzer target: any bytes into the trace reader. An accepted trace must write back to bytes
// that read back equal (the canonical form is a fixed point), and a small one is replayed through
// hkv's manager and through vLLM's (bounded: a few requests and tokens, a short max model len so
// that prompt + output run into it): each replay either refuses the trace with an error or
// finishes every request, with the invariant checker after every step. A replay that never ends
// is a timeout, which libFuzzer reports.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string_view>

#include <hkv/sim/replayer.h>
#include <hkv/sim/trace.h>
#include <hkv/vllm/kv_cache_config.h>

namespace {

constexpr int64_t kMaxModelLen = 96;

hkv::ManagerConfig HkvConfig() {
  hkv::ManagerConfig c;
  c.pool_blocks = {41};
  hkv::GroupConfig g;
  g.rule.kind = hkv::TokenRuleKind::kAll;
  g.block_tokens = 4;
  c.groups = {g};
  c.max_model_len = kMaxModelLen;
  return c;
}

hkv::vllm::KvCacheConfig VllmConfig() {
  hkv::vllm::KvCacheConfig c;
  hkv::vllm::KvCacheSpec full;
  full.block_size = 4;
  full.num_kv_heads = 1;
  full.head_size = full.head_size_v = 2;
  full.dtype_bytes = 2;
  hkv::vllm::KvCacheSpec window = full;
  window.type = hkv::vllm::SpecType::kSlidingWindow;
  window.sliding_window = 10;
  c.groups = {{window, {0}}, {full, {1}}};
  c.num_blocks = 61;
  c.cache_block_size = c.hash_block_size = c.scheduler_block_size = 4;
  c.max_model_len = kMaxModelLen;
  c.max_num_batched_tokens = 16;
  return c;
}

bool Small(const hkv::Trace& trace) {
  if (trace.size() > 24) return false;
  int64_t tokens = 0;
  for (const hkv::TraceRequest& r : trace)
    tokens += static_cast<int64_t>(r.prompt.size()) + r.output_len;
  return tokens <= 8192;
}

void CheckFinished(const hkv::Result<hkv::ReplayReport>& r, const char* which) {
  if (!r.ok()) {
    if (r.status().code() == hkv::StatusCode::kInvalidArgument ||
        r.status().code() == hkv::StatusCode::kResourceExhausted)
      return;
    std::fprintf(stderr, "trace_fuzz: %s replay failed: %s\n", which,
                 std::string(r.status().message()).c_str());
    std::abort();
  }
  for (const hkv::RequestRecord& q : r->requests) {
    if (q.finish_step < 0) {
      std::fprintf(stderr, "trace_fuzz: %s replay left request %lld unfinished\n", which,
                   static_cast<long long>(q.id));
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  hkv::Result<hkv::Trace> trace = hkv::ParseTrace(text, "fuzz.jsonl");
  if (!trace.ok()) return 0;
  std::ostringstream out;
  hkv::WriteTrace(*trace, out);
  hkv::Result<hkv::Trace> again = hkv::ParseTrace(out.str(), "rewritten.jsonl");
  if (!again.ok() || !(*again == *trace)) {
    std::fprintf(stderr, "trace_fuzz: a written trace does not read back equal\n");
    std::abort();
  }
  if (!Small(*trace)) return 0;
  hkv::ReplayOptions o;
  o.token_budget = 16;
  o.max_model_len = kMaxModelLen;
  o.vocab = 50;
  o.check_invariants = true;
  o.record_requests = true;
  CheckFinished(hkv::Replay(*trace, HkvConfig(), o), "hkv");
  CheckFinished(hkv::ReplayVllm(*trace, VllmConfig(), o), "vllm");
  return 0;
}
