"""KVCacheManager: vLLM v1's KV cache manager interface, backed by hybridkv's C++ restatement.

Contract: constructed as vLLM's Scheduler constructs its manager, it answers every call the way
vLLM's own manager at the pinned commit does (same block ids, hits, refusals, freed blocks and
events), because the work is done by ``hybridkv.VllmCore`` (``hkv::vllm::KvCacheManager``), which
is held block for block to vLLM's manager by recorded logs. What it does not implement is refused
by name at construction or at the call: EAGLE's last-block drop, cross-attention (encoder
tokens), sink attention, and a KV metrics collector.

Hot path: requests are keyed by a small int; a request's block hashes are read by the C++ side
only past the ones it has seen; results are tuples of block-id lists wrapped in a KVCacheBlocks
whose KVCacheBlock objects are built only if someone reads ``.blocks``.
"""
from __future__ import annotations

import functools
import weakref
from typing import Any

from hybridkv._hybridkv import VllmCore, VllmHitIds, _vllm_get_block_ids

from . import _standins as v
from ._standins import SPEC_KINDS, KVCacheBlocks


def _block(core: VllmCore, block_id: int):
    b = v.KVCacheBlock(block_id)
    if block_id == 0:
        b.is_null = True
    elif core.is_cached(block_id):
        b.block_hash = b"hybridkv:cached"
    return b


