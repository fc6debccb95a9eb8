#!/usr/bin/env python3
"""A continuous-batching loop in Python over hybridkv's manager.

The scheduler is replay.md's (the one `hkv simulate` uses): first-come first-served, a token
budget per step, chunked prefill, preemption of the newest running request when blocks run out,
admissions only in steps without preemption, each with its prefix-cache hit and only when its
whole prompt fits. It prints the same figures `hkv simulate --json` reports for one allocator
mode, so the two can be compared number for number.

    PYTHONPATH=build/dev/python python3 examples/continuous_batching.py \
        models/google--gemma-2-9b --requests 100 --memory 4GiB

A real engine would run its model where this loop reads block tables and slot mappings (the
arrays a paged-attention kernel takes), and would sample instead of reading outputs from the trace.
"""
import argparse
import collections
import json

import numpy as np

import hybridkv


class Live:
    """A request as the scheduler tracks it."""

    def __init__(self, index, spec):
        self.id = index
        self.spec = spec
        self.tokens = list(spec["prompt"])
        self.computed = 0
        self.outputs = 0
        self.added = False
        self.admitted = False


def replay(trace, config, budget=8192, max_running=1024, max_model_len=16384):
    """Replays `trace` (hybridkv.generate_trace / read_trace) through a new manager.

    The loop allocates every scheduled request before any step runs and commits them after, as
    one forward pass over the batch would; so, as `hkv simulate` does, it has the manager publish
    a step's blocks when it is allocated (config.publish_at_allocate): a request admitted in a
    step hits what an earlier one computes in it.
    """
    config.publish_at_allocate = True
    mgr = hybridkv.KvCacheManager(config)
    token_groups = [g for g, c in enumerate(config.groups) if c.kind != "state"]
    reqs = [Live(i, spec) for i, spec in enumerate(trace)]
    for r in reqs:
        if r.spec["output_len"] > 0 and len(r.spec["output"]) != r.spec["output_len"]:
            raise ValueError("trace without explicit outputs: generate one with outputs")
    waiting, running = collections.deque(), []
    t = collections.Counter()
    num_blocks = sum(n - 1 for n in config.pool_blocks)
    nxt, s = 0, 0
    while nxt < len(reqs) or waiting or running:
        while nxt < len(reqs) and reqs[nxt].spec["arrival_step"] <= s:
            waiting.append(reqs[nxt])
            nxt += 1
        if not waiting and not running:
            s = reqs[nxt].spec["arrival_step"]
            continue
        left, preempted, scheduled = budget, 0, []
        # 1. Running requests in order; on a refusal, preempt from the back and retry.
        i = 0
        while i < len(running):  # preemptions shrink it from the back
            r = running[i]
            i += 1
            n = min(len(r.tokens) - r.computed, left, max_model_len - 1 - r.computed)
            if n <= 0:
                continue
            stop = False
            while True:
                try:
                    mgr.allocate(r.id, n)
                    left -= n
                    scheduled.append((r, n))
                    break
                except hybridkv.ResourceExhaustedError:
                    victim = running.pop()
                    mgr.free(victim.id)
                    victim.added, victim.computed = False, 0
                    preempted += 1
                    waiting.appendleft(victim)
                    if victim is r:
                        stop = True
                        break
            if stop:
                break
        # 2. Admissions, only in a step without preemption.
        while not preempted and waiting and left > 0 and len(running) < max_running:
            r = waiting[0]
            if not r.added:
                mgr.add_request(r.id, np.asarray(r.tokens, dtype=np.int32))
                r.added = True
            hit = mgr.lookup(r.id)
            n = min(len(r.tokens) - hit.tokens, left)
            try:  # the whole remaining prompt must fit: reserve the rest as lookahead
                mgr.allocate(r.id, n, hit, lookahead=len(r.tokens) - hit.tokens - n)
            except hybridkv.ResourceExhaustedError:
                break
            waiting.popleft()
            running.append(r)
            r.computed = hit.tokens
            left -= n
            scheduled.append((r, n))
            if not r.admitted:
                r.admitted = True
                t["first_tokens"] += len(r.tokens)
                t["first_hits"] += hit.tokens
            t["tokens"] += len(r.tokens)
            t["hits"] += hit.tokens
        if not preempted and not running and waiting:
            raise RuntimeError("request %d does not fit even with nothing running"
                               % waiting[0].spec["id"])
        # What the model would run on: each scheduled request's tables and step slots.
        for r, n in scheduled:
            for g in token_groups:
                mgr.block_table(r.id, g)
                if config.groups[g].kind != "encoder":
                    mgr.slot_mapping(r.id, g, r.computed, r.computed + n)
        used = sum(u.num_blocks - u.num_free
                   for u in (mgr.usage(p) for p in range(len(config.pool_blocks))))
        t["peak_blocks_used"] = max(t["peak_blocks_used"], used)
        t["peak_running"] = max(t["peak_running"], len(running))
        # 3. Commit, then 4. outputs and finishing, in scheduling order.
        for r, n in scheduled:
            mgr.commit(r.id, r.computed + n)
            r.computed += n
            t["scheduled_tokens"] += n
        for r, n in scheduled:
            if r.computed < len(r.tokens):
                continue
            if r.outputs < r.spec["output_len"]:
                token = int(r.spec["output"][r.outputs])
                mgr.append_tokens(r.id, [token])
                r.tokens.append(token)
                r.outputs += 1
            if r.outputs >= r.spec["output_len"]:
                running.remove(r)
                mgr.free(r.id)
                r.added = False
        t["preemptions"] += preempted
        t["steps"] += 1
        s += 1
    mgr.check_invariants()
    return {
        "steps": t["steps"],
        "preemptions": t["preemptions"],
        "hit_rate": t["first_hits"] / t["first_tokens"] if t["first_tokens"] else 0.0,
        "hit_rate_incl_readmissions": t["hits"] / t["tokens"] if t["tokens"] else 0.0,
        "peak_blocks_used": t["peak_blocks_used"],
        "peak_running": t["peak_running"],
        "scheduled_tokens": t["scheduled_tokens"],
        "num_blocks": num_blocks,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="config.json or the folder holding it")
    ap.add_argument("--trace", help="JSONL trace (default: generated)")
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--session-gap", type=float, default=150.0)
    ap.add_argument("--allocator", default="hybridkv", choices=["uniform", "padded", "hybridkv"])
    ap.add_argument("--memory", default="16GiB")
    ap.add_argument("--max-model-len", type=int, default=16384)
    ap.add_argument("--budget", type=int, default=8192)
    a = ap.parse_args()
    trace = (hybridkv.read_trace(a.trace) if a.trace else
             hybridkv.generate_trace(requests=a.requests, seed=a.seed, session_gap=a.session_gap))
    model = hybridkv.load_model(a.model)
    alloc = hybridkv.make_allocator(model, a.allocator, memory=a.memory,
                                    max_model_len=a.max_model_len)
    result = replay(trace, alloc.config, budget=a.budget, max_model_len=a.max_model_len)
    print(json.dumps(dict(allocator=a.allocator, **result), indent=2))


if __name__ == "__main__":
    main()
