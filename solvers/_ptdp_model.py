"""Closed-form cost model of one PTD-P configuration (dissertation ch. 4, seed 001).

The ``ptdp`` search (``solvers/ptdp.py``) ranks thousands of (t, p, d, v, b, recompute)
configurations with this model and simulates only the best few. Everything per layer comes
from ``cost_models.transformer.transformer_profile`` (Eq. 4.2 FLOPs L4119-4164, TP all-reduces
L3709-3713 and L3778-3823, scatter/gather p2p bytes bsh/t L4008-4039); this module only adds
them up per pipeline rank and applies the schedule:

- ideal time m T_rank plus the bubble (p - 1)/v of one rank's work (L3512-3652; the interleaved
  bubble (1/v)(p-1)/m of the ideal time);
- every microbatch crosses 2 v stage boundaries per rank (forward and backward, v chunks:
  pipeline traffic grows by v, L3644-3648), each a point-to-point transfer of the last layer's
  ``output_bytes`` on the link between the two stages;
- the data-parallel gradient all-reduce of rank 0 (the last rank to finish its backward) is a
  ring over d replicas (1 - 1/d scaling, L3866-3873), over NVLink while the d replicas of a
  stage sit in one node and over InfiniBand otherwise;
- memory: static bytes (16 B per parameter, split over t) plus the activations of the
  microbatches in flight: min(p - r, m) stages on rank r for 1F1B (L3561-3588) and Megatron's
  warm-up plus one, min(2(p - r - 1) + (v - 1)p + 1, m v) chunks, for interleaved 1F1B
  (ptdp-gavel-cloud.md Sec. 1.2). Tests check both counts against the simulator.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from cost_models import fp8
from cost_models.collectives import deepspeed_bf16_sync_s, exposed_dp_allreduce_s, ranks_allreduce_s
from cost_models.compute import profile_optimizer_step_s
from cost_models.recompute import frontier
from cost_models.memory import GRAD_BYTES_PER_PARAM, usable_memory_bytes
from cost_models.mtp import fold_mtp, mtp_extra_layer
from cost_models.transformer import ADAM_BYTES_PER_PARAM, transformer_profile
from planner.schema import KNOWN_RECOMPUTE, Cluster, LayerProfile, RecomputeOption, TransformerConfig, recompute_modules_of
from solvers import _ptdp_dims as dims_mod
from solvers import _ptdp_v as v_model
from solvers._ptdp_rows import recompute_flops_per_sample, throughput_row  # noqa: F401 (this module's API)
from solvers._ptdp_states import (  # noqa: F401 (this module's API)
    _exact_sum, _rank_ranges, block_value, first_chunk_inflight, heaviest_state_bytes, held_chunk_array,
    held_chunk_counts, multiset, rank_blocks)

INTERLEAVED = "interleaved-1f1b"


@dataclass(frozen=True, slots=True)
class UnitCosts:
    """Per-microbatch costs of the layer kinds at one (t, b) and the degrees beyond: embedding, dense
    decoder, MoE decoder (None for dense models), head."""

    embedding: LayerProfile
    decoder: LayerProfile
    head: LayerProfile
    decoder_source: str = "analytic"
    """The profile's ``source`` (flat-efficiency profiles are ``analytic:efficiency=x``)."""
    moe_decoder: LayerProfile | None = None
    first_dense: int = 0
    """Decoder layers before the first MoE layer (they use ``decoder``, the rest ``moe_decoder``)."""
    expert_static_bytes: float = 0.0
    """Part of ``moe_decoder.static_bytes`` in routed-expert weights (sharded over the expert-DP ranks)."""
    expert_param_bytes: float = 0.0
    """Part of ``moe_decoder.param_bytes`` in routed-expert weights (reduced over the expert-DP ranks)."""
    module_sets: tuple[str, ...] = ()
    """The per-module recompute strategies worth searching, cheapest first (``module_frontier``)."""
    grad_bytes: float = GRAD_BYTES_PER_PARAM
    """Resident gradient bytes per parameter (``ProfileSettings.grad_bytes_per_param``)."""
    weight_copy_ratio: float = 0.0
    """Resident FP8 weight-copy bytes per decoder parameter byte (``fp8.step_weight_terms``; 0 in BF16)."""
    mtp_layers: int = 0
    """Multi-token-prediction modules folded into ``head``; with p > 1 the last rank also keeps a copy of
    the embedding for them, as Megatron-Core does (its gradient is reduced with the first rank's)."""

    @property
    def head_expert_static_bytes(self) -> float:
        """Part of ``head.static_bytes`` in the MTP modules' routed experts (sharded like the layers' experts)."""
        return self.mtp_layers * self.expert_static_bytes if self.moe_decoder is not None else 0.0

    @property
    def head_expert_param_bytes(self) -> float:
        """Part of ``head.param_bytes`` in the MTP modules' routed experts (reduced over the expert-DP ranks)."""
        return self.mtp_layers * self.expert_param_bytes if self.moe_decoder is not None else 0.0

    def counts(self, first: int, num: int) -> tuple[int, int]:
        """(dense, MoE) decoder layers among layers [first, first + num)."""
        if self.moe_decoder is None:
            return num, 0
        dense = max(0, min(first + num, self.first_dense) - first)
        return dense, num - dense


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """One point of the search space."""

    tensor: int
    pipeline: int
    data: int
    virtual: int
    microbatch_size: int
    num_microbatches: int
    recompute: str
    context: int = 1
    expert: int = 1
    expert_tensor: int = 1
    zero_stage: int = 0
    ends: tuple[int, int] = (0, 0)
    """Decoder layers of the first and last stage; (0, 0) = even split."""
    v_schedule: str = ""
    """A V schedule ('zb-v', 'dualpipe-v', virtual 2: ``solvers._ptdp_v``); '' for Megatron's."""

    @property
    def schedule(self) -> str:
        return self.v_schedule or (INTERLEAVED if self.virtual > 1 else "1f1b")

    @property
    def dims(self) -> dims_mod.Dims:
        return dims_mod.Dims(tensor=self.tensor, context=self.context, expert=self.expert,
                             expert_tensor=self.expert_tensor, zero_stage=self.zero_stage, data=self.data)

    @property
    def num_devices(self) -> int:
        return self.tensor * self.pipeline * self.data * self.context

    def chunk_layers(self, num_layers: int) -> list[int]:
        """Decoder layers of each virtual stage in model order (virtual stage k on rank k mod p)."""
        return dims_mod.chunk_layer_counts(num_layers, self.pipeline, self.virtual, self.ends)

    def stage_layers(self, num_layers: int) -> list[int]:
        """Decoder layers of each pipeline rank (all its chunks)."""
        return [sum(n for _, n in ranges) for ranges in self.rank_ranges(num_layers)]

    def but(self, **changes: Any) -> Config:
        """``dataclasses.replace(self, **changes)`` without its per-call field checks (the search
        copies configurations some 10^5 times)."""
        values = dict(zip(_CONFIG_FIELDS, _config_values(self)))
        values.update(changes)
        return Config(**values)

    def rank_ranges(self, num_layers: int) -> tuple[tuple[tuple[int, int], ...], ...]:
        """Per rank, (first layer, count) of each of its chunks: virtual stage k on rank k mod p, or in a
        V schedule on rank k for k < p and 2p - 1 - k after (cached: the search asks for the same
        layouts thousands of times)."""
        return _rank_ranges(num_layers, self.pipeline, self.virtual, self.ends, bool(self.v_schedule))


