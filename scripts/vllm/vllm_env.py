"""Import-path setup for running vLLM's scheduler / KV code and tests on this machine.

Layers, first match wins, per module:
  1. scripts/vllm/overlay/          our stubs (this directory's overlay/)
  2. SHARED_STUBS                   /work/shared/vllm_reference/stubs (KV-manager overlay)
  3. VLLM_SRC                       the extracted vLLM source (real modules)

A meta-path finder resolves every `vllm` / `vllm.*` module against the three roots in
that order, so a stub package (say the shared `vllm/distributed/__init__.py`) does not
hide real submodules below it (`vllm.distributed.kv_transfer...` still loads from
VLLM_SRC).  Non-vllm shims (pydantic, msgspec, ...) live in overlay/ and are found by the
ordinary path finder because overlay/ is put first on sys.path.

Environment:
  VLLM_SRC      the source root holding vllm/ and tests/ (default /tmp/vllm_src); the
                package dir itself (/tmp/vllm_src/vllm) is accepted too.
  HKV_VLLM_STUBS  the shared stubs dir (default <repo>/../shared/vllm_reference/stubs).

Usage:  import vllm_env; vllm_env.setup()   (idempotent; call before importing vllm)
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
OVERLAY = os.path.join(HERE, "overlay")
DEFAULT_SHARED_STUBS = os.path.normpath(
    os.path.join(REPO, "..", "shared", "vllm_reference", "stubs"))
DEFAULT_VLLM_SRC = "/tmp/vllm_src"


def vllm_src_root() -> str:
    src = os.environ.get("VLLM_SRC", DEFAULT_VLLM_SRC).rstrip("/")
    if os.path.basename(src) == "vllm" and os.path.isfile(os.path.join(src, "envs.py")):
        src = os.path.dirname(src)
    return src


def hybridkv_python_dir() -> str:
    """Where the built hybridkv package is (the package needs its compiled module, so the
    source folder python/ is not enough): HKV_PYTHON, else build/release/python, else
    build/dev/python."""
    if os.environ.get("HKV_PYTHON"):
        return os.environ["HKV_PYTHON"]
    for preset in ("release", "dev"):
        d = os.path.join(REPO, "build", preset, "python")
        if os.path.isdir(os.path.join(d, "hybridkv")):
            return d
    return os.path.join(REPO, "build", "release", "python")


def shared_stubs() -> str:
    return os.environ.get("HKV_VLLM_STUBS", DEFAULT_SHARED_STUBS)


def shared_reference_dir() -> str:
    return os.path.dirname(shared_stubs())


class LayeredVllmFinder(importlib.abc.MetaPathFinder):
    """Finds `vllm` and `vllm.*` in (overlay, shared stubs, vLLM source), first hit wins."""

    def __init__(self, roots):
        self.roots = list(roots)

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "vllm" and not fullname.startswith("vllm."):
            return None
        rel = fullname.replace(".", os.sep)
        for root in self.roots:
            init = os.path.join(root, rel, "__init__.py")
            if os.path.isfile(init):
                locs = [os.path.join(r, rel) for r in self.roots
                        if os.path.isdir(os.path.join(r, rel))]
                return importlib.util.spec_from_file_location(
                    fullname, init, submodule_search_locations=locs)
            mod = os.path.join(root, rel + ".py")
            if os.path.isfile(mod):
                return importlib.util.spec_from_file_location(fullname, mod)
        return None

    def origin_layer(self, fullname: str) -> str | None:
        """Which root a module comes from (for reports)."""
        spec = self.find_spec(fullname)
        if spec is None or not spec.origin:
            return None
        for root in self.roots:
            if spec.origin.startswith(root + os.sep):
                return root
        return None


_finder: LayeredVllmFinder | None = None


def setup() -> LayeredVllmFinder:
    global _finder
    if _finder is not None:
        return _finder
    src = vllm_src_root()
    pkg = os.path.join(src, "vllm")
    if not os.path.isfile(os.path.join(pkg, "envs.py")):
        raise SystemExit(f"vLLM source not found at {src} (set VLLM_SRC); see "
                         f"{os.path.join(HERE, 'README.md')}")
    stubs = shared_stubs()
    if not os.path.isdir(os.path.join(stubs, "vllm")):
        raise SystemExit(f"shared stubs not found at {stubs} (set HKV_VLLM_STUBS)")
    # The shared stubs' _stubutil reads VLLM_SRC as the *package* dir.
    os.environ["VLLM_SRC"] = pkg
    os.environ.setdefault("PYTHONHASHSEED", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    for p in (src, OVERLAY):  # overlay first, then the source root (for `tests.*`)
        if p in sys.path:
            sys.path.remove(p)
    sys.path.insert(0, src)
    sys.path.insert(0, OVERLAY)
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        del sys.modules[name]
    _finder = LayeredVllmFinder([OVERLAY, stubs, src])
    sys.meta_path.insert(0, _finder)
    return _finder
