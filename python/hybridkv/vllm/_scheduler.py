"""Scheduler: vLLM's own v1 Scheduler, building hybridkv's KVCacheManager instead of vLLM's.

vLLM's Scheduler.__init__ constructs ``KVCacheManager(...)`` by the name its module imported.
The subclass points that name at hybridkv's class for the duration of the base constructor, so
every argument vLLM passes (config, max model len, batched tokens, caching, EAGLE, stats,
events, context parallel sizes, hash block size, metrics) reaches the adapter unchanged, and
nothing else of the scheduler changes.
"""
import threading

import vllm.v1.core.sched.scheduler as _sched  # type: ignore[import-not-found]

from ._manager import KVCacheManager

_construct = threading.Lock()


class Scheduler(_sched.Scheduler):
    def __init__(self, *args, **kwargs) -> None:
        with _construct:
            saved = _sched.KVCacheManager
            _sched.KVCacheManager = KVCacheManager
            try:
                super().__init__(*args, **kwargs)
            finally:
                _sched.KVCacheManager = saved
