#!/usr/bin/python3
"""hybridkv.vllm against vLLM's own KV cache manager, side by side, and call-log recording.

Both runs use the scheduler loop of ../shared/vllm_reference/run_vllm_manager.py (vLLM's
scheduler rules restated over vLLM's real request and manager classes) on the same trace, in
one process; the only difference is the manager class the loop constructs.

  compare  run each config with vLLM's manager, then with hybridkv.vllm.KVCacheManager: every
           request's row (arrival, first step, hit tokens, preemptions, finish), the digests
           of finish order and of every block id handed out, steps, preemptions and peaks must
           be equal; prints manager time per step for both and the ratio. Exit 1 on a
           difference.
  record   run vLLM's manager with every manager call logged (arguments, the request state it
           read, results, KV events) to DIR/<config>.jsonl.gz: the test data that
           tests/vllm_logs replays against the adapter without vLLM.

Needs vLLM's source at VLLM_SRC (default /tmp/vllm_src/vllm; see the reference README) and the
hybridkv package on PYTHONPATH (build/<preset>/python).

  PYTHONPATH=build/release/python /usr/bin/python3 scripts/vllm_adapter.py compare \
      --trace /tmp/t.jsonl --config all --kv-gib 8
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Not this folder (its vllm/ test tooling would shadow the vllm package), but the replay's
# module, whose event rows the recorder writes. Both are imported after load_reference() has put
# vLLM on the path, so hybridkv.vllm binds to vLLM's own classes.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(__file__)]
sys.path.append(os.path.join(ROOT, "python", "tests"))

REFERENCE = os.environ.get(
    "HKV_VLLM_REFERENCE", os.path.join(os.path.dirname(ROOT), "shared", "vllm_reference"))


def load_reference():
    spec = importlib.util.spec_from_file_location(
        "run_vllm_manager", os.path.join(REFERENCE, "run_vllm_manager.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def reference_args(opts):
    # The reference script's options (its defaults, see its --help), as run_one reads them.
    return argparse.Namespace(
        block_size=16, kv_gib=float(opts.kv_gib), max_model_len=16384, budget=8192,
        max_num_seqs=1024, no_reserve_full_isl=False, mamba_cache_mode="all",
        hash_algo="sha256", log_stats=False, repeat=1, log_dir="", digest=True)


def read_requests(path):
    with open(path) as f:
        return f.read()


def run(ref, name, args, trace, manager_cls, log_dir):
    ref.KVCacheManager = manager_cls
    args.log_dir = log_dir
    return ref.run_one(name, args, trace)


KEYS = ("steps", "preemptions", "prefix_hit_tokens", "prompt_tokens", "peak_blocks_used",
        "peak_running", "scheduled_tokens", "finished", "finish_order_digest",
        "block_id_digest", "alloc_failures")


def compare(ref, args, trace, configs, out_dir):
    import hybridkv.vllm as hv

    vllm_cls = ref.KVCacheManager
    rows = []
    bad = 0
    for name in configs:
        try:
            a = run(ref, name, args, trace, vllm_cls, os.path.join(out_dir, "vllm"))
        except Exception as e:  # vLLM's own refusal (memory below one max-length request)
            b_err = None
            try:
                run(ref, name, args, trace, hv.KVCacheManager, os.path.join(out_dir, "hkv"))
            except Exception as e2:
                b_err = e2
            same = b_err is not None
            rows.append((name, "refused", str(e)[:60], same))
            bad += not same
            continue
        b = run(ref, name, args, trace, hv.KVCacheManager, os.path.join(out_dir, "hkv"))
        diffs = [k for k in KEYS if a[k] != b[k]]
        ra = read_requests(os.path.join(out_dir, "vllm", name, "requests.csv"))
        rb = read_requests(os.path.join(out_dir, "hkv", name, "requests.csv"))
        if ra != rb:
            la, lb = ra.splitlines(), rb.splitlines()
            first = next((i for i, (x, y) in enumerate(zip(la, lb)) if x != y), None)
            diffs.append(f"requests.csv line {first}: {la[first]} vs {lb[first]}"
                         if first is not None else "requests.csv length")
        bad += bool(diffs)
        rows.append((name, a, b, diffs))
    print(f"| config | steps | preemptions | hit rate | vLLM µs/step | hybridkv µs/step | "
          f"ratio | differences |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        if row[1] == "refused":
            print(f"| {row[0]} | refused by both: {row[3]} | | | | | | {row[2]} |")
            continue
        name, a, b, diffs = row
        ratio = a["mgr_us_per_step_mean"] / max(b["mgr_us_per_step_mean"], 1e-9)
        print(f"| {name} | {a['steps']} | {a['preemptions']} | {a['prefix_hit_rate']:.3f} | "
              f"{a['mgr_us_per_step_mean']:.1f} | {b['mgr_us_per_step_mean']:.1f} | "
              f"{ratio:.1f}x | {'none' if not diffs else '; '.join(map(str, diffs))} |")
    return bad


class Recorder:
    """vLLM's own KVCacheManager with every call written down (see the module docstring)."""

    cls = None  # vLLM's class, set by record()
    sink = None  # open gzip file
    header = None
    full = False  # every call's result and events in full, not only each step's digest
    last = None

    def __init__(self, **kwargs):
        kwargs["enable_kv_cache_events"] = True
        self._m = Recorder.cls(**kwargs)
        cfg = kwargs["kv_cache_config"]
        groups = []
        for g in cfg.kv_cache_groups:
            s = g.kv_cache_spec
            groups.append({"spec": type(s).__name__, "block_size": s.block_size,
                           "sliding_window": getattr(s, "sliding_window", None),
                           "attention_chunk_size": getattr(s, "attention_chunk_size", None),
                           "mamba_cache_mode": getattr(s, "mamba_cache_mode", None)})
        head = dict(Recorder.header)
        head.update(groups=groups, num_blocks=cfg.num_blocks,
                    max_model_len=kwargs["max_model_len"],
                    hash_block_size=kwargs["hash_block_size"],
                    max_num_batched_tokens=kwargs["max_num_batched_tokens"],
                    enable_caching=kwargs.get("enable_caching", True))
        self._write(head)
        self._seen = {}   # raw hash -> canonical index (order of first sight)
        self._ints = {}   # the 64-bit event form of a hash -> the same index
        self._last_lookup = {}
        self._digest = self._event_digest = 0
        Recorder.last = self

    def __getattr__(self, name):
        return getattr(self._m, name)

    def _write(self, obj):
        Recorder.sink.write((json.dumps(obj, separators=(",", ":")) + "\n").encode())

    def _see(self, request):
        for h in request.block_hashes:
            if h not in self._seen:
                self._seen[h] = len(self._seen)
                self._ints[int.from_bytes(h, "big") & ((1 << 64) - 1)] = self._seen[h]

    def _hash(self, value):
        return self._ints[value] if isinstance(value, int) else self._seen[value]

    def _events(self):
        from vllm_call_log import event_rows

        return event_rows(self._m.take_events(), self._hash)

    def _log(self, method, request, args, out, rid=None):
        from vllm_call_log import step_digest

        rec = {"m": method}
        if request is not None:
            rec.update(r=request.request_id, nt=request.num_tokens, nc=request.num_computed_tokens)
        elif rid is not None:
            rec["r"] = rid
        if args:
            rec["a"] = args
        ev = self._events()
        self._digest = step_digest(self._digest, out)
        if ev:
            self._event_digest = step_digest(self._event_digest, ev)
        if Recorder.full:
            rec["o"] = out
            if ev:
                rec["e"] = ev
        self._write(rec)

    def _marker(self, kind):
        rec = {"m": kind, "d": self._digest}
        if self._event_digest:
            rec["e"] = self._event_digest
        self._write(rec)
        self._digest = self._event_digest = 0

    def finish(self):
        self._marker("end")

    @staticmethod
    def _ids(blocks):
        return None if blocks is None else [[b.block_id for b in g] for g in blocks.blocks]

    def get_computed_blocks(self, request):
        self._see(request)
        blocks, n = self._m.get_computed_blocks(request)
        self._last_lookup[request.request_id] = self._ids(blocks)
        self._log("get_computed_blocks", request, None, [self._ids(blocks), n])
        return blocks, n

    def allocate_slots(self, request, num_new_tokens, num_new_computed_tokens=0,
                       new_computed_blocks=None, num_lookahead_tokens=0,
                       num_external_computed_tokens=0, delay_cache_blocks=False,
                       num_encoder_tokens=0, full_sequence_must_fit=False):
        self._see(request)
        # Only arguments that differ from vLLM's defaults; computed blocks that are the
        # request's last lookup result are written as "lookup".
        args = {"num_new_tokens": num_new_tokens}
        if new_computed_blocks is not None:
            ids = self._ids(new_computed_blocks)
            args["new_computed_blocks"] = \
                "lookup" if ids == self._last_lookup.get(request.request_id) else ids
        for key, value, default in (
                ("num_new_computed_tokens", num_new_computed_tokens, 0),
                ("num_lookahead_tokens", num_lookahead_tokens, 0),
                ("num_external_computed_tokens", num_external_computed_tokens, 0),
                ("delay_cache_blocks", delay_cache_blocks, False),
                ("num_encoder_tokens", num_encoder_tokens, 0),
                ("full_sequence_must_fit", full_sequence_must_fit, False)):
            if value != default:
                args[key] = value
        out = self._m.allocate_slots(request, num_new_tokens, num_new_computed_tokens,
                                     new_computed_blocks, num_lookahead_tokens,
                                     num_external_computed_tokens, delay_cache_blocks,
                                     num_encoder_tokens, full_sequence_must_fit)
        self._log("allocate_slots", request, args, self._ids(out))
        return out

    def free(self, request):
        self._m.free(request)
        self._log("free", request, None, None)

    def get_blocks(self, request_id):
        out = self._m.get_blocks(request_id)
        self._log("get_blocks", None, None, self._ids(out), rid=request_id)
        return out

    def get_num_common_prefix_blocks(self, request_id):
        out = self._m.get_num_common_prefix_blocks(request_id)
        self._log("get_num_common_prefix_blocks", None, None, list(out), rid=request_id)
        return out

    def take_new_block_ids(self):
        out = self._m.take_new_block_ids()
        self._log("take_new_block_ids", None, None, list(out))
        return out

    def new_step_starts(self):
        # Each step marker carries the digest of the results and events of the step before.
        self._m.new_step_starts()
        self._marker("step")


