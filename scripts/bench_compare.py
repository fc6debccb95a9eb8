#!/usr/bin/env python3
"""Runs two builds of a Google Benchmark program side by side and prints the time of every
benchmark both have, with the ratio after / before.

    scripts/bench_compare.py BEFORE_BIN AFTER_BIN [--filter REGEX] [--rounds 3]

Each round runs BEFORE then AFTER (same filter, same machine, one after the other); the figure
per benchmark is the median over rounds of its real time, so a burst of load on a shared machine
hits both sides alike. Typical use: build the commit before a change into one folder and the
change into another, then compare bench/manager_bench and bench/sim_bench.
"""
import argparse
import json
import statistics
import subprocess
import sys


def run(binary, pattern):
    cmd = [binary, "--benchmark_format=json", f"--benchmark_filter={pattern}"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{binary} failed:\n{out.stderr[-2000:]}")
    times = {}
    for b in json.loads(out.stdout)["benchmarks"]:
        if b.get("error_occurred"):
            continue
        times[b["name"]] = b["real_time"] * {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[
            b.get("time_unit", "ns")]
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--filter", default=".")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    before, after = {}, {}
    for _ in range(args.rounds):
        for name, t in run(args.before, args.filter).items():
            before.setdefault(name, []).append(t)
        for name, t in run(args.after, args.filter).items():
            after.setdefault(name, []).append(t)
    print("| benchmark | before µs | after µs | after / before |")
    print("|---|---|---|---|")
    for name in sorted(set(before) & set(after)):
        b, a = statistics.median(before[name]), statistics.median(after[name])
        print(f"| {name} | {b:.2f} | {a:.2f} | {a / b:.2f} |")
    for name in sorted(set(after) - set(before)):
        print(f"| {name} | - | {statistics.median(after[name]):.2f} | new |")


if __name__ == "__main__":
    main()
