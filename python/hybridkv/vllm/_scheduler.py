"""vLLM's own v1 schedulers, building hybridkv's KVCacheManager.

Scheduler and AsyncScheduler build it with the ``vllm`` policy (vLLM's manager, call for call);
HybridkvScheduler and HybridkvAsyncScheduler with the ``hybridkv`` policy (vLLM's layout,
hybridkv's eviction order).

vLLM's Scheduler.__init__ constructs ``KVCacheManager(...)`` by the name its module imported.
The subclasses point that name at hybridkv's class for the duration of the base constructor, so
every argument vLLM passes (config, max model len, batched tokens, caching, EAGLE, stats,
events, context parallel sizes, hash block size, metrics) reaches the adapter unchanged, and
nothing else of the scheduler changes. AsyncScheduler is for deployments with async scheduling
on: a custom scheduler class replaces vLLM's choice between the two, so pick the matching one.
"""
import functools
import threading

import vllm.v1.core.sched.async_scheduler as _async  # type: ignore[import-not-found]
import vllm.v1.core.sched.scheduler as _sched  # type: ignore[import-not-found]

from ._manager import KVCacheManager

# Reentrant: a program may have put these classes where vLLM's own names were (vLLM's tests do),
# so a base constructor can come back here.
_construct = threading.RLock()


def _init_with_adapter(init, args, kwargs, policy: str = "vllm") -> None:
    with _construct:
        saved = _sched.KVCacheManager
        _sched.KVCacheManager = functools.partial(KVCacheManager, policy=policy)
        try:
            init(*args, **kwargs)
        finally:
            _sched.KVCacheManager = saved


# The bases are bound here, at definition: `super()` below never reaches a name someone
# rebinds later in vLLM's modules.
class Scheduler(_sched.Scheduler):
    def __init__(self, *args, **kwargs) -> None:
        _init_with_adapter(super().__init__, args, kwargs)


class AsyncScheduler(_async.AsyncScheduler):
    def __init__(self, *args, **kwargs) -> None:
        _init_with_adapter(super().__init__, args, kwargs)


class HybridkvScheduler(_sched.Scheduler):
    def __init__(self, *args, **kwargs) -> None:
        _init_with_adapter(super().__init__, args, kwargs, "hybridkv")


class HybridkvAsyncScheduler(_async.AsyncScheduler):
    def __init__(self, *args, **kwargs) -> None:
        _init_with_adapter(super().__init__, args, kwargs, "hybridkv")
