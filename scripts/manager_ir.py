#!/usr/bin/python3
"""Instructions the manager executes per replay step, counted by callgrind: a figure that does not
move with the load of a shared machine, for comparing two builds of `hkv` on one trace.

For each model it runs `hkv simulate --allocator hybridkv` of each binary under
`valgrind --tool=callgrind` and sums the inclusive instruction counts (Ir) of the public
KvCacheManager calls the replay times (AddRequest, Lookup, Allocate, TakeStepInputs, Commit,
AppendTokens, Free, Compact, CompactFor) and of CompactionDue (the Usage calls it makes included), per replay
step. Times on the
2-core shared machines move by up to 2x between runs of one binary; instruction counts are
exact, though they weigh a cache miss like an add, so they complement `scripts/bench_compare.py`
and `scripts/manager_speed.py` rather than replace them. Needs valgrind (apt-get install valgrind);
each replay takes a minute or two under it.

  scripts/manager_ir.py BEFORE_HKV AFTER_HKV [--models a,b] [--requests 2000] [--seed 3]
                        [--gap 50] [--gib 16]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODELS = [
    "meta-llama--Llama-3.1-8B", "google--gemma-2-9b", "google--gemma-3-4b-it",
    "openai--gpt-oss-20b", "ibm-ai-platform--Bamba-9B", "Qwen--Qwen3-Next-80B-A3B-Instruct",
    "ai21labs--Jamba-v0.1"]
CALLS = ("AddRequest", "Lookup", "Allocate", "TakeStepInputs", "Commit", "AppendTokens", "Free",
         "Compact", "CompactFor")
LINE = re.compile(r"^\s*([\d,]+)\s.*?(hkv::KvCacheManager::(\w+)\(|hkv::CompactionDue\()")


def measure(binary: str, model: str, trace: str, gib: int, work: str) -> tuple[dict, int]:
    out = os.path.join(work, "callgrind.out")
    args = [binary, "simulate", os.path.join(ROOT, "models", model), "--trace", trace,
            "--memory", f"{gib}GiB", "--allocator", "hybridkv", "--json"]
    p = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"] + args,
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"callgrind of {binary} on {model} failed:\n{p.stderr[-3000:]}")
    steps = json.loads(p.stdout)["runs"][0]["steps"]
    a = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", out],
                       capture_output=True, text=True, check=True)
    per_call: dict[str, int] = {}
    for line in a.stdout.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        name = m.group(3) or "CompactionDue"
        if m.group(3) is not None and name not in CALLS:
            continue
        per_call[name] = per_call.get(name, 0) + int(m.group(1).replace(",", ""))
    os.remove(out)
    return per_call, steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--gap", type=int, default=50)
    ap.add_argument("--gib", type=int, default=16)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        trace = os.path.join(work, "trace.jsonl")
        subprocess.run([args.after, "trace", "gen", "--requests", str(args.requests), "--seed",
                        str(args.seed), "--session-gap", str(args.gap), "-o", trace], check=True,
                       capture_output=True)
        print(f"Trace: {args.requests} requests, seed {args.seed}, session gap {args.gap}; "
              f"{args.gib} GiB; manager instructions per replay step (callgrind Ir).\n")
        print("| model | before | after | after / before | largest change |")
        print("|---|---|---|---|---|")
        for model in args.models.split(","):
            b, steps_b = measure(args.before, model, trace, args.gib, work)
            a, steps_a = measure(args.after, model, trace, args.gib, work)
            if steps_a != steps_b:
                sys.exit(f"{model}: the two builds replay {steps_b} and {steps_a} steps; compare "
                         "builds that make the same decisions")
            tb, ta = sum(b.values()), sum(a.values())
            moved = max(set(a) | set(b), key=lambda k: abs(a.get(k, 0) - b.get(k, 0)))
            change = (f"{moved} {b.get(moved, 0) / steps_b:,.0f} -> "
                      f"{a.get(moved, 0) / steps_a:,.0f}")
            print(f"| {model} | {tb / steps_b:,.0f} | {ta / steps_a:,.0f} | {ta / tb:.2f} | "
                  f"{change} |", flush=True)


if __name__ == "__main__":
    main()
