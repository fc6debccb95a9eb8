#!/usr/bin/env python3
"""Independent reference implementation of the replay rules in ../shared/design/replay.md.

It models a single full-attention KV group (one pool, one block size) with prefix caching, in
plain Python, and exists only to check `hkv simulate` number for number: same trace, same block
size and block count must give the same steps, preemptions, hit rates, peaks and scheduled
tokens, and the same per-step CSV as `hkv simulate --csv` writes.

Block pool model (what the C++ manager does for one full-attention group):
  * N blocks including block 0, a null block never handed out: N - 1 usable, all free at start,
    in id order. The free list is a queue: allocation takes from the front, and a block taken
    there loses its prefix identity (lazy eviction).
  * A block's identity is the chain of the full 16-token blocks from position 0. Identities are
    interned exactly (no hashing), so a collision cannot hide a difference.
  * Releasing a request: its blocks in reverse order (last first). A block whose count drops to
    0 goes to the front of the free list if it has no identity (so the request's last such
    block is first), to the back otherwise.
  * Publishing: after a step, each full computed block gets the identity of its prefix. If
    another block already holds that identity: while that block is held, this one stays without
    one (and is never retried); if it is free, the identity moves to this block and the old one
    goes to the front of the free list. With --publish-at-allocate (hkv simulate's default;
    --publish-at-commit turns it off there), each full block of known tokens a request's chunk
    completes is published when the chunk is scheduled, so a request admitted later in the same
    step hits it, as vLLM caches blocks; such a block takes an identity from a free one only at
    the step's commit, once it is computed.
  * With --admission-headroom S (hkv's ManagerConfig::admission_headroom_steps), an admission
    also leaves ceil(S * running / block_tokens) blocks free beyond its own, where running counts
    the requests admitted before it (this step's included); with nothing running it needs none.
  * A step where nothing runs and the head of `waiting` still cannot be admitted is an error: with
    every block free it never will be (hkv simulate stops there too; replay.md is silent).

Usage: replay_reference.py TRACE.jsonl --num-blocks N [--block-tokens 16] [--budget 8192]
         [--max-running 1024] [--max-model-len 16384] [--csv OUT.csv] [--publish-at-allocate]
         [--admission-headroom 0]
--num-blocks counts the null block: pass hkv's reported num_blocks + 1.
"""
import argparse
import collections
import json
import sys


class Pool:
    def __init__(self, num_blocks):
        self.usable = num_blocks - 1
        self.ref = [0] * num_blocks
        self.ident = [None] * num_blocks
        self.index = {}  # identity -> block
        self.free = collections.OrderedDict((b, None) for b in range(1, num_blocks))

    def take_front(self):
        b, _ = self.free.popitem(last=False)
        if self.ident[b] is not None:  # evict the cached prefix it held
            del self.index[self.ident[b]]
            self.ident[b] = None
        self.ref[b] = 1
        return b

    def acquire_cached(self, b):
        if self.ref[b] == 0:
            del self.free[b]
        self.ref[b] += 1

    def release(self, blocks):
        """blocks: a request's table; released last block first."""
        to_front = []
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] > 0:
                continue
            if self.ident[b] is None:
                to_front.append(b)
            else:
                self.free[b] = None  # back: evicted last
        for b in reversed(to_front):  # the request's last uncached block ends up at the front
            self.free[b] = None
            self.free.move_to_end(b, last=False)

    def publish(self, b, identity, take_over=True):
        if self.ident[b] is not None:
            return
        old = self.index.get(identity)
        if old is not None:
            if self.ref[old] > 0 or not take_over:  # this copy stays private
                return
            # A free copy would be evicted before this one is freed: the identity moves to this
            # one, and the old copy, caching nothing now, goes to the front.
            self.ident[old] = None
            self.free.move_to_end(old, last=False)
        self.ident[b] = identity
        self.index[identity] = b


