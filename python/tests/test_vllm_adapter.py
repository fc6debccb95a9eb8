"""hybridkv.vllm.KVCacheManager, vLLM's manager interface over hybridkv's C++ restatement.

The judge is vLLM itself: call logs of vLLM's own manager (tests/data/vllm_calls, recorded by
scripts/vllm_adapter.py record) replay with 0 differing calls, block ids and KV events included,
through the C fast path (events off) and the Python path (events on). The rest pins what the
logs do not reach: arguments the reference loop never passes, refusals, and the return types.
"""
import gzip
import json
import pathlib
import types

import pytest

import hybridkv
from hybridkv.vllm import _standins as v
from hybridkv.vllm import IdBlocks, KVCacheManager

import vllm_call_log

LOGS = sorted((pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "vllm_calls")
              .glob("*/*.jsonl.gz"))


def test_every_config_is_recorded():
    names = {p.name.split(".")[0] for p in LOGS}
    assert names == {"llama3_8b", "gemma2_9b", "gemma3_4b", "gptoss_20b", "bamba_9b",
                     "bamba_9b_align", "qwen3next", "jamba"}
    assert len({p.parent.name for p in LOGS}) >= 2


@pytest.mark.parametrize("events", [True, False], ids=["events", "fast"])
@pytest.mark.parametrize("log", LOGS, ids=lambda p: f"{p.parent.name}/{p.name.split('.')[0]}")
def test_recorded_vllm_calls_replay_identically(log, events):
    replay = vllm_call_log.Replay(str(log), events).run(check_every=997)
    assert replay.calls > 1000
    assert replay.differences == []
    m = replay.manager
    assert m._core.idle and m._core.num_free_blocks == m._core.num_blocks - 1


