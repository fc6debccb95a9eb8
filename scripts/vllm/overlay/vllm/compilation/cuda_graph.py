# Stub: real cuda_graph.py needs CUDA graph pools (torch.cuda CUDAPluggableAllocator).
# The scheduler only imports the CUDAGraphStat record (copied verbatim).
import dataclasses  # noqa: F401

from vllm._stubutil import extract

extract("compilation/cuda_graph.py", ["CUDAGraphStat"], globals())