class Req:
    def __init__(self, spec):
        self.spec = spec
        self.tokens = list(spec["prompt"])
        self.outputs = 0
        self.computed = 0
        self.table = []
        self.published = 0  # leading blocks already considered for publishing
        self.ahead = 0  # blocks published at Allocate in the open step start here
        self.chain = []  # identities of the full blocks of self.tokens
        self.admitted = False


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--num-blocks", type=int, required=True, help="including the null block")
    ap.add_argument("--block-tokens", type=int, default=16)
    ap.add_argument("--budget", type=int, default=8192)
    ap.add_argument("--max-running", type=int, default=1024)
    ap.add_argument("--max-model-len", type=int, default=16384)
    ap.add_argument("--csv")
    ap.add_argument("--publish-at-allocate", action="store_true")
    ap.add_argument("--admission-headroom", type=int, default=0, help="decode steps")
    a = ap.parse_args()
    bs = a.block_tokens

    with open(a.trace) as f:
        reqs = [Req(json.loads(line)) for line in f if line.strip()]
    for r in reqs:
        if "output" not in r.spec and r.spec["output_len"] > 0:
            sys.exit("trace without explicit outputs: not supported by this reference")

    interned = {}  # (parent identity, block tokens) -> identity

    def chain(r):  # identities of every full block of r.tokens
        while len(r.chain) < len(r.tokens) // bs:
            j = len(r.chain)
            key = (r.chain[-1] if j else -1, tuple(r.tokens[j * bs:(j + 1) * bs]))
            r.chain.append(interned.setdefault(key, len(interned)))
        return r.chain

    def blocks_for(tokens):
        return -(-tokens // bs)

    pool = Pool(a.num_blocks)
    waiting = collections.deque()
    running = []
    rows = []
    tot = collections.Counter()
    nxt, s = 0, 0

    def publish_through(r, end, take_over=True):  # every full block below `end` not yet published
        ids = chain(r)
        full = end // bs
        for j in range(r.published, full):
            pool.publish(r.table[j], ids[j], take_over)
        r.published = max(r.published, full)

    def scheduled(r, n):
        sched.append((r, n))
        r.ahead = r.published
        if a.publish_at_allocate:
            publish_through(r, min(r.computed + n, len(r.tokens)), take_over=False)

    def evict(r):  # preemption or finish: give back every block
        pool.release(r.table)
        r.table, r.computed, r.published = [], 0, 0

    while nxt < len(reqs) or waiting or running:
        while nxt < len(reqs) and reqs[nxt].spec["arrival_step"] <= s:
            waiting.append(reqs[nxt])
            nxt += 1
        if not waiting and not running:
            s = reqs[nxt].spec["arrival_step"]
            continue
        budget, preempted, sched = a.budget, 0, []
        step_hits = 0
        # 1. running requests; preempt from the back on a failed allocation
        i, stop = 0, False
        while i < len(running) and not stop:
            r = running[i]
            i += 1
            n = min(len(r.tokens) - r.computed, budget, a.max_model_len - 1 - r.computed)
            while n > 0:
                extra = blocks_for(r.computed + n) - len(r.table)
                if extra <= len(pool.free):
                    r.table += [pool.take_front() for _ in range(extra)]
                    budget -= n
                    scheduled(r, n)
                    break
                victim = running.pop()
                evict(victim)
                waiting.appendleft(victim)
                preempted += 1
                if victim is r:  # it preempted itself: no one after it runs this step
                    stop = True
                    break
        # 2. admissions, only when nothing was preempted this step
        while not preempted and waiting and budget > 0 and len(running) < a.max_running:
            r = waiting[0]
            ids = chain(r)
            k = 0
            while k < (len(r.tokens) - 1) // bs and ids[k] in pool.index:
                k += 1
            hits = [pool.index[ids[j]] for j in range(k)]
            fresh = blocks_for(len(r.tokens)) - k  # the whole prompt must fit
            headroom = -(-a.admission_headroom * len(running) // bs)
            if sum(pool.ref[b] == 0 for b in hits) + fresh + headroom > len(pool.free):
                break
            for b in hits:
                pool.acquire_cached(b)
            r.table = hits + [pool.take_front() for _ in range(fresh)]
            r.published = k
            r.computed = k * bs
            n = min(len(r.tokens) - r.computed, budget)
            budget -= n
            waiting.popleft()
            running.append(r)
            scheduled(r, n)
            if not r.admitted:
                r.admitted = True
                tot["first_tokens"] += len(r.tokens)
                tot["first_hits"] += k * bs
            tot["tokens"] += len(r.tokens)
            tot["hits"] += k * bs
            step_hits += k * bs
        if not preempted and not running and waiting:  # tried with everything free: never fits
            r = waiting[0]
            sys.exit("replay: request %d (%d tokens) does not fit in the pool even with nothing "
                     "else running" % (r.spec["id"], len(r.tokens)))
        used = pool.usable - len(pool.free)
        row = [s, len(running), len(waiting), used, len(pool.index), step_hits, preempted, 0]
        tot["peak_blocks"] = max(tot["peak_blocks"], used)
        tot["peak_running"] = max(tot["peak_running"], len(running))
        # 3. commit: publish every full computed block
        for r, n in sched:
            r.computed += n
            row[7] += n
            ids = chain(r)
            for j in range(r.ahead, min(r.published, r.computed // bs)):
                pool.publish(r.table[j], ids[j])  # computed now: may take over a free block's
            publish_through(r, r.computed)
        # 4. outputs and finishing, in scheduling order
        for r, n in sched:
            if r.computed < len(r.tokens):
                continue
            if r.outputs < r.spec["output_len"]:
                r.tokens.append(r.spec["output"][r.outputs])
                r.outputs += 1
            if r.outputs >= r.spec["output_len"]:
                running.remove(r)
                evict(r)
        tot["preemptions"] += preempted
        tot["scheduled"] += row[7]
        tot["steps"] += 1
        rows.append(row)
        s += 1

    result = {
        "steps": tot["steps"],
        "preemptions": tot["preemptions"],
        "hit_rate": tot["first_hits"] / tot["first_tokens"] if tot["first_tokens"] else 0.0,
        "hit_rate_incl_readmissions": tot["hits"] / tot["tokens"] if tot["tokens"] else 0.0,
        "peak_blocks_used": tot["peak_blocks"],
        "peak_running": tot["peak_running"],
        "scheduled_tokens": tot["scheduled"],
        "num_blocks": pool.usable,
    }
    print(json.dumps(result, indent=2))
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("step,running,waiting,blocks_used,cached_blocks,hit_tokens,preemptions,"
                    "scheduled_tokens\n")
            for row in rows:
                f.write(",".join(map(str, row)) + "\n")


if __name__ == "__main__":
    main()