_CONFIG_FIELDS = tuple(Config.__dataclass_fields__)
_config_values = operator.attrgetter(*_CONFIG_FIELDS)


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """Closed-form iteration time and peak memory of a configuration."""

    iteration_s: float
    pipeline_s: float
    """Compute and point-to-point part (ideal + bubble + p2p)."""
    allreduce_s: float
    peak_memory_bytes: float
    fits: bool
    optimizer_s: float = 0.0
    """Mixed-precision Adam step of rank 0's parameters after its all-reduce (memory-bound,
    ``compute.optimizer_step_s``; the simulator charges the same)."""


@dataclass(frozen=True, slots=True)
class ProfileSettings:
    """How layer costs are derived: ``efficiency`` None = the per-operation model."""

    efficiency: float | None = None
    scatter_gather: bool = True
    sequence_parallel: bool | None = None
    attention: str = "flash"
    overlap_tp_comm: bool = False
    recompute_modules: bool = False
    """Offer Megatron-Core's per-module recompute sets (per-operation model only)."""
    module_sets: tuple[tuple[str, ...], ...] = ()
    """Module sets pinned by the ``recompute`` option, offered as strategies of their own."""
    grad_accum_bytes_per_param: float = 0.0
    """A gradient-accumulation pass after every microbatch's backward (DeepSpeed's BF16 optimizer)."""
    grad_bytes_per_param: float = GRAD_BYTES_PER_PARAM
    """Resident gradient bytes per parameter (6 under DeepSpeed's BF16 optimizer: its fp32 buffer)."""
    activation_offload: bool = False
    """Offer the ``offload`` strategy (activations to host memory, ``cost_models.activation_offload``)."""


