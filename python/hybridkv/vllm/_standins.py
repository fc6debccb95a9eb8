"""What the adapter takes from vLLM, or stand-ins with the same fields when vLLM is not importable.

Inside a vLLM process every name below is vLLM's own class or function, so the scheduler, the
model runner and KV-event consumers get exactly the objects they expect. Without vLLM (CI, which
cannot install it, replaying recorded call logs) the stand-ins carry the same fields; they cover
what those logs contain: requests without LoRA, multimodal inputs or cache salts.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

try:
    from vllm.distributed.kv_events import (  # type: ignore[import-not-found]
        MEDIUM_GPU,
        AllBlocksCleared,
        BlockRemoved,
        BlockStored,
    )
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks  # type: ignore[import-not-found]
    from vllm.v1.core.kv_cache_utils import (  # type: ignore[import-not-found]
        KVCacheBlock,
        generate_block_hash_extra_keys,
        maybe_convert_block_hash,
    )
    from vllm.v1.kv_cache_interface import (  # type: ignore[import-not-found]
        get_kv_cache_spec_kind,
        get_kv_cache_spec_sliding_window,
    )
    from vllm.v1.metrics.stats import PrefixCacheStats  # type: ignore[import-not-found]

    HAVE_VLLM = True
except ImportError:
    HAVE_VLLM = False
    MEDIUM_GPU = "GPU"

    @dataclasses.dataclass
    class KVCacheBlock:  # type: ignore[no-redef]
        block_id: int
        ref_cnt: int = 0
        block_hash: Any = None
        is_null: bool = False

    @dataclasses.dataclass
    class KVCacheBlocks:  # type: ignore[no-redef]
        blocks: tuple

        def get_block_ids(self, allow_none: bool = False):
            if allow_none and all(len(g) == 0 for g in self.blocks):
                return None
            return tuple([b.block_id for b in g] for g in self.blocks)

        def new_empty(self):
            return KVCacheBlocks(tuple(() for _ in self.blocks))

    @dataclasses.dataclass
    class BlockStored:  # type: ignore[no-redef]
        block_hashes: list
        parent_block_hash: Any
        token_ids: list
        block_size: int
        lora_id: int | None
        medium: str | None
        lora_name: str | None
        extra_keys: list | None = None
        group_idx: int | None = None
        kv_cache_spec_kind: str | None = None
        kv_cache_spec_sliding_window: int | None = None

    @dataclasses.dataclass
    class BlockRemoved:  # type: ignore[no-redef]
        block_hashes: list
        medium: str | None
        group_idx: int | None = None

    @dataclasses.dataclass
    class AllBlocksCleared:  # type: ignore[no-redef]
        pass

    @dataclasses.dataclass
    class PrefixCacheStats:  # type: ignore[no-redef]
        reset: bool = False
        requests: int = 0
        queries: int = 0
        hits: int = 0
        preempted_requests: int = 0
        preempted_queries: int = 0
        preempted_hits: int = 0

        def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
            if preempted:
                self.preempted_requests += 1
                self.preempted_queries += num_tokens
                self.preempted_hits += num_hits
            else:
                self.requests += 1
                self.queries += num_tokens
                self.hits += num_hits

    def maybe_convert_block_hash(hash_bytes):  # type: ignore[no-redef]
        if os.environ.get("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1") in ("0", "false", "False"):
            return hash_bytes
        return int.from_bytes(hash_bytes, byteorder="big") & ((1 << 64) - 1)

    def generate_block_hash_extra_keys(request, start, end, mm_idx):  # type: ignore[no-redef]
        if getattr(request, "lora_request", None) or getattr(request, "cache_salt", None) or \
                getattr(request, "mm_features", None):
            raise NotImplementedError(
                "hybridkv.vllm without vLLM: extra keys (LoRA, cache salt, multimodal) need "
                "vLLM's own generate_block_hash_extra_keys")
        return None, mm_idx

    def get_kv_cache_spec_kind(spec):  # type: ignore[no-redef]
        return _standin_kind(spec)

    def get_kv_cache_spec_sliding_window(spec):  # type: ignore[no-redef]
        return getattr(spec, "sliding_window", None) if _standin_kind(spec) == "sliding_window" \
            else None


# vLLM's spec classes by name (exact type, as vLLM's spec_manager_map keys them) -> the kind the
# C++ restatement implements. Names absent here are refused by name.
SPEC_KINDS = {
    "FullAttentionSpec": "full_attention",
    "TQFullAttentionSpec": "full_attention",
    "MLAAttentionSpec": "mla",
    "HiddenStateCacheSpec": "mla",
    "SlidingWindowSpec": "sliding_window",
    "SlidingWindowMLASpec": "sliding_window",
    "ChunkedLocalAttentionSpec": "chunked_local",
    "MambaSpec": "mamba",
}

_EVENT_KINDS = {
    "full_attention": "full_attention", "mla": "mla_attention",
    "sliding_window": "sliding_window", "chunked_local": "chunked_local_attention",
    "mamba": "mamba",
}


def _standin_kind(spec) -> str:
    name = type(spec).__name__
    if name == "SlidingWindowMLASpec":
        return "sliding_window_mla"
    return _EVENT_KINDS.get(SPEC_KINDS.get(name, ""), "unknown")


def spec_kind_value(spec) -> str:
    kind = get_kv_cache_spec_kind(spec)
    return getattr(kind, "value", kind)


def direct_token_count_type():
    """vLLM's Request class when its ``num_tokens`` is ``len(self._all_token_ids)`` (checked on
    a bare instance, not assumed), else None. The adapter's C allocate_slots then reads the
    list's length itself instead of running the property's Python frame per call."""
    try:
        from vllm.v1.request import Request  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        probe = object.__new__(Request)
        probe._all_token_ids = [0, 0, 0]
        ok = Request.num_tokens.fget(probe) == 3
        probe._all_token_ids = []
        ok = ok and Request.num_tokens.fget(probe) == 0
    except Exception:  # noqa: BLE001 -- any other shape: keep reading the property
        return None
    return Request if ok else None
