#!/usr/bin/python3
"""The under-pressure grid: every allocator mode of `hkv simulate` over models x memory x load.

For each session gap and seed it generates one trace (`hkv trace gen`), replays it through every
mode (`hkv simulate --allocator all --json`) at each memory size and model, and writes a markdown
page: per model, one row per memory and gap (seeds summed for preemptions and scheduled tokens,
averaged for hit rates), each mode's `hit / preemptions / scheduled Mtok`, and in the last column
where hybridkv is behind - `hit` (below vllm's), `preempt` (above vllm's), `sched` (more prompt
compute than some other mode), and on recurrent hybrids `lead < 1.3x` (where vllm hits below 0.6,
hybridkv hits less than 1.3 times as much) - with a count of such cells at the top. A mode that cannot serve
the model at its max-model-len in that memory shows `refused` and is not compared. Every cell also
replays the `oracle` run (`hkv simulate --oracle`: hybridkv's layout evicting Belady-style by the
trace's future) and shows hybridkv's hit rate as a fraction of the oracle's; the oracle is a
yardstick, not a mode a deployment can run, so it is never counted against hybridkv.

  scripts/pressure_grid.py [--models M1,M2] [--memory 2,4,8,16] [--gaps 15,50,150,300]
                           [--seeds 1,2] [--requests 1000] [--jobs 2] [--hkv BIN] [--out FILE]
                           [--plots DIR] [--replot]

It also draws, per model, hit rate and scheduled tokens against memory for every mode and the
oracle, one column per load (gnuplot, DIR/<model>.png; default docs/pressure_grid/). --replot
redraws them from the cells of an existing page (--out) without replaying anything.

Models are folder names under models/ (default: every bundled model). Figures are deterministic;
manager times are not reported.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("vllm", "uniform", "padded", "hybridkv")
SHOWN = MODES + ("oracle",)


def gen_trace(hkv: str, work: str, requests: int, seed: int, gap: int) -> str:
    path = os.path.join(work, f"t_{requests}_{seed}_{gap}.jsonl")
    subprocess.run([hkv, "trace", "gen", "--requests", str(requests), "--seed", str(seed),
                    "--session-gap", str(gap), "-o", path], check=True, capture_output=True)
    return path


def simulate(hkv: str, model: str, trace: str, gib: int) -> dict:
    cmd = [hkv, "simulate", os.path.join(ROOT, "models", model), "--trace", trace, "--memory",
           f"{gib}GiB", "--allocator", "all", "--oracle", "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode not in (0, 1):
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
    return {r["allocator"]: r for r in json.loads(p.stdout)["runs"]}


def combine(runs: list[dict]) -> dict | None:
    """Seeds of one cell: None when any seed refused the mode."""
    if any("error" in r for r in runs):
        return None
    return {
        "hit": sum(r["hit_rate"] for r in runs) / len(runs),
        "preempt": sum(r["preemptions"] for r in runs),
        "sched": sum(r["scheduled_tokens"] for r in runs),
    }


# The lead the under-pressure goal asks of recurrent hybrids: where vLLM hits below LEAD_BELOW,
# hybridkv hits at least LEAD_FACTOR times as much.
LEAD_BELOW, LEAD_FACTOR = 0.6, 1.3


def short_lead(cell: dict) -> bool:
    """A recurrent hybrid's cell where vllm hits below LEAD_BELOW and hybridkv less than
    LEAD_FACTOR times as much."""
    h, v = cell.get("hybridkv"), cell.get("vllm")
    return (h is not None and v is not None and v["hit"] < LEAD_BELOW
            and h["hit"] < LEAD_FACTOR * v["hit"] - 1e-9)


def behind(cell: dict) -> list[str]:
    h = cell.get("hybridkv")
    if h is None:
        return []
    out = []
    v = cell.get("vllm")
    if v is not None and h["hit"] < v["hit"] - 1e-9:
        out.append("hit")
    if v is not None and h["preempt"] > v["preempt"]:
        out.append("preempt")
    others = [cell[m]["sched"] for m in MODES if m != "hybridkv" and cell.get(m) is not None]
    if others and h["sched"] > min(others):
        out.append("sched")
    return out


def parse_page(path: str) -> dict:
    """The cells of a page this script wrote: {(model, gib, gap): {mode: cell or None}}."""
    cells, model, shown = {}, None, []
    for line in open(path):
        if line.startswith("### "):
            model = line[4:].strip()
        elif line.startswith("| memory |"):
            shown = [c.strip() for c in line.strip().strip("|").split("|")][2:]
        elif model and re.match(r"\| \d+ GiB \|", line):
            parts = [c.strip() for c in line.strip().strip("|").split("|")]
            gib, gap = int(parts[0].split()[0]), int(parts[1])
            row = {}
            for mode, text in zip(shown, parts[2:]):
                if mode not in SHOWN:
                    continue
                if text == "refused":
                    row[mode] = None
                else:
                    hit, preempt, sched = (x.strip() for x in text.split("/"))
                    row[mode] = {"hit": float(hit), "preempt": int(preempt),
                                 "sched": float(sched) * 1e6}
            cells[(model, gib, gap)] = row
    return cells


def plot(cells: dict, models: list[str], memories: list[int], gaps: list[int], out: str) -> None:
    """Per model, a PNG: hit rate (top) and scheduled tokens (bottom) against memory, a column
    per load, a line per mode and the oracle."""
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        for m in models:
            script = [f"set terminal pngcairo size {360 * len(gaps)},620 font ',9'",
                      f"set output '{os.path.join(out, m + '.png')}'",
                      f"set multiplot layout 2,{len(gaps)} title '{m}: 1000 requests, seeds "
                      "summed or averaged'",
                      "set logscale x 2", f"set xrange [{min(memories) * 0.8}:{max(memories) * 1.25}]",
                      "set xtics (" +
                      ", ".join(f"'{g}' {g}" for g in memories) + ")",
                      "set key top left font ',7' samplen 2 opaque", "set grid",
                      "set datafile missing '?'"]
            for row, (what, label) in enumerate((("hit", "hit rate"),
                                                 ("sched", "scheduled Mtok"))):
                for gap in gaps:
                    data = os.path.join(work, f"{len(script)}.dat")
                    points = 0
                    with open(data, "w") as f:
                        for gib in memories:
                            vals = []
                            for mode in SHOWN:
                                c = cells.get((m, gib, gap), {}).get(mode)
                                v = None if c is None else (c[what] if what == "hit"
                                                            else c[what] / 1e6)
                                vals.append("?" if v is None else f"{v:.4f}")
                                points += v is not None
                            f.write(f"{gib} " + " ".join(vals) + "\n")
                    # One legend per row, in its first panel.
                    script.append("set key on" if gap == gaps[0] else "set key off")
                    script.append(f"set title 'gap {gap}'")
                    script.append(f"set xlabel 'memory (GiB)'; set ylabel '{label}'")
                    if points == 0:  # every mode refused every memory at this load
                        script.append("set yrange [0:1]; plot NaN notitle; set autoscale y")
                        continue
                    script.append("plot " + ", ".join(
                        f"'{data}' using 1:{i + 2} with linespoints title '{mode}'"
                        + (" dashtype 2" if mode == "oracle" else "")
                        for i, mode in enumerate(SHOWN)))
            script.append("unset multiplot")
            p = subprocess.run(["gnuplot"], input="\n".join(script), text=True,
                               capture_output=True)
            if p.returncode != 0:
                sys.exit(f"gnuplot failed on {m}:\n{p.stderr[-3000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(sorted(os.listdir(os.path.join(ROOT, "models")))))
    ap.add_argument("--memory", default="2,4,8,16", help="GiB")
    ap.add_argument("--gaps", default="15,50,150,300")
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--hkv", default=os.path.join(ROOT, "build", "release", "tools", "hkv", "hkv"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "pressure_grid.md"))
    ap.add_argument("--plots", default=os.path.join(ROOT, "docs", "pressure_grid"))
    ap.add_argument("--replot", action="store_true",
                    help="redraw the figures from the page --out names, replaying nothing")
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if m]
    memories = [int(x) for x in args.memory.split(",")]
    gaps = [int(x) for x in args.gaps.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    if args.replot:
        cells = parse_page(args.out)
        plot(cells, sorted({k[0] for k in cells}), memories, gaps, args.plots)
        print(f"{args.plots}: {len({k[0] for k in cells})} figures")
        return
    t0 = time.time()
    with tempfile.TemporaryDirectory() as work:
        traces = {(s, g): gen_trace(args.hkv, work, args.requests, s, g)
                  for s in seeds for g in gaps}
        jobs = [(m, gib, g, s) for m in models for gib in memories for g in gaps for s in seeds]
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            results = dict(zip(jobs, pool.map(
                lambda j: simulate(args.hkv, j[0], traces[(j[3], j[2])], j[1]), jobs)))
    lines = []
    behind_cells = []
    # Recurrent hybrids: the models whose hybridkv runs keep state pages.
    recurrent = {m for (m, _, _, _), r in results.items()
                 if r.get("hybridkv", {}).get("state_page_bytes", 0) > 0}
    lead_cells, short_cells = 0, []
    fractions = []  # (hybridkv hit / oracle hit, cell name)
    for m in models:
        lines += [f"### {m}", "",
                  "| memory | gap | " + " | ".join(SHOWN) + " | hybridkv of oracle | "
                  "hybridkv behind |",
                  "|---|---|" + "---|" * (len(SHOWN) + 2)]
        for gib in memories:
            for g in gaps:
                cell = {mode: combine([results[(m, gib, g, s)][mode] for s in seeds])
                        for mode in SHOWN}
                b = behind(cell)
                if m in recurrent and cell.get("vllm") is not None and \
                        cell["vllm"]["hit"] < LEAD_BELOW:
                    lead_cells += 1
                    if short_lead(cell):
                        short_cells.append(f"{m} {gib} GiB gap {g}")
                        b.append(f"lead < {LEAD_FACTOR}x")
                if b:
                    behind_cells.append(f"{m} {gib} GiB gap {g}: {', '.join(b)}")
                shown = ["refused" if cell[mode] is None else
                         f"{cell[mode]['hit']:.3f} / {cell[mode]['preempt']} / "
                         f"{cell[mode]['sched'] / 1e6:.2f}" for mode in SHOWN]
                h, o = cell.get("hybridkv"), cell.get("oracle")
                frac = ""
                if h is not None and o is not None and o["hit"] > 0:
                    fractions.append((h["hit"] / o["hit"], f"{m} {gib} GiB gap {g}"))
                    frac = f"{h['hit'] / o['hit']:.3f}"
                lines.append(f"| {gib} GiB | {g} | " + " | ".join(shown) +
                             f" | {frac} | {', '.join(b)} |")
        lines.append("")
    fractions.sort()
    oracle_summary = []
    if fractions:
        median = fractions[len(fractions) // 2][0]
        above = sum(1 for f, _ in fractions if f >= 1.0 - 1e-9)
        oracle_summary = [
            f"hybridkv's hit rate as a fraction of the oracle's, over the {len(fractions)} cells "
            f"with oracle hits: median **{median:.3f}**, lowest {fractions[0][0]:.3f} "
            f"({fractions[0][1]}); at or above the oracle in {above} cells (Belady's rule is "
            "no optimum when a hit needs pages of several classes and a state at one position).",
            ""]
    head = [
        "# Under memory pressure: every mode over models, memory and load", "",
        f"Written by `scripts/pressure_grid.py` ({time.time() - t0:.0f} s; do not edit): "
        f"`hkv trace gen --requests {args.requests} --seed S --session-gap G` for seeds "
        f"{', '.join(map(str, seeds))}, each replayed by `hkv simulate --allocator all` at every "
        "memory. Cells: hit rate (mean over seeds) / preemptions (sum) / scheduled prompt and "
        "decode tokens in millions (sum): what a deployment computes. `hybridkv behind`: its hit "
        "rate below vllm's, more preemptions than vllm, or more scheduled tokens than any other "
        f"mode; on recurrent hybrids also `lead < {LEAD_FACTOR}x`: where vllm hits below "
        f"{LEAD_BELOW}, hybridkv hits less than {LEAD_FACTOR} times as much. "
        "`oracle`: `hkv simulate --oracle`, hybridkv's layout evicting by the trace's "
        "future (the request that next needs a prefix); a yardstick, never counted as a mode.",
        "",
        f"Cells where hybridkv is behind: **{len(behind_cells)}** of "
        f"{len(models) * len(memories) * len(gaps)}.", ""]
    head += [f"- {c}" for c in behind_cells] + [""]
    if lead_cells:
        head += [f"Recurrent hybrids ({', '.join(sorted(recurrent))}): in {lead_cells} cell{'s' if lead_cells != 1 else ''} "
                 f"vllm hits below {LEAD_BELOW}; hybridkv hits at least {LEAD_FACTOR} times as "
                 f"much in **{lead_cells - len(short_cells)}** of them"
                 + (f" (not in {'; '.join(short_cells)})." if short_cells else "."), ""]
    head += oracle_summary
    with open(args.out, "w") as f:
        f.write("\n".join(head + lines))
    plot(parse_page(args.out), models, memories, gaps, args.plots)
    print(f"{args.out}: {len(behind_cells)} cells behind, {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
