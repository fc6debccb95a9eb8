# Stub: real vllm/v1/utils.py imports uvloop, usage_lib, network/process helpers.
# Exposes the shared stub's ConstantList / tensor_data plus the scheduler's
# record_function_or_nullcontext, copied verbatim.
import contextlib  # noqa: F401
from collections.abc import Sequence  # noqa: F401
from contextlib import AbstractContextManager  # noqa: F401
from typing import Generic, TypeVar, overload  # noqa: F401

import torch  # noqa: F401
from torch.autograd.profiler import record_function  # noqa: F401

import vllm.envs as envs  # noqa: F401
from vllm._stubutil import extract

T = TypeVar("T")
_PROFILER_FUNC = None
extract("v1/utils.py", ["ConstantList", "tensor_data", "record_function_or_nullcontext"],
        globals())
