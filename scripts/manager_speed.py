#!/usr/bin/python3
"""Manager time per step: hybridkv's manager against vLLM's real one, same trace, same run.

For every config of ../shared/vllm_reference/ (vLLM's unmodified KV cache manager; needs its
set-up: python3-torch and VLLM_SRC, see that folder's README) it replays one generated trace
through the reference, then through `hkv simulate --allocator hybridkv` on the bundled model of
the same name, at the same memory, and writes docs/manager_speed.md.

vLLM's figure is the time inside its KV cache manager calls per scheduler step; the block hashing
its Request objects do is reported apart (hash_s) and left out of it. hkv's figure is the time
inside every manager call of a step (the replay times the calls between its own bookkeeping),
block hashing included. Times on a shared 2-core machine are noisy; the ratio of two figures
measured minutes apart in one run is the result.

  scripts/manager_speed.py [--requests 2000] [--seed 3] [--gap 50] [--gib 16] [--hkv BIN]
                           [--hkv-runs 4]
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
REFERENCE = os.path.join(ROOT, "..", "shared", "vllm_reference", "run_vllm_manager.py")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from vllm_conformance import CONFIGS  # noqa: E402  (reference config -> bundled model, mode)


def reference(config: str, trace: str, gib: int, work: str) -> dict:
    out = os.path.join(work, f"{config}.json")
    env = dict(os.environ, PYTHONHASHSEED="0")
    p = subprocess.run(["/usr/bin/python3", REFERENCE, "--config", config, "--trace", trace,
                        "--kv-gib", str(gib), "--out", os.path.join(work, f"{config}.txt"),
                        "--json-out", out, "--log-dir", os.path.join(work, "logs")],
                       capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"reference failed on {config}:\n{p.stderr[-3000:]}")
    return json.load(open(out))["results"][0]


def hkv(binary: str, model: str, trace: str, gib: int) -> dict:
    p = subprocess.run([binary, "simulate", os.path.join(ROOT, "models", model), "--trace", trace,
                        "--memory", f"{gib}GiB", "--allocator", "hybridkv", "--json"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"hkv simulate failed on {model}:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout)["runs"][0]


def find(run: dict, *keys: str) -> float:
    for k in keys:
        if k in run:
            return float(run[k])
    sys.exit(f"the reference's JSON has none of {keys}: {sorted(run)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--gap", type=int, default=50)
    ap.add_argument("--gib", type=int, default=16)
    ap.add_argument("--hkv-runs", type=int, default=4,
                    help="hkv replays per config, half before vLLM's run and half after (median)")
    ap.add_argument("--hkv", default=os.path.join(ROOT, "build", "release", "tools", "hkv", "hkv"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "manager_speed.md"))
    args = ap.parse_args()
    t0 = time.time()
    rows = []
    with tempfile.TemporaryDirectory() as work:
        trace = os.path.join(work, "trace.jsonl")
        subprocess.run([args.hkv, "trace", "gen", "--requests", str(args.requests), "--seed",
                        str(args.seed), "--session-gap", str(args.gap), "-o", trace], check=True,
                       capture_output=True)
        for config, (model, _mode) in CONFIGS.items():
            # hkv's replay takes a second, vLLM's many: hkv runs on both sides of vLLM's run
            # (half before, half after), so a slow or quiet spell of the shared machine falls on
            # both managers; the median stands for the build, the spread is printed.
            def hkv_runs(n: int) -> list[float]:
                return [hkv(args.hkv, model, trace, args.gib)["manager_us_per_step"]["mean"]
                        for _ in range(n)]
            before = hkv_runs(args.hkv_runs // 2)
            ref = reference(config, trace, args.gib, work)
            runs = before + hkv_runs(args.hkv_runs - len(before))
            h = statistics.median(runs)
            spread = (min(runs), max(runs))
            steps = find(ref, "steps")
            v = find(ref, "mgr_us_per_step_mean")
            vh = find(ref, "hash_total_s", "hash_s") * 1e6 / steps
            rows.append((config, model, v, vh, h, spread, v / h, (v + vh) / h))
            print(f"{config}: vLLM {v:.1f} (+{vh:.1f} hashing) us/step, hybridkv {h:.2f} "
                  f"({spread[0]:.2f}-{spread[1]:.2f}): {v / h:.1f}x", flush=True)
    lines = [
        "# Manager time per step: hybridkv against vLLM's real manager", "",
        f"Written by `scripts/manager_speed.py` ({time.time() - t0:.0f} s; do not edit): one "
        f"trace (`hkv trace gen --requests {args.requests} --seed {args.seed} --session-gap "
        f"{args.gap}`), {args.gib} GiB, every config of `../shared/vllm_reference/` (vLLM's "
        "unmodified KV cache manager under its scheduler loop) and `hkv simulate --allocator "
        "hybridkv` on the bundled model of the same name, one after the other in one run "
        f"(hkv: `{os.path.relpath(args.hkv, ROOT)}`; the median of {args.hkv_runs} replays, half "
        "run just before vLLM's and half just after, so that both managers meet the same spell "
        "of the shared machine; their range in brackets).", "",
        "vLLM µs/step: time inside its KV cache manager calls per step (block hashing apart, in "
        "the next column). hybridkv µs/step: time inside every manager call of a step, block "
        "hashing included. Ratio: vLLM's manager time (without its hashing) over hybridkv's "
        "(with); with hashing on both sides in the last column.", "",
        "| config | model | vLLM µs/step | vLLM hashing µs/step | hybridkv µs/step (range) | ratio "
        "| ratio, hashing both |",
        "|---|---|---|---|---|---|---|",
    ]
    for config, model, v, vh, h, spread, ratio, both in rows:
        lines.append(f"| {config} | {model} | {v:.1f} | {vh:.1f} | {h:.2f} ({spread[0]:.2f}-"
                     f"{spread[1]:.2f}) | {ratio:.1f}× | {both:.1f}× |")
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"manager_speed: {args.out} written")


if __name__ == "__main__":
    main()
