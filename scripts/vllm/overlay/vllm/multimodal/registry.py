# Stub: see __init__.py (real registry imports processors/tokenizers).
from vllm.multimodal import MULTIMODAL_REGISTRY, MultiModalRegistry  # noqa: F401
