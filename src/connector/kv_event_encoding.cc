// vLLM's KV-event batch encoding (msgpack) of the manager's events.
#include <fmt/format.h>

#include <hkv/connector/kv_events.h>
#include <hkv/manager/manager_config.h>

#define MSGPACK_NO_BOOST
#include <msgpack.hpp>

namespace hkv {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void PackStr(Packer& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void PackHash(Packer& pk, const BlockHash& h) {
  unsigned char b[16];
  for (int i = 0; i < 8; ++i) {
    b[i] = static_cast<unsigned char>(h.hi >> (56 - 8 * i));
    b[8 + i] = static_cast<unsigned char>(h.lo >> (56 - 8 * i));
  }
  pk.pack_bin(16);
  pk.pack_bin_body(reinterpret_cast<const char*>(b), 16);
}

void PackTokens(Packer& pk, std::span<const int32_t> all, int64_t begin, int64_t end) {
  if (begin < 0 || end > static_cast<int64_t>(all.size()) || begin > end) {
    pk.pack_array(0);  // the caller does not know them
    return;
  }
  pk.pack_array(static_cast<uint32_t>(end - begin));
  for (int64_t i = begin; i < end; ++i)
    pk.pack_int32(all[static_cast<size_t>(i)]);
}

// A run of consecutive events that become one vLLM event.
struct Run {
  KvEvent::Kind kind;
  size_t first = 0, count = 0;
};

// Consecutive events that vLLM reports as one: removals of one group, and stores of one
// request's consecutive blocks of one group.
Result<std::vector<Run>> JoinRuns(std::span<const ManagerEvent> events,
                                  std::span<const KvEventGroup> groups) {
  std::vector<Run> runs;
  for (size_t i = 0; i < events.size(); ++i) {
    const ManagerEvent& e = events[i];
    if (e.kind != KvEvent::Kind::kCleared &&
        (e.group < 0 || static_cast<size_t>(e.group) >= groups.size())) {
      return Status::InvalidArgument(
          fmt::format("kv events: event {} names group {}, outside the {} groups given", i, e.group,
                      groups.size()));
    }
    if (!runs.empty() && runs.back().kind == e.kind && e.kind != KvEvent::Kind::kCleared) {
      const ManagerEvent& p = events[runs.back().first + runs.back().count - 1];
      const KvEventGroup& g = groups[static_cast<size_t>(e.group)];
      // Checkpoints stay one per event: each is its own state, not a run of blocks.
      const int32_t bt = g.kind == "mamba" ? 0 : g.block_tokens;
      const bool joins =
          p.group == e.group && (e.kind == KvEvent::Kind::kRemoved ||
                                 (e.request != 0 && p.request == e.request && bt > 0 &&
                                  e.position >= 0 && e.position == p.position + bt));
      if (joins) {
        ++runs.back().count;
        continue;
      }
    }
    runs.push_back({e.kind, i, 1});
  }
  return runs;
}

void PackHashes(Packer& pk, std::span<const ManagerEvent> events, const Run& run) {
  PackStr(pk, "block_hashes");
  pk.pack_array(static_cast<uint32_t>(run.count));
  for (size_t k = 0; k < run.count; ++k)
    PackHash(pk, events[run.first + k].hash);
}

void PackRemoved(Packer& pk, std::span<const ManagerEvent> events, const Run& run,
                 const KvEventEncoding& encoding) {
  pk.pack_map(4);
  PackStr(pk, "type");
  PackStr(pk, "BlockRemoved");
  PackHashes(pk, events, run);
  PackStr(pk, "medium");
  PackStr(pk, encoding.medium);
  PackStr(pk, "group_idx");
  pk.pack_int32(events[run.first].group);
}

void PackStored(Packer& pk, std::span<const ManagerEvent> events, const Run& run,
                const KvEventGroup& g, const RequestTokens& tokens,
                const KvEventEncoding& encoding) {
  const ManagerEvent& head = events[run.first];
  pk.pack_map(g.sliding_window ? 11 : 10);
  PackStr(pk, "type");
  PackStr(pk, "BlockStored");
  PackHashes(pk, events, run);
  PackStr(pk, "parent_block_hash");
  if (head.parent) {
    PackHash(pk, *head.parent);
  } else {
    pk.pack_nil();
  }
  const std::span<const int32_t> known =
      head.request != 0 && tokens ? tokens(head.request) : std::span<const int32_t>{};
  const bool state = g.kind == "mamba";
  // A checkpoint holds the state after `position` tokens; it chains to the digest `block_tokens`
  // (the manager's alignment) earlier, so it carries only those tokens - bounded however long the
  // prefix - or, without a parent, the tokens from the start.
  const int64_t state_begin =
      head.parent ? std::max<int64_t>(head.position - g.block_tokens, 0) : 0;
  PackStr(pk, "token_ids");
  if (head.position < 0) {
    pk.pack_array(0);
  } else if (state) {
    PackTokens(pk, known, state_begin, head.position);
  } else {
    PackTokens(pk, known, head.position,
               head.position + static_cast<int64_t>(run.count) * g.block_tokens);
  }
  PackStr(pk, "block_size");
  pk.pack_int64(state ? std::max<int64_t>(head.position - state_begin, 0) : g.block_tokens);
  PackStr(pk, "lora_id");
  if (head.adapter != 0) {
    pk.pack_uint64(head.adapter);
  } else {
    pk.pack_nil();
  }
  PackStr(pk, "medium");
  PackStr(pk, encoding.medium);
  PackStr(pk, "lora_name");
  pk.pack_nil();
  PackStr(pk, "group_idx");
  pk.pack_int32(head.group);
  PackStr(pk, "kv_cache_spec_kind");
  PackStr(pk, g.kind);
  if (g.sliding_window) {
    PackStr(pk, "kv_cache_spec_sliding_window");
    pk.pack_int64(*g.sliding_window);
  }
}

}  // namespace

RequestTokens TokensOf(const KvCacheManager& manager) {
  return [&manager](RequestId id) {
    const Result<std::span<const int32_t>> t = manager.Tokens(id);
    return t.ok() ? *t : std::span<const int32_t>{};
  };
}

std::vector<KvEventGroup> KvEventGroupsOf(const Plan& plan) {
  // A state group's "block": the manager's alignment, the distance from a checkpoint to its
  // parent digest.
  const Result<ManagerConfig> config = ManagerConfig::FromPlan(plan);
  const int32_t align = config.ok() ? config->align_tokens() : 0;
  std::vector<KvEventGroup> out;
  for (const KvGroup& g : plan.groups) {
    KvEventGroup e;
    e.block_tokens = g.block_tokens;
    bool mla = !g.layers.empty();
    for (int32_t l : g.layers)
      mla = mla && plan.model.layers[static_cast<size_t>(l)].kind == LayerKind::kMla;
    switch (g.rule.kind) {
      case TokenRuleKind::kAll:
        e.kind = mla ? "mla_attention" : "full_attention";
        break;
      case TokenRuleKind::kWindow:
        e.kind = mla ? "sliding_window_mla" : "sliding_window";
        e.sliding_window = g.rule.span;
        break;
      case TokenRuleKind::kChunk:
        e.kind = "chunked_local_attention";
        break;
      case TokenRuleKind::kState:
        e.kind = "mamba";
        e.block_tokens = align;
        break;
      case TokenRuleKind::kEncoder:
        e.kind = "cross_attention";
        break;
      case TokenRuleKind::kNothing:
        e.kind = "none";
        break;
    }
    out.push_back(std::move(e));
  }
  return out;
}

Result<std::vector<unsigned char>> EncodeKvEventBatch(std::span<const ManagerEvent> events,
                                                      std::span<const KvEventGroup> groups,
                                                      const RequestTokens& tokens,
                                                      const KvEventEncoding& encoding, double ts) {
  HKV_ASSIGN_OR_RETURN(const std::vector<Run> runs, JoinRuns(events, groups));
  msgpack::sbuffer buf;
  Packer pk(&buf);
  pk.pack_array(encoding.data_parallel_rank ? 3 : 2);
  pk.pack_double(ts);
  pk.pack_array(static_cast<uint32_t>(runs.size()));
  for (const Run& run : runs) {
    if (run.kind == KvEvent::Kind::kCleared) {
      pk.pack_map(1);
      PackStr(pk, "type");
      PackStr(pk, "AllBlocksCleared");
    } else if (run.kind == KvEvent::Kind::kRemoved) {
      PackRemoved(pk, events, run, encoding);
    } else {
      const KvEventGroup& g = groups[static_cast<size_t>(events[run.first].group)];
      PackStored(pk, events, run, g, tokens, encoding);
    }
  }
  if (encoding.data_parallel_rank) pk.pack_int64(*encoding.data_parallel_rank);
  const auto* data = reinterpret_cast<const unsigned char*>(buf.data());
  return std::vector<unsigned char>(data, data + buf.size());
}

}  // namespace hkv
