"""Every KvCacheManager call from Python: results, numpy views, batched calls, errors."""
import threading

import numpy as np
import pytest

import hybridkv
from conftest import full_attention_config


def run_prompt(mgr, rid, tokens, hit=None):
    """Adds, looks up and prefills a request in one step; returns the hit."""
    mgr.add_request(rid, np.asarray(tokens, dtype=np.int32))
    hit = mgr.lookup(rid) if hit is None else hit
    mgr.allocate(rid, len(tokens) - hit.tokens, hit)
    mgr.commit(rid, len(tokens))
    return hit


def test_a_request_from_prompt_to_free_and_a_hit_for_the_next(small):
    prompt = np.arange(10, dtype=np.int32)
    small.add_request(1, prompt)
    assert 1 in small and small.contains(1) and len(small) == 1 and small.num_requests == 1
    hit = small.lookup(1)
    assert (hit.tokens, hit.encoder) == (0, False)
    small.allocate(1, 10, hit)
    step = small.step(1)
    assert (step["begin"], step["end"], step["reserved_end"], step["run_encoder"]) == (0, 10, 10, False)
    assert step["copies"].shape == (0, 3)
    table = small.block_table(1, 0)
    assert table.dtype == np.int32 and len(table) == 3 and 0 not in table
    slots = small.slot_mapping(1, 0, 0, 10)
    assert slots.dtype == np.int64
    assert list(slots[:4]) == [table[0] * 4 + k for k in range(4)]
    assert slots[9] == table[2] * 4 + 1
    small.commit(1, 10)
    small.append_tokens(1, [42])
    assert small.num_tokens(1) == 11 and small.num_computed(1) == 10
    small.check_invariants()
    small.free(1)
    assert 1 not in small and len(small) == 0
    # The next request with the same prompt hits its two full blocks (at most prompt - 1 tokens).
    hit = run_prompt(small, 2, prompt)
    assert hit.tokens == 8
    assert small.stats.lookups == 2 and small.stats.hit_tokens == 8
    assert small.stats.lookup_tokens == 20
    small.check_invariants()


def test_block_table_is_the_callers_copy_and_survives_the_request(small):
    run_prompt(small, 1, range(10))
    a = small.block_table(1, 0)
    b = small.block_table(1, 0)
    assert list(a) == list(b) and not np.shares_memory(a, b)
    a[0] = 0  # the caller's own array
    assert small.block_table(1, 0)[0] != 0
    small.append_tokens(1, list(range(20)))
    small.allocate(1, 20)  # grows the table: a view into it would now dangle
    assert list(b) == list(small.block_table(1, 0)[:3])
    small.commit(1, 30)
    small.free(1)
    assert len(b) == 3 and 0 not in b


def test_table_deltas_rebuild_the_table_from_what_changed(small):
    run_prompt(small, 1, range(10))
    size, start, blocks = small.take_table_delta(1, 0)
    assert (size, start) == (3, 0) and blocks.dtype == np.int32
    assert list(blocks) == list(small.block_table(1, 0))
    small.append_tokens(1, [7])
    small.allocate(1, 1)  # position 10 is in block 2: nothing changes
    assert small.take_table_delta(1, 0)[:2] == (3, 3)
    small.commit(1, 11)
    small.append_tokens(1, [8, 9])
    small.allocate(1, 2)  # position 12 opens block 3
    size, start, blocks = small.take_table_delta(1, 0)
    assert (size, start) == (4, 3) and list(blocks) == [small.block_table(1, 0)[3]]
    with pytest.raises(hybridkv.NotFoundError):
        small.take_table_delta(9, 0)