def unit_costs(cfg: TransformerConfig, cluster: Cluster, tensor: int, microbatch_size: int,
               settings: ProfileSettings, dims: dims_mod.Dims | None = None,
               load_balance_factor: float = 1.0, overlap_moe_alltoall: bool = False,
               moe_dispatcher: str = "alltoall") -> UnitCosts:
    """Layer costs at (t, b) and the degrees beyond (``dims``, default none) from a copy of the model
    with one block of each kind (per-layer costs do not depend on the number of layers, and a short
    model keeps the search fast)."""
    assert cluster.device is not None
    dims = dims or dims_mod.Dims(tensor=tensor)
    fd = cfg.first_dense_layers if cfg.is_moe else 0
    short = dims_mod.profile_config(cfg, dims.context).model_copy(update={"num_layers": fd + 1, "mtp_layers": 0})
    profile = transformer_profile(
        short, device=cluster.device, microbatch_size=microbatch_size, tensor_parallel=tensor,
        intra_node_bytes_per_s=tp_link_bytes_per_s(cluster, tensor), **profile_kwargs(settings, tensor),
    )
    layers = profile.layers
    kw = {"microbatch_size": microbatch_size, "load_balance_factor": load_balance_factor,
          "per_operation": profile.source == "analytic", "overlap_moe_alltoall": overlap_moe_alltoall,
          "moe_dispatcher": moe_dispatcher}
    dense = dims_mod.decoder_at_degrees(layers[1], cfg, cluster, dims, moe_layer=cfg.is_moe and fd == 0, **kw)
    moe_dec = None
    experts = 0.0
    if cfg.is_moe:
        moe_dec = dense if fd == 0 else dims_mod.decoder_at_degrees(layers[fd + 1], cfg, cluster, dims,
                                                                     moe_layer=True, **kw)
        experts = dims_mod.expert_params_per_rank(cfg, dims)
    gather = layers[1].param_bytes
    embedding = dims_mod.end_layer_at_degrees(layers[0], cluster, dims, gather)
    head = dims_mod.end_layer_at_degrees(layers[-1], cluster, dims, gather)
    if cfg.mtp_layers:  # folded into the head at the last layer's degrees (``mtp.fold_mtp``)
        sp = tensor > 1 if settings.sequence_parallel is None else settings.sequence_parallel
        flat = None if profile.source == "analytic" else float(profile.source.split("=")[1])  # analytic:efficiency=x
        extra = mtp_extra_layer(short, cluster.device, microbatch_size, tensor, sp, flat)
        head = fold_mtp(head, moe_dec or dense, embedding, extra, cfg.mtp_layers)
    _, copy_ratio = fp8.step_weight_terms(profile.source, 1.0, dims_mod.element_bytes(cfg), cluster.device,
                                          zero_stage=dims.zero_stage)
    units = UnitCosts(embedding=embedding, decoder=dense, head=head,
                      decoder_source=profile.source, moe_decoder=moe_dec, first_dense=fd,
                      expert_static_bytes=ADAM_BYTES_PER_PARAM * experts,
                      expert_param_bytes=dims_mod.element_bytes(cfg) * experts,
                      grad_bytes=settings.grad_bytes_per_param, weight_copy_ratio=copy_ratio,
                      mtp_layers=cfg.mtp_layers)
    return replace(units, module_sets=tuple(module_frontier(units, cfg))) if settings.recompute_modules else units


def profile_kwargs(settings: ProfileSettings, tensor: int) -> dict[str, Any]:
    """``transformer_profile`` keywords of the settings at a tensor-parallel degree."""
    kwargs: dict[str, Any] = {"scatter_gather": settings.scatter_gather and tensor > 1,
                              "sequence_parallel": settings.sequence_parallel, "attention": settings.attention,
                              "activation_offload": settings.activation_offload}
    if settings.efficiency is not None:
        kwargs["efficiency"] = settings.efficiency
    else:
        kwargs["overlap_tp_backward"] = settings.overlap_tp_comm
        kwargs["recompute_modules"] = settings.recompute_modules or list(settings.module_sets)
        kwargs["grad_accum_bytes_per_param"] = settings.grad_accum_bytes_per_param
    return kwargs


def tp_link_bytes_per_s(cluster: Cluster, tensor: int) -> float:
    """NVLink while a tensor-parallel group fits in a node, the inter-node link otherwise."""
    fits = tensor <= cluster.devices_per_node
    return float(cluster.intra_node_bytes_per_s if fits else cluster.inter_node_bytes_per_s)  # type: ignore[arg-type]


def p2p_link(cluster: Cluster, c: Config) -> tuple[float, float]:
    """(bandwidth, latency) of the slowest stage boundary: stage x starts at rank x d c t, so all
    stages share one node only when p d c t fits in it."""
    if c.num_devices <= cluster.devices_per_node:
        return float(cluster.intra_node_bytes_per_s or 0.0), cluster.intra_node_latency_s
    return float(cluster.inter_node_bytes_per_s or 0.0), cluster.inter_node_latency_s


