"""Stand-in for safetensors (not packaged by Debian bookworm).  Imports succeed so that
vLLM's example KV / EC connectors load; their scheduler-side code only checks whether
files exist.  Saving or loading tensors (worker side) raises NotImplementedError."""
from safetensors import torch  # noqa: F401