def test_slot_mapping_into_a_callers_buffer(small):
    small.add_request(1, np.arange(10, dtype=np.int32))
    small.allocate(1, 10)
    out = np.full(6, -1, dtype=np.int64)
    same = small.slot_mapping(1, 0, 2, 8, out=out)
    assert same is out
    assert list(out) == list(small.slot_mapping(1, 0, 2, 8))
    wrong = np.full(5, -1, dtype=np.int64)
    with pytest.raises(hybridkv.InvalidArgumentError) as e:
        small.slot_mapping(1, 0, 2, 8, out=wrong)
    assert "5 slots for the 6 positions" in str(e.value)
    assert list(wrong) == [-1] * 5  # nothing written
    with pytest.raises(hybridkv.InvalidArgumentError) as e:
        small.slot_mapping(1, 0, 8, 2)
    assert "before begin" in str(e.value)
    with pytest.raises(hybridkv.InvalidArgumentError) as e:
        small.slot_mapping(1, 0, 0, 11)
    assert "outside the reserved" in str(e.value)
    read_only = np.zeros(6, dtype=np.int64)
    read_only.flags.writeable = False
    for bad, why in ((np.zeros(6, dtype=np.int32), "out has dtype int32: expected int64"),
                     (np.zeros(12, dtype=np.int64)[::2], "out is not C-contiguous"),
                     ([0] * 6, "out is a list: expected a numpy array of int64"),
                     (np.zeros((2, 3), dtype=np.int64), "out has 2 dimension(s): expected 1"),
                     (read_only, "out is read-only")):
        with pytest.raises(hybridkv.InvalidArgumentError) as e:
            small.slot_mapping(1, 0, 0, 6, out=bad)  # a converted copy would get the slots
        assert why in str(e.value)


def test_refusals_change_nothing_and_map_to_exception_classes(small):
    run_prompt(small, 1, range(10))
    before = (small.usage(0).num_free, small.free_list_order(0))
    small.add_request(2, np.arange(100, 140, dtype=np.int32))
    with pytest.raises(hybridkv.ResourceExhaustedError) as e:
        small.allocate(2, 40)  # 10 blocks, 5 free
    assert "blocks" in str(e.value)
    assert (small.usage(0).num_free, small.free_list_order(0)) == before
    assert small.stats.allocations_failed == 1
    with pytest.raises(hybridkv.NotFoundError) as e:
        small.allocate(77, 1)
    assert "77" in str(e.value) and isinstance(e.value, LookupError)
    with pytest.raises(hybridkv.NotFoundError):
        small.free(77)
    small.free(2)
    with pytest.raises(hybridkv.NotFoundError):  # double free
        small.free(2)
    with pytest.raises(hybridkv.Error) as e:
        small.add_request(1, [1, 2])
    assert "1" in str(e.value)
    with pytest.raises(hybridkv.InvalidArgumentError) as e:
        small.add_request(3, np.zeros(0, dtype=np.int32))
    assert "empty" in str(e.value)
    with pytest.raises(hybridkv.InvalidArgumentError) as e:
        small.add_request(3, np.zeros((2, 2), dtype=np.int32))
    assert "1-d" in str(e.value)
    with pytest.raises(hybridkv.InvalidArgumentError) as e:
        small.add_request(3, [1, -2])
    assert "negative" in str(e.value)
    with pytest.raises(hybridkv.InvalidArgumentError):
        small.add_request(3, np.arange(65, dtype=np.int32))  # beyond max_model_len
    small.add_request(3, [1, 2, 3])
    small.allocate(3, 2)
    with pytest.raises(hybridkv.FailedPreconditionError) as e:
        small.allocate(3, 1)
    assert "open" in str(e.value)
    with pytest.raises(hybridkv.InvalidArgumentError):
        small.commit(3, 9)
    with pytest.raises(hybridkv.FailedPreconditionError):
        small.reset_prefix_cache()
    with pytest.raises(hybridkv.InvalidArgumentError):
        small.block_table(3, 4)
    for call in (small.usage, small.free_list_order, small.uncached_free_blocks):
        with pytest.raises(hybridkv.InvalidArgumentError) as e:
            call(9)
        assert "9" in str(e.value)
    small.check_invariants()


def test_admission_headroom_holds_an_admission_for_the_running_requests():
    c = full_attention_config(num_blocks=11)  # 10 usable 4-token blocks
    c.admission_headroom_steps = 4  # one block per started request
    mgr = hybridkv.KvCacheManager(c)
    run_prompt(mgr, 1, range(16))  # nothing started: 4 blocks, no headroom
    run_prompt(mgr, 2, range(100, 116))  # 4 blocks + 1 kept for request 1
    mgr.add_request(3, np.arange(200, 204, dtype=np.int32))
    with pytest.raises(hybridkv.ResourceExhaustedError) as e:
        mgr.allocate(3, 4, mgr.lookup(3))  # 1 block + 2 kept > 2 free
    assert "admission_headroom_steps" in str(e.value)
    assert mgr.usage(0).num_free == 2
    assert mgr.stats.admissions_held_for_headroom == 1
    mgr.free(1)
    mgr.allocate(3, 4, mgr.lookup(3))
    mgr.check_invariants()


