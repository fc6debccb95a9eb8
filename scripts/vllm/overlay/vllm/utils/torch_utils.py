# Stub: real torch_utils needs torch>=2.x (torch.library.infer_schema, float8 dtypes);
# re-exposes the shared stub's helpers plus the dtype predicates the config/scheduler
# code reads, copied verbatim from the real file by name.
import torch  # noqa: F401

import vllm.envs as envs  # noqa: F401
from vllm._stubutil import extract

extract("utils/torch_utils.py",
        ["get_dtype_size", "nvfp4_kv_cache_full_dim", "is_quantized_kv_cache",
         "kv_cache_uses_per_token_head_scales", "_is_torch_equal_or_newer",
         "is_torch_equal_or_newer"], globals())
from packaging import version  # noqa: E402,F401  (used by the extracted helpers)


def supports_xccl() -> bool:
    # real: torch.distributed.is_xccl_available() (torch >= 2.8); torch 1.13 has no XCCL
    return False


def supports_xpu_graph() -> bool:
    return False