class IdBlocks(KVCacheBlocks):
    """A KVCacheBlocks holding block ids; ``blocks`` builds vLLM's KVCacheBlock objects on
    first read (a snapshot: ref counts are not kept, ``block_hash`` is a marker when cached).

    It refers to the C++ core, not to the manager: the manager's C builtins hold the objects
    they return, and a reference back to the manager through them would be a cycle Python's
    collector cannot see (the manager would never be freed)."""

    def __init__(self, ids: tuple, core: VllmCore) -> None:  # noqa: D107
        self._ids = ids
        self._core = core
        self._blocks = None

    @property
    def blocks(self):  # type: ignore[override]
        if self._blocks is None:
            core = self._core
            self._blocks = tuple([_block(core, b) for b in g] for g in self._ids)
        return self._blocks

    @blocks.setter
    def blocks(self, value) -> None:
        self._blocks = value
        self._ids = tuple([b.block_id for b in g] for g in value)

    # get_block_ids(allow_none=False): the caller's own lists, as vLLM returns, or None when
    # allow_none and every group is empty. In C: the scheduler calls it per running request.
    get_block_ids = _vllm_get_block_ids

    def get_unhashed_block_ids(self) -> list[int]:
        assert len(self._ids) == 1, "Only one group is supported"
        cached = self._core.is_cached
        return [b for b in self._ids[0] if not cached(b)]

    def get_unhashed_block_ids_all_groups(self) -> list[list[int]]:
        cached = self._core.is_cached
        return [[b for b in g if b != 0 and not cached(b)] for g in self._ids]

    def __add__(self, other):
        return IdBlocks(tuple([*a, *b] for a, b in zip(self._ids, _ids_of(other))),
                        self._core)

    def __eq__(self, other):
        return isinstance(other, KVCacheBlocks) and self.get_block_ids() == _ids_of(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"IdBlocks({self._ids!r})"

    def new_empty(self):
        return IdBlocks(tuple(() for _ in self._ids), self._core)


def _ids_of(blocks) -> tuple:
    ids = getattr(blocks, "_ids", None)
    if ids is not None:
        return ids
    return tuple([b.block_id for b in g] for g in blocks.blocks)


def _group_tuple(spec, scale: int) -> tuple:
    name = type(spec).__name__
    kind = SPEC_KINDS.get(name)
    if kind is None:
        raise NotImplementedError(
            f"hybridkv.vllm: KV cache spec {name} is not supported (supported: "
            f"{', '.join(sorted(SPEC_KINDS))}); run this model with vLLM's own manager")
    mode = "all"
    if kind == "mamba":
        # vLLM's MambaManager tells only 'align' apart: 'none' (prefix caching off, MambaSpec's
        # default) follows the same rules as 'all'.
        mode = getattr(spec, "mamba_cache_mode", "none")
        if mode == "none":
            mode = "all"
        if mode not in ("all", "align"):
            raise NotImplementedError(
                f"hybridkv.vllm: mamba_cache_mode {mode!r} is not one vLLM defines "
                "('none', 'all', 'align')")
    return (kind, int(spec.block_size) * scale, int(getattr(spec, "sliding_window", 0) or 0),
            int(getattr(spec, "attention_chunk_size", 0) or 0), mode)


class _PoolView:
    """What callers read off vLLM's BlockPool, answered from the C++ pool."""

    def __init__(self, manager: "KVCacheManager") -> None:
        self._m = manager
        self.enable_caching = manager.enable_caching

    @property
    def num_gpu_blocks(self) -> int:
        return self._m._core.num_blocks

    def get_num_free_blocks(self) -> int:
        return self._m._core.num_free_blocks

    def get_usage(self) -> float:
        return self._m.usage

    @property
    def null_block(self):
        return _block(self._m._core, 0)


class _HitBlocks(IdBlocks):
    """get_computed_blocks' result. vLLM's scheduler usually only hands it back to
    allocate_slots, which reads the ids from C++; the Python lists are built on first read."""

    def __init__(self, hit: VllmHitIds, core: VllmCore) -> None:  # noqa: D107
        self._hit = hit
        self._core = core
        self._blocks = None

    @functools.cached_property
    def _ids(self) -> tuple:  # type: ignore[override]
        return self._hit.to_tuple()


class _EmptyBlocks(IdBlocks):
    """The manager's shared empty KVCacheBlocks (vLLM's empty_kv_cache_blocks)."""

    def __init__(self, num_groups: int, core: VllmCore) -> None:  # noqa: D107
        super().__init__(tuple(() for _ in range(num_groups)), core)
        self._blocks = self._ids


class _GroupView:
    """One group's per-request tables, read-only, for callers that check for leaks the way
    vLLM's own scripts do (``coordinator.single_type_managers[g].req_to_blocks``)."""

    def __init__(self, manager: "KVCacheManager", group: int) -> None:
        self._m = manager
        self._g = group

    @property
    def req_to_blocks(self) -> dict[str, list[int]]:
        core = self._m._core
        out = {rid: core.block_ids(i)[self._g] for rid, i in self._m._ids.items()}
        return {rid: b for rid, b in out.items() if b}

    @property
    def num_cached_block(self) -> dict[str, int]:
        return {} if self._m._core.idle else {rid: -1 for rid in self._m._ids}


class _CoordinatorView:
    def __init__(self, manager: "KVCacheManager") -> None:
        self.single_type_managers = tuple(
            _GroupView(manager, g) for g in range(manager.num_kv_cache_groups))


class KVCacheManager:
    """Drop-in for ``vllm.v1.core.kv_cache_manager.KVCacheManager`` (same constructor, methods,
    properties and return types).

    ``policy`` (hybridkv's own keyword, after vLLM's): ``"vllm"`` answers every call as vLLM's
    manager does; ``"hybridkv"`` keeps vLLM's layout, tables and hit rules and changes which free
    block is evicted next (blocks without an identity first, then recurrent states a request has
    moved past that nothing shares), so more of what later requests hit stays cached. See
    docs/vllm.md."""

    def __init__(
        self,
        kv_cache_config,
        max_model_len: int,
        hash_block_size: int,
        max_num_batched_tokens: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        metrics_collector: Any = None,
        policy: str = "vllm",
    ) -> None:
        if policy not in ("vllm", "hybridkv"):
            raise ValueError(f"hybridkv.vllm: policy {policy!r}: expected 'vllm' or 'hybridkv'")
        if use_eagle:
            raise NotImplementedError(
                "hybridkv.vllm: EAGLE speculative decoding (use_eagle) drops the last hit block "
                "per group; that rule is not restated yet; use vLLM's own manager")
        if metrics_collector is not None:
            raise NotImplementedError(
                "hybridkv.vllm: the KV cache residency metrics collector reads vLLM's block "
                "objects; turn off KV cache metrics or use vLLM's own manager")
        if max_num_batched_tokens is None:
            max_num_batched_tokens = max_model_len
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.use_eagle = use_eagle
        self.log_stats = log_stats
        self.metrics_collector = None
        self.prefix_cache_stats = v.PrefixCacheStats() if log_stats else None
        self.kv_cache_config = kv_cache_config
        self.hash_block_size = hash_block_size
        groups = kv_cache_config.kv_cache_groups
        self.num_kv_cache_groups = len(groups)
        scale = dcp_world_size * pcp_world_size
        specs = [g.kv_cache_spec for g in groups]
        self._core = VllmCore([_group_tuple(s, scale) for s in specs],
                              int(kv_cache_config.num_blocks), int(hash_block_size),
                              int(max_model_len), int(max_num_batched_tokens),
                              bool(enable_caching), bool(enable_kv_cache_events), policy)
        self.policy = policy
        self._events_on = bool(enable_kv_cache_events)
        self.kv_cache_event_metadata = tuple(
            (v.spec_kind_value(s), v.get_kv_cache_spec_sliding_window(s)) for s in specs)
        self.empty_kv_cache_blocks = _EmptyBlocks(len(groups), self._core)
        self.block_pool = _PoolView(self)
        self.coordinator = _CoordinatorView(self)
        self._ids: dict[str, int] = {}
        self._events: list = []
        self._event_hash: dict[int, bytes] = {}  # cached block -> its hash, for BlockRemoved
        # The per-step calls without a Python frame: C builtins with vLLM's signatures. The C
        # allocate_slots cannot queue events, so with events on the Python one serves; the C
        # get_computed_blocks keeps no statistics, so with log_stats the Python one serves.
        # What the builtins hold must not lead back to this manager (see IdBlocks): the slow
        # paths reach it through a weak reference.
        me = weakref.ref(self)

        def slow_allocate(*args, **kwargs):
            return KVCacheManager.allocate_slots(me(), *args, **kwargs)

        def slow_computed(request):
            return KVCacheManager.get_computed_blocks(me(), request)

        fast = VllmCore.fast_calls(self._core, self._ids, self.empty_kv_cache_blocks,
                                   functools.partial(IdBlocks, core=self._core), slow_allocate,
                                   slow_computed, functools.partial(_HitBlocks, core=self._core),
                                   _HitBlocks, v.direct_token_count_type())
        (allocate, self.new_step_starts, self.get_num_common_prefix_blocks,
         self.take_new_block_ids, get_computed, self._rid) = fast
        if not self._events_on:
            self.allocate_slots = allocate
            self.take_events = list  # vLLM's block pool answers [] with events off
        if self.enable_caching and not self.log_stats:
            self.get_computed_blocks = get_computed

    # -- request ids ------------------------------------------------------------------------
    def _wrap(self, ids):
        return IdBlocks(ids, self._core) if ids else self.empty_kv_cache_blocks

    # -- vLLM's interface -------------------------------------------------------------------
    @property
    def usage(self) -> float:
        total = self._core.num_blocks - 1
        if not total:
            return 0
        return 1.0 - self._core.num_free_blocks / total

    def make_prefix_cache_stats(self):
        if not self.log_stats:
            return None
        stats = self.prefix_cache_stats
        self.prefix_cache_stats = v.PrefixCacheStats()
        return stats

    def get_computed_blocks(self, request):
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return self.empty_kv_cache_blocks, 0
        ids, n = self._core.get_computed_blocks(self._rid(request.request_id),
                                                request.num_tokens, request.block_hashes)
        if self.log_stats:
            self.prefix_cache_stats.record(num_tokens=request.num_tokens, num_hits=n,
                                           preempted=request.num_preemptions > 0)
        return self._wrap(ids), n

    def allocate_slots(
        self,
        request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks=None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
    ):
        if num_encoder_tokens:
            raise NotImplementedError(
                "hybridkv.vllm: encoder tokens (cross-attention) are not supported")
        if num_new_tokens == 0 and num_external_computed_tokens == 0:
            raise ValueError("num_new_tokens must be greater than 0 when there are no "
                             "external computed tokens")
        if new_computed_blocks is None or new_computed_blocks is self.empty_kv_cache_blocks:
            computed = None
        else:
            computed = _ids_of(new_computed_blocks)
        ids = self._core.allocate_slots(
            self._rid(request.request_id), request.num_tokens, request.block_hashes,
            request.num_computed_tokens, num_new_tokens, num_new_computed_tokens, computed,
            num_lookahead_tokens, num_external_computed_tokens, delay_cache_blocks,
            full_sequence_must_fit)
        if self._events_on:
            self._drain(request)
        if ids is None:
            return None
        return IdBlocks(ids, self._core) if ids else self.empty_kv_cache_blocks

    def free(self, request) -> None:
        rid = self._ids.pop(request.request_id, None)
        if rid is not None:
            self._core.free(rid)  # freeing publishes nothing in vLLM's block pool

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        rid = self._ids.get(request_id)
        if rid is not None:
            self._core.remove_skipped_blocks(rid, total_computed_tokens)

    def evict_blocks(self, block_ids: set[int]) -> None:
        self._core.evict_blocks(list(block_ids))
        if self._events_on:
            self._drain(None)

    def reset_prefix_cache(self) -> bool:
        if not self._core.reset_prefix_cache():
            return False
        if self._events_on:
            self._drain(None)
        if self.log_stats:
            self.prefix_cache_stats.reset = True
        return True

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        rid = self._ids.get(running_request_id)
        if rid is None:
            return [0] * self.num_kv_cache_groups
        return self._core.num_common_prefix_blocks(rid)

    def take_events(self) -> list:
        events, self._events = self._events, []
        for event in events:
            if isinstance(event, v.BlockStored) and event.group_idx is not None and \
                    0 <= event.group_idx < len(self.kv_cache_event_metadata):
                kind, window = self.kv_cache_event_metadata[event.group_idx]
                event.kv_cache_spec_kind = kind
                event.kv_cache_spec_sliding_window = window
        return events

    def get_blocks(self, request_id: str):
        rid = self._ids.get(request_id)
        if rid is None:
            return self.empty_kv_cache_blocks
        ids = self._core.block_ids(rid)
        return IdBlocks(ids, self._core) if any(ids) else self.empty_kv_cache_blocks

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self.get_blocks(request_id).get_block_ids()

    def cache_blocks(self, request, num_computed_tokens: int) -> None:
        if self.enable_caching:
            self._core.cache_blocks(self._rid(request.request_id), request.num_tokens,
                                    request.block_hashes, num_computed_tokens)
            if self._events_on:
                self._drain(request)

    def create_kv_cache_blocks(self, blocks):
        return KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks

    def take_new_block_ids(self) -> list[int]:
        return self._core.take_new_block_ids()

    def new_step_starts(self) -> None:
        self._core.new_step_starts()

    # -- events -----------------------------------------------------------------------------
    def _hash_at(self, request, index: int, block_size: int) -> bytes:
        scale = block_size // self.hash_block_size
        hashes = request.block_hashes
        if scale == 1:
            return hashes[index]
        return b"".join(hashes[index * scale:(index + 1) * scale])

    def _drain(self, request) -> None:
        for e in self._core.take_events():
            if e[0] == "stored":
                self._events.append(self._stored(request, *e[1:]))
            elif e[0] == "removed":
                _, group, block = e
                raw = self._event_hash.pop(block)
                self._events.append(v.BlockRemoved(
                    block_hashes=[v.maybe_convert_block_hash(raw)], medium=v.MEDIUM_GPU,
                    group_idx=group))
            else:
                self._event_hash.clear()
                self._events.append(v.AllBlocksCleared())

    def _stored(self, request, group, rid, block_size, first, end, blocks, indices):
        new_hashes = []
        extra_keys = []
        mm_idx = 0
        for block, i in zip(blocks, indices):
            raw = self._hash_at(request, i, block_size)
            self._event_hash[block] = raw
            new_hashes.append(v.maybe_convert_block_hash(raw))
            keys, mm_idx = v.generate_block_hash_extra_keys(
                request, i * block_size, (i + 1) * block_size, mm_idx)
            extra_keys.append(keys)
        parent = None if first == 0 else \
            v.maybe_convert_block_hash(self._hash_at(request, first - 1, block_size))
        lora = getattr(request, "lora_request", None)
        return v.BlockStored(
            block_hashes=new_hashes,
            parent_block_hash=parent,
            token_ids=request.all_token_ids[first * block_size:end * block_size],
            block_size=block_size,
            lora_id=lora.adapter_id if lora else None,
            medium=v.MEDIUM_GPU,
            lora_name=lora.name if lora else None,
            extra_keys=extra_keys if extra_keys else None,
            group_idx=group,
        )

    # -- checks -----------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Ref counts, free queue and prefix map agree (raises hybridkv.Error if not)."""
        self._core.check_invariants()