def test_fork_copies_the_shared_partial_block_and_truncate_rolls_back(small):
    run_prompt(small, 1, range(6))
    small.append_tokens(1, [50])
    small.fork(1, 2)
    assert small.num_tokens(2) == 7 and small.num_computed(2) == 6
    small.allocate(2, 1)
    copies = small.step(2)["copies"]
    assert copies.shape == (1, 3)
    group, src, dst = copies[0]
    assert group == 0 and src == small.block_table(1, 0)[1] and dst == small.block_table(2, 0)[1]
    assert src != dst
    small.commit(2, 7)
    r = small.truncate(2, 3)
    assert (r.tokens, r.computed) == (3, 3)
    assert "TruncateResult" in repr(r)
    with pytest.raises(hybridkv.InvalidArgumentError):
        small.truncate(2, 99)
    small.check_invariants()


def test_evict_returns_blocks_and_refuses_truncate_afterwards(small):
    run_prompt(small, 1, range(20))
    before = small.block_table(1, 0)
    assert small.usage(0).num_free == 3
    e = small.evict(1, 0, 8, 4)
    assert (e.keep, e.write_from, e.blocks_released, e.blocks_replaced) == (8, 4, 3, 1)
    assert "EvictResult" in repr(e)
    after = small.block_table(1, 0)
    assert len(after) == 2 and after[0] == before[0] and after[1] != before[1]
    assert small.usage(0).num_free == 6
    with pytest.raises(hybridkv.FailedPreconditionError, match="evicted"):
        small.truncate(1, 4)
    with pytest.raises(hybridkv.InvalidArgumentError, match="keep 9"):
        small.evict(1, 0, 9, 0)
    small.check_invariants()


def test_events_and_reset(small):
    run_prompt(small, 1, range(10))
    events = small.take_events()
    assert [e.kind for e in events] == ["stored", "stored"]
    assert all(e.pool == 0 and e.group == 0 and 0 <= e.hash < 2**128 for e in events)
    assert events[0].hash != events[1].hash
    assert {e.block for e in events} == set(small.block_table(1, 0)[:2].tolist())
    # Provenance for routers: the request, where each block starts, the block before it.
    assert [(e.request, e.position, e.adapter) for e in events] == [(1, 0, 0), (1, 4, 0)]
    assert events[0].parent is None and events[1].parent == events[0].hash
    assert small.take_events() == []
    small.free(1)
    assert small.usage(0).num_cached == 2
    assert len(small.uncached_free_blocks(0)) == 6
    small.reset_prefix_cache()
    assert [e.kind for e in small.take_events()] == ["cleared"]
    assert small.usage(0).num_cached == 0


def test_external_store_hit_loads_then_publishes_or_starts_over(small):
    # Another engine published a prompt's blocks into a store: (digest, group) pairs.
    other = hybridkv.KvCacheManager(full_attention_config())
    run_prompt(other, 1, range(10))
    store = {(e.hash, e.group) for e in other.take_events() if e.kind == "stored"}
    asked = []

    def has(digest, group):
        asked.append((digest, group))
        return (digest, group) in store

    small.add_request(1, np.arange(10, dtype=np.int32))
    assert small.lookup(1).tokens == 0
    hit = small.lookup(1, has)
    assert (hit.tokens, hit.loads) == (8, 2) and asked
    small.allocate(1, 2, hit)
    step = small.step(1)
    loads = step["loads"]
    assert loads.dtype == np.int32 and loads.shape == (2, 4)
    assert list(loads[:, 0]) == [0, 0] and list(loads[:, 3]) == [0, 0]
    assert list(loads[:, 2]) == small.block_table(1, 0)[:2].tolist()
    assert {(d, 0) for d in step["load_digests"]} == store
    with pytest.raises(hybridkv.FailedPreconditionError):
        small.commit(1, 10)
    small.check_invariants()
    small.finish_load(1, True)
    assert small.step(1)["loads"].shape == (0, 4)
    small.commit(1, 10)
    assert small.stats.blocks_loaded == 2
    small.free(1)
    # A failed load: the request starts over and looks up again.
    small.reset_prefix_cache()
    small.add_request(2, np.arange(10, dtype=np.int32))
    hit = small.lookup(2, has)
    small.allocate(2, 2, hit)
    small.finish_load(2, False)
    assert small.stats.loads_failed == 1 and small.usage(0).num_cached == 0
    with pytest.raises(hybridkv.FailedPreconditionError):
        small.finish_load(2, False)
    run_prompt(small, 3, range(4))
    small.check_invariants()
    # A store that raises: the error reaches the caller, the manager is unchanged.
    small.add_request(4, np.arange(10, dtype=np.int32))

    def broken(digest, group):
        raise KeyError("store down")

    with pytest.raises(KeyError):
        small.lookup(4, broken)
    with pytest.raises(TypeError):
        small.lookup(4, lambda d, g: "yes")
    assert small.lookup(4).tokens == 4  # request 3 published block 0
    small.check_invariants()


