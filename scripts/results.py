#!/usr/bin/python3
"""Regenerates every result table of docs/results.md from the repository alone.

Traces come from `hkv trace gen` (seeded), figures from `hkv simulate --json`; nothing is typed
in by hand. Called by scripts/results.sh, which
builds the release CLI first. Manager times are measured side by side in one run per table row;
on a shared machine only their ratios mean something.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = {
    "Llama-3.1-8B": "meta-llama--Llama-3.1-8B",
    "Gemma-2-9B": "google--gemma-2-9b",
    "Gemma-3-4B": "google--gemma-3-4b-it",
    "gpt-oss-20b": "openai--gpt-oss-20b",
    "Bamba-9B": "ibm-ai-platform--Bamba-9B",
    "Qwen3-Next-80B": "Qwen--Qwen3-Next-80B-A3B-Instruct",
    "Jamba-v0.1": "ai21labs--Jamba-v0.1",
}


class Runner:
    def __init__(self, hkv: str, work: str):
        self.hkv, self.work = hkv, work
        self.traces: dict[tuple, str] = {}

    def trace(self, requests: int, seed: int, gap: int) -> str:
        key = (requests, seed, gap)
        if key not in self.traces:
            path = os.path.join(self.work, f"t_{requests}_{seed}_{gap}.jsonl")
            subprocess.run([self.hkv, "trace", "gen", "--requests", str(requests), "--seed",
                            str(seed), "--session-gap", str(gap), "-o", path], check=True,
                           capture_output=True)
            self.traces[key] = path
        return self.traces[key]

    def simulate(self, model: str, trace: str | None, memory: str, allocator: str) -> dict:
        cmd = [self.hkv, "simulate", os.path.join(ROOT, "models", MODELS[model]), "--memory",
               memory, "--allocator", allocator, "--json"]
        if trace:
            cmd += ["--trace", trace]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode not in (0, 1):
            sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr}")
        return {r["allocator"]: r for r in json.loads(p.stdout)["runs"]}


def cell(run: dict | None, fmt: str = "{preemptions} / {hit_rate:.3f}") -> str:
    if run is None:
        return "-"
    if "error" in run:
        return "refused" if "vLLM refuses" in run["error"] else "n/a"
    return fmt.format(**run)


def default_trace_table(r: Runner) -> list[str]:
    out = ["| model | allocator | block | steps | preemptions | hit rate | ideal | peak running |"
           " scheduled tokens | splits/step |", "|---|---|---|---|---|---|---|---|---|---|"]
    for model in ("Gemma-2-9B", "Bamba-9B"):
        runs = r.simulate(model, None, "16GiB", "all")
        for name in ("vllm", "uniform", "padded", "hybridkv"):
            x = runs[name]
            out.append(f"| {model} | {name} | {x['block_tokens']} | {x['steps']} | "
                       f"{x['preemptions']} | {x['hit_rate']:.4f} | {x['ideal_hit_rate']:.4f} | "
                       f"{x['peak_running']} | {x['scheduled_tokens']:,} | "
                       f"{x['state_splits']['per_step']:.3f} |")
    return out


def load_sweep_table(r: Runner) -> list[str]:
    out = ["| session gap | vllm | uniform | padded | hybridkv |", "|---|---|---|---|---|"]
    for gap in (50, 100, 150, 200, 300):
        runs = r.simulate("Gemma-2-9B", r.trace(1000, 7, gap), "16GiB", "all")
        out.append(f"| {gap} | " + " | ".join(cell(runs.get(a)) for a in
                                                ("vllm", "uniform", "padded", "hybridkv")) + " |")
    return out


def pressure_table(r: Runner, gap: int) -> tuple[list[str], list[str]]:
    trace = r.trace(1000, 3, gap)
    sizes = ("2GiB", "4GiB", "8GiB", "16GiB")
    head = "| model | " + " | ".join(f"{s} vllm | {s} hybridkv" for s in sizes) + " |"
    out = [head, "|---|" + "---|" * (2 * len(sizes))]
    times = ["| model | memory | vllm µs/step | hybridkv µs/step | ratio |", "|---|---|---|---|---|"]
    for model in MODELS:
        cells = []
        for size in sizes:
            runs = r.simulate(model, trace, size, "all")
            cells += [cell(runs.get("vllm")), cell(runs.get("hybridkv"))]
            v, h = runs.get("vllm"), runs.get("hybridkv")
            if size == "16GiB" and v and h and "error" not in v and "error" not in h:
                vm = v["manager_us_per_step"]["mean"]
                hm = h["manager_us_per_step"]["mean"]
                times.append(f"| {model} | {size} | {vm:.1f} | {hm:.1f} | {hm / vm:.2f} |")
        out.append(f"| {model} | " + " | ".join(cells) + " |")
    return out, times


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hkv", default=os.path.join(ROOT, "build", "release", "tools", "hkv", "hkv"))
    args = ap.parse_args()
    t0 = time.time()
    with tempfile.TemporaryDirectory() as work:
        r = Runner(args.hkv, work)
        a = default_trace_table(r)
        b = load_sweep_table(r)
        c50, times = pressure_table(r, 50)
        c150, _ = pressure_table(r, 150)
    elapsed = time.time() - t0

    main_tables = [
        "### Default trace, 16 GiB (`hkv simulate MODEL`: 1000 requests, seed 7, a session every "
        "150 steps)", "", *a, "",
        "### Under memory pressure: vLLM against hybridkv (preemptions / hit rate)", "",
        "`hkv trace gen --requests 1000 --seed 3 --session-gap 50` (overloaded), "
        "`hkv simulate MODEL --trace T --memory M`; `refused`: vLLM does not start with that "
        "memory (one max-length request does not fit).", "", *c50, "",
    ]
    results = [
        "# Results", "",
        "Every table here is written by `scripts/results.sh` (this run took "
        f"{elapsed:.0f} s after the build); do not edit by hand. Figures are deterministic "
        "except manager times.", "",
        "`vllm` is vLLM v1's own KV cache manager and scheduler rules (held equal to the real "
        "vLLM request by request: docs/sim.md); `uniform`, `padded` and `hybridkv` are hkv's "
        "manager under three allocator modes. Hit rate = prompt tokens served from the cache at "
        "each request's first admission / prompt tokens; ideal = the same with an infinite cache at "
        "the mode's hit granularity; splits/step = recurrent checkpoints inside prefill chunks per "
        "step (hkv caps them at 2 per request and step; vLLM has none by construction).", "",
        *main_tables,
        "### The same, a session every 150 steps (moderate load)", "", *c150, "",
        "### Load sweep, Gemma-2-9B, 16 GiB (preemptions / hit rate)", "",
        "`hkv trace gen --requests 1000 --seed 7 --session-gap G`.", "", *b, "",
        "### Manager time per step, overloaded trace, 16 GiB", "",
        "Mean over steps of the time inside manager calls (every call an engine makes per step, "
        "state calls included), both modes in one `hkv simulate` run on the same machine. "
        "Absolute times on a shared 2-core machine are noise; the ratio is the figure.", "",
        *times, "",
    ]
    with open(os.path.join(ROOT, "docs", "results.md"), "w") as f:
        f.write("\n".join(results))
    print("\n".join(results))
    print(f"results: docs/results.md written in {elapsed:.0f} s")


if __name__ == "__main__":
    main()
