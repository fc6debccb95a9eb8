# Stub: real perf.py (MFU metrics) needs pydantic BaseModel and per-model FLOP tables;
# the scheduler builds ModelMetrics only with observability enable_mfu_metrics.
# The PerfStats / DebugPerfStats records are copied verbatim.
from dataclasses import dataclass  # noqa: F401

from vllm._stubutil import extract

extract("v1/metrics/perf.py", ["DebugPerfStats", "PerfStats"], globals())


class ModelMetrics:
    def __init__(self, *a, **k):
        raise NotImplementedError("MFU metrics are not available in this overlay")
