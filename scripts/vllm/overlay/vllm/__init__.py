"""Stub top-level `vllm` (overlay in front of the shared stubs): like the shared stub it
imports nothing heavy (the real one pulls engine entrypoints, torch.compile,
transformers); it adds the lazy top-level names tests import (`from vllm import
SamplingParams`).  Submodules resolve through vllm_env's layered finder."""
__version__ = "stub-overlay"
__version_tuple__ = (0, 0, 0)

_LAZY = {
    "SamplingParams": "vllm.sampling_params",
    "PoolingParams": "vllm.pooling_params",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vllm' (hybridkv overlay) has no attribute {name!r}")