def test_a_differing_manager_is_caught(tmp_path):
    # The same log with one step's digest changed, and with one request's allocation asked
    # for one more token: both must be reported.
    lines = [json.loads(x) for x in gzip.open(LOGS[0], "rt")]
    steps = [i for i, r in enumerate(lines) if r.get("m") == "step"]
    lines[steps[len(steps) // 2]]["d"] ^= 1
    path = tmp_path / "changed.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(json.dumps(x) for x in lines))
    replay = vllm_call_log.Replay(str(path), events=False).run()
    assert len(replay.differences) == 1 and "results differ" in replay.differences[0]


def spec(name, block_size, **fields):
    s = type(name, (), {})()
    s.block_size = block_size
    for k, val in fields.items():
        setattr(s, k, val)
    return s


def config(*specs, num_blocks=9):
    return types.SimpleNamespace(
        num_blocks=num_blocks,
        kv_cache_groups=[types.SimpleNamespace(kv_cache_spec=s) for s in specs])


def request(rid, tokens, block_size=4):
    r = vllm_call_log.Request(rid, tokens, [], block_size)
    return r


def manager(*specs, num_blocks=9, **kw):
    kw.setdefault("max_model_len", 64)
    kw.setdefault("hash_block_size", 4)
    return KVCacheManager(config(*(specs or (spec("FullAttentionSpec", 4),)),
                                 num_blocks=num_blocks), **kw)


def admit(m, r, n=None):
    blocks, hit = m.get_computed_blocks(r)
    out = m.allocate_slots(r, (n or r.num_tokens) - hit, hit, blocks)
    if out is not None:
        r.num_computed_tokens = hit + (n or r.num_tokens) - hit
    return blocks, hit, out


def test_blocks_come_back_as_vllm_kv_cache_blocks():
    m = manager()
    r = request("a", list(range(10)))
    blocks, hit, out = admit(m, r)
    assert hit == 0 and blocks is m.empty_kv_cache_blocks
    assert isinstance(out, v.KVCacheBlocks) and isinstance(out, IdBlocks)
    assert out.get_block_ids() == ([1, 2, 3],)
    ids = out.get_block_ids()
    ids[0].append(99)  # the caller's copy
    assert out.get_block_ids() == ([1, 2, 3],)
    assert [b.block_id for b in out.blocks[0]] == [1, 2, 3]
    assert m.empty_kv_cache_blocks.get_block_ids(allow_none=True) is None
    assert m.empty_kv_cache_blocks.get_block_ids() == ([],)
    # Full blocks are cached at allocation; the third holds 2 tokens and is not.
    assert out.get_unhashed_block_ids() == [3]
    assert m.get_block_ids("a") == ([1, 2, 3],)
    assert m.usage == pytest.approx(3 / 8)
    assert m.block_pool.get_num_free_blocks() == 5


def test_a_second_request_hits_and_the_free_order_is_vllms():
    m = manager()
    a = request("a", list(range(10)))
    admit(m, a)
    m.free(a)
    assert m._core.free_queue() == [4, 5, 6, 7, 8, 3, 2, 1]  # tail first
    b = request("b", list(range(9)) + [77])
    blocks, hit, out = admit(m, b)
    assert hit == 8 and blocks.get_block_ids() == ([1, 2],)
    assert out.get_block_ids() == ([4],)
    assert m.get_num_common_prefix_blocks("b") == [3]
    m.check_invariants()


@pytest.mark.parametrize("policy", ["vllm", "hybridkv"])
def test_the_hybridkv_policy_reuses_a_block_without_identity_before_a_cached_one(policy):
    m = manager(num_blocks=4, policy=policy)
    assert m.policy == policy
    first = request("first", list(range(8)))  # blocks 1 and 2, both cached
    admit(m, first)
    m.free(first)
    other = request("other", list(range(100, 105)))  # takes 3 (cached) and 2 (no identity)
    admit(m, other)
    m.free(other)
    assert m._core.free_queue() == ([1, 2, 3] if policy == "vllm" else [2, 1, 3])
    admit(m, request("third", list(range(200, 204))))  # one block
    again = request("again", list(range(8)))
    assert m.get_computed_blocks(again)[1] == (0 if policy == "vllm" else 4)
    m.check_invariants()


def test_an_unknown_policy_is_refused_by_name():
    with pytest.raises(ValueError, match="policy 'lru'"):
        manager(policy="lru")


def test_unsupported_configurations_are_refused_by_name():
    with pytest.raises(NotImplementedError, match="CrossAttentionSpec"):
        manager(spec("CrossAttentionSpec", 4))
    with pytest.raises(NotImplementedError, match="EAGLE"):
        manager(use_eagle=True)
    with pytest.raises(NotImplementedError, match="metrics"):
        manager(metrics_collector=object())
    with pytest.raises(NotImplementedError, match="mamba_cache_mode 'auto'"):
        manager(spec("MambaSpec", 4, mamba_cache_mode="auto"))
    with pytest.raises(hybridkv.InvalidArgumentError, match="sliding window 0"):
        manager(spec("SlidingWindowSpec", 4, sliding_window=0))
    m = manager()
    r = request("a", list(range(10)))
    with pytest.raises(NotImplementedError, match="encoder tokens"):
        m.allocate_slots(r, 10, num_encoder_tokens=5)


def test_bad_calls_raise_and_change_nothing():
    m = manager()
    r = request("a", list(range(10)))
    admit(m, r)
    before = (m._core.free_queue(), m.get_block_ids("a"))
    with pytest.raises(ValueError, match="num_new_tokens must be greater than 0"):
        m.allocate_slots(r, 0)
    with pytest.raises(hybridkv.InvalidArgumentError, match="-2 new tokens"):
        m.allocate_slots(r, -2)  # the C fast path hands it to Python, which raises
    with pytest.raises(hybridkv.InvalidArgumentError, match="-1 lookahead tokens"):
        m.allocate_slots(r, 1, num_lookahead_tokens=-1)
    with pytest.raises(hybridkv.InvalidArgumentError, match="evict block 9"):
        m.evict_blocks({1, 9})
    r.block_hashes.pop()
    with pytest.raises(hybridkv.InvalidArgumentError, match="append-only"):
        m.get_computed_blocks(r)
    assert (m._core.free_queue(), m.get_block_ids("a")) == before
    m.check_invariants()
    m.free(request("never-seen", [1, 2]))  # vLLM: a no-op
    assert m.get_blocks("never-seen") is m.empty_kv_cache_blocks
    assert m.get_num_common_prefix_blocks("never-seen") == [0]


def test_slots_past_the_tokens_are_granted_for_drafts_but_not_cached():
    # vLLM's scheduler asks for draft tokens (and async placeholders) beyond num_tokens.
    m = manager()
    r = request("a", list(range(8)))
    admit(m, r)
    assert m.allocate_slots(r, 4).get_block_ids() == ([3],)  # 1 token + 3 drafts
    assert m._core.num_cached_blocks == 2
    r.num_computed_tokens = 11  # the async scheduler's placeholders run ahead of the tokens
    assert m.allocate_slots(r, 1) is m.empty_kv_cache_blocks
    m.check_invariants()


def test_a_refusal_returns_none_and_allocates_nothing():
    m = manager(num_blocks=4)
    r = request("a", list(range(20)))
    assert admit(m, r)[2] is None
    assert m._core.num_free_blocks == 3
    assert m.allocate_slots(r, 20, full_sequence_must_fit=True) is None
    assert m.allocate_slots(r, 12) is not None  # a first chunk fits
    m.check_invariants()


def test_connector_tokens_get_blocks_but_no_hit_and_delayed_blocks_cache_later():
    m = manager(enable_kv_cache_events=True)
    r = request("a", list(range(12)))
    # 8 tokens arrive from a connector, 4 are computed here; caching waits for the transfer.
    out = m.allocate_slots(r, 4, num_external_computed_tokens=8, delay_cache_blocks=True)
    assert out.get_block_ids() == ([3],)
    assert m.get_block_ids("a") == ([1, 2, 3],)
    assert m.take_new_block_ids() == [1, 2, 3]
    assert m.take_events() == []
    assert m.get_computed_blocks(request("b", list(range(12))))[1] == 0
    r.num_computed_tokens = 12
    m.cache_blocks(r, 12)
    events = m.take_events()
    assert [type(e).__name__ for e in events] == ["BlockStored"]
    assert events[0].token_ids == list(range(12)) and len(events[0].block_hashes) == 3
    assert events[0].kv_cache_spec_kind == "full_attention"
    assert m.get_computed_blocks(request("b", list(range(12)) + [5]))[1] == 12


def test_evictions_and_a_reset_publish_vllms_events():
    m = manager(enable_kv_cache_events=True, log_stats=True)
    r = request("a", list(range(8)))
    admit(m, r)
    assert not m.reset_prefix_cache()  # blocks are held
    m.evict_blocks({1})
    stored, removed = m.take_events()
    assert removed.block_hashes == stored.block_hashes[:1] and removed.group_idx == 0
    m.free(r)
    assert m.reset_prefix_cache()
    assert [type(e).__name__ for e in m.take_events()] == ["AllBlocksCleared"]
    stats = m.make_prefix_cache_stats()
    assert stats.reset and stats.requests == 1 and stats.queries == 8
    assert m.make_prefix_cache_stats().requests == 0


def test_prefix_caching_off():
    m = manager(enable_caching=False)
    a = request("a", list(range(10)))
    admit(m, a)
    m.free(a)
    assert m.get_computed_blocks(request("b", list(range(10))))[1] == 0
    assert m.get_num_common_prefix_blocks("b") == [0]


def test_hybrid_groups_and_context_parallel_block_sizes():
    # Sliding window + Mamba (align) like the bundled hybrids, with a 2-way DCP block scale.
    m = manager(spec("SlidingWindowSpec", 4, sliding_window=4),
                spec("MambaSpec", 4, mamba_cache_mode="align"), num_blocks=40,
                hash_block_size=4, dcp_world_size=2)
    r = request("a", list(range(40)))
    blocks, hit, out = admit(m, r, 32)
    assert len(out.get_block_ids()) == 2
    assert m.kv_cache_event_metadata == (("sliding_window", 4), ("mamba", None))
    m.check_invariants()
    m.free(r)
    assert m._core.idle


def test_a_dropped_manager_is_freed():
    # The C builtins hold their state in a capsule the cycle collector cannot look into: if
    # that state led back to the manager, the manager and its C++ pool would never be freed.
    import gc
    import weakref

    m = manager(enable_kv_cache_events=False)
    r = request("a", list(range(10)))
    admit(m, r)
    kept = m.allocate_slots(r, 1)  # a result the caller keeps does not hold the manager either
    ref = weakref.ref(m)
    del m
    gc.collect()
    assert ref() is None
    assert kept is not None and kept.get_block_ids(allow_none=True) is None