def inflight_chunks(c: Config, rank: int) -> int:
    """Peak chunk activations held by a rank: 1F1B min(p - r, m); interleaved Megatron's warm-up
    (p - r - 1) 2 + (v - 1) p plus the steady-state forward, capped at m v."""
    p, v, m = c.pipeline, c.virtual, c.num_microbatches
    if v == 1:
        return min(p - rank, m)
    return min(2 * (p - rank - 1) + (v - 1) * p + 1, m * v)


def _block_sum(u: UnitCosts, first: int, num: int, value: Any) -> float:
    """Sum of ``value(layer)`` over decoder layers [first, first + num)."""
    dense, moe_count = u.counts(first, num)
    total = dense * value(u.decoder) if dense else 0.0
    return total + (moe_count * value(u.moe_decoder) if moe_count else 0.0)


def _blocks(u: UnitCosts, all_ranges: tuple[tuple[tuple[int, int], ...], ...]
            ) -> tuple[tuple[tuple[tuple[int, int], ...], ...], tuple[int, ...]]:
    """``rank_blocks`` of the ranks' chunk lists for this model (dense, or MoE from ``u.first_dense``)."""
    return rank_blocks(all_ranges, None if u.moe_decoder is None else u.first_dense)


def _layer_values(u: UnitCosts, value: Any) -> tuple[float, float]:
    """``value`` of a dense and of an MoE decoder layer (0 for a dense model's MoE layers, of which it has none)."""
    return value(u.decoder), value(u.moe_decoder) if u.moe_decoder is not None else 0.0


def _ranges_sum(u: UnitCosts, ranges: Sequence[tuple[int, int]], value: Any) -> float:
    """``math.fsum`` of ``_block_sum`` over the ranges, from the distinct blocks and their counts."""
    return rank_sums(u, (tuple(ranges),), value)[0]


def rank_sums(u: UnitCosts, all_ranges: tuple[tuple[tuple[int, int], ...], ...], value: Any) -> list[float]:
    """``_ranges_sum`` of every rank, each distinct chunk list summed once (the same floats)."""
    distinct, index = _blocks(u, all_ranges)
    vd, vm = _layer_values(u, value)
    sums = [_exact_sum(multiset(blocks), vd, vm) for blocks in distinct]
    return [sums[i] for i in index]


def rank_work_s(u: UnitCosts, cfg: TransformerConfig, c: Config) -> list[float]:
    """Per-rank compute per microbatch: its decoder blocks (F + B + recompute), plus the
    embedding on rank 0 and the head on rank p - 1."""
    work = rank_sums(u, c.rank_ranges(cfg.num_layers),
                     lambda lay: lay.forward_s + lay.backward_s + option(lay, c.recompute).extra_s)
    work[0] += u.embedding.forward_s + u.embedding.backward_s
    work[-1] += u.head.forward_s + u.head.backward_s + head_option(u, c.recompute).extra_s
    return work


def head_option(u: UnitCosts, strategy: str) -> RecomputeOption:
    """The head's option under a recompute setting: its multi-token-prediction modules' blocks follow the
    setting (``mtp.fold_mtp``); a head without them, or a strategy it does not offer, keeps ``none``."""
    options = u.head.recompute
    if options and strategy in options:
        return options[strategy]
    return RecomputeOption(activation_bytes=u.head.activation_bytes or 0.0)


def _moe_layers(u: UnitCosts, ranges: Sequence[tuple[int, int]]) -> int:
    return sum(n_moe for _, n_moe in _blocks(u, (tuple(ranges),))[0][0])


def chunk_activations(u: UnitCosts, c: Config, ranges: Sequence[tuple[int, int]], rank: int) -> float:
    """Peak activation bytes of a rank's decoder chunks: in-flight count x chunk size when its chunks are
    equal, else the heaviest state of Megatron's interleaved order weighted by each chunk's size."""
    sizes = [_block_sum(u, first, num, lambda lay: option(lay, c.recompute).activation_bytes)
             for first, num in ranges]
    return _sized_activations(c, sizes, rank)


def offload_host_bytes(u: UnitCosts, cfg: TransformerConfig, c: Config) -> float:
    """The largest host memory a rank's offloaded activations take: every decoder layer's ``none``
    activations, times the microbatches the schedule holds in flight (``chunk_activations``)."""
    keep = c.but(recompute="none")
    return max(chunk_activations(u, keep, ranges, r) for r, ranges in enumerate(c.rank_ranges(cfg.num_layers)))


def _sized_activations(c: Config, sizes: list[float], rank: int) -> float:
    if c.virtual == 1 or len(set(sizes)) == 1:
        return inflight_chunks(c, rank) * max(sizes)
    return heaviest_state_bytes(c.pipeline, c.virtual, c.num_microbatches, rank, tuple(sizes))


