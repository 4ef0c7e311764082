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
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from cost_models.collectives import exposed_dp_allreduce_s
from cost_models.compute import profile_optimizer_step_s
from cost_models.memory import usable_memory_bytes
from cost_models.simulate import allreduce_link
from cost_models.transformer import (
    allreduce_time_s, attention_core_forward_flops, flops_per_iteration, model_flops_per_sample, transformer_profile,
)
from planner.schema import Cluster, LayerProfile, TransformerConfig
from solvers import _ptdp_v as v_model

INTERLEAVED = "interleaved-1f1b"


@dataclass(frozen=True, slots=True)
class UnitCosts:
    """Per-microbatch costs of the three layer kinds at one (t, b): embedding, decoder, head."""

    embedding: LayerProfile
    decoder: LayerProfile
    head: LayerProfile
    decoder_source: str = "analytic"
    """The profile's ``source`` (flat-efficiency profiles are ``analytic:efficiency=x``)."""


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
    v_schedule: str = ""
    """A V schedule ('zb-v', 'dualpipe-v', virtual 2: ``solvers._ptdp_v``); '' for Megatron's."""

    @property
    def schedule(self) -> str:
        return self.v_schedule or (INTERLEAVED if self.virtual > 1 else "1f1b")


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


def unit_costs(cfg: TransformerConfig, cluster: Cluster, tensor: int, microbatch_size: int,
               settings: ProfileSettings) -> UnitCosts:
    """Layer costs at (t, b) from a one-block copy of the model (per-layer costs do not depend on
    the number of layers, and one block keeps the search fast)."""
    assert cluster.device is not None
    profile = transformer_profile(
        cfg.model_copy(update={"num_layers": 1}), device=cluster.device, microbatch_size=microbatch_size,
        tensor_parallel=tensor, intra_node_bytes_per_s=tp_link_bytes_per_s(cluster, tensor),
        **profile_kwargs(settings, tensor),
    )
    embedding, decoder, head = profile.layers
    return UnitCosts(embedding=embedding, decoder=decoder, head=head, decoder_source=profile.source)


def profile_kwargs(settings: ProfileSettings, tensor: int) -> dict[str, Any]:
    """``transformer_profile`` keywords of the settings at a tensor-parallel degree."""
    kwargs: dict[str, Any] = {"scatter_gather": settings.scatter_gather and tensor > 1,
                              "sequence_parallel": settings.sequence_parallel, "attention": settings.attention}
    if settings.efficiency is not None:
        kwargs["efficiency"] = settings.efficiency
    elif settings.overlap_tp_comm:
        kwargs["overlap_tp_backward"] = True
    return kwargs


def tp_link_bytes_per_s(cluster: Cluster, tensor: int) -> float:
    """NVLink while a tensor-parallel group fits in a node, the inter-node link otherwise."""
    fits = tensor <= cluster.devices_per_node
    return float(cluster.intra_node_bytes_per_s if fits else cluster.inter_node_bytes_per_s)  # type: ignore[arg-type]


def p2p_link(cluster: Cluster, c: Config) -> tuple[float, float]:
    """(bandwidth, latency) of the slowest stage boundary: stage x starts at rank x d t, so all
    stages share one node only when p d t fits in it."""
    if c.pipeline * c.data * c.tensor <= cluster.devices_per_node:
        return float(cluster.intra_node_bytes_per_s or 0.0), cluster.intra_node_latency_s
    return float(cluster.inter_node_bytes_per_s or 0.0), cluster.inter_node_latency_s


def dp_link(cluster: Cluster, c: Config) -> tuple[float, float]:
    """(bandwidth, latency) of the data-parallel ring of one stage. Its d replicas are t ranks
    apart: the ring stays in a node while d t fits in it; otherwise each node holds
    k = devices_per_node / t replicas of the ring, whose traffic leaves over their k network
    cards (one per GPU on Selene, L4081-4086), so the ring runs at min(intra, k x inter)."""
    # Stage 0's replicas in Megatron's order (rank = replica x t); the simulator's ring.
    return allreduce_link(cluster, [j * c.tensor for j in range(c.data)])


