"""The explained comparison behind `run_vllm_tests.py --compare` (writes docs/vllm_tests.md).

vLLM's tests/v1/core run twice on this machine: with vLLM's own KVCacheManager / Scheduler
and with the replacements (hybridkv.vllm). Every test whose result differs is explained by
the first entry of EXPLAINED that matches its id and its failure message (with the
replacement), and given a class:

  a  the test reads or builds vLLM internals the adapter does not expose (BlockPool's
     block objects, free queue, hash map, event queue; the coordinator's per-request
     tables holding KVCacheBlock objects; ref_cnt ...)
  b  a feature the adapter refuses on purpose, by name (NotImplementedError)
  c  a real behaviour difference on vLLM's public KVCacheManager interface

A differing test that matches no entry is listed as class `?` and makes the run exit 2:
diagnose it and add an entry. Tests failing in both runs are grouped by
run_vllm_tests.CANNOT_RUN.
"""
from __future__ import annotations

import re
import time
from collections import Counter, OrderedDict

from run_vllm_tests import why_cannot

# (test-id regex, adapter failure-message regex, class, one-line reason, detail or None).
# First match wins. Keep reasons short; `detail` (class c) is printed once under the table.
EXPLAINED = [
    (r"", r"exceed its \d+ tokens", "c",
     "`allocate_slots` raises `InvalidArgumentError` when computed + new tokens exceed "
     "`request.num_tokens` + lookahead; vLLM allows it (draft tokens of spec decoding, async "
     "output placeholders, a prompt-less request)",
     "C++ `KvCacheManager::AllocateSlots` (src/vllm/kv_cache_manager.cc:253, right "
     "after `local_computed`: `if (local_computed + a.num_external_computed_tokens"
     " + a.num_new_tokens > request.num_tokens() + a.num_lookahead_tokens) return bad(...)`) "
     "has no counterpart in vLLM's `allocate_slots`: vLLM's scheduler passes "
     "`num_new_tokens` = tokens with spec (`request.num_tokens_with_spec` + "
     "`num_output_placeholders` - `num_computed_tokens`), which exceeds `request.num_tokens` "
     "whenever draft tokens are scheduled (spec decoding) or the async scheduler has output "
     "placeholders in flight; vLLM only caps what it *caches* at `request.num_tokens` "
     "(the C++ does that too: `to_cache`). Repro (block size 4, 11 blocks, max_model_len 64):"
     " `r` = 8-token request; `m.allocate_slots(r, 8)` -> `([1, 2],)` in both; "
     "`r.num_computed_tokens = 8; m.allocate_slots(r, 4)` (1 token + 3 drafts) -> vLLM "
     "`([3],)`, hybridkv `InvalidArgumentError: ... 8 computed + 0 external + 4 new tokens "
     "exceed its 8 tokens`. Fix: delete that check (keep the negative-count checks); "
     "python/tests/test_vllm_adapter.py "
     "`test_bad_calls_raise_and_change_nothing` pins the refusal (`exceed its 10 tokens`) and "
     "must change with it. Verified on a scratch build with the check removed: every test of "
     "this row passes, no other result changes."),
    (r"", r"'_PoolView' object has no attribute 'blocks'", "a",
     "reads `block_pool.blocks` (KVCacheBlock objects: ref_cnt, block_hash)", None),
    (r"", r"'_PoolView' object has no attribute 'free_block_queue'", "a",
     "reads `block_pool.free_block_queue`", None),
    (r"", r"'_PoolView' object has no attribute 'cached_block_hash_to_block'", "a",
     "reads `block_pool.cached_block_hash_to_block`", None),
    (r"", r"'_PoolView' object has no attribute "
          r"'(get_new_blocks|kv_event_queue|get_cached_block)'", "a",
     "calls BlockPool internals (`get_new_blocks`, `kv_event_queue`, `get_cached_block`)",
     None),
    (r"test_decode\b", r"'int' object has no attribute 'block_hash'", "a",
     "reads KVCacheBlock objects from `coordinator.single_type_managers[0].req_to_blocks` "
     "(block ids in the adapter)", None),
    (r"test_prefill_not_enough_free_blocks_with_computed_blocks",
     r"assert \[KVCacheBlock", "a",
     "compares KVCacheBlock objects with `req_to_blocks` (block ids in the adapter), then "
     "reads `ref_cnt`", None),
    (r"test_kv_connector_basic", r"assert -1 == ", "a",
     "reads `coordinator.single_type_managers[0].num_cached_block` (the adapter answers -1 "
     "placeholders)", None),
    (r"", r"EAGLE speculative decoding \(use_eagle\)", "b",
     "EAGLE (`use_eagle=True`) refused at construction", None),
    (r"", r"mamba_cache_mode 'none'", "b",
     "Mamba with `mamba_cache_mode='none'` (MambaSpec's default) refused at construction",
     None),
    (r"", r"CrossAttentionSpec is not supported", "b",
     "cross-attention (`CrossAttentionSpec`, encoder-decoder) refused at construction", None),
]