def _chunk_sizes(u: UnitCosts, c: Config, all_ranges: tuple[tuple[tuple[int, int], ...], ...]
                 ) -> tuple[list[list[float]], tuple[int, ...]]:
    """Activation bytes of each chunk of every distinct chunk list under ``c.recompute`` (the floats
    ``chunk_activations`` sums), and each rank's index into the lists."""
    distinct, index = _blocks(u, all_ranges)
    vd, vm = _layer_values(u, lambda lay: option(lay, c.recompute).activation_bytes)
    return [[block_value(block, vd, vm) for block in blocks] for blocks in distinct], index


def ranks_peak_bytes(u: UnitCosts, c: Config, all_ranges: tuple[tuple[tuple[int, int], ...], ...],
                     fixed: list[tuple[int, float]]) -> float:
    """max over the (rank, fixed bytes) of ``rank_fixed_bytes`` of fixed + ``chunk_activations``, the chunk
    sizes of each distinct chunk list computed once (the same floats)."""
    sizes, index = _chunk_sizes(u, c, all_ranges)
    # ``fixed`` holds the head's ``none`` bytes: the MTP blocks in it follow the recompute setting
    head = head_option(u, c.recompute).activation_bytes - (u.head.activation_bytes or 0.0)
    return max(f + _sized_activations(c, sizes[index[r]], r) + (head if r == c.pipeline - 1 else 0.0)
               for r, f in fixed)


def rank_static_bytes(u: UnitCosts, ranges: Sequence[tuple[int, int]], dims: dims_mod.Dims) -> float:
    """Model states of a rank's decoder blocks (its chunks' (first, count) ranges) under the ZeRO stage,
    dense and expert parts apart."""
    return ranks_static_bytes(u, (tuple(ranges),), dims)[0]


def _fsdp_buffer_bytes(u: UnitCosts, dims: dims_mod.Dims) -> float:
    """The FSDP gather buffer of the largest decoder layer (``_ptdp_dims.fsdp_buffer_bytes``)."""
    return dims_mod.fsdp_buffer_bytes(max(u.decoder.param_bytes, (u.moe_decoder or u.decoder).param_bytes), dims)


def ranks_static_bytes(u: UnitCosts, all_ranges: tuple[tuple[tuple[int, int], ...], ...],
                       dims: dims_mod.Dims) -> list[float]:
    """Model states of every rank's decoder blocks under the ZeRO stage, dense and expert parts apart,
    each distinct chunk list costed once."""
    distinct, index = _blocks(u, all_ranges)
    vd, vm = _layer_values(u, lambda lay: lay.static_bytes)
    pd, pm = _layer_values(u, lambda lay: lay.param_bytes)
    out = []
    for blocks in distinct:
        # a dense model has no expert bytes: skip counting its (zero) MoE layers, the same 0.0
        expert = sum(n_moe for _, n_moe in blocks) * u.expert_static_bytes if u.expert_static_bytes else 0.0
        dense = _exact_sum(multiset(blocks), vd, vm) - expert
        copies = u.weight_copy_ratio * _exact_sum(multiset(blocks), pd, pm) if u.weight_copy_ratio else 0.0
        out.append(dims_mod.sharded_static_bytes(dense, expert, dims, u.grad_bytes) + copies)
    return [out[i] for i in index]


def peak_memory_bytes(u: UnitCosts, cfg: TransformerConfig, c: Config) -> float:
    """Peak bytes over the ranks (rank 0 holds the most activations and the embedding, rank p - 1 the
    head; with an even split middle ranks hold less than rank 0, so only the two ends are costed). The
    head's chunk runs each forward right before its backward (1F1B, and Megatron's interleaved order
    once m >= p), so it holds one microbatch; the embedding's chunk count is ``first_chunk_inflight``.
    Both peaks are added to the rank's total, an upper bound within the embedding's share."""
    ranges = c.rank_ranges(cfg.num_layers)
    return ranks_peak_bytes(u, c, ranges, rank_fixed_bytes(u, cfg, c, ranges))


