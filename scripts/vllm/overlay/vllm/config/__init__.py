"""vllm.config for this machine (overlay; replaces the shared stub's plain dataclasses).

REAL vLLM classes (their own files, unmodified, made importable by the pydantic
stand-in in overlay/pydantic): CacheConfig, SchedulerConfig (incl. __post_init__ defaults
and get_scheduler_cls), KVTransferConfig, ECTransferConfig, KVEventsConfig,
StructuredOutputsConfig, ObservabilityConfig, LoadConfig, MambaConfig, KernelConfig,
ProfilerConfig, OffloadConfig and the helpers in vllm/config/utils.py.

STAND-INS (the real modules need transformers / HF hub downloads (ModelConfig,
SpeculativeConfig), vllm.platforms CUDA detection + torch.distributed (ParallelConfig,
LoRAConfig), torch>=2 inductor passes (CompilationConfig), or all of those (VllmConfig)):
plain dataclasses with the real field names and defaults for every field the scheduler,
KV cache code, StructuredOutputManager and tests/v1/core read.
"""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import InitVar, field
from typing import Any

from vllm._stubutil import extract
from vllm.config.utils import (  # noqa: F401  (real)
    SupportsHash,
    config,
    get_attr_docs,
    get_field,
    is_init_field,
    replace,
)
from vllm.config.cache import CacheConfig  # noqa: F401  (real)
from vllm.config.scheduler import SchedulerConfig  # noqa: F401  (real)
from vllm.config.kv_transfer import KVTransferConfig  # noqa: F401  (real)
from vllm.config.ec_transfer import ECTransferConfig  # noqa: F401  (real)
from vllm.config.kv_events import KVEventsConfig  # noqa: F401  (real, see kv_events.py)
from vllm.config.structured_outputs import StructuredOutputsConfig  # noqa: F401  (real)
from vllm.config.observability import ObservabilityConfig  # noqa: F401  (real)
from vllm.config.load import LoadConfig  # noqa: F401  (real)
from vllm.config.mamba import MambaConfig  # noqa: F401  (real)
from vllm.config.kernel import KernelConfig  # noqa: F401  (real)
from vllm.config.profiler import ProfilerConfig  # noqa: F401  (real)
from vllm.config.offload import OffloadConfig  # noqa: F401  (real)

# The two enums are copied verbatim from vllm/config/compilation.py (that module needs
# torch>=2 inductor passes and platform detection).
extract("config/compilation.py", ["CompilationMode", "CUDAGraphMode"], globals())

# Known models used by tests/v1 (max_position_embeddings of their HF configs), so the
# ModelConfig stand-in derives max_model_len like the real one would from the HF config.
_KNOWN_MAX_LEN = {
    "facebook/opt-125m": 2048,
    "Qwen/Qwen3-0.6B": 40960,
    "meta-llama/Llama-3.2-1B-Instruct": 131072,
}


@dataclasses.dataclass
class ModelConfig:
    """Stand-in for vllm.config.model.ModelConfig (real: reads the HF config via
    transformers).  Field names/defaults as the real class; max_model_len is derived from
    _KNOWN_MAX_LEN (else 8192) when not given."""
    model: str = "Qwen/Qwen3-0.6B"
    tokenizer: str | None = None
    trust_remote_code: bool = False
    dtype: Any = "auto"
    seed: int = 0
    max_model_len: int | None = None
    original_max_model_len: int | None = None
    skip_tokenizer_init: bool = False
    enable_return_routed_experts: bool = False
    enable_prompt_embeds: bool = False
    max_logprobs: int = 20
    logprobs_mode: str = "raw_logprobs"
    disable_sliding_window: bool = False
    disable_cascade_attn: bool = True
    enforce_eager: bool = False
    revision: str | None = None
    tokenizer_revision: str | None = None
    runner: str = "auto"
    convert: str = "auto"
    hf_overrides: dict = field(default_factory=dict)
    served_model_name: Any = None
    generation_config: str = "auto"
    quantization: Any = None
    attention_chunk_size: int | None = None
    # not real ModelConfig init fields, but properties there:
    is_encoder_decoder: bool = False
    is_multimodal_model: bool = False
    is_hybrid: bool = False
    use_mla: bool = False
    is_attention_free: bool = False
    multimodal_config: Any = None
    pooler_config: Any = None
    runner_type: str = "generate"

    def __post_init__(self):
        if self.tokenizer is None:
            self.tokenizer = self.model
        if self.max_model_len is None:
            self.max_model_len = _KNOWN_MAX_LEN.get(self.model, 8192)
        if self.original_max_model_len is None:
            self.original_max_model_len = self.max_model_len
        if self.dtype == "auto":
            import torch
            self.dtype = torch.bfloat16
        elif isinstance(self.dtype, str):
            import torch
            self.dtype = getattr(torch, self.dtype)

    def get_vocab_size(self) -> int:
        return 50272

    def get_sliding_window(self):
        return None

    @property
    def architecture(self) -> str:
        return "StandInForCausalLM"


