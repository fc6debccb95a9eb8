# Un-stub (mostly): vLLM's ExampleConnector (used by tests/v1 as the reference KV
# connector), run unmodified except two worker-side imports: the MLA / Triton attention
# metadata classes (GPU backends; only used in worker-side isinstance checks).
# (safetensors comes from the overlay's stand-in.)
from vllm._real import exec_real_dropping_imports


class MLACommonMetadata:  # stand-in (GPU MLA backend)
    pass


class TritonAttentionMetadata:  # stand-in (Triton backend)
    pass


exec_real_dropping_imports(
    "distributed/kv_transfer/kv_connector/v1/example_connector.py", globals(),
    {"vllm.model_executor.layers.attention.mla_attention",
     "vllm.v1.attention.backends.triton_attn"})