def rank_fixed_bytes(u: UnitCosts, cfg: TransformerConfig, c: Config,
                     all_ranges: list[list[tuple[int, int]]] | None = None) -> list[tuple[int, float]]:
    """(rank, bytes) of the ranks ``peak_memory_bytes`` costs: all but the decoder activations (model
    states, the FSDP buffer, the embedding's and head's shares), which no recompute setting changes.
    ``all_ranges``: ``c.rank_ranges(cfg.num_layers)`` when the caller has it."""
    dims = c.dims
    all_ranges = all_ranges or c.rank_ranges(cfg.num_layers)
    p = c.pipeline
    ranks = range(p) if c.ends != (0, 0) else sorted({0, p - 1})
    emb_static = dims_mod.sharded_static_bytes(u.embedding.static_bytes, 0.0, dims, u.grad_bytes)
    head_expert = u.head_expert_static_bytes
    head_static = dims_mod.sharded_static_bytes(u.head.static_bytes - head_expert, head_expert, dims, u.grad_bytes)
    buffer = _fsdp_buffer_bytes(u, dims)
    out = []
    statics = ranks_static_bytes(u, all_ranges, dims)
    for r in ranks:
        total = statics[r] + buffer
        if r == 0:
            first = first_chunk_inflight(p, c.virtual, c.num_microbatches)
            total += emb_static + first * (u.embedding.activation_bytes or 0.0)
        if r == p - 1:
            total += head_static + (u.head.activation_bytes or 0.0)
            if u.mtp_layers and p > 1:  # the MTP modules' embedding copy
                total += emb_static
        out.append((r, total))
    return out


def option(layer: LayerProfile, strategy: str) -> RecomputeOption:
    """``layer.strategies()[strategy]`` without copying the options (profiles offer up to ~80 module sets)."""
    options = layer.recompute
    if options and strategy in options:
        return options[strategy]
    return layer.strategies()[strategy]


def _dp_sync_s(u: UnitCosts, cluster: Cluster, c: Config, ranges: list[tuple[int, int]], *, overlap_grad_reduce: bool,
               overlap_param_gather: bool = False, fp32_allreduce: bool = False) -> float:
    """Rank 0's gradient synchronisation: dense weights over the d x c ranks, experts over the expert-DP
    ranks. ZeRO-0 all-reduces; ZeRO-1/2 reduce-scatter the gradients and all-gather the updated weights
    (the all-reduce's volume, ZeRO Sec. 7.2); ZeRO-3 only reduce-scatters (its all-gathers run per layer,
    in the layer costs), under the backward as FSDP does. ``overlap_grad_reduce`` hides the reduction
    bucket by bucket under rank 0's backward, ``overlap_param_gather`` the all-gather under its forward
    (``collectives.exposed_dp_allreduce_s``). ``fp32_allreduce``: DeepSpeed's BF16 optimizer under its
    pipeline engine all-reduces its fp32 gradients after the last microbatch (twice the bytes, not
    overlapped) and, at ZeRO-1, all-gathers the updated 16-bit weights (``collectives.deepspeed_bf16_sync_s``)."""
    dims = c.dims
    expert = _moe_layers(u, ranges) * u.expert_param_bytes
    params = u.embedding.param_bytes + _ranges_sum(u, ranges, lambda lay: lay.param_bytes)
    if c.v_schedule:  # rank 0 also holds the head
        params += u.head.param_bytes
        expert += u.head_expert_param_bytes
    total = 0.0
    for num_bytes, ranks, stride in ((params - expert, dims.dp_ranks, c.tensor),
                                     (expert, dims.expert_dp_ranks, c.expert * c.expert_tensor)):
        if ranks > 1 and num_bytes > 0:  # stage 0's group in Megatron's order, the simulator's collective
            total += ranks_allreduce_s(cluster, num_bytes, [j * stride for j in range(ranks)])
    if fp32_allreduce:
        return deepspeed_bf16_sync_s(total, c.zero_stage)
    backward = _ranges_sum(u, ranges, lambda lay: lay.backward_s) + u.embedding.backward_s
    if c.zero_stage == 0:
        return exposed_dp_allreduce_s(total, backward) if overlap_grad_reduce else total
    reduce = total / 2  # reduce-scatter; ZeRO-1/2 all-gather the other half after the step
    gather = reduce if c.zero_stage < 3 else 0.0
    if c.zero_stage == 3 or overlap_grad_reduce:
        reduce = exposed_dp_allreduce_s(reduce, backward)
    if overlap_param_gather:
        gather = exposed_dp_allreduce_s(gather, _ranges_sum(u, ranges, lambda lay: lay.forward_s)
                                        + u.embedding.forward_s)
    return reduce + gather


def _v_peak_memory_bytes(u: UnitCosts, cfg: TransformerConfig, c: Config) -> float:
    """A V schedule's fullest rank: the activations ``solvers._ptdp_v`` counts on the schedule's own order,
    with its blocks' (rank 0: also the embedding's and head's) model states sharded as the ZeRO stage says."""
    dims, all_ranges = c.dims, c.rank_ranges(cfg.num_layers)
    p, m = c.pipeline, c.num_microbatches
    head_expert = u.head_expert_static_bytes
    ends = dims_mod.sharded_static_bytes(u.embedding.static_bytes + u.head.static_bytes - head_expert, head_expert,
                                         dims, u.grad_bytes)
    ends_act = (u.embedding.activation_bytes or 0.0, head_option(u, c.recompute).activation_bytes)
    sizes, index = _chunk_sizes(u, c, all_ranges)
    static = ranks_static_bytes(u, all_ranges, dims)
    peak = static[0] + ends + v_model.activation_bytes(c.schedule, p, m, 0, sizes[index[0]], ends_act)
    # ranks holding the same chunks hold the same states; the count in flight grows with the rank
    last = {i: r for r, i in enumerate(index) if r > 0}
    for i, r in last.items():
        peak = max(peak, static[r] + v_model.activation_bytes(c.schedule, p, m, r, sizes[i]))
    return _fsdp_buffer_bytes(u, dims) + peak


