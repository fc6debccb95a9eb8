# Un-stub: the real vllm/v1/engine/__init__.py (EngineCoreOutput(s), EngineCoreEvent,
# FinishReason, ... as msgspec Structs via the overlay's msgspec stand-in), except the
# import of v1/serial_utils (needs cloudpickle + pydantic-core), whose UtilityResult
# wrapper is restated here.
from typing import Any

from vllm._real import exec_real_dropping_imports


class UtilityResult:  # as vllm/v1/serial_utils.py
    def __init__(self, r: Any = None):
        self.result = r


exec_real_dropping_imports("v1/engine/__init__.py", globals(), {"vllm.v1.serial_utils"})
