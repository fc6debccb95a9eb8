"""TEST-ONLY replacement classes that prove the class swap of run_vllm_tests.py /
run_scheduler.py reaches vLLM's code: subclasses of vLLM's own KVCacheManager and
Scheduler that only count calls to their public methods (class-level counters, so
instances built anywhere -- tests, create_scheduler, the scheduler itself -- add up).

  --manager counting_classes:CountingKVCacheManager
  --scheduler-cls counting_classes:CountingScheduler
"""
from __future__ import annotations

import functools
from collections import Counter

from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.sched.scheduler import Scheduler

MANAGER_METHODS = (
    "__init__", "get_computed_blocks", "allocate_slots", "free", "remove_skipped_blocks",
    "new_step_starts", "get_blocks", "get_block_ids", "get_num_common_prefix_blocks",
    "take_events", "take_new_block_ids", "reset_prefix_cache", "make_prefix_cache_stats",
    "evict_blocks", "cache_blocks", "create_kv_cache_blocks", "empty_kv_cache_blocks",
)
SCHEDULER_METHODS = ("__init__", "schedule", "update_from_output", "add_request",
                     "finish_requests")


def _counted(cls, names):
    counts: Counter = Counter()
    for name in names:
        orig = getattr(cls.__mro__[1], name, None)
        if orig is None or not callable(orig):
            continue

        def make(orig=orig, name=name):
            @functools.wraps(orig)
            def wrapper(self, *a, **k):
                counts[name] += 1
                return orig(self, *a, **k)
            return wrapper
        setattr(cls, name, make())
    cls.call_counts = counts
    return cls


class CountingKVCacheManager(KVCacheManager):
    pass


class CountingScheduler(Scheduler):
    pass


_counted(CountingKVCacheManager, MANAGER_METHODS)
_counted(CountingScheduler, SCHEDULER_METHODS)