def test_request_options_salt_adapter_items_and_retention(small):
    run_prompt(small, 1, range(10))
    small.free(1)
    small.add_request(2, np.arange(10, dtype=np.int32), cache_salt="tenant-b")
    assert small.lookup(2).tokens == 0  # another salt never shares
    small.add_request(3, np.arange(10, dtype=np.int32), adapter_id=5)
    assert small.lookup(3).tokens == 0
    small.add_request(4, np.arange(10, dtype=np.int32), items=[(2**100 + 7, 4, 4)])
    assert small.lookup(4).tokens == 4  # the image changes the digest from block 1 on
    small.add_request(5, np.arange(10, dtype=np.int32), low_retention=True)
    assert small.lookup(5).tokens == 8
    with pytest.raises(hybridkv.InvalidArgumentError) as e:
        small.add_request(6, [1, 2], items=[(-1, 0, 1)])
    assert "2^128" in str(e.value)
    with pytest.raises(hybridkv.InvalidArgumentError):
        small.add_request(6, [1, 2], items=[(1, 1, 5)])  # outside the prompt
    with pytest.raises(hybridkv.InvalidArgumentError):
        small.add_request(6, [1, 2], encoder_tokens=4, encoder_input=9)  # no cross attention
    assert 6 not in small


def test_batched_step_calls_match_the_per_request_ones():
    mgr = hybridkv.KvCacheManager(full_attention_config(num_blocks=33, max_model_len=256))
    ids = np.array([10, 11, 12], dtype=np.uint64)
    for i, rid in enumerate(ids):
        run_prompt(mgr, int(rid), range(100 * i, 100 * i + 5 + 3 * i))
    mgr.append_tokens_batch(ids, np.array([1, 2, 3], dtype=np.int32))
    assert [mgr.num_tokens(int(r)) for r in ids] == [6, 9, 12]
    assert mgr.allocate_batch(ids, np.array([1, 1, 1])) == 3
    tables = mgr.block_tables(ids, 0)
    assert tables.shape == (3, 3) and tables.dtype == np.int32
    for row, rid in zip(tables, ids):
        t = mgr.block_table(int(rid), 0)
        assert list(row[:len(t)]) == list(t) and all(row[len(t):] == 0)
    out = np.full((3, 8), -1, dtype=np.int32)
    assert mgr.block_tables(ids, 0, out=out) is out and (out[:, 3:] == 0).all()
    with pytest.raises(hybridkv.InvalidArgumentError) as e:
        mgr.block_tables(ids, 0, out=np.zeros((3, 2), dtype=np.int32))
    assert "out has 2 columns: expected at least 3" in str(e.value)
    with pytest.raises(hybridkv.InvalidArgumentError) as e:
        mgr.block_tables(ids, 0, out=np.zeros((2, 8), dtype=np.int32))
    assert "out has 2 rows: expected 3" in str(e.value)
    slots = mgr.step_slot_mapping(ids, 0)
    expected = np.concatenate([mgr.slot_mapping(int(r), 0, mgr.step(int(r))["begin"],
                                                mgr.step(int(r))["end"]) for r in ids])
    assert slots.dtype == np.int64 and list(slots) == list(expected)
    mgr.commit_batch(ids, np.array([6, 9, 12]))
    assert [mgr.num_computed(int(r)) for r in ids] == [6, 9, 12]
    with pytest.raises(hybridkv.InvalidArgumentError) as e:
        mgr.commit_batch(ids, np.array([1, 2]))
    assert "3 ids but 2 positions" in str(e.value)
    with pytest.raises(hybridkv.InvalidArgumentError):
        mgr.allocate_batch(ids, np.array([1]))
    with pytest.raises(hybridkv.InvalidArgumentError):
        mgr.append_tokens_batch(ids, np.array([1], dtype=np.int32))
    # Blocks run short part-way: the batch stops there and reports how many got theirs.
    mgr.append_tokens_batch(ids, np.array([4, 5, 6], dtype=np.int32))
    free = mgr.usage(0).num_free
    mgr.add_request(13, np.arange(4 * free, dtype=np.int32))
    mgr.allocate(13, 4 * free)
    # Positions 6 and 9 fit in blocks the first two hold; position 12 needs a new block.
    assert mgr.allocate_batch(ids, np.array([1, 1, 1])) == 2
    assert mgr.num_computed(12) == 12 and mgr.block_table(12, 0).shape == (3,)
    mgr.commit_batch(ids[:2], np.array([7, 10]))
    mgr.free(13)
    assert mgr.allocate_batch(ids[2:], np.array([1])) == 1
    with pytest.raises(hybridkv.FailedPreconditionError):
        mgr.allocate_batch(ids[2:], np.array([1]))  # its step is open
    mgr.check_invariants()


