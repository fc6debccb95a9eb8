#!/usr/bin/python3
"""Run vLLM's own KV-cache / scheduler unit tests (tests/v1/core of the extracted vLLM
source) on this machine, under pytest with the overlay of scripts/vllm/overlay, and
write a markdown table: every test id with passed / failed / error / skipped and, for
failures, the first line of the reason.

  /usr/bin/python3 scripts/vllm/run_vllm_tests.py [--out vllm_tests.md]
      [--manager module:Class] [--scheduler-cls module:Class] [--pythonpath DIR ...]
      [--files test_prefix_caching.py,...] [-k EXPR] [--json-out FILE]

--manager replaces vllm.v1.core.kv_cache_manager.KVCacheManager, --scheduler-cls
replaces vllm.v1.core.sched.scheduler.Scheduler, before any test module is imported, in
every module that imported them by name (tests, tests/v1/core/utils.create_scheduler,
the scheduler, the coordinator users); see hkv_vllm_pytest_plugin.py.  A replacement
class with a `call_counts` dict (counting_classes.py) gets its counts reported.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter, OrderedDict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import vllm_env  # noqa: E402

DEFAULT_FILES = [  # tests/v1/core: every file there (the e2e ones need a real engine)
    "test_prefix_caching.py", "test_single_type_kv_cache_manager.py",
    "test_kv_cache_utils.py", "test_scheduler.py", "test_async_scheduler.py",
    "test_priority_scheduler_random.py", "test_kv_sharing.py", "test_kv_cache_metrics.py",
    "test_encoder_cache_manager.py", "test_output.py", "test_repetition_detection.py",
    "test_reset_prefix_cache_e2e.py", "test_scheduler_e2e.py",
]

# Why a test cannot pass on this machine, by file / test-name pattern (used for the
# "cannot run here" column; a failing test that matches none of these is a real failure).
CANNOT_RUN = [
    (r"test_scheduler_e2e\.py|test_reset_prefix_cache_e2e\.py",
     "end-to-end: needs vllm.LLM / EngineArgs with real model weights, a GPU, "
     "transformers"),
    (r"multimodal|mm_|_mm|ec_connector|encoder_cache_with_shift|partial_requests",
     "multimodal (llava): encoder budget from HF multimodal processors (transformers)"),
    (r"structured_output", "structured outputs: xgrammar/guidance + HF tokenizer"),
]


def why_cannot(test_id: str) -> str:
    for pat, why in CANNOT_RUN:
        if re.search(pat, test_id):
            return why
    return ""


def first_reason(elem) -> str:
    msg = (elem.get("message") or "").strip()
    text = elem.text or ""
    e_lines = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ")]
    if msg and msg not in ("collection failure", "failed on setup with", ""):
        line = msg.splitlines()[0]
    elif e_lines:
        # for import errors the last E line names the missing thing
        line = e_lines[-1] if "collection" in msg else e_lines[0]
    else:
        line = (text.strip().splitlines() or [""])[-1]
    return line.replace("|", "\\|")[:240]


def parse_junit(path: str, src_root: str) -> list[dict]:
    rows = []
    for tc in ET.parse(path).getroot().iter("testcase"):
        cls, name = tc.get("classname", ""), tc.get("name", "")
        parts = cls.split(".") if cls else name.split(".")
        # map dotted classname to a file path (tests.v1.core.test_x[.TestClass])
        fpath, rest = None, []
        for i in range(len(parts), 0, -1):
            cand = os.path.join(src_root, *parts[:i]) + ".py"
            if os.path.isfile(cand):
                fpath, rest = "/".join(parts[:i]) + ".py", parts[i:]
                break
        if cls:
            tid = f"{fpath or cls}::" + "::".join(rest + [name])
        else:
            tid = fpath or name
        status, reason = "passed", ""
        for child in tc:
            if child.tag == "failure":
                status, reason = "failed", first_reason(child)
            elif child.tag == "error":
                status, reason = "error", first_reason(child)
            elif child.tag == "skipped":
                status, reason = "skipped", (child.get("message") or "").splitlines()[0] \
                    if child.get("message") else ""
        rows.append(dict(id=tid, file=(fpath or tid).split("::")[0],
                         status=status, reason=reason,
                         time=float(tc.get("time") or 0)))
    return rows


def run_suite(src: str, files: list[str], manager: str | None, scheduler_cls: str | None,
              pythonpath: list[str], kexpr: str | None, pytest_args: list[str], timeout: int,
              junit: str | None = None, start_only: bool = False):
    """Run pytest over `files` (names under tests/v1/core) with the given replacements.
    Returns the result dict (see collect()); with start_only, a handle for collect()."""
    core = os.path.join(src, "tests", "v1", "core")
    paths = [os.path.join(core, f) for f in files]
    keep_junit = bool(junit)
    junit = junit or tempfile.mktemp(suffix=".xml", prefix="hkv_vllm_junit_")
    swap_rep = tempfile.mktemp(suffix=".json", prefix="hkv_vllm_swap_")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([HERE] + ([env["PYTHONPATH"]]
                                                  if env.get("PYTHONPATH") else []))
    env["PYTHONHASHSEED"] = env.get("PYTHONHASHSEED", "0")
    env["VLLM_SRC"] = src
    env["HKV_VLLM_SWAP_REPORT"] = swap_rep
    ppath = [vllm_env.hybridkv_python_dir()] + pythonpath
    env["HKV_VLLM_PYTHONPATH"] = os.pathsep.join(ppath)
    env.pop("HKV_VLLM_MANAGER", None)
    env.pop("HKV_VLLM_SCHEDULER_CLS", None)
    if manager:
        env["HKV_VLLM_MANAGER"] = manager
    if scheduler_cls:
        env["HKV_VLLM_SCHEDULER_CLS"] = scheduler_cls
    cmd = [sys.executable, "-m", "pytest", "-p", "hkv_vllm_pytest_plugin",
           "-p", "no:cacheprovider", "--rootdir", src, "--confcutdir", core,
           "-q", "-rN", "--tb=short", "--continue-on-collection-errors", f"--junitxml={junit}",
           "-o", "junit_family=xunit1", "-W", "ignore::ResourceWarning"]
    if kexpr:
        cmd += ["-k", kexpr]
    cmd += pytest_args + paths
    print("+", " ".join(cmd), flush=True)
    out_f = tempfile.TemporaryFile(mode="w+")
    h = dict(proc=subprocess.Popen(cmd, env=env, cwd=src, stdout=out_f,
                                   stderr=subprocess.STDOUT, text=True),
             out_f=out_f, t0=time.time(), junit=junit, keep_junit=keep_junit,
             swap_rep=swap_rep, src=src, files=files, timeout=timeout,
             manager=manager, scheduler_cls=scheduler_cls, hkv_python=ppath[0])
    return h if start_only else collect(h)


def collect(h: dict) -> dict:
    """Wait for a run_suite(start_only=True) handle; rows, per-file counts, swap report."""
    proc = h["proc"]
    try:
        proc.wait(timeout=max(1, h["timeout"] - (time.time() - h["t0"])))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    wall = time.time() - h["t0"]
    h["out_f"].seek(0)
    stdout = h["out_f"].read()
    h["out_f"].close()
    print("\n".join(stdout.strip().splitlines()[-3:]))
    junit, src = h["junit"], h["src"]
    if not os.path.exists(junit):
        print(stdout[-5000:])
        raise SystemExit(f"pytest wrote no junit xml (rc={proc.returncode})")
    rows = parse_junit(junit, src)
    swap = {}
    if os.path.exists(h["swap_rep"]):
        with open(h["swap_rep"]) as f:
            swap = json.load(f)
        os.unlink(h["swap_rep"])
    if not h["keep_junit"]:
        os.unlink(junit)
    per_file: "OrderedDict[str, Counter]" = OrderedDict()
    for f in h["files"]:
        per_file["tests/v1/core/" + f] = Counter()
    for r in rows:
        per_file.setdefault(r["file"], Counter())[r["status"]] += 1
        r["cannot_run_here"] = why_cannot(r["id"]) if r["status"] in (
            "failed", "error") else ""
    return dict(rows=rows, per_file=per_file, swap=swap, rc=proc.returncode, wall=wall,
                manager=h["manager"], scheduler_cls=h["scheduler_cls"],
                hkv_python=h["hkv_python"])


def vllm_commit(src: str) -> str:
    commit_f = os.path.join(src, "VLLM_COMMIT")
    return open(commit_f).read().strip() if os.path.exists(commit_f) else "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--manager", help="module:Class replacing KVCacheManager")
    ap.add_argument("--scheduler-cls", help="module:Class replacing Scheduler")
    ap.add_argument("--compare", action="store_true",
                    help="run twice, vLLM's own classes and the replacements (default "
                         "hybridkv.vllm:KVCacheManager / hybridkv.vllm:Scheduler), in "
                         "parallel; write the explained comparison (default "
                         "docs/vllm_tests.md), see compare_vllm_tests.py")
    ap.add_argument("--pythonpath", action="append", default=[],
                    help="extra import dir for the replacement modules (repeatable; "
                         "the built hybridkv package is always added)")
    ap.add_argument("--files", help="comma list of files under tests/v1/core "
                                    "(default: all of them)")
    ap.add_argument("-k", dest="kexpr", help="pytest -k expression")
    ap.add_argument("--out", help="markdown table (default vllm_tests.md; with --compare "
                                  "docs/vllm_tests.md of the repository)")
    ap.add_argument("--json-out", help="also write the rows as JSON")
    ap.add_argument("--junit", help="keep pytest's junit XML here")
    ap.add_argument("--timeout", type=int, default=3000, help="seconds for the run")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest args (after --)")
    args = ap.parse_args()

    src = vllm_env.vllm_src_root()
    core = os.path.join(src, "tests", "v1", "core")
    if not os.path.isdir(core):
        raise SystemExit(f"{core} missing: extract vLLM's tests (see README.md)")
    files = args.files.split(",") if args.files else DEFAULT_FILES
    for f in files:
        if not os.path.isfile(os.path.join(core, f)):
            raise SystemExit(f"no such test file: {os.path.join(core, f)}")

    if args.compare:
        import compare_vllm_tests
        manager = args.manager or "hybridkv.vllm:KVCacheManager"
        sched = args.scheduler_cls or "hybridkv.vllm:Scheduler"
        common = (src, files)
        rest = (args.pythonpath, args.kexpr, args.pytest_args, args.timeout)
        hb = run_suite(*common, None, None, *rest, start_only=True)
        ha = run_suite(*common, manager, sched, *rest, start_only=True)
        base, adapter = collect(hb), collect(ha)
        out = args.out or os.path.join(vllm_env.REPO, "docs", "vllm_tests.md")
        argv = " ".join(([f"HKV_PYTHON={os.environ['HKV_PYTHON']}"]
                         if os.environ.get("HKV_PYTHON") else [])
                        + ["/usr/bin/python3", "scripts/vllm/run_vllm_tests.py"]
                        + sys.argv[1:])
        text, unexplained = compare_vllm_tests.render(base, adapter, src, vllm_commit(src),
                                                      argv)
        with open(out, "w") as f:
            f.write(text)
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(dict(base=base, adapter=adapter), f, indent=1, default=dict)
        print(text[:text.find("## Tests that differ")])
        print(f"wrote {out}")
        if unexplained:
            print(f"WARNING: {len(unexplained)} differing test(s) match no explanation in "
                  "compare_vllm_tests.EXPLAINED:\n  " + "\n  ".join(unexplained))
            raise SystemExit(2)
        return

    res = run_suite(src, files, args.manager, args.scheduler_cls, args.pythonpath, args.kexpr,
                    args.pytest_args, args.timeout, junit=args.junit)
    rows, per_file, swap, wall = res["rows"], res["per_file"], res["swap"], res["wall"]
    args.out = args.out or "vllm_tests.md"

    out = []
    out.append("# vLLM tests/v1/core on this machine (hybridkv overlay)")
    out.append("")
    out.append(f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, wall {wall:.1f} s, "
               f"pytest rc {res['rc']}")
    out.append(f"- vLLM source: `{src}` (commit {vllm_commit(src)}); shared stubs: "
               f"`{vllm_env.shared_stubs()}`")
    out.append(f"- KVCacheManager: `{args.manager or 'vLLM (unswapped)'}`; Scheduler: "
               f"`{args.scheduler_cls or 'vLLM (unswapped)'}`")
    for s in swap.get("swaps", []):
        out.append(f"- swap {s['original']} -> {s['replacement']}; at session end the "
                   "name is bound to the replacement in: "
                   + ", ".join(f"`{m}`" for m in s.get("bound_to_replacement",
                                                       s["rebound"])))
    for name, c in swap.get("call_counts", {}).items():
        out.append(f"- call counts of the {name} replacement: "
                   + ", ".join(f"{k}={v}" for k, v in sorted(c.items())))
    out.append("")
    out.append("## Per file")
    out.append("")
    out.append("| file | passed | failed | error | skipped | of which cannot run here |")
    out.append("|---|---:|---:|---:|---:|---:|")
    tot = Counter()
    for f, c in per_file.items():
        cr = sum(1 for r in rows if r["file"] == f and r["cannot_run_here"])
        tot.update(c)
        tot["cannot"] += cr
        out.append(f"| {f} | {c['passed']} | {c['failed']} | {c['error']} | "
                   f"{c['skipped']} | {cr} |")
    out.append(f"| **total** | {tot['passed']} | {tot['failed']} | {tot['error']} | "
               f"{tot['skipped']} | {tot['cannot']} |")
    out.append("")
    out.append("## Every test")
    out.append("")
    out.append("| test id | result | reason (first line) | cannot run here because |")
    out.append("|---|---|---|---|")
    for r in rows:
        out.append(f"| `{r['id']}` | {r['status']} | {r['reason']} | "
                   f"{r['cannot_run_here']} |")
    text = "\n".join(out) + "\n"
    with open(args.out, "w") as f:
        f.write(text)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(dict(per_file={k: dict(v) for k, v in per_file.items()},
                           rows=rows, swap=swap, pytest_rc=res["rc"]), f, indent=1)
    print("\n".join(out[:out.index("## Every test")]))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
