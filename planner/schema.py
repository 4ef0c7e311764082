"""Every type that crosses a module boundary in paraplan.

The formats are documented in docs/input-formats.md (the plan JSON's fields are a contract):
layer profiles, clusters, transformer configs, pipeline problems, plans and simulation
results. All types are immutable pydantic models that reject unknown keys, round-trip
through JSON and export a JSON Schema (``docs/schema/``).

Conventions: names carry units (``_s``, ``_bytes``, ``_flops``, ``_bytes_per_s``),
counts are ``num_*``, sequences are tuples.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Annotated, Any, Literal, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from planner import schema_io
from planner.errors import InvalidProblemError

SCHEMA_VERSION = "paraplan.plan/v1"

from planner.schema_types import (  # noqa: F401 (re-exported: other modules import them from here)
    BatchCount,
    Bytes,
    DeviceCount,
    ExtraTime,
    Latency,
    LayerCount,
    LayerIndex,
    LayerTime,
    MicrobatchCount,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Rate,
    _at_most,
    _count,
    _DEVICES_WHY,
    _field_accepts,
    _field_is_flag,
    _wrong_scalar,
    _WIDTH,
    _LENGTH,
)

# Pipeline schedules the simulator runs ("custom" = the plan's own per-rank action list).
ScheduleName = Literal["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v", "dualpipe-v", "2bw", "flush",
                       "custom"]
SCHEDULE_NAMES: tuple[str, ...] = ScheduleName.__args__  # type: ignore[attr-defined]
V_SCHEDULES: tuple[str, ...] = ("zb-v", "dualpipe-v")
"""Schedules with V placement: two chunks per rank, rank r holds virtual stages r and 2p - 1 - r."""


def virtual_stage_home(virtual_stage: int, num_stages: int, schedule: str) -> tuple[int, int]:
    """(pipeline rank, chunk index) holding a virtual stage.

    Megatron's loop placement puts virtual stage k on rank k % p as chunk k // p. The V
    schedules (ZB-V, DualPipeV) go down the ranks and back up: virtual stage k < p is chunk 0
    of rank k, and k >= p is chunk 1 of rank 2p - 1 - k, so the last stage sits on rank 0
    next to the first and the turn of the V (stages p - 1 and p) is on one rank.
    """
    p = num_stages
    if schedule in V_SCHEDULES:
        return (virtual_stage, 0) if virtual_stage < p else (2 * p - 1 - virtual_stage, 1)
    return virtual_stage % p, virtual_stage // p
PlanStatus = Literal["optimal", "feasible", "time_limit"]
# Recompute strategies have free names; these three are the ones the cost models derive.
KNOWN_RECOMPUTE = ("none", "selective", "full")
_STRATEGY_RE = re.compile(r"^[a-z][a-z0-9_-]*(\+[a-z][a-z0-9_-]*)*$")
RecomputeModule = Literal["core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"]
RECOMPUTE_MODULES: tuple[str, ...] = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
"""Megatron-Core's ``--recompute-modules`` choices (``TransformerConfig.recompute_modules``), in its
documented order. A recompute strategy named by modules joined with ``+`` (``layernorm+moe_act``)
is Megatron's selective granularity with exactly those modules; ``selective`` is ``core_attn``."""


@lru_cache(maxsize=1024)
def recompute_modules_of(strategy: str) -> tuple[str, ...] | None:
    """The modules a strategy recomputes: () for ``none``, ("core_attn",) for ``selective``, the
    ``+``-joined names of a module strategy in canonical order; None for ``full`` and for strategy
    names that are not module sets (measured profiles may name their own)."""
    if strategy == "none":
        return ()
    if strategy == "selective":
        return ("core_attn",)
    parts = strategy.split("+")
    if not all(part in RECOMPUTE_MODULES for part in parts):
        return None
    return tuple(m for m in RECOMPUTE_MODULES if m in parts)


def module_strategy(modules: Sequence[str]) -> str:
    """The strategy name of a module set: canonical order joined by ``+``; ``none`` when empty.

    Raises:
        InvalidProblemError: a name that is not one of ``RECOMPUTE_MODULES``.
    """
    bad = sorted(set(modules) - set(RECOMPUTE_MODULES))
    if bad:
        raise InvalidProblemError(f"recompute modules {bad} are not Megatron-Core's; choose from {list(RECOMPUTE_MODULES)}")
    return "+".join(m for m in RECOMPUTE_MODULES if m in modules) or "none"