def two_level_config():
    """Three slabs of four 4-token pages, one full-attention group."""
    c = full_attention_config(num_blocks=13)
    c.num_slabs = 3
    c.pages_per_slab = [4]
    c.validate()
    return c


def test_compaction_moves_pages_out_of_sparse_slabs_and_arena_usage():
    mgr = hybridkv.KvCacheManager(two_level_config())
    for rid in range(12):
        run_prompt(mgr, rid, [1000 + rid])  # one page each, nothing cached (no full block)
    for rid in range(0, 12, 2):
        mgr.free(rid)  # every slab keeps half its pages
    arena = mgr.arena()
    assert arena.num_slabs == 3 and len(arena.classes) == 1
    assert arena.classes[0].held_pages == 6 and arena.classes[0].stranded_pages == 6
    assert mgr.usage(0).num_stranded == 6
    mgr.add_request(99, [5])
    mgr.allocate(99, 1)
    with pytest.raises(hybridkv.FailedPreconditionError):
        mgr.compact(3)  # a step is open
    mgr.commit(99, 1)
    moves, slabs = mgr.compact(3)
    assert moves.dtype == np.int32 and moves.shape[1] == 3 and len(moves) >= 2
    assert len(slabs) == 1 and (moves[:, 0] == 0).all()
    assert mgr.arena().slabs_compacted == 1 and mgr.arena().pages_moved == len(moves)
    # A full compaction drops the free cache of the slabs it empties; only one made for a class
    # (compact_for) moves younger cached pages.
    assert mgr.arena().cached_pages_moved == 0
    with pytest.raises(hybridkv.InvalidArgumentError):
        mgr.compact(0)
    moves, slabs = mgr.compact([1])
    assert slabs == [] or len(slabs) <= 1
    mgr.check_invariants()
    plain = hybridkv.KvCacheManager(full_attention_config())
    moves, slabs = plain.compact(1)
    assert moves.shape == (0, 3) and slabs == []


def test_compact_for_a_class_that_evicts_nothing_moves_nothing():
    mgr = hybridkv.KvCacheManager(two_level_config())
    for rid in range(12):
        run_prompt(mgr, rid, [1000 + rid])
    for rid in range(0, 12, 2):
        mgr.free(rid)
    usage = mgr.usage(0)
    assert usage.num_free_cached == 0 and usage.num_free == 6
    # Its free pages cache nothing: its next page evicts nothing, so nothing is compacted for it.
    moves, slabs = mgr.compact_for(0, [3])
    assert moves.shape == (0, 3) and slabs == []
    assert mgr.arena().classes[0].stranded_pages == 6
    with pytest.raises(hybridkv.InvalidArgumentError):
        mgr.compact_for(1, [3])
    mgr.check_invariants()


