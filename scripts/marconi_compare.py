#!/usr/bin/python3
"""hybridkv against Marconi (MLSys 2025), one request at a time, on our own traces.

Marconi's simulator serves a trace sequentially: for each request it matches the prompt's prefix,
then inserts prompt + output. The fair hkv counterpart is the same trace and memory with one
request running at a time (`hkv simulate --max-running 1 --budget 16384`). For each model, memory
and trace seed this runs Marconi's own caches through `../shared/marconi_reference/` - V1 (its
"SGLang+": selective admission, LRU) and V2 (FLOP-aware eviction, alpha tuned online), both with
`--strict` so they stay within the capacity they are given - and every hkv mode, and writes a
markdown page of token hit rates (%). `best Marconi` is the better of the two.

Two more columns separate granularity and accounting from policy. Marconi's replay inserts
prompt + every output token, one token more per request than an engine computes (the last
sampled token is never run through the model, so no KV or state exists for it); `best Marconi,
computed` runs both policies again on the same trace with each request's last output token left
out of what is inserted (the prompts, and so what is looked up, unchanged). Marconi's radix tree
matches any number of tokens, hkv's 16-token blocks a multiple of 16; `hkv hybridkv, 1-token
pages` is the hybridkv mode at `--block-tokens 1`, the granularity Marconi (and an engine with
page size 1) works at, beside `token ideal`, every token the trace's earlier requests computed.

  scripts/marconi_compare.py [--seeds 1,2,3] [--requests 2000] [--jobs 2] [--hkv BIN]
                             [--marconi-dir /tmp/marconi] [--out docs/marconi.md]
                             [--marconi-cache FILE]

Marconi's runs take most of the time (about 50 minutes on 2 cores) and do not depend on hkv:
`--marconi-cache FILE` keeps their results in a JSON file, keyed by model, memory, seed, trace
length and policy, and reuses them on the next run (delete the file to run them again).

Marconi's code (CC BY-NC: run, never copied) must be extracted to --marconi-dir first, as
`../shared/marconi_reference/README.md` shows (`fetch github:ruipeterpan/marconi` gives the git
copy). Hit rates are deterministic; nothing timed is reported.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DRIVER = os.path.join(ROOT, "..", "shared", "marconi_reference", "marconi_driver.py")
# Model folder, Marconi's name for it, memory sizes (GiB): from where hkv is far below its ideal
# to where every policy keeps most of the trace.
MODELS = (
    ("ibm-ai-platform--Bamba-9B", "bamba", (2, 4, 8, 16)),
    ("ai21labs--Jamba-v0.1", "jamba", (0.5, 1, 2, 4)),
    ("Qwen--Qwen3-Next-80B-A3B-Instruct", "qwen3next", (2, 4, 8, 16)),
)
HKV_MODES = ("vllm", "padded", "hybridkv")


def gen_trace(hkv: str, work: str, requests: int, seed: int) -> str:
    path = os.path.join(work, f"t_{requests}_{seed}.jsonl")
    subprocess.run([hkv, "trace", "gen", "--requests", str(requests), "--seed", str(seed), "-o",
                    path], check=True, capture_output=True)
    return path


def computed_trace(trace: str) -> str:
    """The trace with each request's last output token left out: what Marconi's replay inserts is
    then what an engine computed. The prompts stay as they are."""
    path = trace.replace(".jsonl", "_computed.jsonl")
    with open(trace) as src, open(path, "w") as dst:
        for line in src:
            r = json.loads(line)
            r["output"] = r["output"][:-1]
            r["output_len"] = len(r["output"])
            dst.write(json.dumps(r) + "\n")
    return path


def run_marconi(name: str, gib: float, policy: str, trace: str, marconi_dir: str) -> float:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, DRIVER, "--model", name, "--gib", str(gib), "--policy", policy,
               "--trace", trace, "--strict", "--out", out.name]
        env = dict(os.environ, MARCONI_DIR=marconi_dir)
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if p.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
        with open(out.name) as f:
            return json.load(f)["token_hit_rate"]


def run_hkv(hkv: str, model: str, gib: float, trace: str) -> dict:
    def simulate(allocator: str, *extra: str) -> dict:
        cmd = [hkv, "simulate", os.path.join(ROOT, "models", model), "--trace", trace, "--memory",
               f"{int(gib * 1024)}MiB", "--max-running", "1", "--budget", "16384", "--allocator",
               allocator, "--json", *extra]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode not in (0, 1):
            sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
        return {r["allocator"]: r for r in json.loads(p.stdout)["runs"]}

    runs = simulate("all")
    out = {m: (None if "error" in runs[m] else runs[m]["hit_rate"]) for m in HKV_MODES}
    fine = simulate("hybridkv", "--block-tokens", "1")["hybridkv"]
    out["fine"] = None if "error" in fine else fine["hit_rate"]
    out["token_ideal"] = None if "error" in fine else fine["ideal_hit_rate"]
    return out


def pct(x: float | None, digits: int = 1) -> str:
    return "refused" if x is None else f"{100 * x:.{digits}f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--hkv", default=os.path.join(ROOT, "build", "release", "tools", "hkv", "hkv"))
    ap.add_argument("--marconi-dir", default=os.environ.get("MARCONI_DIR", "/tmp/marconi"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "marconi.md"))
    ap.add_argument("--marconi-cache", default=None)
    args = ap.parse_args()
    cache: dict[str, float] = {}
    if args.marconi_cache and os.path.exists(args.marconi_cache):
        with open(args.marconi_cache) as f:
            cache = json.load(f)
    if not os.path.exists(os.path.join(args.marconi_dir, "radix_cache_hybrid.py")):
        sys.exit(f"Marconi's code is not in {args.marconi_dir}: see "
                 "../shared/marconi_reference/README.md")
    seeds = [int(x) for x in args.seeds.split(",")]
    t0 = time.time()
    with tempfile.TemporaryDirectory() as work:
        traces = {s: gen_trace(args.hkv, work, args.requests, s) for s in seeds}
        computed = {s: computed_trace(t) for s, t in traces.items()}
        jobs = []
        for model, name, memories in MODELS:
            for gib in memories:
                for s in seeds:
                    for policy in ("v1", "v2", "v1 computed", "v2 computed"):
                        jobs.append(("marconi", model, gib, s, policy))
                    jobs.append(("hkv", model, gib, s, None))

        def run(job):
            kind, model, gib, s, policy = job
            if kind == "hkv":
                return run_hkv(args.hkv, model, gib, traces[s])
            name = next(n for m, n, _ in MODELS if m == model)
            key = f"{name}|{gib:g}|{s}|{args.requests}|{policy.replace(' ', '|')}"
            if key not in cache:
                version, *variant = policy.split()
                trace = computed[s] if variant else traces[s]
                cache[key] = run_marconi(name, gib, version, trace, args.marconi_dir)
            return cache[key]

        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            results = dict(zip(jobs, pool.map(run, jobs)))
    if args.marconi_cache:
        with open(args.marconi_cache, "w") as f:
            json.dump(cache, f, indent=0, sort_keys=True)
    lines = [
        "# hybridkv against Marconi, one request at a time", "",
        f"Written by `scripts/marconi_compare.py` ({time.time() - t0:.0f} s; do not edit). "
        f"Traces: `hkv trace gen --requests {args.requests} --seed S` (multi-turn chat, 80% of "
        "sessions sharing one of 4 system prompts). Token hit rates in %: Marconi's V1 (selective "
        "admission + LRU) and V2 (FLOP-aware eviction) run through "
        "`../shared/marconi_reference/marconi_driver.py --strict` (within capacity); hkv modes "
        "through `hkv simulate --max-running 1 --budget 16384` on the same trace and memory. "
        "`hkv - best` is hybridkv minus the better Marconi policy, in points. Marconi's replay "
        "inserts every output token, though an engine never computes the last one of a request; "
        "`best Marconi, computed` runs both policies with that token left out of what they "
        "insert (prompts unchanged). `hkv hybridkv, 1-token pages` is the hybridkv mode at "
        "`--block-tokens 1`, Marconi's granularity; `token ideal` is every computed token the "
        "earlier requests share, the most any cache of computed tokens can hit "
        "(`ideal_hit_rate` of that run).", ""]
    wins = total = fair_wins = fine_wins = 0
    for model, name, memories in MODELS:
        lines += [f"## {model}", "",
                  "| memory | seed | Marconi V1 | Marconi V2 | best Marconi | "
                  + " | ".join(f"hkv {m}" for m in HKV_MODES) + " | hkv - best | "
                  "best Marconi, computed | hkv - computed | hkv hybridkv, 1-token pages | "
                  "1-token - computed | token ideal |",
                  "|---|---|---|---|---|" + "---|" * len(HKV_MODES) + "---|---|---|---|---|---|"]
        for gib in memories:
            for s in seeds:
                v1 = results[("marconi", model, gib, s, "v1")]
                v2 = results[("marconi", model, gib, s, "v2")]
                best = max(v1, v2)
                fair = max(results[("marconi", model, gib, s, "v1 computed")],
                           results[("marconi", model, gib, s, "v2 computed")])
                h = results[("hkv", model, gib, s, None)]

                def minus(x: float | None, y: float, digits: int) -> str:
                    return "-" if x is None else f"{100 * (x - y):+.{digits}f}"

                total += 1
                wins += h["hybridkv"] is not None and h["hybridkv"] >= best
                fair_wins += h["hybridkv"] is not None and h["hybridkv"] >= fair
                fine_wins += h["fine"] is not None and h["fine"] >= fair
                lines.append(f"| {gib:g} GiB | {s} | {pct(v1)} | {pct(v2)} | {pct(best)} | "
                             + " | ".join(pct(h[m]) for m in HKV_MODES)
                             + f" | {minus(h['hybridkv'], best, 1)} | {pct(fair, 2)} | "
                             f"{minus(h['hybridkv'], fair, 2)} | {pct(h['fine'], 2)} | "
                             f"{minus(h['fine'], fair, 2)} | {pct(h['token_ideal'], 2)} |")
        lines.append("")
    lines[2:2] = [
        f"hybridkv at or above the best Marconi policy in **{wins} of {total}** cells. With both "
        "sides counting only the tokens an engine computes (`best Marconi, computed`), hybridkv "
        f"is at or above it in **{fair_wins} of {total}** at its 16-token blocks and in "
        f"**{fine_wins} of {total}** at 1-token pages, Marconi's own granularity.", ""]
    with open(args.out, "w") as f:
        f.write("\n".join(lines))
    print(f"{args.out}: {wins}/{total} cells at or above Marconi ({fair_wins}/{total} and "
          f"{fine_wins}/{total} on computed tokens), {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
