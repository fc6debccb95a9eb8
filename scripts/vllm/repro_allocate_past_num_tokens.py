#!/usr/bin/python3
"""Class-c repro of docs/vllm_tests.md: allocate_slots with num_new_tokens past
request.num_tokens (draft tokens of spec decoding / async output placeholders), vLLM's own
KVCacheManager vs hybridkv's.

  PYTHONPATH=build/dev/python /usr/bin/python3 scripts/vllm/repro_allocate_past_num_tokens.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_env  # noqa: E402

vllm_env.setup()
sys.path.insert(0, vllm_env.vllm_src_root())
from tests.v1.core.test_prefix_caching import make_kv_cache_config, make_request  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmKVCacheManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import init_none_hash  # noqa: E402

from hybridkv.vllm import KVCacheManager as HkvKVCacheManager  # noqa: E402

init_none_hash(sha256)
for cls in (VllmKVCacheManager, HkvKVCacheManager):
    m = cls(make_kv_cache_config(4, 11), max_model_len=64, hash_block_size=4)
    r = make_request("0", list(range(8)), 4, sha256)
    print(cls.__module__, "prefill:", m.allocate_slots(r, 8).get_block_ids())
    r.num_computed_tokens = 8
    try:  # a decode step with 3 draft tokens: 1 + 3 new tokens, the request has 8 tokens
        print("   decode + 3 drafts:", m.allocate_slots(r, 4).get_block_ids())
    except Exception as e:  # noqa: BLE001
        print("   decode + 3 drafts:", type(e).__name__, e)