def record(ref, args, trace, configs, out_dir, trace_params):
    Recorder.cls = ref.KVCacheManager
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for name in configs:
        path = os.path.join(out_dir, f"{name}.jsonl.gz")
        Recorder.header = {"config": name, "kv_gib": args.kv_gib, "trace": trace_params}
        with gzip.open(path, "wb", compresslevel=9) as f:
            Recorder.sink = f
            try:
                res = run(ref, name, args, trace, Recorder, "")
                Recorder.last.finish()
            except Exception as e:  # vLLM refuses this memory size
                rows.append((name, f"refused: {str(e)[:80]}"))
                f.close()
                os.remove(path)
                continue
        rows.append((name, f"{res['steps']} steps, {res['preemptions']} preemptions, "
                           f"hit rate {res['prefix_hit_rate']:.3f}, "
                           f"{os.path.getsize(path) // 1024} KiB"))
    for name, text in rows:
        print(f"{name}: {text}")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["compare", "record"])
    ap.add_argument("--trace", help="a replay.md trace file")
    ap.add_argument("--gen", help="REQUESTS:SEED:GAP: make the trace with hybridkv's generator "
                                  "(what record stores, so the replay can make it again)")
    ap.add_argument("--config", default="all")
    ap.add_argument("--kv-gib", default="16")
    ap.add_argument("--out-dir", default="/tmp/hkv_vllm_adapter")
    ap.add_argument("--full", action="store_true",
                    help="record: every call's result and events, not only per-step digests")
    opts = ap.parse_args()

    ref = load_reference()
    args = reference_args(opts)
    trace_params = None
    if opts.gen:
        import hybridkv

        n, seed, gap = opts.gen.split(":")
        trace_params = {"requests": int(n), "seed": int(seed), "session_gap": float(gap)}
        trace = hybridkv.generate_trace(**trace_params)
        for r in trace:
            r["prompt"] = [int(t) for t in r["prompt"]]
            r["output"] = [int(t) for t in r["output"]]
    else:
        trace = ref.load_trace(opts.trace)
    configs = list(ref.CONFIGS) if opts.config == "all" else opts.config.split(",")
    t0 = time.time()
    if opts.mode == "record":
        if trace_params is None:
            ap.error("record needs --gen (the log stores the trace's parameters, not the trace)")
        Recorder.full = opts.full
        record(ref, args, trace, configs, opts.out_dir, trace_params)
        return 0
    bad = compare(ref, args, trace, configs, opts.out_dir)
    print(f"\n{len(configs)} configs, {bad} differing, {time.time() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
