"""hybridkv: KV-cache memory management for hybrid LLMs.

The compiled library lives in ``hybridkv._hybridkv``; everything it exports is re-exported
here, so ``import hybridkv`` is the whole API. ``hybridkv.vllm`` (imported on demand) puts the
manager under vLLM's scheduler.
"""
from ._hybridkv import *  # noqa: F401,F403  (the extension defines exactly the public API)
from ._hybridkv import __doc__, __version__, _decode_steps_cpp  # noqa: F401
