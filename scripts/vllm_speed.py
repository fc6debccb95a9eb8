#!/usr/bin/python3
"""vLLM's real Scheduler with its own KV cache manager and with hybridkv's, side by side.

For each config, scripts/vllm/run_scheduler.py runs vLLM's Scheduler class over the same trace
twice, alternating, `--rounds` times: once as vLLM builds it, once installed the way
`--scheduler-cls hybridkv.vllm.Scheduler` installs it. The outputs must be equal (steps,
preemptions, hit rate, the digest of every request's finish and of every block id handed to the
model runner); the table gives the median manager time per step (time inside the manager's
public methods and KVCacheBlocks.get_block_ids, as that script measures it) and scheduler time
per step of each, and their ratio. Writes docs/vllm_speed.md (or --out).

  /usr/bin/python3 scripts/vllm_speed.py --requests 1000 --seed 3 --session-gap 50 --kv-gib 8
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = ["llama3_8b", "gemma2_9b", "gemma3_4b", "gptoss_20b", "bamba_9b", "bamba_9b_align",
           "qwen3next", "jamba"]
SAME = ("steps", "preemptions", "prefix_hit_rate", "finish_digest", "block_id_digest",
        "scheduled_tokens")


def run(trace, config, kv_gib, scheduler_cls, env):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, os.path.join(ROOT, "scripts", "vllm", "run_scheduler.py"),
               "--trace", trace, "--config", config, "--kv-gib", str(kv_gib),
               "--json-out", out.name]
        if scheduler_cls:
            cmd += ["--scheduler-cls", scheduler_cls]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode != 0:
            return {"error": (p.stderr.strip().splitlines() or ["?"])[-1]}
        return json.load(open(out.name))["results"][0]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--session-gap", type=float, default=50)
    ap.add_argument("--kv-gib", type=float, default=8)
    ap.add_argument("--config", default=",".join(CONFIGS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "vllm_speed.md"))
    opts = ap.parse_args()

    hkv = os.path.join(ROOT, "build", "release", "tools", "hkv", "hkv")
    trace = tempfile.mktemp(suffix=".jsonl")
    subprocess.run([hkv, "trace", "gen", "--requests", str(opts.requests), "--seed",
                    str(opts.seed), "--session-gap", str(opts.session_gap), "-o", trace],
                   check=True, capture_output=True)
    env = dict(os.environ)
    env.setdefault("HKV_PYTHON", os.path.join(ROOT, "build", "release", "python"))
    rows = []
    bad = 0
    t0 = time.time()
    for config in opts.config.split(","):
        runs = {"vllm": [], "hybridkv": []}
        for _ in range(opts.rounds):
            runs["vllm"].append(run(trace, config, opts.kv_gib, None, env))
            runs["hybridkv"].append(run(trace, config, opts.kv_gib, "hybridkv.vllm:Scheduler",
                                        env))
        a, b = runs["vllm"][0], runs["hybridkv"][0]
        if "error" in a or "error" in b:
            same = ("error" in a) == ("error" in b)
            rows.append(f"| {config} | refused by {'both' if same else 'one'}: "
                        f"{(a.get('error') or b.get('error'))[:70]} | | | | | | | |")
            bad += not same
            continue
        diffs = [k for k in SAME if any(r[k] != a[k] for r in runs["vllm"] + runs["hybridkv"])]
        bad += bool(diffs)
        everyone = runs["vllm"] + runs["hybridkv"]
        # The timer's own cost per call, calibrated in every run; one figure (their median)
        # is taken off both sides, which make the same calls.
        overhead = statistics.median(r["timer_overhead_ns"] for r in everyone)
        calls = {k: {r["mgr_calls"] for r in runs[k]} for k in runs}
        for r in everyone:
            r["mgr_net_us"] = (r["mgr_total_s"] * 1e9 - r["mgr_calls"] * overhead) / 1e3 / r["steps"]
        med = {k: {m: statistics.median(r[m] for r in runs[k])
                   for m in ("mgr_us_per_step", "mgr_net_us", "sched_us_per_step")} for k in runs}
        ratio = med["vllm"]["mgr_us_per_step"] / med["hybridkv"]["mgr_us_per_step"]
        net = med["vllm"]["mgr_net_us"] / med["hybridkv"]["mgr_net_us"]
        sched = med["vllm"]["sched_us_per_step"] / med["hybridkv"]["sched_us_per_step"]
        same_calls = calls["vllm"] == calls["hybridkv"] and len(calls["vllm"]) == 1
        if not same_calls:
            diffs.append("manager calls")
            bad += 1
        rows.append(
            f"| {config} | {a['steps']} | {a['preemptions']} | {a['prefix_hit_rate']:.3f} | "
            f"{'equal' if not diffs else 'DIFFER: ' + ', '.join(diffs)} | "
            f"{a['mgr_calls'] / a['steps']:.1f} | "
            f"{med['vllm']['mgr_us_per_step']:.1f} → {med['hybridkv']['mgr_us_per_step']:.1f} "
            f"({ratio:.1f}x) | {overhead:.0f} | "
            f"{med['vllm']['mgr_net_us']:.1f} → {med['hybridkv']['mgr_net_us']:.1f} | "
            f"**{net:.1f}x** | {med['vllm']['sched_us_per_step']:.0f} → "
            f"{med['hybridkv']['sched_us_per_step']:.0f} ({sched:.1f}x) |")
    os.remove(trace)
    text = [
        "# vLLM's Scheduler with hybridkv.vllm, side by side",
        "",
        f"Made by `/usr/bin/python3 scripts/vllm_speed.py --requests {opts.requests} --seed "
        f"{opts.seed} --session-gap {opts.session_gap:g} --kv-gib {opts.kv_gib:g} --rounds "
        f"{opts.rounds}` ({time.time() - t0:.0f} s). vLLM's real `Scheduler` class (pinned "
        "commit of `../shared/vllm_reference`) runs the trace through "
        "`scripts/vllm/run_scheduler.py`, once with vLLM's own KV cache manager and once with "
        "`--scheduler-cls hybridkv.vllm:Scheduler`, alternating; times are medians of the "
        "rounds, on this shared 2-core machine. Outputs: steps, preemptions, hit rate, scheduled "
        "tokens and the digests of every finish and every block id handed to the model runner, "
        "equal in every round of both.",
        "",
        "| config | steps | preemptions | hit rate | outputs | manager calls/step | "
        "manager µs/step as timed, vLLM → hybridkv | timer ns/call | manager µs/step, timer "
        "taken off | manager ratio | scheduler µs/step |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "Manager time is what `run_scheduler.py` measures: time inside the manager's public "
        "methods and `KVCacheBlocks.get_block_ids` (hybridkv's subclasses included), each call "
        "wrapped by a Python timer. The timer's own cost is inside every timed call, the same "
        "on both sides, and it is most of a hybridkv call: each run calibrates it "
        "(`timer_overhead_ns` in `run_scheduler.py`: the mean a wrapped no-op records, less "
        "what the no-op costs unwrapped), and `timer taken off` subtracts the median of those "
        "figures once per call from both sides, which make the same calls (checked: `manager "
        "calls` would be listed as differing). The ratio is of those; the as-timed figures "
        "are beside them. A calibrated no-op runs hot, so the figure taken off is if anything "
        "below what the timer costs between the scheduler's calls.",
    ]
    with open(opts.out, "w") as f:
        f.write("\n".join(text) + "\n")
    print("\n".join(text))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