def inflight_chunks(c: Config, rank: int) -> int:
    """Peak chunk activations held by a rank: 1F1B min(p - r, m); interleaved Megatron's warm-up
    (p - r - 1) 2 + (v - 1) p plus the steady-state forward, capped at m v."""
    p, v, m = c.pipeline, c.virtual, c.num_microbatches
    if v == 1:
        return min(p - rank, m)
    return min(2 * (p - rank - 1) + (v - 1) * p + 1, m * v)


def rank_work_s(u: UnitCosts, cfg: TransformerConfig, c: Config) -> list[float]:
    """Per-rank compute per microbatch: l/p decoder blocks (F + B + recompute), plus the
    embedding on rank 0 and the head on rank p - 1."""
    dec = u.decoder
    per_block = dec.forward_s + dec.backward_s + dec.strategies()[c.recompute].extra_s
    blocks = cfg.num_layers // c.pipeline
    work = [blocks * per_block] * c.pipeline
    work[0] += u.embedding.forward_s + u.embedding.backward_s
    work[-1] += u.head.forward_s + u.head.backward_s
    return work


@lru_cache(maxsize=4096)
def first_chunk_inflight(p: int, v: int, m: int) -> int:
    """Peak activations of chunk 0 (the one with the embedding) on rank 0, following Megatron's
    order: forward k runs chunk (k mod p v) div p, backward k chunk v - 1 - (k mod p v) div p."""
    total = m * v
    warmup = min(p - 1, m) if v == 1 else min(2 * (p - 1) + (v - 1) * p, total)
    held = peak = 0
    # Past the warm-up each step runs one forward and one backward, and the chunk pattern
    # repeats every p v steps with no net change: two periods hold the peak of the whole run.
    steps = total + warmup if total <= warmup + 2 * p * v else warmup + 2 * p * v
    for k in range(steps):
        if k < total and (k % (p * v)) // p == 0:  # forward k
            held += 1
            peak = max(peak, held)
        j = k - warmup  # backward j follows forward j + warmup
        if 0 <= j < total and v - 1 - (j % (p * v)) // p == 0:
            held -= 1
    return peak


def peak_memory_bytes(u: UnitCosts, cfg: TransformerConfig, c: Config) -> float:
    """Peak bytes over ranks 0 and p - 1 (rank 0 holds the most activations and the embedding;
    rank p - 1 the head; middle ranks hold less than rank 0). The head's chunk runs each
    forward right before its backward (1F1B, and Megatron's interleaved order once m >= p), so
    it holds one microbatch; the embedding's chunk count is ``first_chunk_inflight``. Both peaks
    are added to the rank's total, an upper bound within the embedding's share."""
    blocks_per_chunk = cfg.num_layers // (c.pipeline * c.virtual)
    dec = u.decoder
    chunk_act = blocks_per_chunk * dec.strategies()[c.recompute].activation_bytes
    blocks_static = cfg.num_layers // c.pipeline * dec.static_bytes
    first = first_chunk_inflight(c.pipeline, c.virtual, c.num_microbatches)
    rank0 = blocks_static + u.embedding.static_bytes + inflight_chunks(c, 0) * chunk_act + first * (
        u.embedding.activation_bytes or 0.0)
    last = blocks_static + u.head.static_bytes + inflight_chunks(c, c.pipeline - 1) * chunk_act + (
        u.head.activation_bytes or 0.0)
    if c.pipeline == 1:
        return rank0 + u.head.static_bytes + (u.head.activation_bytes or 0.0)
    return max(rank0, last)


