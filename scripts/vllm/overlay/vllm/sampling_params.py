# Un-stub (mostly): vLLM's own sampling_params.py -- SamplingParams (a msgspec Struct,
# via the overlay's msgspec stand-in), RepetitionDetectionParams, StructuredOutputsParams,
# RequestOutputKind, ... -- run unmodified except three imports that need transformers /
# pydantic-core: the tokenizer protocol, the mistral check and the pydantic mixin.
from typing import Any

from vllm._real import exec_real_dropping_imports


class PydanticMsgspecMixin:  # stand-in: pydantic-core schema hooks (API server only)
    pass


TokenizerLike = Any  # stand-in: vllm.tokenizers.TokenizerLike (protocol, transformers)


def is_mistral_tokenizer(tokenizer) -> bool:  # stand-in: no mistral tokenizers here
    return False


exec_real_dropping_imports(
    "sampling_params.py", globals(),
    {"vllm.tokenizers", "vllm.utils.mistral", "vllm.v1.serial_utils"})