def _v_pipeline_s(u: UnitCosts, cfg: TransformerConfig, c: Config, send_s: float) -> float:
    """``_ptdp_v.pipeline_s`` from the ranks' chunks: each rank's work (rank 0 with the embedding and the
    head), and the heaviest chunk's F, B with recompute, W and communication."""
    all_ranges = c.rank_ranges(cfg.num_layers)
    work = rank_sums(u, all_ranges, lambda lay: lay.forward_s + lay.backward_s + option(lay, c.recompute).extra_s)
    ends = (u.embedding.forward_s + u.embedding.backward_s + u.head.forward_s + u.head.backward_s
            + head_option(u, c.recompute).extra_s)
    work[0] += ends
    blocks = {block for chunks in _blocks(u, all_ranges)[0] for block in chunks}  # (dense, MoE) layers per chunk
    values = [_layer_values(u, value) for value in (
        lambda lay: lay.forward_s, lambda lay: lay.backward_s + option(lay, c.recompute).extra_s,
        lambda lay: lay.backward_weight_s or 0.0, lambda lay: lay.forward_comm_s or 0.0,
        lambda lay: lay.backward_comm_s or 0.0)]
    chunks = [tuple(block_value(block, vd, vm) for vd, vm in values) for block in sorted(blocks)]
    heaviest = max(chunks, key=lambda t: (t[0] + t[1], t))
    return v_model.pipeline_s(c.schedule, c.pipeline, c.num_microbatches, work, heaviest, send_s,  # type: ignore[arg-type]
                              ends_s=ends)


def peak_memory_lower_bound(u: UnitCosts, cfg: TransformerConfig, c: Config) -> float:
    """At most ``config_peak_memory_bytes``, cheaply: rank 0's fixed bytes plus its in-flight chunk count
    times its smallest chunk (Megatron's order holds that many right after its warm-up); 0 for a V
    schedule."""
    if c.v_schedule:
        return 0.0
    all_ranges = c.rank_ranges(cfg.num_layers)
    distinct, index = _blocks(u, all_ranges)
    vd, vm = _layer_values(u, lambda lay: option(lay, c.recompute).activation_bytes)
    smallest = min(block_value(block, vd, vm) for block in distinct[index[0]])  # rank 0's of ``_chunk_sizes``
    fixed = rank_static_bytes(u, all_ranges[0], c.dims) + _fsdp_buffer_bytes(u, c.dims)
    return fixed + inflight_chunks(c, 0) * smallest


def config_peak_memory_bytes(u: UnitCosts, cfg: TransformerConfig, c: Config) -> float:
    """The closed form's peak bytes of a configuration (rank 0 of a V schedule, else the busiest end)."""
    return _v_peak_memory_bytes(u, cfg, c) if c.v_schedule else peak_memory_bytes(u, cfg, c)


def module_frontier(u: UnitCosts, cfg: TransformerConfig) -> list[str]:
    """The per-module recompute strategies worth searching, cheapest first: sorted by the whole model's
    recompute time (each dense and MoE block weighted by its count), each kept only when it holds no more
    bytes than the previous one in either kind of block and fewer in total (``cost_models.recompute.
    frontier`` with the per-kind condition), so every rank's peak falls along the list."""
    dense, moe_count = u.counts(0, cfg.num_layers)
    kinds = [(lay.strategies(), n) for lay, n in ((u.decoder, dense), (u.moe_decoder, moe_count)) if lay and n]
    names = [name for name in kinds[0][0] if name not in KNOWN_RECOMPUTE and recompute_modules_of(name) is not None]
    per_kind = {name: [options[name].activation_bytes for options, _ in kinds] for name in names}
    total = {name: RecomputeOption(activation_bytes=math.fsum(n * options[name].activation_bytes for options, n in kinds),
                                   extra_s=math.fsum(n * options[name].extra_s for options, n in kinds))
             for name in names}
    chain: list[str] = []
    for name in frontier(total):
        if not chain or all(a <= b for a, b in zip(per_kind[name], per_kind[chain[-1]])):
            chain.append(name)
    return chain


