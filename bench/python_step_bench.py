#!/usr/bin/env python3
"""Per-step overhead of driving the manager from Python against the same loop in C++.

One decode step of R running requests: allocate one token each, read every block table and the
step's slot mapping, commit, append a token. Three ways, on identical managers, in one process,
interleaved over several rounds (medians reported):
  cpp      hybridkv._decode_steps_cpp: the loop in C++ (the reference).
  batched  five calls per step: allocate_batch, block_tables (into a reused int32 matrix),
           step_slot_mapping, commit_batch, append_tokens_batch.
  per-req  the per-request calls (allocate, block_table, slot_mapping, commit, append_tokens) in a
           Python loop: what a port of a Python scheduler would do first.

    PYTHONPATH=build/release/python python3 bench/python_step_bench.py [--running 256 1024]
"""
import argparse
import statistics
import time

import numpy as np

import hybridkv


def make_manager(running, prompt=1000, decode_room=4096):
    cfg = hybridkv.ManagerConfig()
    block = 16
    per_request = (prompt + decode_room) // block + 1
    cfg.pool_blocks = [running * per_request + 1]
    cfg.groups = [hybridkv.GroupConfig("all", block_tokens=block, pool=0)]
    cfg.max_model_len = prompt + decode_room
    cfg.record_events = False
    mgr = hybridkv.KvCacheManager(cfg)
    ids = np.arange(1, running + 1, dtype=np.uint64)
    for rid in ids:
        mgr.add_request(int(rid), (np.arange(prompt) + int(rid) * prompt) % 32000)
        mgr.allocate(int(rid), prompt)
        mgr.commit(int(rid), prompt)
        mgr.append_tokens(int(rid), [1])
    return mgr, ids


def run_cpp(mgr, ids, steps, state):
    hybridkv._decode_steps_cpp(mgr, ids.tolist(), 0, steps)


def run_batched(mgr, ids, steps, state):
    ones = np.ones(len(ids), dtype=np.int64)
    computed = state.setdefault("computed", np.array([mgr.num_computed(int(r)) for r in ids]))
    table = state.setdefault("table", np.zeros((len(ids), 512), dtype=np.int32))
    tokens = np.ones(len(ids), dtype=np.int32)
    for _ in range(steps):
        if mgr.allocate_batch(ids, ones) != len(ids):
            raise RuntimeError("out of blocks")
        mgr.block_tables(ids, 0, out=table)
        mgr.step_slot_mapping(ids, 0)
        computed += 1
        mgr.commit_batch(ids, computed)
        mgr.append_tokens_batch(ids, tokens)


def run_per_request(mgr, ids, steps, state):
    rids = [int(r) for r in ids]
    computed = state.setdefault("computed", {r: mgr.num_computed(r) for r in rids})
    for _ in range(steps):
        for r in rids:
            mgr.allocate(r, 1)
        for r in rids:
            mgr.block_table(r, 0)
            c = computed[r]
            mgr.slot_mapping(r, 0, c, c + 1)
        for r in rids:
            computed[r] += 1
            mgr.commit(r, computed[r])
            mgr.append_tokens(r, [1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--running", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--steps", type=int, default=100, help="steps per timed round")
    ap.add_argument("--rounds", type=int, default=9)
    a = ap.parse_args()
    ways = [("cpp", run_cpp), ("batched", run_batched), ("per-req", run_per_request)]
    print(f"{'running':>8} {'way':>8} {'us/step':>10} {'x cpp':>7}")
    for running in a.running:
        setups = {name: (make_manager(running), {}) for name, _ in ways}
        times = {name: [] for name, _ in ways}
        for _ in range(a.rounds):  # interleaved, so drift on a shared machine hits every way
            for name, fn in ways:
                (mgr, ids), state = setups[name]
                t0 = time.perf_counter()
                fn(mgr, ids, a.steps, state)
                times[name].append((time.perf_counter() - t0) / a.steps * 1e6)
        cpp = statistics.median(times["cpp"])
        for name, _ in ways:
            med = statistics.median(times[name])
            print(f"{running:>8} {name:>8} {med:>10.1f} {med / cpp:>7.2f}")
        for (mgr, _), _ in setups.values():
            mgr.check_invariants()


if __name__ == "__main__":
    main()
