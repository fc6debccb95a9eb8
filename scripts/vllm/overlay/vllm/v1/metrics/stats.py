# Un-stub: the real vllm/v1/metrics/stats.py (SchedulerStats, PrefixCacheStats, ...)
# imports with the overlay's cuda_graph / perf stubs; the shared overlay exposes only
# the KV-manager subset.
from vllm._real import exec_real

exec_real("v1/metrics/stats.py", globals())