@dataclasses.dataclass
class ParallelConfig:
    """Stand-in for vllm.config.parallel.ParallelConfig (real: torch.distributed,
    vllm.platforms).  Single process, rank 0; real field names/defaults."""
    pipeline_parallel_size: int = 1
    tensor_parallel_size: int = 1
    prefill_context_parallel_size: int = 1
    decode_context_parallel_size: int = 1
    data_parallel_size: int = 1
    data_parallel_size_local: int = 1
    data_parallel_rank: int = 0
    data_parallel_rank_local: int | None = None
    data_parallel_external_lb: bool = False
    data_parallel_hybrid_lb: bool = False
    enable_expert_parallel: bool = False
    distributed_executor_backend: Any = None
    dcp_kv_cache_interleave_size: int = 1
    cp_kv_cache_interleave_size: int = 1
    rank: int = 0
    world_size: int = field(init=False)
    data_parallel_index: int = field(init=False)

    def __post_init__(self):
        self.world_size = (self.pipeline_parallel_size * self.tensor_parallel_size
                           * self.prefill_context_parallel_size)
        self.data_parallel_index = self.data_parallel_rank


@dataclasses.dataclass
class LoRAConfig:
    """Stand-in for vllm.config.lora.LoRAConfig (real: vllm.platforms)."""
    max_lora_rank: int = 16
    max_loras: int = 1
    fully_sharded_loras: bool = False
    max_cpu_loras: int | None = None
    lora_dtype: Any = "auto"


@dataclasses.dataclass
class SpeculativeConfig:
    """Stand-in for vllm.config.speculative.SpeculativeConfig (real: loads the draft
    model's HF config).  method is inferred from `model` as the real one does for
    "ngram"/"[ngram]"; use_eagle()/uses_draft_model() as in the real class."""
    num_speculative_tokens: int | None = None
    model: str | None = None
    method: str | None = None
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None
    max_model_len: int | None = None
    disable_padded_drafter_batch: bool = False
    parallel_drafting: bool = False

    def __post_init__(self):
        if self.method is None and self.model in ("ngram", "[ngram]"):
            self.method = "ngram"
        if self.method == "ngram":
            if self.prompt_lookup_min is None:
                self.prompt_lookup_min = 5 if self.prompt_lookup_max is None \
                    else self.prompt_lookup_max
            if self.prompt_lookup_max is None:
                self.prompt_lookup_max = self.prompt_lookup_min

    def use_eagle(self) -> bool:
        return self.method in ("eagle", "eagle3", "mtp", "dflash")

    def use_dflash(self) -> bool:
        return self.method == "dflash"

    def uses_draft_model(self) -> bool:
        return self.method == "draft_model"

    def uses_extract_hidden_states(self) -> bool:
        return self.method == "extract_hidden_states"

    def use_ngram_gpu(self) -> bool:
        return self.method == "ngram_gpu"


@dataclasses.dataclass
class CompilationConfig:
    """Stand-in for vllm.config.compilation.CompilationConfig (torch>=2 inductor)."""
    mode: Any = None
    cudagraph_mode: Any = None
    cudagraph_capture_sizes: list | None = None
    max_cudagraph_capture_size: int | None = None
    static_forward_context: dict = field(default_factory=dict)


@dataclasses.dataclass
class AttentionConfig:
    """Stand-in for vllm.config.attention.AttentionConfig (imports attention backends)."""
    backend: Any = None


@dataclasses.dataclass
class DeviceConfig:
    """Stand-in for vllm.config.device.DeviceConfig (real: platform detection)."""
    device: Any = "cpu"
    device_type: str = "cpu"


class OptimizationLevel(enum.IntEnum):
    O0 = 0
    O1 = 1
    O2 = 2
    O3 = 3


