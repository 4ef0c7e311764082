"""The parallel dimensions the ``ptdp`` search adds to t x p x d: sharded data parallelism (ZeRO-1/2/3),
context parallelism (ring attention), expert parallelism (with expert tensor parallelism) and uneven
first/last pipeline stages. Formulas: ``cost_models.parallelism`` (one function each, unit-tested);
sources and the rules below: docs/solver-ptdp.md, "Parallel dimensions".

What goes where (the simulator runs the same plan):

- per layer and microbatch, baked into the plan's layer profile (so the simulator charges them too):
  context parallelism's per-rank shape (s/c tokens per rank: linear layers, activations and stage
  transfers at s/c; the causal attention core c times that of an s/c sequence, Megatron's
  load-balanced split), the ring's K/V transfers beyond the attention they overlap, the experts'
  dispatch and combine all-to-all, the routing imbalance (``load_balance_factor``), the expert weights
  a rank holds (E/e experts split over the expert-TP ranks), and FSDP's per-layer parameter all-gather
  beyond the compute it overlaps (ZeRO-3, forward and backward of every microbatch);
- per step and pipeline rank (the closed form's data-parallel term, the simulator's all-reduce): the
  gradient reduction (ring all-reduce, or reduce-scatter + all-gather at the same volume for ZeRO-1/2,
  reduce-scatter only for ZeRO-3), the Adam step sharded over the data-parallel ranks (ZeRO >= 1), and
  the model states sharded by ``parallelism.zero_state_bytes_per_rank``: dense weights over the
  d x c data-parallel ranks, experts over the expert-data-parallel ranks t d c / (e etp).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from cost_models import fp8, moe, parallelism
from cost_models.activation_offload import OFFLOAD, offload_bandwidth_bytes_per_s, offload_option
from cost_models.collectives import group_allgather_s
from cost_models.compute import collective_sm_share, compute_constants, has_constants
from cost_models.layer_ops import FLASH_BACKWARD_FACTOR
from cost_models.memory import GRAD_BYTES_PER_PARAM, zero_static_scale
from cost_models.parallelism import (
    deduplicated_alltoall_bytes_per_rank,
    expected_nodes_per_token,
    expert_alltoall_bytes_per_rank,
    expert_load_time_factor,
    overlapped_exposed_s,
    ring_attention_exposed_s,
    ring_attention_kv_bytes_per_rank,
)
from cost_models.transformer import ADAM_BYTES_PER_PARAM
from planner.schema import Cluster, LayerProfile, RecomputeOption, TransformerConfig, recompute_modules_of

MIN_TOKENS_PER_CONTEXT_RANK = 4096
"""Default of the ``min_tokens_per_context_rank`` option: context degrees leaving fewer tokens per rank
are not searched. The cost model leaves out the per-block kernel overheads of short shards (each ring
step runs two half-blocks of the load-balanced split), which Megatron's guidance to use context
parallelism from 8K tokens reflects."""
ZERO_STAGES = (0, 1, 2, 3)
MAX_UNEVEN_CHUNKS = 8
"""Largest interleaving factor searched for layer counts that p v does not divide (uneven end chunks)."""
NEAR_EVEN = (-1, -1)
"""``ends`` of the near-even layout: every virtual stage ``l // (p v)`` layers and the remaining ones
one each to the middle stages, in order (Megatron's ``--pipeline-model-parallel-layout``; e.g.
DeepSeek-V3's 61 layers on 32 virtual stages: 1, 2 x 29, 1, 1)."""
V_EVEN_RANKS = (-2, -2)
"""``ends`` of a V schedule's layout where 2p does not divide the layers: every rank l // p layers or one
more (the extra ones on the last ranks, rank 0 with the embedding and the head among the lighter),
each rank's two chunks half and half (the odd layer in chunk 0; rank 0's in chunk 0, beside the
embedding, the head being the heavier end)."""
V_LIGHT_RANK0 = (-3, -3)
"""``ends`` of a V layout that makes room for the embedding and the head: rank 0's two chunks
l // (2p) layers each, the other ranks as even as ``V_EVEN_RANKS`` makes them (DeepSeek-V3's 61 layers
on 16 ranks: 2 on rank 0, 3 on rank 1, 4 on the rest)."""
V_LAYOUTS = (V_EVEN_RANKS, V_LIGHT_RANK0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Dims:
    """The degrees beyond t, p, b that change a layer's per-rank costs."""

    tensor: int
    context: int = 1
    expert: int = 1
    expert_tensor: int = 1
    zero_stage: int = 0
    data: int = 1
    """Data-parallel degree; it matters to the layer costs only under ZeRO-3 (per-layer all-gather)."""

    @property
    def dp_ranks(self) -> int:
        """Ranks the dense weights' gradients are reduced over (and ZeRO shards them over): d x c."""
        return self.data * self.context

    @property
    def expert_dp_ranks(self) -> int:
        """Expert-data-parallel ranks: t d c / (e etp) (Megatron-Core's expert rank generator)."""
        return max(1, self.tensor * self.data * self.context // (self.expert * self.expert_tensor))


# ------------------------------------------------------------------------------------------
# Which degrees to search
# ------------------------------------------------------------------------------------------


def context_degrees(cfg: TransformerConfig, devices: int, fixed: int | None, attention: str,
                    min_tokens: int = MIN_TOKENS_PER_CONTEXT_RANK) -> list[int]:
    """c dividing the devices with seq % 2c == 0 and at least ``min_tokens`` tokens per rank; ring
    attention runs on the fused (flash) attention only."""
    if fixed is not None:
        return [fixed]
    if attention != "flash":
        return [1]
    s = cfg.seq_length
    return [c for c in _divisors(devices) if c == 1 or (s % (2 * c) == 0 and s // c >= min_tokens)]


def expert_degrees(cfg: TransformerConfig, dp_ranks: int, fixed: int | None) -> list[int]:
    """e dividing the expert count and the ``dp_ranks`` = t d c / etp ranks the expert layers spread over
    (the d x c data ranks at etp = t; with the experts whole, etp = 1, the tensor ranks too:
    Megatron-Core's MoE parallel folding)."""
    if not cfg.is_moe:
        return [1]
    num_experts = int(cfg.num_experts or 0)
    if fixed is not None:
        return [fixed] if num_experts % fixed == 0 and dp_ranks % fixed == 0 else []
    return [e for e in _divisors(num_experts) if dp_ranks % e == 0]


def expert_tensor_degrees(cfg: TransformerConfig, tensor: int, fixed: int | None) -> list[int]:
    """Expert TP: 1 (experts whole, Megatron-Core's choice for fine-grained experts) or t (split like the
    dense FFN); the expert FFN width must divide by it."""
    if not cfg.is_moe:
        return [1]
    width = cfg.moe_ffn_hidden_size or cfg.ffn_size
    options = [fixed] if fixed is not None else sorted({1, tensor})
    return [k for k in options if width % k == 0 and tensor % k == 0]


def zero_stages_for(stages: tuple[int, ...], pipeline: int, dp_ranks: int, *,
                    overlap_grad_reduce: bool = False) -> list[int]:
    """ZeRO stages worth costing: none past 0 without data parallelism; ZeRO-3 (Megatron FSDP) only
    without pipelining; 0 is dominated by 1 when both are searched (same traffic, less memory, the Adam
    step sharded), unless the gradient reduction overlaps the backward (ZeRO-1's weight all-gather
    then stays exposed while ZeRO-0's all-reduce hides)."""
    if dp_ranks == 1:  # nothing to shard over one rank: every stage is DDP
        return [0]
    out = [z for z in stages if z != 3 or pipeline == 1]
    if 0 in out and 1 in out and not overlap_grad_reduce:
        out.remove(0)
    return out


def stage_layouts(num_layers: int, pipeline: int, virtual: int, *, embedding_layers: float, head_layers: float,
                  uneven: bool, fixed: tuple[int, int] | None = None, near_even: bool = False) -> list[tuple[int, int]]:
    """(first, last) decoder layers of the first and last virtual stages; (0, 0) = Megatron's even
    split. Uneven ends are searched with p v >= 2 virtual stages: the split that balances the embedding
    and the output head against the decoder layers (``balanced_end_stage_layers`` over the p v virtual
    stages; Megatron's ``--decoder-first/last-pipeline-num-layers`` for 1F1B, its
    ``--pipeline-model-parallel-layout`` when interleaved). Pinned ends (``fixed``) are stage counts
    (1F1B only). ``near_even``: also ``NEAR_EVEN`` where the layers do not split evenly (offered for a
    pinned interleaving depth only: the closed form ranks its unequal chunks optimistically, by up to
    7 % against the simulator for Llama 3 405B at v = 5-7), and whenever no other uneven layout exists."""
    k = pipeline * virtual
    even = num_layers % k == 0
    if fixed is not None:
        return [fixed] if virtual == 1 and pipeline >= 2 and _valid_ends(num_layers, pipeline, *fixed) else []
    out = [(0, 0)] if even else []
    if uneven and k >= 2:
        # interleaved: the last virtual stage may hold the head alone (Megatron's layout 'mL', DeepSeek-V3)
        split = _balanced(num_layers, k, round(embedding_layers, 2), round(head_layers, 2), virtual > 1)
        if split is None and not even:  # an end left empty: one layer there (Megatron-Bridge's 405B layouts)
            split = _single_layer_ends(num_layers, k)
        if split is None:  # an end left empty and no single-layer ends: the best split keeping a layer at each end
            split = _nonempty_ends(num_layers, k, embedding_layers, head_layers)
        if split is not None and (not even or len(set(split)) > 1):
            out.append((split[0], split[-1]))
        if near_even and not even and k >= 3 and all(chunk_layer_counts(num_layers, pipeline, virtual, ends)
                                       != chunk_layer_counts(num_layers, pipeline, virtual, NEAR_EVEN) for ends in out):
            out.append(NEAR_EVEN)  # the end-plus-even-middle family cannot split l this evenly (l prime, ...)
        if not out:  # no even split and no end-plus-even-middle one (e.g. a head made heavy by MTP modules
            out.append(NEAR_EVEN)  # leaves its end empty): near-even, the ends the lighter
    return out


def _single_layer_ends(num_layers: int, k: int) -> tuple[int, ...] | None:
    """One decoder layer in each end virtual stage and an even middle, when the balanced split would
    leave an end empty (an embedding or head heavier than the layers beside it; Megatron-Bridge's
    recipes count the embedding and the loss as layers of the split, e.g. Llama 3.1 405B's 126 layers
    on 64 virtual stages: 1, 2 x 62, 1); None when the middle does not divide evenly."""
    middle = num_layers - 2
    if k <= 2 or middle % (k - 2) or middle // (k - 2) < 1:
        return None
    return (1, *[middle // (k - 2)] * (k - 2), 1)


@lru_cache(maxsize=4096)
def _nonempty_ends(num_layers: int, k: int, embedding_layers: float, head_layers: float) -> tuple[int, ...] | None:
    """First, even middle, last over k stages with every stage holding a layer, minimising the busiest stage
    (the embedding and the head in layer units on the ends; ties: the more even split): what
    ``_balanced`` gives when a heavy head (the output layer with multi-token-prediction modules) would
    empty its end. None when no such split exists or none is less busy than ``NEAR_EVEN``'s."""
    if k < 3:
        return None
    near = chunk_layer_counts(num_layers, k, 1, NEAR_EVEN)
    near_load = max(near[0] + embedding_layers, *near[1:-1], near[-1] + head_layers)
    best: tuple[float, int, tuple[int, ...]] | None = None
    for per in range(1, num_layers // (k - 2) + 1):
        rest = num_layers - per * (k - 2)
        for first in range(1, rest):
            last = rest - first
            load = max(first + embedding_layers, per, last + head_layers)
            key = (load, max(first, per, last) - min(first, per, last))
            if best is None or key < best[:2]:
                best = (*key, (first, *[per] * (k - 2), last))
    return best[2] if best is not None and best[0] < near_load - 1e-9 else None


def _valid_ends(num_layers: int, pipeline: int, first: int, last: int) -> bool:
    middle = num_layers - first - last
    if first < 1 or last < 1 or middle < 0:
        return False
    return middle == 0 if pipeline == 2 else middle % (pipeline - 2) == 0 and middle >= pipeline - 2


@lru_cache(maxsize=4096)
def _balanced(num_layers: int, pipeline: int, embedding_layers: float, head_layers: float,
              head_alone: bool = False) -> tuple[int, ...] | None:
    """``parallelism.balanced_end_stage_layers``, cached, or None when it leaves a stage empty (``head_alone``:
    but the last, which then holds the output head alone, as an interleaved layout string may say)."""
    split = tuple(parallelism.balanced_end_stage_layers(num_layers, pipeline, embedding_layers=embedding_layers,
                                                        head_layers=head_layers))
    if min(split[:-1]) >= 1 and split[-1] >= (0 if head_alone and pipeline >= 3 else 1):
        return split
    return None


def stage_layer_counts(num_layers: int, pipeline: int, ends: tuple[int, int]) -> list[int]:
    """Decoder layers per pipeline stage: even, or the given end stages and an even middle."""
    return chunk_layer_counts(num_layers, pipeline, 1, ends)


def chunk_layer_counts(num_layers: int, pipeline: int, virtual: int, ends: tuple[int, int]) -> list[int]:
    """Decoder layers per virtual stage (p v of them, model order): even, the given first and last
    virtual stages and an even middle, or ``NEAR_EVEN``."""
    first, last = ends
    k = pipeline * virtual
    if ends in V_LAYOUTS:
        return _v_chunk_counts(num_layers, pipeline, light_rank0=ends == V_LIGHT_RANK0)
    if ends == NEAR_EVEN:
        base, extra = divmod(num_layers, k)
        counts = [base] * k
        order = [*range(1, k - 1), k - 1, 0]  # the middle first, then the last, then the first stage
        for i in order[:extra]:
            counts[i] += 1
        return counts
    if (first, last) == (0, 0):
        return [num_layers // k] * k
    if k == 2:
        return [first, last]
    return [first, *[(num_layers - first - last) // (k - 2)] * (k - 2), last]


def _v_chunk_counts(num_layers: int, pipeline: int, *, light_rank0: bool) -> list[int]:
    """Decoder layers of a V layout's 2p virtual stages in model order (rank r: stages r and 2p - 1 - r;
    ``V_EVEN_RANKS``, ``V_LIGHT_RANK0``)."""
    p = pipeline
    first = 2 * (num_layers // (2 * p)) if light_rank0 else None
    rest, ranks = (num_layers - first, p - 1) if first is not None else (num_layers, p)
    base, extra = divmod(rest, ranks)
    totals = [base + (1 if i >= ranks - extra else 0) for i in range(ranks)]  # the extra ones on the last ranks
    if first is not None:
        totals = [first, *totals]
    counts = [0] * (2 * p)
    for r, n in enumerate(totals):
        counts[r], counts[2 * p - 1 - r] = n - n // 2, n // 2
    return counts


def v_layouts(num_layers: int, pipeline: int) -> list[tuple[int, int]]:
    """A V schedule's layouts: even where 2p divides the layers; else ``V_EVEN_RANKS`` and, where it
    differs and leaves every chunk a layer, ``V_LIGHT_RANK0``."""
    if num_layers % (2 * pipeline) == 0:
        return [(0, 0)]
    out = [V_EVEN_RANKS] if num_layers >= 2 * pipeline else []
    if pipeline < 2:
        return out
    light = _v_chunk_counts(num_layers, pipeline, light_rank0=True)
    if min(light) >= 1 and (not out or light != _v_chunk_counts(num_layers, pipeline, light_rank0=False)):
        out.append(V_LIGHT_RANK0)
    return out


def _divisors(n: int) -> list[int]:
    small, large = [], []
    k = 1
    while k * k <= n:
        if n % k == 0:
            small.append(k)
            if k * k != n:
                large.append(n // k)
        k += 1
    return small + large[::-1]


# ------------------------------------------------------------------------------------------
# Per-layer costs at the degrees (baked into the layer profile)
# ------------------------------------------------------------------------------------------


def profile_config(cfg: TransformerConfig, context: int) -> TransformerConfig:
    """The config whose one-device profile gives a context-parallel rank's linear costs: s/c tokens."""
    return cfg if context == 1 else cfg.model_copy(update={"seq_length": cfg.seq_length // context})


def decoder_at_degrees(layer: LayerProfile, cfg: TransformerConfig, cluster: Cluster, dims: Dims, *,
                       microbatch_size: int, moe_layer: bool, load_balance_factor: float = 1.0,
                       per_operation: bool = True, overlap_moe_alltoall: bool = False,
                       moe_dispatcher: str = "alltoall") -> LayerProfile:
    """A decoder layer profiled at (t, b) on s/c tokens, with the context, expert and ZeRO-3 terms.
    ``per_operation``: the layer comes from the per-operation model (GEMM shapes matter); a flat-efficiency
    layer keeps the experts' time (same FLOPs at the same rate)."""
    fwd, bwd = layer.forward_s, layer.backward_s
    options = dict(layer.strategies())
    tail = 0.0  # what PyTorch's early-stopping checkpoint does not re-run (OpTimes.tail_s)
    early_stop = cluster.device is not None and compute_constants(cluster.device).full_recompute == "early-stop"
    if "full" in options and early_stop:
        tail = max(0.0, layer.forward_s - options["full"].extra_s)
    c = dims.context
    flops = layer.flops
    if c > 1:
        core_fwd = options["selective"].extra_s  # attention core of an s/c sequence
        shard = profile_config(cfg, c)
        if flops is not None:  # F + B of the core: c x that of an s/c sequence
            flops += (c - 1) * 3 * moe.attention_core_forward_flops(shard, microbatch_size=microbatch_size,
                                                                    tensor_parallel=dims.tensor)
        ring_fwd, ring_bwd = ring_exposed_s(cfg, cluster, dims, microbatch_size, core_fwd)
        fwd += (c - 1) * core_fwd + ring_fwd
        bwd += (c - 1) * FLASH_BACKWARD_FACTOR * core_fwd + ring_bwd
        options["selective"] = options["selective"].model_copy(update={"extra_s": c * core_fwd})
    static, params, weight = layer.static_bytes, layer.param_bytes, layer.backward_weight_s
    a2a_fwd = imbalance = 0.0
    regroup = (0.0, 0.0, 0.0)
    if moe_layer:
        delta = expert_params_delta(cfg, dims)
        static += ADAM_BYTES_PER_PARAM * delta
        params += element_bytes(cfg) * delta
        a2a = alltoall_s(cfg, cluster, dims, microbatch_size, moe_dispatcher)
        regroup = expert_gemm_delta_s(cfg, cluster, dims, microbatch_size) if per_operation else (0.0, 0.0, 0.0)
        imbalance = 0.0
        if dims.expert > 1:  # the busiest expert rank sets the pace; one rank holding all experts does not wait
            imbalance = (expert_load_time_factor(load_balance_factor=load_balance_factor) - 1) * routed_share(cfg)
        a2a_fwd = a2a_bwd = 2 * a2a
        if overlap_moe_alltoall:  # one microbatch's all-to-alls under another's compute of the layer,
            share = alltoall_sm_share(cluster, moe_dispatcher)  # which runs on the SMs they leave it
            a2a_fwd = overlapped_exposed_s(2 * a2a, layer.backward_s, sm_share=share)
            a2a_bwd = overlapped_exposed_s(2 * a2a, layer.forward_s, sm_share=share)
        fwd += a2a_fwd + imbalance * layer.forward_s + regroup[0]
        bwd += a2a_bwd + imbalance * layer.backward_s + regroup[1] + regroup[2]
        weight = None if weight is None else weight + regroup[2]
    if dims.zero_stage == 3:  # dense weights over the d c ranks, experts over the expert-DP ranks
        if per_operation and cluster.device is not None and fp8.is_fp8(cluster.device):
            fwd += fp8.weight_cast_s(params / element_bytes(cfg), cluster.device)  # cast per gather: nothing cached
        experts = element_bytes(cfg) * expert_params_per_rank(cfg, dims) if moe_layer else 0.0
        gather = (group_allgather_s(cluster, params - experts, dims.dp_ranks, dims.tensor)
                  + group_allgather_s(cluster, experts, dims.expert_dp_ranks, dims.expert * dims.expert_tensor))
        share = collective_sm_share(cluster.device) if cluster.device is not None else 0.0
        # the next layer's gather runs under this layer's compute, on the SMs NCCL leaves it
        fwd += max(0.0, gather - fwd) + share * min(gather, fwd)
        bwd += max(0.0, gather - bwd) + share * min(gather, bwd)
    if "full" in options:
        options["full"] = options["full"].model_copy(update={"extra_s": fwd - tail})
    if OFFLOAD in options and cluster.device is not None:  # the copies hide behind the layer at its degrees
        options[OFFLOAD] = offload_option(layer.model_copy(update={"forward_s": fwd, "backward_s": bwd,
                                                                   "recompute": options}),
                                          offload_bandwidth_bytes_per_s(cluster.device))
    moe_again = (a2a_fwd + regroup[0] + imbalance * layer.forward_s) if moe_layer else 0.0
    _module_options_at_degrees(options, (c - 1) * core_fwd if c > 1 else 0.0, moe_again)
    return layer.model_copy(update={"forward_s": fwd, "backward_s": bwd, "backward_weight_s": weight, "flops": flops,
                                    "static_bytes": static, "param_bytes": params, "recompute": options})


def _module_options_at_degrees(options: dict[str, RecomputeOption], core_again_s: float, moe_again_s: float) -> None:
    """Per-module recompute at the degrees: re-running ``core_attn`` repeats the K/V ring's extra core
    work (c - 1 more shards), re-running ``moe`` the dispatch/combine all-to-alls, the expert GEMMs'
    change of shape and the busiest expert rank's wait (what the layer's forward gained for them)."""
    for name, option in list(options.items()):
        modules = recompute_modules_of(name)
        if name in ("none", "selective") or not modules:
            continue
        extra = core_again_s * ("core_attn" in modules) + moe_again_s * ("moe" in modules)
        if extra:
            options[name] = option.model_copy(update={"extra_s": option.extra_s + extra})


def end_layer_at_degrees(layer: LayerProfile, cluster: Cluster, dims: Dims, first_gather_bytes: float) -> LayerProfile:
    """ZeRO-3: the first unit's all-gather waits in full (embedding forward, head backward)."""
    if dims.zero_stage != 3:
        return layer
    gather = group_allgather_s(cluster, first_gather_bytes, dims.dp_ranks, dims.tensor)
    key = "forward_s" if layer.kind == "embedding" else "backward_s"
    return layer.model_copy(update={key: getattr(layer, key) + gather})


def ring_exposed_s(cfg: TransformerConfig, cluster: Cluster, dims: Dims, microbatch_size: int,
                   core_fwd_s: float) -> tuple[float, float]:
    """(forward, backward) ring-attention time beyond the attention it overlaps, per layer and
    microbatch: c - 1 steps, each passing one K/V block of s/c tokens (the tensor rank's heads) on the
    context ring (ranks t apart), against the attention of one block (the core's per-rank total / c)."""
    c, t = dims.context, dims.tensor
    kv_width = sum(moe.attention_kv_widths(cfg)) / 2
    fwd_bytes, bwd_bytes = ring_attention_kv_bytes_per_rank(
        microbatch_size=microbatch_size, seq_length=cfg.seq_length, kv_width=int(kv_width), context_parallel=c,
        element_bytes=element_bytes(cfg))
    bandwidth, latency = _group_hop(cluster, c, t)
    step_fwd = latency + fwd_bytes / (c - 1) / t / bandwidth
    step_bwd = latency + bwd_bytes / (c - 1) / t / bandwidth
    return (ring_attention_exposed_s(block_compute_s=core_fwd_s, block_transfer_s=step_fwd, context_parallel=c),
            ring_attention_exposed_s(block_compute_s=FLASH_BACKWARD_FACTOR * core_fwd_s, block_transfer_s=step_bwd,
                                     context_parallel=c))


MOE_DISPATCHERS = ("alltoall", "deepep")
"""Expert token dispatchers: ``alltoall`` sends every (token, expert) copy (Megatron's alltoall
dispatcher); ``deepep`` sends a token once per distinct remote node and forwards it over NVLink there
(DeepEP's normal kernels; Megatron's flex dispatcher, deepep and hybridep backends)."""


DEEPEP_SMS = 20
"""SMs DeepEP's normal (high-throughput) dispatch and combine kernels occupy: DeepSeek-V3 dedicates 20
of the H800's 132 SMs to its all-to-all and finds them enough to saturate IB and NVLink
([deepseek-v3] Sec. 3.2.2); DeepEP's kernels default to that count."""


def alltoall_sm_share(cluster: Cluster, dispatcher: str) -> float:
    """Share of the SMs an all-to-all hidden under compute holds: ``DEEPEP_SMS`` for ``deepep``, NCCL's
    CTAs (``compute.collective_sm_share``) for ``alltoall``; 0 without compute constants."""
    device = cluster.device
    if device is None or not has_constants(device):
        return 0.0
    if dispatcher == "deepep":
        return min(0.5, DEEPEP_SMS / compute_constants(device).num_sms)
    return collective_sm_share(device)


def alltoall_s(cfg: TransformerConfig, cluster: Cluster, dims: Dims, microbatch_size: int,
               dispatcher: str = "alltoall") -> float:
    """One dispatch (or combine) all-to-all of an MoE layer: each rank sends its b s/(c t) tokens x k
    copies, (e-1)/e of them to other expert ranks (ranks etp apart); the in-node and the off-node shares
    run at once, each on its link (NVLink; one NIC per GPU). ``deepep``: the network carries each token
    once per distinct remote node (``parallelism.deduplicated_alltoall_bytes_per_rank``)."""
    e = dims.expert
    if e == 1:
        return 0.0
    tokens = microbatch_size * cfg.seq_length // (dims.context * dims.tensor)
    k = int(cfg.experts_per_token or 1)
    fraction = _collective_fraction(cluster)
    per_node = max(1, min(e, cluster.devices_per_node // dims.expert_tensor))
    if dispatcher == "deepep":
        reach = expected_nodes_per_token(num_experts=int(cfg.num_experts or 1), experts_per_token=k,
                                         nodes=max(1, e // per_node), router_groups=cfg.router_num_groups,
                                         router_group_topk=cfg.router_group_topk)
        nvlink, network = deduplicated_alltoall_bytes_per_rank(
            tokens_per_rank=tokens, hidden_size=cfg.hidden_size, experts_per_token=k, expert_parallel=e,
            ranks_per_node=per_node, nodes_per_token=reach, element_bytes=element_bytes(cfg))
    else:
        total = expert_alltoall_bytes_per_rank(tokens_per_rank=tokens, hidden_size=cfg.hidden_size,
                                               experts_per_token=k, expert_parallel=e,
                                               element_bytes=element_bytes(cfg))
        intra_share = (per_node - 1) / (e - 1)
        nvlink, network = total * intra_share, total * (1 - intra_share)
    intra = nvlink / (float(cluster.intra_node_bytes_per_s or 1.0) * fraction)
    inter = network / (float(cluster.inter_node_bytes_per_s or 1.0) * fraction)
    latency = cluster.inter_node_latency_s if per_node < e else cluster.intra_node_latency_s
    return latency + max(intra, inter)


def expert_gemm_delta_s(cfg: TransformerConfig, cluster: Cluster, dims: Dims, microbatch_size: int,
                        ) -> tuple[float, float, float]:
    """(forward, input-gradient, weight-gradient) time the routed experts' GEMMs change by when the
    rank runs E/e experts on the tokens the e ranks route to them, split over the expert-TP ranks,
    instead of all E experts split over t on its own tokens (the profile's shape): the same FLOPs in
    fewer, taller GEMMs (rows per expert x e t / etp under sequence parallelism)."""
    if dims.expert == 1 and dims.expert_tensor == dims.tensor:
        return 0.0, 0.0, 0.0
    assert cluster.device is not None
    num_experts, k = int(cfg.num_experts or 0), int(cfg.experts_per_token or 0)
    tokens = microbatch_size * cfg.seq_length / dims.context
    before = _expert_gemms_s(cfg, cluster, tokens * k / num_experts, dims.tensor, num_experts)
    rows = tokens * k / num_experts * dims.expert * (1 if dims.expert_tensor == dims.tensor else 1 / dims.tensor)
    after = _expert_gemms_s(cfg, cluster, rows, dims.expert_tensor, num_experts // dims.expert)
    return after[0] - before[0], after[1] - before[1], after[2] - before[2]


def _expert_gemms_s(cfg: TransformerConfig, cluster: Cluster, rows: float, split: int, count: int,
                    ) -> tuple[float, float, float]:
    """Up (gate) and down projections of ``count`` experts of ``rows`` tokens each, width / split, in the
    linear layers' dtype (FP8 casts of inputs and output gradients are the same elements either way, and
    the weights' casts are per step: ``cost_models.fp8``)."""
    from cost_models.compute import gemm_fwd_bwd_s  # noqa: PLC0415

    width, h = cfg.moe_ffn_hidden_size or cfg.ffn_size, cfg.hidden_size
    up = (2 if cfg.gated_mlp else 1) * width // split
    total = [0.0, 0.0, 0.0]
    dtype = fp8.gemm_dtype(cluster.device)  # type: ignore[arg-type]
    for m, n, kk in ((rows, up, h), (rows, h, width // split)):
        for j, value in enumerate(gemm_fwd_bwd_s(m, n, kk, cluster.device, dtype=dtype)):  # type: ignore[arg-type]
            total[j] += count * value
    return total[0], total[1], total[2]


def expert_params_per_rank(cfg: TransformerConfig, dims: Dims) -> float:
    """Routed-expert weights one rank holds per MoE layer: E/e experts split over the expert-TP ranks."""
    return parallelism.expert_params_per_rank(num_experts=int(cfg.num_experts or 0), params_per_expert=moe.expert_params(cfg),
                                              expert_parallel=dims.expert, expert_tensor_parallel=dims.expert_tensor)


def expert_params_delta(cfg: TransformerConfig, dims: Dims) -> float:
    """Expert weights per rank at (e, etp) minus what the t-split profile holds (E/t experts' worth)."""
    return expert_params_per_rank(cfg, dims) - int(cfg.num_experts or 0) * moe.expert_params(cfg) / dims.tensor


def routed_share(cfg: TransformerConfig) -> float:
    """Share of an MoE layer's matmul FLOPs in its routed experts (what routing imbalance slows)."""
    index = cfg.first_dense_layers
    routed = int(cfg.experts_per_token or 0) * (3 if cfg.gated_mlp else 2) * cfg.hidden_size * (
        cfg.moe_ffn_hidden_size or cfg.ffn_size)
    return routed / moe.decoder_matmul_params(cfg, index)


# ------------------------------------------------------------------------------------------
# Per-step data-parallel terms (ZeRO)
# ------------------------------------------------------------------------------------------


def sharded_static_bytes(dense_static_bytes: float, expert_static_bytes: float, dims: Dims,
                         grad_bytes: float = GRAD_BYTES_PER_PARAM) -> float:
    """Model states on one rank: dense over d x c, experts over the expert-data-parallel ranks
    (``memory.zero_static_scale``, i.e. ``parallelism.zero_state_bytes_per_rank`` over 16 B/param),
    with ``grad_bytes`` of gradients per parameter (6 under DeepSpeed's BF16 optimizer)."""
    z = dims.zero_stage
    if z == 0 and grad_bytes == GRAD_BYTES_PER_PARAM:
        return dense_static_bytes + expert_static_bytes
    return (dense_static_bytes * zero_static_scale(z, dims.dp_ranks, grad_bytes=grad_bytes)
            + expert_static_bytes * zero_static_scale(z, dims.expert_dp_ranks, grad_bytes=grad_bytes))


def fsdp_buffer_bytes(layer_param_bytes: float, dims: Dims) -> float:
    """ZeRO-3 keeps the unsharded weights of the running layer and the prefetched next one."""
    return 2 * layer_param_bytes if dims.zero_stage == 3 else 0.0


def _group_hop(cluster: Cluster, size: int, stride: int) -> tuple[float, float]:
    """Bandwidth (with the collective fraction) and latency of the slowest hop of a ring of ``size``
    ranks ``stride`` apart: NVLink while it fits a node, one NIC per GPU otherwise."""
    fraction = _collective_fraction(cluster)
    if size * stride <= cluster.devices_per_node:
        return float(cluster.intra_node_bytes_per_s or 1.0) * fraction, cluster.intra_node_latency_s
    return float(cluster.inter_node_bytes_per_s or 1.0) * fraction, cluster.inter_node_latency_s


def _collective_fraction(cluster: Cluster) -> float:
    from cost_models.compute import compute_constants  # noqa: PLC0415 (same lazy import as collectives)

    return compute_constants(cluster.device).collective_bandwidth_fraction if cluster.device else 1.0


def element_bytes(cfg: TransformerConfig) -> int:
    return 4 if cfg.dtype == "fp32" else 2