class _Frozen(BaseModel):
    # allow_inf_nan=False: every float must be finite (docs/input-formats.md, "Input rules").
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, defer_build=True)

    @field_validator("*", mode="before")
    @classmethod
    def _strict_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """``true`` is not the number 1 and ``"1"`` is not a number: where a field (or its items)
        holds no bool or no str, refuse one (JSON types as the schema states them)."""
        if info.field_name is None:
            return value
        bool_ok, str_ok = _field_accepts(cls, info.field_name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and _field_is_flag(cls, info.field_name):
            raise ValueError("a number is not a boolean here; write true or false")
        if bool_ok and str_ok:
            return value
        wrong = _wrong_scalar(value, bool_ok=bool_ok, str_ok=str_ok)
        if wrong == "boolean":
            raise ValueError("a boolean is not a number here; write the number itself")
        if wrong == "string":
            raise ValueError("a string is not a number here; write the number without quotes")
        return value

    def to_json(self, **kwargs: Any) -> str:
        """Serialize to a JSON string (keyword arguments go to ``model_dump_json``)."""
        return self.model_dump_json(**kwargs)

    @classmethod
    def from_json(cls: type[_T], text: str | bytes) -> _T:
        """Parse and validate JSON text; raise ``InvalidProblemError`` on any defect."""
        from planner.schema_io import loads_json

        return cls.from_dict(loads_json(text, what=cls.__name__))

    @classmethod
    def from_dict(cls: type[_T], data: Any) -> _T:
        """Validate a decoded JSON object; raise ``InvalidProblemError`` on any defect."""
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise InvalidProblemError(format_validation_error(cls.__name__, e)) from None


_T = TypeVar("_T", bound=_Frozen)


class _Result(_Frozen):
    """Base of output-only types (simulation, scheduling and fill results): they may carry an
    unbounded value (``inf``: no memory limit given) and are never read back as input."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=True, defer_build=True)


def format_validation_error(type_name: str, error: ValidationError) -> str:
    """One line per defect: the JSON path of the field, the value given and what is wrong."""
    lines = [f"invalid {type_name}:"]
    items = error.errors()
    failed = [tuple(i["loc"]) for i in items]
    for item in items:
        loc = tuple(item["loc"])
        if item["type"] == "too_short" and any(f[: len(loc)] == loc and f != loc for f in failed):
            continue  # a tuple whose items failed also reports as too short; say it once
        path = ".".join(str(p) for p in item["loc"]) or "(top level)"
        if item["type"] == "extra_forbidden":
            lines.append(f"  unknown key {path!r}; remove it (see docs/input-formats.md for the fields)")
            continue
        if item["type"] == "missing":
            lines.append(f"  missing required field {path!r}")
            continue
        value = item.get("input")
        shown = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
        if len(shown) > 60:
            shown = shown[:57] + "..."
        lines.append(f"  {path} = {shown}: {item['msg']}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# Model: layer profiles and transformer configs
# --------------------------------------------------------------------------------------


class RecomputeOption(_Frozen):
    """Cost of one recompute strategy for one layer, per microbatch."""

    activation_bytes: Bytes
    """Bytes the layer keeps alive from its forward to its backward under this strategy."""
    extra_s: ExtraTime = 0.0
    """Time added to the backward pass to recompute what was not kept."""


class LayerProfile(_Frozen):
    """Costs of one layer on one device, per microbatch (architecture.md, layer profile)."""

    name: str
    kind: str = "layer"
    """Layer type (e.g. ``embedding``, ``decoder``, ``head``); layers of one kind are interchangeable."""
    forward_s: LayerTime
    backward_s: LayerTime
    """The whole backward (input and weight gradients), without recomputation."""
    backward_weight_s: ExtraTime | None = None
    """The weight-gradient part of ``backward_s``; enables the zero-bubble schedules."""
    forward_comm_s: ExtraTime | None = None
    """Communication inside ``forward_s`` (tensor-parallel collectives, expert all-to-all) that
    another microbatch's compute can hide: DualPipeV's overlapped F&B blocks use it."""
    backward_comm_s: ExtraTime | None = None
    """Communication inside ``backward_s``, likewise."""
    activation_bytes: Bytes | None = None
    """Bytes kept for backward with no recomputation (when ``recompute`` has no ``none``)."""
    static_bytes: Bytes = 0.0
    """Resident bytes on a device holding the layer: weights, gradients, optimizer state."""
    output_bytes: Bytes = 0.0
    """Bytes of the layer's output, sent to the next stage when a stage boundary follows."""
    param_bytes: Bytes = 0.0
    """Gradient bytes all-reduced across data-parallel replicas."""
    flops: Annotated[float, Field(ge=0), _at_most(1e24, "a yotta-FLOP per layer and microbatch")] | None = None
    """Model FLOPs of forward plus backward (no recompute) per microbatch on this device."""
    recompute: dict[str, RecomputeOption] | None = None

    @model_validator(mode="after")
    def _check(self) -> LayerProfile:
        for name, total in (("forward_comm_s", self.forward_s), ("backward_comm_s", self.backward_s)):
            part = getattr(self, name)
            if part is not None and part > total:
                raise ValueError(f"{name}={part} exceeds the time it is part of ({total}); give at most {total}")
        if self.backward_weight_s is not None and self.backward_weight_s >= self.backward_s:
            raise ValueError(
                f"backward_weight_s={self.backward_weight_s} must be smaller than "
                f"backward_s={self.backward_s} (it is the weight-gradient part of the backward)"
            )
        for strategy in self.recompute or {}:
            if not _STRATEGY_RE.match(strategy):
                raise ValueError(f"recompute strategy name {strategy!r} must match {_STRATEGY_RE.pattern}")
        none = (self.recompute or {}).get("none")
        if none is not None:
            if none.extra_s != 0:
                raise ValueError(f"recompute.none.extra_s={none.extra_s} must be 0")
            if self.activation_bytes is not None and self.activation_bytes != none.activation_bytes:
                raise ValueError(
                    f"activation_bytes={self.activation_bytes} disagrees with "
                    f"recompute.none.activation_bytes={none.activation_bytes}; give one of them"
                )
        return self

    def strategies(self) -> dict[str, RecomputeOption]:
        """All recompute options of the layer; ``none`` is always present."""
        options = dict(self.recompute or {})
        if "none" not in options:
            options["none"] = RecomputeOption(activation_bytes=self.activation_bytes or 0.0, extra_s=0.0)
        return options


class ModelProfile(_Frozen):
    """An ordered chain of layer profiles (architecture.md, layer profile JSON)."""

    format: Literal["paraplan.profile/v1"] = "paraplan.profile/v1"
    name: str
    layers: tuple[LayerProfile, ...] = Field(min_length=1, max_length=schema_io.MAX_LAYERS)
    microbatch_size: BatchCount = 1
    """Samples per microbatch that the per-microbatch costs were measured or derived for."""
    tensor_parallel: DeviceCount = 1
    """Tensor-parallel degree that the per-device costs assume."""
    degrees_included: bool = False
    """The per-layer costs are already one rank's share at the plan's context, expert (and expert
    tensor) degrees, with the K/V ring, the expert all-to-alls and ZeRO-3's per-layer gathers in
    them (the ptdp search's profiles). False: the costs hold the whole sequence and every expert
    split by t only, and the simulator derives those terms (cost_models/sim/dims.py)."""
    tokens_per_sample: PositiveInt | None = None
    device: str | None = None
    """Name of the device the times are for, when known."""
    source: str = ""
    """Provenance: ``profiler``, ``analytic``, ``pipedream:<file>``..."""

    @property
    def num_layers(self) -> int:
        return len(self.layers)


class TransformerConfig(_Frozen):
    """A decoder-only transformer (architecture.md, transformer config JSON)."""

    format: Literal["paraplan.transformer/v1"] = "paraplan.transformer/v1"
    name: str
    hidden_size: _WIDTH
    num_layers: LayerCount
    num_heads: _WIDTH
    seq_length: _LENGTH
    vocab_size: _LENGTH
    ffn_hidden_size: _WIDTH | None = None
    """Defaults to 4 x hidden_size."""
    num_kv_heads: _WIDTH | None = None
    """Grouped-query attention; defaults to num_heads."""
    mlp: Literal["gelu", "swiglu", "geglu", "relu"] = "gelu"
    """FFN: ``gelu`` / ``relu`` (OPT) two matrices, w2 act(w1 x); ``swiglu`` (Llama) and ``geglu``
    (Gemma: tanh GELU as the gate) three, w2 (act(w1 x) * w3 x)."""
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    bias: bool = True
    position_embedding: Literal["learned", "rope", "alibi"] = "learned"
    """``learned`` adds a seq_length x hidden_size table; ``rope`` rotates Q and K (a kernel per
    layer); ``alibi`` (BLOOM, MPT) adds a per-head linear bias to the attention scores: no
    parameters, no kernel of its own (it rides in the attention kernel)."""
    tied_embeddings: bool = True
    parallel_block: bool = False
    """Attention and MLP read the same input and add to the residual together (GPT-J, GPT-NeoX /
    Pythia, Falcon, Phi-2; Hugging Face ``use_parallel_residual``, ``parallel_attn``). Same
    parameters and FLOPs as the sequential block; costed as one (docs/models-and-configs.md)."""
    dtype: Literal["fp16", "bf16", "fp32"] = "bf16"
    rope_theta: PositiveFloat | None = None
    """RoPE base frequency as the source config states it (Llama-3: 500000); None = tool default."""
    norm_eps: PositiveFloat | None = None
    """Norm epsilon as the source config states it; None = tool default."""
    # Mixture of experts (all None/0 = a dense model). Costs: cost_models; sources: docs/cost-model.md.
    num_experts: _WIDTH | None = None
    """Routed experts per MoE layer (Mixtral 8x7B: 8; DeepSeek-V3: 256)."""
    experts_per_token: _WIDTH | None = None
    """Top-k routed experts each token goes to (Mixtral: 2; DeepSeek-V3: 8)."""
    moe_ffn_hidden_size: _WIDTH | None = None
    """FFN size of one routed expert; defaults to ffn_hidden_size."""
    num_shared_experts: NonNegativeInt = 0
    """Always-active shared experts per MoE layer (DeepSeek-V3: 1)."""
    first_dense_layers: NonNegativeInt = 0
    """The first k decoder layers use a dense FFN instead of MoE (DeepSeek-V3: 3)."""
    capacity_factor: PositiveFloat | None = None
    """Expert capacity factor (None = dropless)."""
    # Router numerics: no parameter or FLOP cost of note, but part of the model the exports carry.
    router_score_function: Literal["softmax", "sigmoid"] = "softmax"
    """Expert scores (DeepSeek-V3: sigmoid; Megatron --moe-router-score-function)."""
    router_expert_bias: bool = False
    """Auxiliary-loss-free balancing with a per-expert bias (DeepSeek-V3; --moe-router-enable-expert-bias)."""
    router_topk_scaling_factor: PositiveFloat | None = None
    """Scale of the routed experts' weights (DeepSeek-V3: 2.5; --moe-router-topk-scaling-factor)."""
    router_num_groups: PositiveInt | None = None
    """Group-limited routing: expert groups (DeepSeek-V3: 8; --moe-router-num-groups)."""
    router_group_topk: PositiveInt | None = None
    """Groups each token may use (DeepSeek-V3: 4; --moe-router-group-topk)."""
    # Attention variants (costs: cost_models.architecture; docs/models-and-configs.md).
    head_dim: PositiveInt | None = None
    """Per-head width when it is not hidden_size / num_heads (Qwen3: 128; Megatron --kv-channels)."""
    qk_norm: bool = False
    """RMSNorm on each head's queries and keys (Qwen3; Megatron --qk-layernorm)."""
    qkv_bias: bool = False
    """Biases on the Q, K, V projections only (Qwen2; Megatron --add-qkv-bias); ``bias`` covers all."""
    rope_scaling: dict[str, float | str] | None = None
    """RoPE scaling as the source config states it (Llama-3.1: rope_type llama3, factor 8)."""
    sliding_window: PositiveInt | None = None
    """Sliding-window attention: in the windowed layers each query attends itself and the
    ``sliding_window - 1`` keys before it (Hugging Face ``sliding_window``, GPT-OSS: 128, Mistral 7B
    v0.1: 4096; Megatron ``--window-size``). None: full causal attention in every layer."""
    global_attention_every: PositiveInt | None = None
    """With ``sliding_window``: every k-th layer (0-based layers k-1, 2k-1, ...) attends the whole
    causal context, the others are windowed (GPT-OSS and Gemma 2: 2; Gemma 3: 6; Megatron
    ``--window-attn-skip-freq``). None: every layer is windowed."""
    # Multi-latent attention (DeepSeek-V2/V3): kv_lora_rank set = MLA.
    kv_lora_rank: PositiveInt | None = None
    """Rank of the compressed K/V latent (DeepSeek-V3: 512); None = standard attention."""
    q_lora_rank: PositiveInt | None = None
    """Rank of the compressed query (DeepSeek-V3: 1536); None = full-rank query projection."""
    qk_nope_head_dim: PositiveInt | None = None
    """Per-head query/key width without RoPE (DeepSeek-V3: 128; Megatron --qk-head-dim)."""
    qk_rope_head_dim: PositiveInt | None = None
    """Per-head query/key width carrying RoPE, shared by all heads for K (DeepSeek-V3: 64)."""
    v_head_dim: PositiveInt | None = None
    """Per-head value width (DeepSeek-V3: 128)."""
    mtp_layers: NonNegativeInt = 0
    """Multi-token-prediction modules after the last layer (DeepSeek-V3: 1; Megatron ``--mtp-num-layers``,
    Hugging Face ``num_nextn_predict_layers``): each adds two norms, a 2h -> h projection, one decoder
    block like the last layer and its final norm, and runs the output head again; it shares the
    embedding and the output head and sits on the last pipeline stage ([deepseek-v3] Sec. 2.2)."""

    @model_validator(mode="after")
    def _check(self) -> TransformerConfig:
        if self.hidden_size % self.num_heads and self.head_dim is None and self.kv_lora_rank is None:
            raise ValueError(
                f"hidden_size={self.hidden_size} must be divisible by num_heads={self.num_heads}, "
                "or give head_dim (the per-head width)"
            )
        mla = (self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim)
        if self.kv_lora_rank is not None and None in mla:
            raise ValueError(
                "multi-latent attention (kv_lora_rank set) needs qk_nope_head_dim, qk_rope_head_dim and v_head_dim"
            )
        if self.kv_lora_rank is None and self.q_lora_rank is not None:
            raise ValueError("q_lora_rank applies to multi-latent attention only; give kv_lora_rank too")
        kv = self.num_kv_heads or self.num_heads
        if self.num_heads % kv:
            raise ValueError(f"num_heads={self.num_heads} must be divisible by num_kv_heads={kv}")
        if (self.num_experts is None) != (self.experts_per_token is None):
            raise ValueError("num_experts and experts_per_token go together: give both for a MoE model, neither for a dense one")
        if self.num_experts is not None and self.experts_per_token > self.num_experts:
            raise ValueError(f"experts_per_token={self.experts_per_token} exceeds num_experts={self.num_experts}")
        if self.first_dense_layers > self.num_layers:
            raise ValueError(f"first_dense_layers={self.first_dense_layers} exceeds num_layers={self.num_layers}")
        if self.mtp_layers > self.num_layers:
            raise ValueError(f"mtp_layers={self.mtp_layers} exceeds num_layers={self.num_layers}: give the number of "
                             "multi-token-prediction modules (DeepSeek-V3: 1), or 0 for none")
        if self.global_attention_every is not None and self.sliding_window is None:
            raise ValueError(f"global_attention_every={self.global_attention_every} applies to sliding-window "
                             "attention only; give sliding_window (the window in tokens) too, or drop it")
        return self

    @property
    def windowed_layers(self) -> int:
        """Decoder layers that attend a sliding window (``sliding_window``, ``global_attention_every``)."""
        if self.sliding_window is None:
            return 0
        every = self.global_attention_every
        return self.num_layers - (self.num_layers // every if every else 0)

    @property
    def ffn_size(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def head_size(self) -> int:
        """Per-head query/key width: head_dim, or hidden_size / num_heads."""
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def gated_mlp(self) -> bool:
        """A gated FFN (``swiglu``, ``geglu``): three matrices instead of two."""
        return self.mlp in ("swiglu", "geglu")

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None


# --------------------------------------------------------------------------------------
# Hardware
# --------------------------------------------------------------------------------------


class ComputeModel(_Frozen):
    """Constants of the per-operation compute model (``cost_models.compute``; formulas and
    sources in docs/cost-model.md). ``paraplan calibrate`` fits them from measurements."""

    num_sms: PositiveInt
    """Streaming multiprocessors (tiles of one GEMM wave run one per SM)."""
    gemm_tile_m: PositiveInt = 256
    gemm_tile_n: PositiveInt = 128
    """Output tile of the GEMM kernels (cuBLAS/CUTLASS on Ampere/Hopper: 256 x 128)."""
    gemm_max_fraction: Annotated[float, Field(gt=0, le=1)] = 0.8
    """Fraction of peak FLOP/s a full wave of large tiles sustains."""
    gemm_k_overhead: NonNegativeFloat = 128.0
    """Per-tile prologue/epilogue cost, in elements of the reduction dimension K."""
    memory_bandwidth_fraction: Annotated[float, Field(gt=0, le=1)] = 0.8
    """Fraction of HBM bandwidth elementwise kernels reach."""
    kernel_launch_s: NonNegativeFloat = 4e-6
    """Fixed cost of one kernel (launch plus tail)."""
    collective_bandwidth_fraction: Annotated[float, Field(gt=0, le=1)] = 0.8
    """Fraction of the link bandwidth NCCL collectives reach (bus bandwidth / link bandwidth)."""
    peak_flops_by_dtype: dict[str, PositiveFloat] = Field(default_factory=dict)
    """Dense peaks by precision (``fp32``, ``tf32``, ``fp8``); 16-bit is ``Device.peak_flops``."""
    attention_kernel: str = "fa2"
    """Flash-attention kernel family the training stack runs (``fa1``: FlashAttention and its Triton
    port, ``fa2``, ``fa3`` on Hopper, ``cudnn`` and ``fa4`` on Blackwell...): the key of ``attention_fractions`` used for ``attention="flash"``
    layers."""
    attention_fractions: dict[str, Annotated[float, Field(gt=0, le=1)]] = Field(default_factory=dict)
    """Share of the 16-bit peak each flash-attention kernel family sustains over a step's forward and
    backward on full waves of long sequences (``cost_models.compute.flash_attention_s``); with none
    listed, flash runs at 0.85 of the GEMM fraction."""
    elementwise_kernels: Literal["fused", "eager"] = "fused"
    """How the training stack runs the memory-bound layer kernels: ``fused`` (Megatron-LM /
    Transformer Engine fused norms, rotary and SwiGLU; also ``torch.compile``) or ``eager``
    (PyTorch eager: RMSNorm and rotary as chains of fp32 kernels, SwiGLU as two kernels, grouped
    K/V expanded before SDPA; byte counts in docs/cost-model.md)."""
    full_recompute: Literal["whole", "early-stop"] = "whole"
    """How the training stack re-runs a fully recomputed decoder layer in the backward: ``whole``
    (its whole forward again: Megatron-LM's and Megatron-DeepSpeed's reentrant checkpoint,
    Transformer Engine's) or ``early-stop`` (PyTorch's non-reentrant ``torch.utils.checkpoint``
    since 2.1: the recompute stops once every tensor the backward saved is back, so the layer's
    last linear layer, the FFN output projection, and the collective after it are not re-run;
    torchtitan, FSDP's ``checkpoint_wrapper``, ``paraplan run``)."""
    linear_precision: Literal["bf16", "fp8", "fp8-cs"] = "bf16"
    """Precision of the linear layers' GEMMs (``cost_models.fp8``): ``bf16``, or Transformer Engine
    FP8 (QKV, projection and MLP GEMMs in FP8; attention core, norms, softmax, embedding and logits
    in BF16) with delayed scaling (``fp8``, TE's default recipe) or current scaling (``fp8-cs``,
    Megatron-Bridge's FP8-CS: one more pass over each tensor for its amax)."""
    fp8_gemm_max_fraction: Annotated[float, Field(gt=0, le=1)] | None = None
    """Fraction of the FP8 peak a full wave of large FP8 tiles sustains; None = ``gemm_max_fraction``."""

    @model_validator(mode="after")
    def _check_attention_kernel(self) -> ComputeModel:
        if self.attention_fractions and self.attention_kernel not in self.attention_fractions:
            families = ", ".join(sorted(self.attention_fractions))
            raise ValueError(
                f"attention_kernel={self.attention_kernel!r} is not one of attention_fractions' kernel families "
                f"({families}); name one of them, or add its share of peak to attention_fractions")
        return self


class Device(_Frozen):
    """One accelerator."""

    name: str
    memory_bytes: Annotated[float, Field(gt=0), _at_most(1e24, "a yottabyte, above any device")]
    peak_flops: Rate
    """Dense 16-bit (fp16/bf16) peak, FLOP/s."""
    memory_bandwidth_bytes_per_s: Rate | None = None
    """Nominal HBM bandwidth; None = the preset's of the same name (required with ``compute``
    constants on a device that is no preset)."""
    host_link_bytes_per_s: Rate | None = None
    """Device-host link (PCIe) bandwidth, for offloading; None = the preset's of the same name."""
    host_memory_bytes: Annotated[float, Field(gt=0)] | None = None
    """Host (CPU) memory available to this device for offloaded activations: the node's system
    memory over its devices; None = the preset's of the same name (unchecked where no preset says)."""
    compute: ComputeModel | None = None
    """Per-operation compute constants; None = the preset's of the same name, else defaults."""
    memory_headroom_bytes: NonNegativeFloat | None = None
    """Memory no plan may use (CUDA context, workspaces, NCCL buffers, fragmentation); None =
    the default of ``cost_models.memory.default_headroom_bytes``. ``--memory-headroom`` sets it."""


class Cluster(_Frozen):
    """A homogeneous cluster of nodes, or (for cluster scheduling) counts per worker type."""

    format: Literal["paraplan.cluster/v1"] = "paraplan.cluster/v1"
    name: str
    device: Device | None = None
    num_nodes: DeviceCount = 1
    devices_per_node: DeviceCount = 1
    intra_node_bytes_per_s: Rate | None = None
    inter_node_bytes_per_s: Rate | None = None
    intra_node_latency_s: Latency = 0.0
    inter_node_latency_s: Latency = 0.0
    worker_types: dict[str, DeviceCount] | None = None
    """Accelerator counts by type (Gavel form); replaces ``device`` for cluster scheduling."""

    @model_validator(mode="after")
    def _check(self) -> Cluster:
        if self.device is None and self.worker_types is None:
            raise ValueError("a cluster needs either 'device' (pipeline planning) or 'worker_types' (scheduling)")
        schema_io.bounded("num_devices", self.num_devices, schema_io.MAX_DEVICES, _DEVICES_WHY)
        if self.device is not None:
            for key in ("intra_node_bytes_per_s", "inter_node_bytes_per_s"):
                if getattr(self, key) is None:
                    raise ValueError(f"missing required field {key!r} for a cluster with a 'device'")
        return self

    @property
    def num_devices(self) -> int:
        if self.device is None:
            return sum((self.worker_types or {}).values())
        return self.num_nodes * self.devices_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.devices_per_node

    def link(self, rank_a: int, rank_b: int) -> tuple[float, float]:
        """(bytes per second, latency in seconds) of the link between two ranks."""
        if self.node_of(rank_a) == self.node_of(rank_b):
            return float(self.intra_node_bytes_per_s or 0.0), self.intra_node_latency_s
        return float(self.inter_node_bytes_per_s or 0.0), self.inter_node_latency_s


# --------------------------------------------------------------------------------------
# Problems
# --------------------------------------------------------------------------------------


class PipelineProblem(_Frozen):
    """What the pipeline solvers take: a model, a cluster and the user's constraints.

    ``None`` means the solver chooses. Malformed combinations (microbatches the interleaved
    schedule cannot take) are rejected here; shapes the cluster or model cannot hold (more
    stages than layers or devices) are the solvers' infeasibility (exit 3).
    """

    model: ModelProfile
    cluster: Cluster
    transformer: TransformerConfig | None = None
    """Set when the model came from a transformer config; solvers varying t or b re-derive it."""
    schedule: ScheduleName = "1f1b"
    num_stages: DeviceCount | None = None
    num_chunks: LayerCount = 1
    num_microbatches: MicrobatchCount | None = None
    global_batch_size: BatchCount | None = None
    data_parallel: DeviceCount | None = None
    bpipe: bool = False
    time_limit_s: PositiveFloat | None = None

    @model_validator(mode="after")
    def _check(self) -> PipelineProblem:
        if self.cluster.device is None:
            raise ValueError("pipeline planning needs a cluster with a 'device' (not only 'worker_types')")
        # Stages vs layers and devices are checked by the solvers (solvers.common.resolve_layout):
        # they are infeasibility (exit 3, with the largest depth that works), not malformed input.
        if self.bpipe and self.num_stages is not None and self.num_stages < 4:
            raise ValueError(
                f"bpipe=true with num_stages={self.num_stages}: BPipe pairs stage s with stage p-1-s and moves "
                "activations only from 4 stages on (below that every stage already holds at most the balanced "
                "count); use num_stages >= 4 (--pipeline 4) or drop bpipe"
            )
        if self.schedule == "interleaved-1f1b" and self.num_chunks < 2:
            raise ValueError("schedule 'interleaved-1f1b' needs num_chunks >= 2 (use '1f1b' for one chunk)")
        if self.schedule in V_SCHEDULES:
            if self.num_chunks == 1:  # the default: a V schedule always runs two chunks per rank
                object.__setattr__(self, "num_chunks", 2)
            elif self.num_chunks != 2:
                raise ValueError(f"schedule {self.schedule!r} runs exactly 2 chunks per rank (V placement); "
                                 f"got num_chunks={self.num_chunks}, use 2")
        elif self.num_chunks > 1 and self.schedule not in ("interleaved-1f1b", "custom"):
            raise ValueError(
                f"num_chunks={self.num_chunks} needs schedule 'interleaved-1f1b', not {self.schedule!r}"
            )
        if (
            self.schedule == "interleaved-1f1b"
            and self.num_stages is not None
            and self.num_microbatches is not None
            and self.num_microbatches % self.num_stages
        ):
            lo = self.num_microbatches // self.num_stages * self.num_stages
            raise ValueError(
                f"the interleaved schedule needs num_microbatches to be a multiple of num_stages="
                f"{self.num_stages} (dissertation [narayanan-thesis] ch. 4); got {self.num_microbatches}, use "
                f"{lo or self.num_stages} or {lo + self.num_stages}"
            )
        if self.num_stages is not None and self.num_microbatches is not None:
            schema_io.bounded("num_microbatches x num_stages x num_chunks",
                              self.num_microbatches * self.num_stages * self.num_chunks, schema_io.MAX_PIPELINE_WORK,
                              "the simulator steps each microbatch on each stage; 32 times PTD-P's largest run")
        if self.global_batch_size is not None:
            # the fewest microbatches any layout gets: every device a data-parallel replica
            replicas = self.data_parallel or self.cluster.num_devices
            fewest = -(-self.global_batch_size // (self.model.microbatch_size * replicas))
            if fewest > schema_io.MAX_MICROBATCHES:
                raise ValueError(
                    f"global_batch_size={self.global_batch_size} gives at least {fewest:,} microbatches per pipeline "
                    f"(microbatch size {self.model.microbatch_size}, {replicas} replicas at most); the limit is "
                    f"{schema_io.MAX_MICROBATCHES:,} (the simulator steps each one): use a smaller global batch "
                    "or a larger microbatch size"
                )
        if self.global_batch_size is not None and self.global_batch_size % self.model.microbatch_size:
            raise ValueError(
                f"global_batch_size={self.global_batch_size} is not a multiple of the microbatch "
                f"size {self.model.microbatch_size}"
            )
        return self


# --------------------------------------------------------------------------------------
# Plans
# --------------------------------------------------------------------------------------


class Action(NamedTuple):
    """One compute action of a schedule, written like torch's ``_Action``: ``"2F0"``, ``"1I3"``.

    ``stage`` is the global (virtual) stage index, ``kind`` one of F, B, I, W.
    """

    stage: int
    kind: str
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @staticmethod
    def parse(text: str) -> Action:
        match = _ACTION_RE.match(text.strip())
        if match is None:
            raise InvalidProblemError(
                f"cannot parse action {text!r}; write <stage><F|B|I|W><microbatch>, e.g. '2F0'"
            )
        return Action(int(match.group(1)), match.group(2), int(match.group(3)))


_ACTION_RE = re.compile(r"^(\d+)([FBIW])(\d+)$")


class Degrees(_Frozen):
    data: DeviceCount = 1
    tensor: DeviceCount = 1
    pipeline: DeviceCount = 1
    virtual: LayerCount = 1
    context: DeviceCount = 1
    """Context parallelism: the sequence split over this many ranks (attention exchanges K/V)."""
    expert: DeviceCount = 1
    """Expert parallelism: MoE experts split over this many ranks (carved out of data x context)."""


class Chunk(_Frozen):
    """A contiguous run of layers placed on one stage (a virtual stage when interleaved)."""

    layers: tuple[LayerIndex, LayerIndex]
    """[first, last_exclusive)."""
    recompute: dict[str, LayerIndex | tuple[LayerIndex, ...]] = Field(default_factory=dict)
    """Strategy -> a count (the chunk's first layers, in the order listed) or absolute layer
    indices. Layers not named use ``none``."""

    @model_validator(mode="after")
    def _check(self) -> Chunk:
        first, last = self.layers
        if last <= first:
            raise ValueError(f"chunk layers [{first}, {last}) is empty; last_exclusive must exceed first")
        self.layer_strategies()  # raises on overlap or out-of-range
        return self

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]

    def layer_strategies(self) -> tuple[str, ...]:
        """The recompute strategy of each layer of the chunk, in layer order."""
        first, last = self.layers
        out: list[str | None] = [None] * (last - first)
        cursor = 0
        for strategy, spec in self.recompute.items():
            if isinstance(spec, int):
                indices = range(first + cursor, first + cursor + spec)
                cursor += spec
            else:
                indices = spec
            for i in indices:
                if not first <= i < last:
                    raise ValueError(
                        f"recompute {strategy!r} names layer {i}, outside the chunk's layers [{first}, {last})"
                    )
                if out[i - first] is not None:
                    raise ValueError(f"layer {i} has two recompute strategies ({out[i - first]!r}, {strategy!r})")
                out[i - first] = strategy
        return tuple(s or "none" for s in out)


class Stage(_Frozen):
    index: NonNegativeInt
    replicas: DeviceCount = 1
    """Copies of the stage. Left out, a plan sets it to ``degrees.data``; a different value on
    some stage is PipeDream's per-stage replication (1F1B-RR, simulated without flush)."""
    ranks: tuple[NonNegativeInt, ...] = Field(default=(), max_length=schema_io.MAX_DEVICES)
    """Global ranks holding the stage: replicas x tensor-parallel ranks, replica-major."""
    chunks: tuple[Chunk, ...] = Field(min_length=1)


class BPipeSpec(_Frozen):
    pairs: tuple[tuple[NonNegativeInt, NonNegativeInt], ...] = Field(max_length=schema_io.MAX_DEVICES)
    target_inflight: _count(schema_io.MAX_LAYERS + 1, "activation sets a stage holds: one per chunk and one more")  # type: ignore[valid-type]


class OffloadHost(_Frozen):
    """Host side of an offloaded plan, per node (``cost_models.offload.HostSpec`` has the defaults)."""

    host_link_bytes_per_s: PositiveFloat
    """Peak bandwidth of one host-device link (PCIe), per direction."""
    gpus_per_host_link: PositiveInt
    """GPUs sharing one host link behind a PCIe switch."""
    pinned: bool
    pinned_efficiency: Annotated[float, Field(gt=0, le=1)]
    """Fraction of the link's peak that pinned-memory copies reach."""
    cpu_optimizer_params_per_s: PositiveFloat
    """CPU Adam throughput of one node, all cores together."""
    cpu_memory_bytes: PositiveFloat
    peer_over_host_link: bool = False
    """GPU peer copies and collectives inside a node travel over the host links (no NVLink)."""


class OffloadSpec(_Frozen):
    """How an offloaded (GPU/CPU) plan runs: SPipe, Mobius or ZeRO-Offload (docs/solver-spipe.md).

    The forward stages are the plan's virtual stages (forward stage i on GPU i mod G); the
    backward stages are layer ranges in model order with one GPU each.
    """

    mode: Literal["pipeline", "zero-offload"]
    """``pipeline``: SPipe / Mobius stage pipelines; ``zero-offload``: ZeRO-3 with CPU offload."""
    placement: Literal["coupled", "decoupled"] | None = None
    """Backward stage placement: on the forward stage's GPU (Mobius) or SPipe's decoupled rule."""
    forward_stages_per_gpu: PositiveInt | None = None
    backward_stages_per_gpu: PositiveInt | None = None
    backward_stages: tuple[tuple[NonNegativeInt, NonNegativeInt], ...] = ()
    """Layer ranges [first, last) of the backward stages in model order (mode ``pipeline``)."""
    backward_gpus: tuple[NonNegativeInt, ...] = ()
    """GPU of each backward stage (mode ``pipeline``)."""
    async_optimizer: bool = False
    """Step each stage's optimizer on the CPU as soon as its gradients arrive (SPipe); else after all."""
    prefetch: bool = True
    """Double-buffered parameter prefetch (the next stage's copy overlaps the current one)."""
    recompute: str = "full"
    host: OffloadHost

    @model_validator(mode="after")
    def _check(self) -> OffloadSpec:
        if self.mode == "pipeline" and (not self.backward_stages or len(self.backward_gpus) != len(self.backward_stages)):
            raise ValueError(
                f"offload mode 'pipeline' needs backward_stages and one backward_gpus entry per stage; got "
                f"{len(self.backward_stages)} stages and {len(self.backward_gpus)} GPUs"
            )
        return self


class Predicted(_Frozen):
    iteration_time_s: NonNegativeFloat
    throughput_samples_per_s: NonNegativeFloat
    bubble_fraction: NonNegativeFloat
    bottleneck_s: NonNegativeFloat
    """Steady-state time per microbatch of the slowest stage or link (PipeDream's objective)."""
    peak_memory_bytes: tuple[NonNegativeFloat, ...]


class Plan(_Frozen):
    """A solver's answer (architecture.md, plan JSON). It embeds the model and cluster so
    that it can be re-simulated and executed on its own."""

    schema_version: Literal["paraplan.plan/v1"] = SCHEMA_VERSION
    solver: str
    options: dict[str, Any] = Field(default_factory=dict)
    status: PlanStatus = "optimal"
    solve_time_s: NonNegativeFloat | None = None
    """Wall-clock seconds the solver took. Left out by ``planner.api.plan`` unless asked for
    (``timings=True``, CLI ``--timings``): a plan is byte-identical for identical input."""
    model: ModelProfile
    cluster: Cluster
    transformer: TransformerConfig | None = None
    """The transformer the profile was derived from, when there is one (Megatron export)."""
    degrees: Degrees
    schedule: ScheduleName
    microbatch_size: BatchCount
    num_microbatches: MicrobatchCount
    global_batch_size: BatchCount
    stages: tuple[Stage, ...] = Field(min_length=1)
    bpipe: BPipeSpec | None = None
    offload: OffloadSpec | None = None
    """Set for GPU/CPU offloaded plans (solvers spipe, mobius, zero-offload); the simulator and the
    runtime run such plans as offloaded pipelines."""
    zero_stage: Literal[0, 1, 2, 3] = 0
    """Data-parallel sharding: 0 replicated (DDP), 1 optimizer states sharded (Megatron's
    distributed optimizer), 2 optimizer states and gradients, 3 parameters too (FSDP)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism beside tensor parallelism (norm/dropout activations split by t)."""
    recompute_modules: tuple[RecomputeModule, ...] | None = None
    """Megatron-Core's ``--recompute-modules``: the submodules every module-granular layer recomputes
    (the chunks name them as a strategy such as ``layernorm+moe_act``). Filled in from the chunks
    when left out; None when no layer uses a module strategy (``selective`` alone is Megatron's
    default, ``core_attn``). Megatron applies one set to every layer, so a plan uses at most one."""
    actions: tuple[tuple[str, ...], ...] | None = None
    """Per-rank compute actions (``"2F0"``...) for schedule ``custom``."""
    predicted: Predicted | None = None
    notes: tuple[str, ...] = ()
    candidates: tuple[dict[str, Any], ...] = ()
    """The solver's ranked alternatives (a sweep or search table), best first: one flat row of
    scalars per configuration, the same keys in every row; empty for solvers that have none."""

    @model_validator(mode="before")
    @classmethod
    def _typed_offload(cls, data: Any) -> Any:
        # Plan files written before Plan.offload kept it in options['offload']: read it from there.
        if isinstance(data, dict) and data.get("offload") is None:
            options = data.get("options")
            if isinstance(options, dict) and isinstance(options.get("offload"), dict):
                data = {**data, "offload": options["offload"],
                        "options": {k: v for k, v in options.items() if k != "offload"}}
        return data

    @model_validator(mode="after")
    def _check(self) -> Plan:
        p, v = self.degrees.pipeline, self.degrees.virtual
        if self.offload is not None and self.bpipe is not None:
            raise ValueError("a plan sets either 'offload' or 'bpipe', not both; remove one")
        if any("replicas" not in stage.model_fields_set for stage in self.stages):
            # Frozen model: set the default replication (degrees.data) once, during validation.
            object.__setattr__(self, "stages", tuple(
                stage if "replicas" in stage.model_fields_set
                else stage.model_copy(update={"replicas": self.degrees.data}) for stage in self.stages
            ))
        if len(self.stages) != p:
            raise ValueError(f"degrees.pipeline={p} but the plan has {len(self.stages)} stages")
        if self.schedule in V_SCHEDULES and v != 2:
            raise ValueError(f"schedule {self.schedule!r} runs exactly 2 chunks per stage (V placement); "
                             f"degrees.virtual={v}, use 2")
        for stage in self.stages:
            if len(stage.chunks) != v:
                raise ValueError(f"stage {stage.index} has {len(stage.chunks)} chunks, degrees.virtual={v}")
        covered = sorted(c.layers for s in self.stages for c in s.chunks)
        expected = 0
        for first, last in covered:
            if first != expected:
                raise ValueError(
                    f"chunks must cover layers 0..{self.model.num_layers - 1} exactly once; "
                    f"layer {min(first, expected)} is {'missing' if first > expected else 'covered twice'}"
                )
            expected = last
        if expected != self.model.num_layers:
            raise ValueError(f"chunks cover {expected} layers but the model has {self.model.num_layers}")
        for stage in self.stages:
            for chunk in stage.chunks:
                for i, strategy in zip(range(*chunk.layers), chunk.layer_strategies()):
                    if strategy not in self.model.layers[i].strategies():
                        raise ValueError(
                            f"layer {i} ({self.model.layers[i].name}) has no recompute strategy "
                            f"{strategy!r}; it allows {sorted(self.model.layers[i].strategies())}"
                        )
        etp = self.options.get("expert_tensor_parallel")
        _check_parallel_degrees(self.degrees, self.transformer, etp if isinstance(etp, int) and etp >= 1 else None)
        self._check_recompute_modules()
        if self.schedule == "custom" and self.actions is None:
            raise ValueError("schedule 'custom' needs 'actions' (one list of actions per pipeline rank)")
        if self.actions is not None and len(self.actions) != p:
            raise ValueError(f"'actions' has {len(self.actions)} rank lists, degrees.pipeline={p}")
        return self

    def _check_recompute_modules(self) -> None:
        named = sorted({s for stage in self.stages for chunk in stage.chunks for s in chunk.layer_strategies()
                        if s not in KNOWN_RECOMPUTE and recompute_modules_of(s) is not None})
        if len(named) > 1:
            raise ValueError(f"the chunks use the module strategies {named}; Megatron applies one "
                             "--recompute-modules set to every layer: use one of them everywhere")
        derived = recompute_modules_of(named[0]) if named else None
        given = None if self.recompute_modules is None else recompute_modules_of(module_strategy(self.recompute_modules))
        if given is not None and given != derived:
            raise ValueError(f"recompute_modules={list(self.recompute_modules or ())} but the chunks use "
                             f"{named or 'no module strategy'}; name the set as a strategy "
                             f"({module_strategy(self.recompute_modules or ())!r}) or leave recompute_modules out")
        if self.recompute_modules is None and derived is not None:
            object.__setattr__(self, "recompute_modules", derived)  # frozen model: set once, in validation

    def chunk_of_virtual_stage(self, virtual_stage: int) -> tuple[int, int]:
        """(stage index, chunk index) of a virtual stage: virtual stage c*p + x is chunk c of stage x
        (Megatron's placement); V schedules place it as ``virtual_stage_home`` says."""
        return virtual_stage_home(virtual_stage, self.degrees.pipeline, self.schedule)

    def virtual_stages(self) -> tuple[Chunk, ...]:
        """Chunks in model order (``chunk_of_virtual_stage`` of each virtual stage)."""
        p, v = self.degrees.pipeline, self.degrees.virtual
        homes = (self.chunk_of_virtual_stage(k) for k in range(p * v))
        return tuple(self.stages[x].chunks[c] for x, c in homes)

    def stage_ranks(self) -> tuple[int, ...]:
        """Pipeline rank of every virtual stage, in model order."""
        p, v = self.degrees.pipeline, self.degrees.virtual
        return tuple(self.chunk_of_virtual_stage(k)[0] for k in range(p * v))


def expert_group_ranks(degrees: Degrees, expert_tensor: int | None = None) -> int:
    """Ranks of a pipeline stage the expert layers spread over, t d c / etp (Megatron-Core's MoE
    parallel folding: the expert-parallel group may take the tensor ranks when the experts are not
    tensor-split, ``expert_tensor`` 1; with the default etp = t it is the d x c data ranks)."""
    etp = degrees.tensor if expert_tensor is None else expert_tensor
    return max(1, degrees.tensor * degrees.data * degrees.context // etp)


def _check_parallel_degrees(degrees: Degrees, cfg: TransformerConfig | None, expert_tensor: int | None = None) -> None:
    """Expert and context degrees the model can take (issue 15: bad input names the field and the fix)."""
    e, c = degrees.expert, degrees.context
    if e > 1:
        if cfg is None or cfg.num_experts is None:
            raise ValueError(f"degrees.expert={e} needs a mixture-of-experts transformer (num_experts set); use 1")
        if cfg.num_experts % e:
            ok = [k for k in range(1, cfg.num_experts + 1) if cfg.num_experts % k == 0 and k <= e]
            raise ValueError(
                f"transformer.num_experts={cfg.num_experts} is not divisible by degrees.expert={e}; "
                f"use an expert-parallel degree that divides it, e.g. {ok[-1]}")
        ranks = expert_group_ranks(degrees, expert_tensor)
        if ranks % e:
            raise ValueError(
                f"degrees.expert={e} must divide the {ranks} ranks the experts spread over: data x context = "
                f"{degrees.data * c}, times tensor = {degrees.tensor} when the experts are not tensor-split "
                f"(options.expert_tensor_parallel=1, Megatron-Core's MoE parallel folding; it is "
                f"{expert_tensor or degrees.tensor} here); use an expert degree dividing {ranks}")
    if c > 1 and cfg is not None and cfg.seq_length % (2 * c):
        raise ValueError(
            f"transformer.seq_length={cfg.seq_length} is not divisible by 2 x degrees.context = {2 * c} (context "
            "parallelism gives each rank two balanced chunks of the sequence); pad the sequence to a multiple of "
            f"{2 * c} or choose a context degree c with seq_length divisible by 2c")


# --------------------------------------------------------------------------------------
# Simulation results
# --------------------------------------------------------------------------------------


class TimelineEvent(NamedTuple):
    """One interval on one pipeline rank's timeline."""

    rank: int
    """Pipeline rank (stage index)."""
    kind: str
    """F, B, I, W, R (recompute inside backward) or AR (data-parallel all-reduce)."""
    stage: int
    """Virtual stage index (-1 for AR)."""
    microbatch: int
    start_s: float
    end_s: float


class Bubble(_Result):
    start_s: float
    end_s: float
    free_memory_bytes: float


class StageResult(_Result):
    index: int
    busy_s: float
    idle_s: float
    peak_memory_bytes: float
    peak_inflight_microbatches: int
    """Peak number of (chunk, microbatch) activations held at once."""
    bubbles: tuple[Bubble, ...] = ()


class SimResult(_Result):
    """Output of the one schedule simulator (architecture.md, simulator output)."""

    iteration_time_s: float
    bubble_fraction: float
    """Idle time / (iteration_time_s x number of pipeline ranks)."""
    throughput_samples_per_s: float
    allreduce_s: float = 0.0
    memory_capacity_bytes: float
    fits_memory: bool
    stages: tuple[StageResult, ...]
    events: tuple[TimelineEvent, ...] = ()

    def to_json(self, *, include_events: bool = False, **kwargs: Any) -> str:
        exclude = None if include_events else {"events"}
        return self.model_dump_json(exclude=exclude, **kwargs)


def json_schemas() -> dict[str, dict[str, Any]]:
    """The JSON Schema of every input and output format, by file name."""
    from planner import schema_cloud, schema_fill, schema_gavel  # they import this module: no top-level import

    return {
        "profile.schema.json": ModelProfile.model_json_schema(),
        "transformer.schema.json": TransformerConfig.model_json_schema(),
        "cluster.schema.json": Cluster.model_json_schema(),
        "problem.schema.json": PipelineProblem.model_json_schema(),
        "plan.schema.json": Plan.model_json_schema(),
        "simulation.schema.json": SimResult.model_json_schema(),
        "jobs.schema.json": schema_gavel.JobsFile.model_json_schema(),
        "allocation.schema.json": schema_gavel.Allocation.model_json_schema(),
        "cluster-sim.schema.json": schema_gavel.ClusterSimResult.model_json_schema(),
        "fill-jobs.schema.json": schema_fill.FillJobsFile.model_json_schema(),
        "fill.schema.json": schema_fill.FillPlan.model_json_schema(),
        "cloud-catalogue.schema.json": schema_cloud.Catalogue.model_json_schema(),
        "cloud-jobs.schema.json": schema_cloud.CloudJobsFile.model_json_schema(),
        "cloud-problem.schema.json": schema_cloud.CloudProblem.model_json_schema(),
        "cloud-plan.schema.json": schema_cloud.CloudPlan.model_json_schema(),
        "price-trace.schema.json": schema_cloud.PriceTrace.model_json_schema(),
        "cloud-replay.schema.json": schema_cloud.ReplayResult.model_json_schema(),
    }
