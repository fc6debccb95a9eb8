"""hybridkv inside vLLM: a drop-in KV cache manager for vLLM v1's scheduler.

    vllm serve MODEL --scheduler-cls hybridkv.vllm.Scheduler
    vllm serve MODEL --async-scheduling --scheduler-cls hybridkv.vllm.AsyncScheduler

``Scheduler`` is vLLM's own Scheduler class with one change: the KV cache manager it builds is
``hybridkv.vllm.KVCacheManager``, which answers vLLM's manager interface call for call from
hybridkv's C++ restatement of vLLM's manager (same block ids, hits and events; see
docs/vllm.md for what it does not support yet). ``KVCacheManager`` needs no vLLM to import; the
``Scheduler`` needs vLLM importable.
"""
from ._manager import IdBlocks, KVCacheManager
from ._standins import HAVE_VLLM

__all__ = ["KVCacheManager", "IdBlocks", "HAVE_VLLM", "Scheduler", "AsyncScheduler"]


def __getattr__(name):
    # The scheduler subclass is made on first use, so importing this package never imports
    # vLLM's scheduler (and works where vLLM is absent).
    if name in ("Scheduler", "AsyncScheduler"):
        from . import _scheduler

        return getattr(_scheduler, name)
    raise AttributeError(f"module 'hybridkv.vllm' has no attribute {name!r}")
