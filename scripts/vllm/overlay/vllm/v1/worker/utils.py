# Stub: real vllm/v1/worker/utils.py imports attention layers, triton and the platform.
# Only the KV-sharing helper the KV-cache tests use is exposed, copied verbatim.
from vllm._stubutil import extract

extract("v1/worker/utils.py", ["add_kv_sharing_layers_to_kv_cache_groups"], globals())