def test_recurrent_state_slots(bamba):
    cfg = hybridkv.make_allocator(bamba, "hybridkv", memory="4GiB").config
    state_group = [g.kind for g in cfg.groups].index("state")
    mgr = hybridkv.KvCacheManager(cfg)
    mgr.add_request(1, np.arange(40, dtype=np.int32))
    mgr.allocate(1, 40)
    st = mgr.state(1, state_group)
    assert st["read"] == 0 and st["write"] > 0 and isinstance(st["snapshots"], list)
    with pytest.raises(hybridkv.InvalidArgumentError) as e:
        mgr.state(1, 1 - state_group if state_group < 2 else 0)
    assert "not a state group" in str(e.value)
    with pytest.raises(hybridkv.InvalidArgumentError):
        mgr.block_table(1, state_group)
    mgr.commit(1, 40)
    mgr.free(1)
    mgr.add_request(2, np.arange(40, dtype=np.int32))
    assert mgr.lookup(2).tokens > 0  # the prompt-end checkpoint serves a hit
    mgr.check_invariants()


def test_step_inputs_in_one_call_match_the_per_request_views(bamba):
    cfg = hybridkv.make_allocator(bamba, "hybridkv", memory="4GiB").config
    kinds = [g.kind for g in cfg.groups]
    mgr = hybridkv.KvCacheManager(cfg)
    mgr.add_request(1, np.arange(40, dtype=np.int32))
    mgr.allocate(1, 40)
    got = mgr.take_step_inputs(1)
    assert got["step"]["begin"] == 0 and got["step"]["end"] == 40
    slots = []
    for g, kind in enumerate(kinds):
        if kind == "state":
            assert got["tables"][g] is None
            assert got["states"][g] == mgr.state(1, g)
            continue
        size, start, blocks = got["tables"][g]
        assert (size, start) == (len(mgr.block_table(1, g)), 0)
        assert list(blocks) == list(mgr.block_table(1, g)) and got["states"][g] is None
        if kind != "encoder":
            slots += list(mgr.slot_mapping(1, g, 0, 40))
    assert got["slots"].dtype == np.int64 and list(got["slots"]) == slots
    mgr.commit(1, 40)
    mgr.append_tokens(1, [5])
    mgr.allocate(1, 1)
    again = mgr.take_step_inputs(1)  # the tables were taken: only what changed since
    for g, kind in enumerate(kinds):
        if kind != "state":
            size, start, blocks = again["tables"][g]
            assert start == size - len(blocks) and start >= 1
    with pytest.raises(hybridkv.NotFoundError):
        mgr.take_step_inputs(9)
    mgr.commit(1, 41)
    with pytest.raises(hybridkv.FailedPreconditionError):
        mgr.take_step_inputs(1)  # no open step


def test_config_usage_and_stats_read_back(small):
    cfg = small.config
    assert cfg.pool_blocks == [9] and cfg.groups[0].block_tokens == 4
    u = small.usage(0)
    assert (u.num_blocks, u.num_free, u.num_cached, u.usage) == (8, 8, 0, 0.0)
    run_prompt(small, 1, range(10))
    u = small.usage(0)
    assert (u.num_free, u.usage) == (5, 3 / 8)
    assert small.free_list_order(0) == sorted(small.free_list_order(0))
    assert small.arena().num_slabs == 0
    s = small.stats
    assert (s.lookups, s.encoder_lookups, s.encoder_hits, s.recomputed_tokens) == (1, 0, 0, 0)


def test_threads_share_a_manager_safely():
    mgr = hybridkv.KvCacheManager(full_attention_config(num_blocks=129, max_model_len=256))
    errors = []

    def worker(base):
        try:
            for k in range(200):
                rid = base * 1000 + k
                tokens = np.arange(k % 7, k % 7 + 20, dtype=np.int32)
                mgr.add_request(rid, tokens)
                hit = mgr.lookup(rid)
                mgr.allocate(rid, 20 - hit.tokens, hit)
                mgr.block_table(rid, 0).copy()
                mgr.commit(rid, 20)
                mgr.free(rid)
        except Exception as e:  # reported below; a crash would end the process instead
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(b,)) for b in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(mgr) == 0
    mgr.check_invariants()


