#!/usr/bin/python3
"""One allocator mode of two `hkv` builds, side by side over models x memory x load.

Generates the grid's traces (`hkv trace gen --requests R --seed S --session-gap G`, with the
first build), replays each through `hkv simulate MODEL --trace T --memory M --allocator MODE
--json` with both builds, and prints every cell (seeds averaged for hit rates, summed for
preemptions and scheduled tokens) where the two differ, then the sums of the differences. A cell
is marked `<<` when the second build hits less, preempts more or schedules more tokens.

  scripts/mode_diff.py BEFORE_HKV AFTER_HKV [--models M1,M2] [--memory 2,4,8,16]
                       [--gaps 15,50,150,300] [--seeds 1,2] [--requests 1000]
                       [--allocator hybridkv] [--jobs 2]
                       [--before-args "--admission-headroom 0"] [--after-args ...]

The default models are the recurrent hybrids (the ones two-level memory serves); `--models all`
takes every bundled model. --before-args / --after-args add `hkv simulate` options to one side,
so that one build can be compared with itself under another setting. Figures are
deterministic; manager times are not compared.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shlex
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECURRENT = ("ibm-ai-platform--Bamba-9B", "ai21labs--Jamba-v0.1",
             "Qwen--Qwen3-Next-80B-A3B-Instruct")


def simulate(hkv: str, model: str, trace: str, gib: int, allocator: str,
             extra: list[str]) -> dict | None:
    cmd = [hkv, "simulate", os.path.join(ROOT, "models", model), "--trace", trace, "--memory",
           f"{gib}GiB", "--allocator", allocator, "--json"] + extra
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode not in (0, 1):
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
    run = json.loads(p.stdout)["runs"][0]
    return None if "error" in run else run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--models", default=",".join(RECURRENT))
    ap.add_argument("--memory", default="2,4,8,16", help="GiB")
    ap.add_argument("--gaps", default="15,50,150,300")
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--allocator", default="hybridkv")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--before-args", default="", help="extra hkv simulate options, first build")
    ap.add_argument("--after-args", default="", help="extra hkv simulate options, second build")
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if m]
    if models == ["all"]:
        models = sorted(os.listdir(os.path.join(ROOT, "models")))
    sides = [(args.before, shlex.split(args.before_args)),
             (args.after, shlex.split(args.after_args))]
    memories = [int(x) for x in args.memory.split(",")]
    gaps = [int(x) for x in args.gaps.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    with tempfile.TemporaryDirectory() as work:
        traces = {}
        for s in seeds:
            for g in gaps:
                path = os.path.join(work, f"t_{s}_{g}.jsonl")
                subprocess.run([args.before, "trace", "gen", "--requests", str(args.requests),
                                "--seed", str(s), "--session-gap", str(g), "-o", path],
                               check=True, capture_output=True)
                traces[(s, g)] = path
        jobs = [(b, m, gib, g, s) for b in (0, 1) for m in models for gib in memories
                for g in gaps for s in seeds]
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            runs = dict(zip(jobs, pool.map(
                lambda j: simulate(sides[j[0]][0], j[1], traces[(j[4], j[3])], j[2],
                                   args.allocator, sides[j[0]][1]), jobs)))
    total = [0.0, 0, 0.0]
    steps = [0, 0]  # over every cell both builds serve: how long the replays took to drain
    named = [" ".join([hkv] + extra) for hkv, extra in sides]
    print(f"{args.allocator}: {named[0]} -> {named[1]}, seeds {args.seeds} "
          "(hit rate averaged, preemptions and scheduled Mtok summed)")
    for m in models:
        for gib in memories:
            for g in gaps:
                cells = []
                for b in (0, 1):
                    rs = [runs[(b, m, gib, g, s)] for s in seeds]
                    if any(r is None for r in rs):
                        cells.append(None)
                        continue
                    cells.append((sum(r["hit_rate"] for r in rs) / len(rs),
                                  sum(r["preemptions"] for r in rs),
                                  sum(r["scheduled_tokens"] for r in rs) / 1e6,
                                  sum(r["steps"] for r in rs)))
                a, b = cells
                if a is None or b is None:
                    if a != b:
                        print(f"{m} {gib} GiB gap {g}: refused by one build only")
                    continue
                steps[0] += a[3]
                steps[1] += b[3]
                if a[:3] == b[:3]:
                    continue
                worse = b[0] < a[0] - 1e-9 or b[1] > a[1] or b[2] > a[2] + 1e-9
                print(f"{m} {gib} GiB gap {g}: hit {a[0]:.3f} -> {b[0]:.3f}, preemptions "
                      f"{a[1]} -> {b[1]}, scheduled {a[2]:.2f} -> {b[2]:.2f} M"
                      + (" <<" if worse else ""))
                total[0] += b[0] - a[0]
                total[1] += b[1] - a[1]
                total[2] += b[2] - a[2]
    print(f"sum of differences: hit {total[0]:+.3f}, preemptions {total[1]:+d}, scheduled "
          f"{total[2]:+.2f} M")
    if steps[0] > 0:
        print(f"steps to drain every trace: {steps[0]} -> {steps[1]} "
              f"({100.0 * (steps[1] - steps[0]) / steps[0]:+.2f}%)")


if __name__ == "__main__":
    main()
