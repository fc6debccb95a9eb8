#!/usr/bin/python3
"""Compare `hkv simulate --allocator vllm` with vLLM's real KV cache manager, request by request.

For every (trace, config, memory) it runs ../shared/vllm_reference/run_vllm_manager.py (vLLM's
unmodified manager; needs VLLM_SRC, see that folder's README) and hkv on the same trace, and
compares the per-request log (arrival, first scheduled step, first-admission hit tokens,
preemptions, finish step) and the run figures (steps, preemptions, scheduled tokens, peak blocks,
peak running, and the reference's digest of every block id handed to the model runner). A memory size vLLM refuses must be refused by hkv too.

  --gen N:SEED:GAP  a trace made by `hkv trace gen --requests N --seed SEED --session-gap GAP`
                   (repeatable; named rN_sSEED_gGAP)
  --record DIR     also store vLLM's logs as test data (DIR/<trace>/<config>_<gib>gib.csv plus
                   summary.json with the generator's parameters and vLLM's figures), which
                   tests/sim/vllm_recorded_test.cc replays in CI. Only generated traces are
                   recorded: the test makes the trace again from its parameters.

Exit status 0 when every case is equal.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = os.path.join(ROOT, "..", "shared", "vllm_reference", "run_vllm_manager.py")

# vLLM reference config -> (bundled model, hkv --mamba-cache-mode)
CONFIGS = {
    "llama3_8b": ("meta-llama--Llama-3.1-8B", "auto"),
    "gemma2_9b": ("google--gemma-2-9b", "auto"),
    "gemma3_4b": ("google--gemma-3-4b-it", "auto"),
    "gptoss_20b": ("openai--gpt-oss-20b", "auto"),
    "bamba_9b": ("ibm-ai-platform--Bamba-9B", "all"),
    "bamba_9b_align": ("ibm-ai-platform--Bamba-9B", "align"),
    "qwen3next": ("Qwen--Qwen3-Next-80B-A3B-Instruct", "align"),
    "jamba": ("ai21labs--Jamba-v0.1", "align"),
}
FIGURES = ("steps", "preemptions", "scheduled_tokens", "peak_blocks_used", "peak_running",
           "block_id_digest")


def run_reference(config, trace, gib, workdir):
    out_json = os.path.join(workdir, f"{config}.json")
    logs = os.path.join(workdir, "logs")
    env = dict(os.environ, PYTHONHASHSEED="0")
    p = subprocess.run(
        ["/usr/bin/python3", REFERENCE, "--config", config, "--trace", trace, "--kv-gib",
         str(gib), "--log-dir", logs, "--out", os.path.join(workdir, "ref.txt"),
         "--json-out", out_json],
        capture_output=True, text=True, env=env)
    if p.returncode != 0:
        if "ValueError: To serve at least one request" in p.stderr:
            return None, None
        sys.exit(f"reference failed on {config} {gib} GiB:\n{p.stderr[-3000:]}")
    res = json.load(open(out_json))["results"][0]
    rows = list(csv.reader(open(os.path.join(logs, config, "requests.csv"))))
    return {k: res[k] for k in FIGURES} | {"prefix_hit_rate": res["prefix_hit_rate"]}, rows


def run_hkv(hkv, config, trace, gib, workdir):
    model, mode = CONFIGS[config]
    req_dir = os.path.join(workdir, "hkv")
    p = subprocess.run(
        [hkv, "simulate", os.path.join(ROOT, "models", model), "--trace", trace, "--memory",
         f"{gib}GiB", "--allocator", "vllm", "--mamba-cache-mode", mode, "--json",
         "--requests-csv", req_dir],
        capture_output=True, text=True)
    if p.returncode != 0:
        if "vLLM refuses" in p.stderr:
            return None, None
        sys.exit(f"hkv failed on {config} {gib} GiB:\n{p.stderr}")
    run = json.loads(p.stdout)["runs"][0]
    rows = list(csv.reader(open(os.path.join(req_dir, "vllm_requests.csv"))))
    return {k: run[k] for k in FIGURES} | {"prefix_hit_rate": run["hit_rate"]}, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hkv", default=os.path.join(ROOT, "build", "dev", "tools", "hkv", "hkv"))
    ap.add_argument("--trace", action="append", default=[], help="JSONL trace (repeatable)")
    ap.add_argument("--gen", action="append", default=[], help="N:SEED:GAP (repeatable)")
    ap.add_argument("--config", default="all", help="comma list of %s" % ",".join(CONFIGS))
    ap.add_argument("--gib", default="2,4,8,16", help="comma list of KV memory sizes")
    ap.add_argument("--record", help="store vLLM's logs under this directory")
    args = ap.parse_args()
    configs = list(CONFIGS) if args.config == "all" else args.config.split(",")
    failures = 0
    gen_dir = tempfile.mkdtemp()
    traces = [(t, None) for t in args.trace]
    for g in args.gen:
        n, seed, gap = (int(x) for x in g.split(":"))
        path = os.path.join(gen_dir, f"r{n}_s{seed}_g{gap}.jsonl")
        subprocess.run([args.hkv, "trace", "gen", "--requests", str(n), "--seed", str(seed),
                        "--session-gap", str(gap), "-o", path], check=True,
                       capture_output=True)
        traces.append((path, {"requests": n, "seed": seed, "session_gap": gap}))
    if args.record and any(gen is None for _, gen in traces):
        sys.exit("--record stores generated traces only (--gen)")
    for trace, gen in traces:
        tname = os.path.splitext(os.path.basename(trace))[0]
        summary = {}
        for config in configs:
            for gib in args.gib.split(","):
                with tempfile.TemporaryDirectory() as wd:
                    ref, ref_rows = run_reference(config, trace, gib, wd)
                    got, got_rows = run_hkv(args.hkv, config, trace, gib, wd)
                    key = f"{config}_{gib}gib"
                    if ref is None or got is None:
                        same = ref is None and got is None
                        print(f"{tname} {key}: vLLM {'refuses' if ref is None else 'runs'}, "
                              f"hkv {'refuses' if got is None else 'runs'}"
                              f" -> {'OK' if same else 'DIFFERENT'}")
                        failures += not same
                        if args.record and ref is None:
                            summary[key] = {"refused": True}
                        continue
                    diff = [(a, b) for a, b in zip(ref_rows, got_rows) if a != b]
                    diff += [] if len(ref_rows) == len(got_rows) else [("rows", "count")]
                    figs = {k: (ref[k], got[k]) for k in FIGURES if ref[k] != got[k]}
                    ok = not diff and not figs
                    failures += not ok
                    print(f"{tname} {key}: {len(ref_rows) - 1} requests, preemptions "
                          f"{ref['preemptions']}, hit {ref['prefix_hit_rate']:.4f} -> "
                          f"{'OK' if ok else f'DIFFERENT: {len(diff)} rows, figures {figs}'}"
                          + (f" first {diff[0]}" if diff else ""), flush=True)
                    if args.record:
                        d = os.path.join(args.record, tname)
                        os.makedirs(d, exist_ok=True)
                        with open(os.path.join(d, f"{key}.csv"), "w", newline="") as f:
                            csv.writer(f, lineterminator="\n").writerows(ref_rows)
                        summary[key] = ref
        if args.record:
            d = os.path.join(args.record, tname)
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "summary.json"), "w") as f:
                json.dump({"trace": gen, "cases": summary}, f, indent=1, sort_keys=True)
                f.write("\n")
    shutil.rmtree(gen_dir, ignore_errors=True)
    print(f"{failures} differing cases")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