@pytest.mark.parametrize("on", [True, False])
def test_a_follow_up_demotes_the_checkpoint_it_continued_from(bamba, on):
    cfg = hybridkv.make_allocator(bamba, "hybridkv", memory="4GiB").config
    assert cfg.evict_uncovered
    cfg.evict_uncovered = on
    mgr = hybridkv.KvCacheManager(cfg)
    first = np.arange(64, dtype=np.int32)
    run_prompt(mgr, 1, first)
    mgr.free(1)
    follow_up = np.concatenate([first, np.arange(1000, 1032, dtype=np.int32)])
    assert run_prompt(mgr, 2, follow_up).tokens == 64
    mgr.free(2)
    s = mgr.stats
    assert s.superseded_hits_demoted == (1 if on else 0)
    assert s.uncovered_blocks_demoted == 0 and s.unreachable_checkpoints_demoted == 0
    mgr.check_invariants()


def test_without_prompt_checkpoints_a_repeated_prompt_is_checkpointed_at_its_branch(bamba):
    hits = {}
    for on in (True, False):
        cfg = hybridkv.make_allocator(bamba, "hybridkv", memory="4GiB").config
        assert not cfg.prompt_checkpoints  # the simulator's modes admit states by expected reuse
        cfg.prompt_checkpoints = on
        mgr = hybridkv.KvCacheManager(cfg)
        prompt = np.arange(100, dtype=np.int32)
        run_prompt(mgr, 1, prompt)
        for t in range(20):  # decodes past the prompt: its final state is at 112
            mgr.append_tokens(1, [5000 + t])
            mgr.allocate(1, 1)
            mgr.commit(1, 101 + t)
        mgr.free(1)
        hits[on] = [run_prompt(mgr, 2, prompt).tokens]
        mgr.free(2)
        hits[on].append(run_prompt(mgr, 3, prompt).tokens)
        mgr.free(3)
        mgr.check_invariants()
    assert hits[True] == [96, 96]
    assert hits[False] == [0, 96]


def test_a_prefix_two_requests_branch_from_is_marked_shared():
    c = full_attention_config(num_blocks=17)
    c.branch_bonus = 1.0
    mgr = hybridkv.KvCacheManager(c)
    prompt = list(range(100, 108))  # two blocks every request starts with
    run_prompt(mgr, 1, prompt + list(range(1000, 1008)))
    mgr.free(1)
    assert mgr.stats.shared_prefixes_marked == 0
    assert run_prompt(mgr, 2, prompt + list(range(2000, 2008))).tokens == 8
    assert mgr.stats.shared_prefixes_marked == 1
    mgr.free(2)
    mgr.check_invariants()
    c.branch_bonus = -1.0
    with pytest.raises(hybridkv.InvalidArgumentError, match="branch_bonus -1"):
        hybridkv.KvCacheManager(c)


def test_the_thrash_guard_puts_finished_requests_on_probation_but_not_preempted_ones():
    c = full_attention_config(num_blocks=17)
    c.thrash_guard = True
    c.thrash_keep_share = 1.0 / 16  # fixed: about 15 of 16 finished requests on probation
    mgr = hybridkv.KvCacheManager(c)
    assert mgr.stats.thrash_keep_share == pytest.approx(1.0 / 16)
    for rid in range(1, 21):
        run_prompt(mgr, rid, list(range(1000 * rid, 1000 * rid + 8)))
        mgr.free(rid, preempted=True)
    assert mgr.stats.thrash_probation_frees == 0
    for rid in range(21, 41):
        run_prompt(mgr, rid, list(range(1000 * rid, 1000 * rid + 8)))
        mgr.free(rid)
    assert mgr.stats.thrash_probation_frees > 10
    mgr.check_invariants()
    c.thrash_keep_share = 2.0
    with pytest.raises(hybridkv.InvalidArgumentError, match="thrash_keep_share 2"):
        hybridkv.KvCacheManager(c)


def test_a_prefix_computed_again_takes_the_keys_of_its_free_copies():
    c = full_attention_config(num_blocks=17)
    mgr = hybridkv.KvCacheManager(c)
    prompt = list(range(100, 113))  # three full blocks and a partial one
    run_prompt(mgr, 1, prompt)
    mgr.free(1)
    assert mgr.stats.keys_taken_over == 0
    run_prompt(mgr, 2, prompt, hit=hybridkv.PrefixHit())  # computes them again
    assert mgr.stats.keys_taken_over == 3
    mgr.free(2)
    mgr.check_invariants()
    mgr.add_request(3, np.asarray(prompt, dtype=np.int32))
    assert mgr.lookup(3).tokens == 12