STATUSES = ("passed", "failed", "error", "skipped")


def explain(row: dict):
    for id_re, msg_re, cls, reason, detail in EXPLAINED:
        if re.search(id_re, row["id"]) and re.search(msg_re, row["reason"]):
            return cls, reason, detail
    return "?", "UNEXPLAINED: " + row["reason"][:160], None


def _short(test_id: str) -> str:
    return test_id.split("::", 1)[1] if "::" in test_id else test_id


def _compact(ids: list[str]) -> str:
    """test_x[a], test_x[b] -> test_x[a,b]; ids of one file."""
    groups: "OrderedDict[str, list[str]]" = OrderedDict()
    for t in ids:
        m = re.match(r"(.*?)\[(.*)\]$", t)
        name, param = (m.group(1), m.group(2)) if m else (t, None)
        groups.setdefault(name, [])
        if param is not None:
            groups[name].append(param)
    parts = []
    for name, params in groups.items():
        parts.append(f"`{name}[{', '.join(params)}]`" if params else f"`{name}`")
    return ", ".join(parts)


def render(base: dict, adapter: dict, src: str, commit: str, argv: str):
    """Markdown text and the list of differing tests no EXPLAINED entry matches."""
    b_rows = {r["id"]: r for r in base["rows"]}
    a_rows = {r["id"]: r for r in adapter["rows"]}
    out = ["# vLLM's tests/v1/core with hybridkv's KVCacheManager and Scheduler", ""]
    out.append("Generated by `scripts/vllm/run_vllm_tests.py --compare` (see "
               "scripts/vllm/README.md, explanations in `scripts/vllm/compare_vllm_tests.py`"
               "); do not edit by hand.")
    out.append("")
    out.append(f"- command: `{argv}`")
    out.append(f"- date: {time.strftime('%Y-%m-%d %H:%M %Z')}; vLLM source `{src}` "
               f"(commit {commit[:12]}); hybridkv package `{adapter['hkv_python']}`")
    out.append(f"- runs: **vLLM** = vLLM's own classes (pytest rc {base['rc']}, "
               f"{base['wall']:.0f} s); **adapter** = KVCacheManager `{adapter['manager']}`,"
               f" Scheduler `{adapter['scheduler_cls']}` (rc {adapter['rc']}, "
               f"{adapter['wall']:.0f} s)")
    out.append("- classes: **a** the test reads or builds vLLM internals the adapter does not "
               "expose; **b** a feature the adapter refuses by name; **c** a real behaviour "
               "difference on vLLM's public manager interface")
    out.append("")
    out.append("## Per file (passed / failed / error / skipped)")
    out.append("")
    out.append("| file | vLLM | adapter | differ |")
    out.append("|---|---|---|---:|")
    files = list(OrderedDict.fromkeys(list(base["per_file"]) + list(adapter["per_file"])))
    tot_b, tot_a = Counter(), Counter()
    diff_by_file = Counter()
    for tid in b_rows.keys() | a_rows.keys():
        sb = b_rows.get(tid, {}).get("status", "absent")
        sa = a_rows.get(tid, {}).get("status", "absent")
        if sb != sa:
            diff_by_file[(b_rows.get(tid) or a_rows.get(tid))["file"]] += 1
    for f in files:
        cb = Counter(base["per_file"].get(f, {}))
        ca = Counter(adapter["per_file"].get(f, {}))
        tot_b.update(cb)
        tot_a.update(ca)
        out.append(f"| {f.rsplit('/', 1)[-1]} | " + " / ".join(str(cb[s]) for s in STATUSES)
                   + " | " + " / ".join(str(ca[s]) for s in STATUSES)
                   + f" | {diff_by_file[f]} |")
    out.append("| **total** | " + " / ".join(str(tot_b[s]) for s in STATUSES) + " | "
               + " / ".join(str(tot_a[s]) for s in STATUSES)
               + f" | {sum(diff_by_file.values())} |")
    out.append("")

    # differing tests, grouped by (class, reason), then by file
    groups: "OrderedDict[tuple, dict]" = OrderedDict()
    unexplained = []
    details = OrderedDict()
    for tid, rb in b_rows.items():
        ra = a_rows.get(tid)
        if ra is None or ra["status"] == rb["status"]:
            continue
        if ra["status"] in ("failed", "error"):
            cls, reason, detail = explain(ra)
        else:
            cls, reason, detail = "?", f"UNEXPLAINED: vLLM {rb['status']}, adapter " \
                                       f"{ra['status']}", None
        if cls == "?":
            unexplained.append(tid)
        key = (cls, reason)
        g = groups.setdefault(key, dict(files=OrderedDict(), detail=detail,
                                        trans=Counter()))
        g["files"].setdefault(rb["file"], []).append(_short(tid))
        g["trans"][f"{rb['status']}→{ra['status']}"] += 1
        if detail:
            details[reason] = detail
    out.append("## Tests that differ")
    out.append("")
    counts = Counter()
    for (cls, _), g in groups.items():
        counts[cls] += sum(len(v) for v in g["files"].values())
    out.append("By class: " + ", ".join(f"**{c}** {counts[c]}" for c in sorted(counts))
               + (" (none)" if not counts else ""))
    out.append("")
    out.append("| class | n | tests | reason |")
    out.append("|---|---:|---|---|")
    rank = {"c": 0, "?": 0, "b": 1, "a": 2}
    for (cls, reason), g in sorted(groups.items(), key=lambda kv: rank.get(kv[0][0], 3)):
        n = sum(len(v) for v in g["files"].values())
        tests = "; ".join(f"{f.rsplit('/', 1)[-1]}: {_compact(ids)}"
                          for f, ids in g["files"].items())
        trans = ", ".join(f"{k} {v}" for k, v in g["trans"].items())
        out.append(f"| {cls} | {n} | {tests} | {reason} ({trans}) |")
    out.append("")
    if details:
        out.append("### Class c, diagnosis")
        out.append("")
        for reason, detail in details.items():
            out.append(f"- {detail}")
        out.append("")

    out.append("## Tests that fail in both runs (cannot run on this machine)")
    out.append("")
    both = Counter()
    other = []
    for tid, rb in b_rows.items():
        ra = a_rows.get(tid)
        if ra and rb["status"] in ("failed", "error") and ra["status"] in ("failed", "error"):
            why = why_cannot(tid)
            if why:
                both[(rb["file"].rsplit("/", 1)[-1], why)] += 1
            else:
                other.append(tid)
    out.append("| file | n | why |")
    out.append("|---|---:|---|")
    for (f, why), n in both.items():
        out.append(f"| {f} | {n} | {why} |")
    for tid in other:
        out.append(f"| {_short(tid)} | 1 | fails in both, not a known cannot-run case: "
                   f"{b_rows[tid]['reason'][:120]} |")
    out.append("")
    return "\n".join(out) + "\n", unexplained
