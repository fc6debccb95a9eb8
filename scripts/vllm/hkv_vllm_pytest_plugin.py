"""pytest plugin (load with `-p hkv_vllm_pytest_plugin`, scripts/vllm on sys.path) that
makes vLLM's own tests run on this machine and optionally swaps in replacement classes.

  HKV_VLLM_MANAGER=module:Class        replaces vllm.v1.core.kv_cache_manager.KVCacheManager
  HKV_VLLM_SCHEDULER_CLS=module:Class  replaces vllm.v1.core.sched.scheduler.Scheduler
  HKV_VLLM_PYTHONPATH=dir:dir          extra import dirs for those modules

The replacement is installed before any test module is imported (pytest_configure), on
the defining module, so `from vllm.v1.core.kv_cache_manager import KVCacheManager` in
test modules, tests/v1/core/utils.py (create_scheduler) and the scheduler module bind the
replacement; a sweep after collection rebinds any module-level name still pointing at
the original class (except in the replacement's own top-level package).  The swap is recorded in
the pytest header and in $HKV_VLLM_SWAP_REPORT (JSON) when set.
"""
from __future__ import annotations

import importlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import vllm_env  # noqa: E402

vllm_env.setup()

_SWAPS: list[dict] = []


def load_obj(spec: str):
    mod, _, name = spec.partition(":")
    if not name:
        raise SystemExit(f"expected module:Class, got {spec!r}")
    obj = importlib.import_module(mod)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def install(orig_module: str, attr: str, spec: str) -> dict:
    """Replace orig_module.attr by the object named by spec, then rebind the name in
    every loaded module that imported the original by name."""
    m = importlib.import_module(orig_module)
    original = getattr(m, attr)
    repl = load_obj(spec)
    rec = dict(name=attr, original=f"{original.__module__}.{original.__qualname__}",
               replacement=spec, rebound=[])
    setattr(m, attr, repl)
    rec["rebound"].append(orig_module)
    _SWAPS.append(dict(rec, _orig=original, _repl=repl))
    sweep()
    return rec


def sweep() -> None:
    for s in _SWAPS:
        orig, repl = s["_orig"], s["_repl"]
        own = getattr(repl, "__module__", "") or ""
        top = own.split(".")[0]
        for modname, mod in list(sys.modules.items()):
            # leave the replacement's own package alone (it may subclass or wrap the
            # original by name)
            if mod is None or modname == top or modname.startswith(top + "."):
                continue
            d = getattr(mod, "__dict__", None)
            if not d:
                continue
            for k, v in list(d.items()):
                if v is orig:
                    d[k] = repl
                    if modname not in s["rebound"]:
                        s["rebound"].append(modname)


def _report() -> list[dict]:
    out = []
    for s in _SWAPS:
        rec = {k: v for k, v in s.items() if not k.startswith("_")}
        top = (getattr(s["_repl"], "__module__", "") or "").split(".")[0]
        rec["bound_to_replacement"] = sorted(
            n for n, m in list(sys.modules.items())
            if m is not None and n != top and not n.startswith(top + ".")
            and any(v is s["_repl"] for v in list(getattr(m, "__dict__", {}).values())))
        out.append(rec)
    return out


def pytest_configure(config):
    for mark in ("cpu_test", "core_model", "slow_test", "skip_global_cleanup"):
        config.addinivalue_line("markers", f"{mark}: vLLM CI marker")
    for p in filter(None, os.environ.get("HKV_VLLM_PYTHONPATH", "").split(os.pathsep)):
        if p not in sys.path:
            sys.path.insert(0, p)
    # Import the modules that bind these names by `from ... import` before tests do.
    importlib.import_module("vllm.v1.core.kv_cache_manager")
    importlib.import_module("vllm.v1.core.sched.scheduler")
    importlib.import_module("vllm.v1.core.sched.async_scheduler")
    mgr = os.environ.get("HKV_VLLM_MANAGER")
    if mgr:
        install("vllm.v1.core.kv_cache_manager", "KVCacheManager", mgr)
    sch = os.environ.get("HKV_VLLM_SCHEDULER_CLS")
    if sch:
        install("vllm.v1.core.sched.scheduler", "Scheduler", sch)


def pytest_report_header(config):
    lines = [f"hkv overlay: VLLM_SRC={os.environ.get('VLLM_SRC')} "
             f"stubs={vllm_env.shared_stubs()}"]
    for s in _report():
        lines.append(f"hkv swap: {s['original']} -> {s['replacement']}")
    return lines


def pytest_collection_finish(session):
    sweep()


def pytest_sessionfinish(session, exitstatus):
    sweep()
    out = os.environ.get("HKV_VLLM_SWAP_REPORT")
    if out:
        rep = _report()
        counts = {}
        for s in _SWAPS:
            c = getattr(s["_repl"], "call_counts", None)
            if isinstance(c, dict):
                counts[s["name"]] = dict(c)
        with open(out, "w") as f:
            json.dump(dict(swaps=rep, call_counts=counts), f, indent=1)