def estimate(u: UnitCosts, cfg: TransformerConfig, cluster: Cluster, c: Config, *,
             overlap_grad_reduce: bool = False) -> Estimate:
    """Closed-form iteration time and memory of one configuration."""
    assert cluster.device is not None
    p, v, m = c.pipeline, c.virtual, c.num_microbatches
    work = rank_work_s(u, cfg, c)
    t_max, t_avg = max(work), math.fsum(work) / p
    send_s = 0.0
    if p > 1:
        bandwidth, latency = p2p_link(cluster, c)
        send_s = latency + u.decoder.output_bytes / bandwidth
    # Each microbatch waits on 2 v transfers per rank in the steady state and 2 (p - 1) more to fill
    # and drain the pipeline (Megatron's 1F1B sends are blocking).
    pipeline_s = m * (t_max + 2 * v * send_s) + (p - 1) / v * t_avg + 2 * (p - 1) * send_s
    if c.v_schedule:  # ZB-V / DualPipeV: their own bubble and in-flight counts
        pipeline_s = v_model.pipeline_s(u, cfg, c, send_s)
    allreduce = 0.0
    if c.data > 1:
        bandwidth, latency = dp_link(cluster, c)
        blocks = cfg.num_layers // p
        params = u.embedding.param_bytes + blocks * u.decoder.param_bytes
        allreduce = allreduce_time_s(params, c.data, bandwidth, latency)
        if overlap_grad_reduce:  # buckets hide under rank 0's last backward (collectives.exposed_dp_allreduce_s)
            last_backward = blocks * u.decoder.backward_s + u.embedding.backward_s
            allreduce = exposed_dp_allreduce_s(allreduce, last_backward)
    peak = v_model.peak_memory_bytes(u, cfg, c) if c.v_schedule else peak_memory_bytes(u, cfg, c)
    rank0_static = cfg.num_layers // p * u.decoder.static_bytes + u.embedding.static_bytes
    if c.v_schedule:
        rank0_static = v_model.rank0_static_bytes(u, cfg, c)
    optimizer = profile_optimizer_step_s(u.decoder_source, rank0_static, cluster.device)
    return Estimate(iteration_s=pipeline_s + allreduce + optimizer, pipeline_s=pipeline_s, allreduce_s=allreduce,
                    peak_memory_bytes=peak, fits=peak <= usable_memory_bytes(cluster.device),
                    optimizer_s=optimizer)


def throughput_row(cfg: TransformerConfig, cluster: Cluster, c: Config, iteration_s: float) -> dict[str, float]:
    """Samples/s and two FLOP rates per GPU at an iteration time, labelled:

    - ``model_tflops_per_gpu`` / ``mfu``: model FLOPs (forward + backward, no recompute: Eq. 4.2
      without its recompute forward), the useful work;
    - ``hardware_tflops_per_gpu`` / ``hfu``: FLOPs the GPUs execute, including the recompute forward
      when (and only when) the configuration recomputes: ``full`` adds one forward of every decoder
      layer (Eq. 4.2 as printed, which assumes full recompute, L4166-4190), ``selective`` the
      attention core's forward.
    """
    assert cluster.device is not None
    batch = c.num_microbatches * c.microbatch_size * c.data
    devices = c.tensor * c.pipeline * c.data
    model = model_flops_per_sample(cfg) * batch
    hardware = model + recompute_flops_per_sample(cfg, c.recompute) * batch
    peak = cluster.device.peak_flops
    return {
        "samples_per_s": batch / iteration_s,
        "model_tflops_per_gpu": model / iteration_s / devices / 1e12,
        "hardware_tflops_per_gpu": hardware / iteration_s / devices / 1e12,
        "mfu": model / iteration_s / devices / peak,
        "hfu": hardware / iteration_s / devices / peak,
    }


def recompute_flops_per_sample(cfg: TransformerConfig, recompute: str) -> float:
    """Extra FLOPs per sample of a uniform recompute setting (0 for ``none``)."""
    if recompute == "full":
        return flops_per_iteration(cfg, global_batch_size=1, recompute=True) - model_flops_per_sample(cfg)
    if recompute == "selective":
        return cfg.num_layers * attention_core_forward_flops(cfg, microbatch_size=1)
    return 0.0