def estimate(u: UnitCosts, cfg: TransformerConfig, cluster: Cluster, c: Config, *,
             overlap_grad_reduce: bool = False, overlap_param_gather: bool = False,
             fp32_allreduce: bool = False, pipeline_s: float | None = None) -> Estimate:
    """Closed-form iteration time and memory of one configuration (``pipeline_s``: its ``pipeline_time_s``
    when the caller has it)."""
    assert cluster.device is not None
    pipeline_s, allreduce, optimizer = time_parts(u, cfg, cluster, c, overlap_grad_reduce=overlap_grad_reduce,
                                                  overlap_param_gather=overlap_param_gather,
                                                  fp32_allreduce=fp32_allreduce, pipeline_s=pipeline_s)
    peak = config_peak_memory_bytes(u, cfg, c)
    return Estimate(iteration_s=pipeline_s + allreduce + optimizer, pipeline_s=pipeline_s, allreduce_s=allreduce,
                    peak_memory_bytes=peak, fits=peak <= usable_memory_bytes(cluster.device),
                    optimizer_s=optimizer)


def iteration_s(u: UnitCosts, cfg: TransformerConfig, cluster: Cluster, c: Config, *,
                pipeline_s: float | None = None, **overlap: bool) -> float:
    """``estimate(...).iteration_s`` without the memory (the same float)."""
    pipeline_s, allreduce, optimizer = time_parts(u, cfg, cluster, c, pipeline_s=pipeline_s, **overlap)
    return pipeline_s + allreduce + optimizer


def pipeline_time_s(u: UnitCosts, cfg: TransformerConfig, cluster: Cluster, c: Config) -> float:
    """Compute, bubble and point-to-point seconds of the closed form (the first of ``time_parts``)."""
    p, v, m = c.pipeline, c.virtual, c.num_microbatches
    send_s = 0.0
    if p > 1:
        bandwidth, latency = p2p_link(cluster, c)
        send_s = latency + u.decoder.output_bytes / bandwidth
    if c.v_schedule:  # ZB-V / DualPipeV: their own bubble and in-flight counts
        return _v_pipeline_s(u, cfg, c, send_s)
    work = rank_work_s(u, cfg, c)
    t_max, t_avg = max(work), math.fsum(work) / p
    bubble = (p - 1) / v * t_avg
    if c.ends == dims_mod.NEAR_EVEN:  # unequal chunks: the fill and drain run at the larger chunks' pace
        counts = c.chunk_layers(cfg.num_layers)
        bubble *= max(counts) * len(counts) / sum(counts)
    # Each microbatch waits on 2 v transfers per rank in the steady state and 2 (p - 1) more to fill
    # and drain the pipeline (Megatron's 1F1B sends are blocking).
    return m * (t_max + 2 * v * send_s) + bubble + 2 * (p - 1) * send_s


def time_parts(u: UnitCosts, cfg: TransformerConfig, cluster: Cluster, c: Config, *,
               overlap_grad_reduce: bool = False, overlap_param_gather: bool = False,
               fp32_allreduce: bool = False, pipeline_s: float | None = None) -> tuple[float, float, float]:
    """(pipeline, data-parallel sync, optimizer step) seconds of the closed form; no memory (``pipeline_s``:
    the first when the caller has it)."""
    assert cluster.device is not None
    if pipeline_s is None:
        pipeline_s = pipeline_time_s(u, cfg, cluster, c)
    p = c.pipeline
    rank0 = c.rank_ranges(cfg.num_layers)[0]
    allreduce = 0.0
    if c.num_devices > c.tensor * p:
        allreduce = _dp_sync_s(u, cluster, c, rank0, overlap_grad_reduce=overlap_grad_reduce,
                               overlap_param_gather=overlap_param_gather, fp32_allreduce=fp32_allreduce)
    expert_static = _moe_layers(u, rank0) * u.expert_static_bytes
    dense_static = _ranges_sum(u, rank0, lambda lay: lay.static_bytes) + u.embedding.static_bytes - expert_static
    if c.v_schedule or p == 1:  # rank 0 also holds the head
        dense_static += u.head.static_bytes - u.head_expert_static_bytes
        expert_static += u.head_expert_static_bytes
    shard = c.zero_stage >= 1
    optimizer = profile_optimizer_step_s(u.decoder_source, dense_static, cluster.device,
                                         shard=c.dims.dp_ranks if shard else 1) + profile_optimizer_step_s(
        u.decoder_source, expert_static, cluster.device, shard=c.dims.expert_dp_ranks if shard else 1)
    cast_s, _ = fp8.step_weight_terms(u.decoder_source, _ranges_sum(u, rank0, lambda lay: lay.param_bytes),
                                      dims_mod.element_bytes(cfg), cluster.device, zero_stage=c.zero_stage,
                                      num_layers=sum(n for _, n in rank0))
    return pipeline_s, allreduce, optimizer + cast_s