def _default_scheduler_config():
    return SchedulerConfig.default_factory()


@dataclasses.dataclass
class VllmConfig:
    """Stand-in for vllm.config.vllm.VllmConfig (real: imports every sub-config,
    transformers, triton).  Same fields and defaults; __post_init__ does only the
    scheduler-relevant part of the real one: SchedulerConfig / ModelConfig defaults,
    async_scheduling None -> False (the single-process synchronous engine path), and
    its max_model_len cross-check."""
    model_config: ModelConfig = None  # type: ignore[assignment]
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    scheduler_config: SchedulerConfig = field(default_factory=_default_scheduler_config)
    device_config: DeviceConfig = field(default_factory=DeviceConfig)
    load_config: LoadConfig = field(default_factory=LoadConfig)
    offload_config: OffloadConfig = field(default_factory=OffloadConfig)
    attention_config: AttentionConfig = field(default_factory=AttentionConfig)
    mamba_config: MambaConfig = field(default_factory=MambaConfig)
    kernel_config: KernelConfig = field(default_factory=KernelConfig)
    lora_config: LoRAConfig | None = None
    speculative_config: SpeculativeConfig | None = None
    structured_outputs_config: StructuredOutputsConfig = field(
        default_factory=StructuredOutputsConfig)
    observability_config: ObservabilityConfig = field(
        default_factory=ObservabilityConfig)
    quant_config: Any = None
    compilation_config: CompilationConfig = field(default_factory=CompilationConfig)
    profiler_config: ProfilerConfig = field(default_factory=ProfilerConfig)
    kv_transfer_config: KVTransferConfig | None = None
    kv_events_config: KVEventsConfig | None = None
    ec_transfer_config: ECTransferConfig | None = None
    reasoning_config: Any = None
    additional_config: dict = field(default_factory=dict)
    instance_id: str = ""
    optimization_level: OptimizationLevel = OptimizationLevel.O2
    performance_mode: str = "balanced"
    weight_transfer_config: Any = None
    shutdown_timeout: int = 0
    use_v2_model_runner: bool = False  # a property in the real class (needs triton)

    def __post_init__(self):
        if self.scheduler_config.async_scheduling is None:
            self.scheduler_config.async_scheduling = False
        # Hybrid KV cache manager (HMA) rule, restated from VllmConfig.__post_init__:
        # platform = a CUDA GPU (supports HMA); no chunked local attention; with no
        # user preference, HMA is disabled iff the KV connector lacks SupportsHMA.
        need_disable = False
        if self.scheduler_config.disable_hybrid_kv_cache_manager is None:
            if self.kv_transfer_config is not None:
                from vllm.distributed.kv_transfer.kv_connector.factory import (
                    KVConnectorFactory,
                )
                from vllm.distributed.kv_transfer.kv_connector.v1.base import (
                    supports_hma,
                )
                connector_cls = KVConnectorFactory.get_connector_class(
                    self.kv_transfer_config)
                all_support_hma = supports_hma(connector_cls)
                if all_support_hma and connector_cls.__name__ == "MultiConnector":
                    subs = self.kv_transfer_config.kv_connector_extra_config.get(
                        "connectors", [])
                    all_support_hma = all(
                        supports_hma(KVConnectorFactory.get_connector_class(
                            KVTransferConfig(**sub))) for sub in subs)
                need_disable = not all_support_hma
            self.scheduler_config.disable_hybrid_kv_cache_manager = need_disable
        if not self.instance_id:
            import uuid
            self.instance_id = uuid.uuid4().hex[:5]

    @property
    def needs_dp_coordinator(self) -> bool:
        return False

    def compute_hash(self) -> str:
        return "stand-in"


_current_vllm_config: VllmConfig | None = None


def get_current_vllm_config() -> VllmConfig:
    return _current_vllm_config or VllmConfig()


def get_current_vllm_config_or_none() -> VllmConfig | None:
    return _current_vllm_config


class set_current_vllm_config:  # noqa: N801 (real name)
    def __init__(self, vllm_config, *a, **k):
        self.cfg = vllm_config

    def __enter__(self):
        global _current_vllm_config
        self.prev, _current_vllm_config = _current_vllm_config, self.cfg
        return self.cfg

    def __exit__(self, *exc):
        global _current_vllm_config
        _current_vllm_config = self.prev
        return False
