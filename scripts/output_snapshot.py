#!/usr/bin/env python3
"""Records what `hkv plan`, `hkv simulate` and `hkv verify` print for every bundled model, timings
left out, so that a change meant to alter no behaviour (a restructuring, a refactor) can be shown
to print byte-identical results before and after.

    scripts/output_snapshot.py record --hkv build/dev/tools/hkv/hkv --out /tmp/before
    ... change, rebuild ...
    scripts/output_snapshot.py record --hkv build/dev/tools/hkv/hkv --out /tmp/after
    scripts/output_snapshot.py compare /tmp/before /tmp/after

`record` replays one generated chat trace (300 requests, seed 3, a session every 50 steps)
through every allocator mode at 16 GiB and under pressure at 4 GiB, and runs the reference engine's
verify workload for seeds 1-3. `compare` lists every file that differs and exits 1 if any does.
"""
import argparse
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Keys whose values are measured times, not results.
TIMING_KEYS = {"manager_us_per_step"}


def strip_timings(value):
    if isinstance(value, dict):
        return {k: strip_timings(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [strip_timings(v) for v in value]
    return value


def run_json(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        # A refusal is a result too (a model that cannot serve 4 GiB, say): record its message.
        return {"exit": out.returncode, "stderr": out.stderr.strip()}
    return strip_timings(json.loads(out.stdout))


def record(args):
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    trace = out / "trace.jsonl"
    subprocess.run([args.hkv, "trace", "gen", "--requests", "300", "--seed", "3",
                    "--session-gap", "50", "-o", str(trace)], check=True, capture_output=True)
    models = sorted(p for p in (ROOT / "models").iterdir() if (p / "config.json").exists())
    for model in models:
        results = {"plan": run_json([args.hkv, "plan", str(model), "--json"])}
        for memory in ("16GiB", "4GiB"):
            results[f"simulate_{memory}"] = run_json(
                [args.hkv, "simulate", str(model), "--trace", str(trace), "--memory", memory,
                 "--json"])
        for seed in (1, 2, 3):
            results[f"verify_seed{seed}"] = run_json(
                [args.hkv, "verify", str(model), "--seed", str(seed), "--json"])
        # Paths differ between checkouts; the model's folder name is what identifies it.
        text = json.dumps(results, indent=1, sort_keys=True)
        text = text.replace(str(trace), "trace.jsonl").replace(str(ROOT) + "/", "")
        (out / f"{model.name}.json").write_text(text + "\n")
        print(f"recorded {model.name}", flush=True)
    trace.unlink()


def compare(args):
    a, b = pathlib.Path(args.before), pathlib.Path(args.after)
    names = sorted({p.name for p in a.glob("*.json")} | {p.name for p in b.glob("*.json")})
    differing = []
    for name in names:
        pa, pb = a / name, b / name
        if not pa.exists() or not pb.exists() or pa.read_bytes() != pb.read_bytes():
            differing.append(name)
    for name in differing:
        print(f"differs: {name}")
    print(f"{len(names) - len(differing)} of {len(names)} models print identical results")
    return 1 if differing or not names else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--hkv", default=str(ROOT / "build/dev/tools/hkv/hkv"))
    rec.add_argument("--out", required=True)
    cmp = sub.add_parser("compare")
    cmp.add_argument("before")
    cmp.add_argument("after")
    args = parser.parse_args()
    if args.command == "record":
        record(args)
        return 0
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
