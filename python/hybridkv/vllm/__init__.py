"""hybridkv inside vLLM: a drop-in KV cache manager for vLLM v1's scheduler.

    vllm serve MODEL --scheduler-cls hybridkv.vllm.Scheduler
    vllm serve MODEL --async-scheduling --scheduler-cls hybridkv.vllm.AsyncScheduler
    vllm serve MODEL --scheduler-cls hybridkv.vllm.HybridkvScheduler   # hybridkv's eviction

``Scheduler`` is vLLM's own Scheduler class with one change: the KV cache manager it builds is
``hybridkv.vllm.KVCacheManager``, which answers vLLM's manager interface call for call from
hybridkv's C++ restatement of vLLM's manager (same block ids, hits and events; see
docs/vllm.md for what it does not support yet). ``HybridkvScheduler`` and
``HybridkvAsyncScheduler`` build it with the ``hybridkv`` policy: vLLM's layout and hit rules,
hybridkv's choice of which free block to evict. ``KVCacheManager`` needs no vLLM to import; the
schedulers need vLLM importable.
"""
from ._manager import IdBlocks, KVCacheManager
from ._standins import HAVE_VLLM

_SCHEDULERS = ("Scheduler", "AsyncScheduler", "HybridkvScheduler", "HybridkvAsyncScheduler")
__all__ = ["KVCacheManager", "IdBlocks", "HAVE_VLLM", *_SCHEDULERS]


def __getattr__(name):
    # The scheduler subclass is made on first use, so importing this package never imports
    # vLLM's scheduler (and works where vLLM is absent).
    if name in _SCHEDULERS:
        from . import _scheduler

        return getattr(_scheduler, name)
    raise AttributeError(f"module 'hybridkv.vllm' has no attribute {name!r}")
