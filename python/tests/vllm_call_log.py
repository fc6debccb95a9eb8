"""Replays a call log of vLLM's own KV cache manager (scripts/vllm_adapter.py record) against
hybridkv.vllm.KVCacheManager, without vLLM: every call is made again with the same arguments on a
request in the same state, and its result and its KV events must equal the recorded ones.

The log stores the trace's generator parameters, not the trace: the requests' tokens come from
hybridkv.generate_trace again. Block hashes are a chained SHA-256 of our own (vLLM's hashes are
not stored): hits depend only on which hashes are equal, and events are compared with every hash
replaced by the order in which the run first saw it, on both sides.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import types
import zlib

import hybridkv
from hybridkv.vllm import _standins as v
from hybridkv.vllm import KVCacheManager


def step_digest(digest: int, value) -> int:
    """A running CRC-32 over one step's call results, or over its event rows: what a log stores
    per step ("d" and "e" of the step marker) unless recorded with --full."""
    return zlib.crc32(json.dumps(value, separators=(",", ":")).encode(), digest)


def event_rows(events, hash_index) -> list:
    """KV events as compact rows, the same for the recorder and the replay: ["s", groups, hashes,
    parent, block_size, token count, extra keys, lora id], ["r", groups, hashes], ["c"], every
    hash as its index in the order the run first saw it. Consecutive events equal but for the
    group are one row (vLLM emits one per group of a layer kind)."""
    rows = []
    for e in events:
        kind = type(e).__name__
        if kind == "BlockStored":
            parent = e.parent_block_hash
            row = ["s", [e.group_idx], [hash_index(x) for x in e.block_hashes],
                   None if parent is None else hash_index(parent), e.block_size,
                   len(e.token_ids), e.extra_keys, e.lora_id]
        elif kind == "BlockRemoved":
            row = ["r", [e.group_idx], [hash_index(x) for x in e.block_hashes]]
        else:
            row = ["c"]
        if rows and len(row) > 1 and rows[-1][0] == row[0] and rows[-1][2:] == row[2:]:
            rows[-1][1].append(e.group_idx)
        else:
            rows.append(row)
    return rows


class Request:
    """The fields of vLLM's Request the manager reads, grown to a recorded token count."""

    def __init__(self, rid: str, prompt, output, hash_block_size: int) -> None:
        self.request_id = rid
        self.all_token_ids = [int(t) for t in prompt]
        self._output = [int(t) for t in output]
        self._prompt_len = len(self.all_token_ids)
        self._hbs = hash_block_size
        self.block_hashes: list[bytes] = []
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.skip_reading_prefix_cache = False
        self.lora_request = None
        self.cache_salt = None
        self.mm_features: list = []
        self._hash()

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    def grow_to(self, n: int) -> None:
        if n > self.num_tokens:
            self.all_token_ids.extend(self._output[self.num_tokens - self._prompt_len:
                                                   n - self._prompt_len])
            self._hash()
        assert self.num_tokens == n, (self.request_id, self.num_tokens, n)

    def _hash(self) -> None:
        bs = self._hbs
        parent = self.block_hashes[-1] if self.block_hashes else b"\0" * 32
        for b in range(len(self.block_hashes), self.num_tokens // bs):
            block = self.all_token_ids[b * bs:(b + 1) * bs]
            parent = hashlib.sha256(parent + ",".join(map(str, block)).encode()).digest()
            self.block_hashes.append(parent)


def make_config(head):
    groups = []
    for g in head["groups"]:
        spec = type(g["spec"], (), {})()  # vLLM's spec class, by name
        spec.block_size = g["block_size"]
        spec.sliding_window = g["sliding_window"]
        spec.attention_chunk_size = g["attention_chunk_size"]
        spec.mamba_cache_mode = g["mamba_cache_mode"]
        groups.append(types.SimpleNamespace(kv_cache_spec=spec))
    return types.SimpleNamespace(num_blocks=head["num_blocks"], kv_cache_groups=groups)


def ids_of(blocks):
    if blocks is None:
        return None
    ids = getattr(blocks, "_ids", None)
    if ids is None:
        ids = tuple([b.block_id for b in g] for g in blocks.blocks)
    return [list(g) for g in ids]


class Replay:
    def __init__(self, path: str, events: bool) -> None:
        with gzip.open(path, "rt") as f:
            self.lines = [json.loads(line) for line in f]
        self.head = self.lines[0]
        self.events = events
        trace = hybridkv.generate_trace(**self.head["trace"])
        hbs = self.head["hash_block_size"]
        self.requests = {str(r["id"]): Request(str(r["id"]), r["prompt"], r["output"], hbs)
                         for r in trace}
        self.manager = KVCacheManager(
            make_config(self.head), max_model_len=self.head["max_model_len"],
            hash_block_size=hbs,
            max_num_batched_tokens=self.head["max_num_batched_tokens"],
            enable_caching=self.head["enable_caching"], enable_kv_cache_events=events)
        self.seen: dict[bytes, int] = {}
        self.ints: dict[int, int] = {}
        self.last_lookup: dict[str, object] = {}
        self.calls = 0
        self.steps = 0
        self.differences: list[str] = []
        self.digest = self.event_digest = 0
        self.step_start = 1

    def _see(self, req: Request) -> None:
        for h in req.block_hashes:
            if h not in self.seen:
                self.seen[h] = len(self.seen)
                self.ints[int.from_bytes(h, "big") & ((1 << 64) - 1)] = self.seen[h]

    def _hash(self, value) -> int:
        return self.ints[value] if isinstance(value, int) else self.seen[value]

    def _events(self) -> list:
        return event_rows(self.manager.take_events(), self._hash)

    def _request(self, rec, see: bool = True) -> Request:
        # The recorder numbers hashes when a lookup or allocation reads them; so must we.
        req = self.requests[rec["r"]]
        req.grow_to(rec["nt"])
        req.num_computed_tokens = rec["nc"]
        if see:
            self._see(req)
        return req

    def _check(self, n: int, rec, got) -> None:
        self.digest = step_digest(self.digest, got)
        if "o" in rec and got != rec["o"]:
            self.differences.append(f"call {n} {rec['m']}({rec.get('r', '')}): vLLM "
                                    f"{rec['o']}, hybridkv {got}")
        if not self.events:
            return
        events = self._events()
        if events:
            self.event_digest = step_digest(self.event_digest, events)
        if "o" in rec and events != rec.get("e", []):
            self.differences.append(f"call {n} {rec['m']}({rec.get('r', '')}) events: vLLM "
                                    f"{rec.get('e', [])}, hybridkv {events}")

    def _close_step(self, n: int, rec) -> None:
        calls = f"calls {self.step_start}..{n - 1}"
        if "d" in rec and rec["d"] != self.digest:
            self.differences.append(f"{calls}: results differ from vLLM's (record the log "
                                    "with --full to see which call)")
        if self.events and "d" in rec and rec.get("e", 0) != self.event_digest:
            self.differences.append(f"{calls}: KV events differ from vLLM's (record the log "
                                    "with --full to see which call)")
        self.digest = self.event_digest = 0
        self.step_start = n + 1
        self.steps += 1

    def run(self, check_every: int = 0) -> "Replay":
        m = self.manager
        for n, rec in enumerate(self.lines[1:], 1):
            method = rec["m"]
            self.calls += 1
            if method in ("step", "end"):
                self._close_step(n, rec)
                if method == "step":
                    m.new_step_starts()
                continue
            if method == "get_computed_blocks":
                req = self._request(rec)
                blocks, hit = m.get_computed_blocks(req)
                self.last_lookup[req.request_id] = blocks
                self._check(n, rec, [ids_of(blocks), hit])
            elif method == "allocate_slots":
                req = self._request(rec)
                args = dict(rec["a"])
                computed = args.get("new_computed_blocks")
                if computed == "lookup":
                    args["new_computed_blocks"] = self.last_lookup[req.request_id]
                elif computed is not None:
                    args["new_computed_blocks"] = v.KVCacheBlocks(
                        tuple([v.KVCacheBlock(b) for b in g] for g in computed))
                self._check(n, rec, ids_of(m.allocate_slots(req, **args)))
            elif method == "free":
                m.free(self._request(rec, see=False))
                self._check(n, rec, None)
            elif method == "get_blocks":
                self._check(n, rec, ids_of(m.get_blocks(rec["r"])))
            elif method == "get_num_common_prefix_blocks":
                self._check(n, rec, list(m.get_num_common_prefix_blocks(rec["r"])))
            elif method == "take_new_block_ids":
                self._check(n, rec, list(m.take_new_block_ids()))
            else:
                raise ValueError(f"call {n}: unknown method {method}")
            if check_every and n % check_every == 0:
                m.check_invariants()
        m.check_invariants()
        return self
