"""What the simulator charges for the parallel dimensions beyond t x p x d: data-parallel gradient
synchronisation under every ZeRO stage, FSDP's per-layer gathers, context parallelism's ring
attention and expert parallelism's all-to-all (docs/simulator.md, "Parallel dimensions").

Rank layout (Megatron-Core's order ``tp-cp-ep-dp-pp``): the data-parallel group of a stage's
dense weights is its d x c replicas and context ranks, tensor rank 0 of each ``t`` apart; the
expert-parallel group is e consecutive members of that group and the expert-data-parallel group
every e-th member (d x c / e ranks); the context group is c ranks ``t`` apart.

Gradient synchronisation runs on the engine (``cost_models.sim.sync``), and so do FSDP's gathers
and the expert all-to-alls (``cost_models.sim.layercomm``); this module gives their durations, per
layer for the latter (``stage_comm``), and the closed form of what they add to each virtual stage's
forward and backward without contention (``stage_extras``), which ``pipeline_costs`` adds to F and B:

- gradient synchronisation (``rank_terms``): ZeRO-0 all-reduces the gradients, ZeRO-1/2
  reduce-scatter them and all-gather the updated weights (the same 2 (n-1)/n volume, ZeRO Sec.
  7.2), ZeRO-3 only reduce-scatters (weights are gathered per layer); ``overlap_grad_reduce`` (and
  ZeRO-3) run the reduction bucket by bucket under the backward, ``overlap_param_gather`` hides the
  all-gather under the next forward (``collectives.exposed_dp_allreduce_s``; ``sync_s`` is the
  closed-form tail);
- FSDP (ZeRO-3): each layer's weights all-gathered before its forward and again before its
  backward, one layer of prefetch (closed form ``parallelism.fsdp_exposed_comm_s``); two gathered
  layers stay resident;
- context parallelism: a profile derived for the whole sequence is split over c ranks (compute,
  activations and stage outputs x 1/c); each attention layer adds the K/V ring steps its
  attention does not hide (``parallelism.ring_attention_exposed_s``; it stays this closed form
  inside the layer on the engine too, ``layercomm``);
- expert parallelism: a dispatch and a combine all-to-all per MoE layer in the forward and two
  more in the backward (GShard Sec. 3), on the intra- and inter-node links the group spans; with
  ``overlap_moe_alltoall`` a forward's all-to-alls hide under another microbatch's backward of the
  layer and vice versa (Megatron's 1F1B all-to-all overlap, DualPipe's pairing).

Collective model: ``ring`` (default) charges the gradient all-reduce as
``collectives.ranks_allreduce_s`` (the solvers' closed forms do too) and the FSDP gathers, context
ring and all-to-alls on ``costs.allreduce_link``'s ring; ``plan.options["collectives"] =
"hierarchical"`` uses NCCL's hierarchical collectives of ``cost_models.collectives`` with the
device's bus-bandwidth fraction for all of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from cost_models import fp8, moe
from cost_models.collectives import (
    alltoall_s,
    allreduce_s,
    deepspeed_bf16_sync_s,
    exposed_dp_allreduce_s,
    hierarchical_allreduce_s,
    nodes_allgather_s,
    ranks_allreduce_s,
    ring_allgather_s,
)
from cost_models.compute import collective_sm_share
from cost_models.layer_ops import FLASH_BACKWARD_FACTOR
from cost_models.memory import grad_bytes_per_param, zero_static_scale
from cost_models.sim.layercomm import LayerComm, StageComm, closed_form_extra
from planner.errors import InvalidProblemError
from planner.schema import Chunk, LayerProfile, Plan

COLLECTIVE_MODELS = ("ring", "hierarchical")


def applies(plan: Plan) -> bool:
    """Whether the plan uses a dimension this module charges (else costs.py's DDP ring alone)."""
    d = plan.degrees
    return d.context > 1 or d.expert > 1 or plan.zero_stage > 0 or collective_model(plan) != "ring"


def collective_model(plan: Plan) -> str:
    """``plan.options["collectives"]``: ``ring`` (default) or ``hierarchical``.

    Raises:
        InvalidProblemError: any other value.
    """
    model = plan.options.get("collectives", "ring")
    if model not in COLLECTIVE_MODELS:
        raise InvalidProblemError(f"options.collectives={model!r}; use one of {list(COLLECTIVE_MODELS)}")
    return str(model)


@dataclass(frozen=True, slots=True)
class Group:
    """A communication group (tensor rank 0 of each member) and the link model its collectives use."""

    ranks: tuple[int, ...]
    model: str
    intra_bytes_per_s: float
    inter_bytes_per_s: float
    intra_latency_s: float
    inter_latency_s: float
    ring_bytes_per_s: float
    ring_latency_s: float
    ranks_per_node: int = 1
    num_nodes: int = 1

    @property
    def size(self) -> int:
        return len(self.ranks)

    def allreduce_s(self, num_bytes: float) -> float:
        n = self.size
        if n <= 1 or num_bytes <= 0:
            return 0.0
        if self.model == "ring":
            return 2 * ring_allgather_s(num_bytes, n, self.ring_bytes_per_s, self.ring_latency_s)
        if self.num_nodes == 1:
            return allreduce_s(num_bytes, n, self.intra_bytes_per_s, self.intra_latency_s)
        return hierarchical_allreduce_s(num_bytes, self.ranks_per_node, self.num_nodes, self.intra_bytes_per_s,
                                        self.inter_bytes_per_s, self.intra_latency_s, self.inter_latency_s)

    def allgather_s(self, num_bytes: float) -> float:
        """All-gather (= reduce-scatter) of a ``num_bytes`` buffer: half a ring all-reduce."""
        n = self.size
        if n <= 1 or num_bytes <= 0:
            return 0.0
        if self.model == "ring":
            return ring_allgather_s(num_bytes, n, self.ring_bytes_per_s, self.ring_latency_s)
        return nodes_allgather_s(num_bytes, n, self.ranks_per_node, self.num_nodes, self.intra_bytes_per_s,
                                 self.inter_bytes_per_s, self.intra_latency_s, self.inter_latency_s)

    def alltoall_s(self, num_bytes: float) -> float:
        """All-to-all of ``num_bytes`` per rank spread over the group (``collectives.alltoall_s``)."""
        return alltoall_s(num_bytes, self.size, self.ranks_per_node, self.intra_bytes_per_s, self.inter_bytes_per_s,
                          self.intra_latency_s, self.inter_latency_s)

    def p2p_s(self, num_bytes: float) -> float:
        """One ring step's send to the next member: over NVLink inside one node, else the NIC."""
        if self.size <= 1 or num_bytes <= 0:
            return 0.0
        if self.num_nodes == 1:
            return num_bytes / self.intra_bytes_per_s + self.intra_latency_s
        return num_bytes / self.inter_bytes_per_s + self.inter_latency_s


def make_group(plan: Plan, ranks: Sequence[int]) -> Group:
    """The group of ``ranks`` with the plan's collective model (module docstring)."""
    from cost_models.sim.costs import allreduce_link  # costs imports this module

    cluster, model = plan.cluster, collective_model(plan)
    nodes = [cluster.node_of(r) for r in ranks]
    per_node = nodes.count(nodes[0])
    fraction = _bus_fraction(plan) if model == "hierarchical" else 1.0
    intra = float(cluster.intra_node_bytes_per_s or 0.0) * fraction
    inter = float(cluster.inter_node_bytes_per_s or 0.0) * fraction
    ring_bw, ring_lat = allreduce_link(cluster, list(ranks)) if len(ranks) > 1 else (1.0, 0.0)
    return Group(ranks=tuple(ranks), model=model, intra_bytes_per_s=intra or inter, inter_bytes_per_s=inter or intra,
                 intra_latency_s=cluster.intra_node_latency_s, inter_latency_s=cluster.inter_node_latency_s,
                 ring_bytes_per_s=ring_bw, ring_latency_s=ring_lat, ranks_per_node=per_node,
                 num_nodes=len(set(nodes)))


def _bus_fraction(plan: Plan) -> float:
    from cost_models.compute import compute_constants, has_constants

    device = plan.cluster.device
    return compute_constants(device).collective_bandwidth_fraction if device and has_constants(device) else 1.0


# ------------------------------------------------------------------------------------------
# Rank layout
# ------------------------------------------------------------------------------------------


def data_context_ranks(plan: Plan, stage_index: int) -> list[int]:
    """Tensor rank 0 of each of the stage's replicas x context ranks (replica-major, Megatron order).

    ``Stage.ranks`` lists them replicas x context x tensor when given; otherwise stage x = ranks
    x d c t ... (x + 1) d c t - 1, tensor fastest, then context, then data."""
    t, c = plan.degrees.tensor, plan.degrees.context
    stage = plan.stages[stage_index]
    d = stage.replicas
    if len(stage.ranks) >= d * c * t:
        return [stage.ranks[k * t] for k in range(d * c)]
    base = stage_index * d * c * t
    return [base + k * t for k in range(d * c)]


def context_ranks(plan: Plan, stage_index: int) -> list[int]:
    return data_context_ranks(plan, stage_index)[: plan.degrees.context]


def stage_ranks(plan: Plan, stage_index: int) -> list[int]:
    """Every rank of a stage: ``Stage.ranks`` when complete, else the stage's block in Megatron's order."""
    width = plan.degrees.tensor * plan.degrees.context * plan.stages[stage_index].replicas
    ranks = plan.stages[stage_index].ranks
    return list(ranks) if len(ranks) >= width else list(range(stage_index * width, (stage_index + 1) * width))


def expert_ranks(plan: Plan, stage_index: int) -> list[int]:
    """The expert-parallel group of the stage's first rank: e ranks ``expert TP`` apart
    (Megatron-Core's expert order, expert TP fastest, then expert, then expert data)."""
    etp = expert_tensor_parallel(plan)
    return stage_ranks(plan, stage_index)[:: etp][: plan.degrees.expert]


def expert_data_ranks(plan: Plan, stage_index: int) -> list[int]:
    """The expert-data-parallel group of the stage's first rank: t d c / (e x expert TP) ranks."""
    return stage_ranks(plan, stage_index)[:: expert_tensor_parallel(plan) * plan.degrees.expert]


# ------------------------------------------------------------------------------------------
# Layer parts
# ------------------------------------------------------------------------------------------


def expert_fraction(plan: Plan, layer_index: int) -> float:
    """Share of profile layer ``layer_index``'s parameters that are routed experts (0 for dense
    layers, the embedding and the head without multi-token prediction; the profile's layer i is decoder
    block i - 1; the head with MTP modules folded in holds their MoE blocks' experts), for a profile
    holding every expert split by t, or E / (e x expert TP) experts when it is per expert rank."""
    cfg = plan.transformer
    block = layer_index - 1
    if cfg is None or not cfg.is_moe:
        return 0.0
    experts = int(cfg.num_experts or 0) * moe.expert_params(cfg)
    d = plan.degrees
    per_rank = 1 / (d.expert * expert_tensor_parallel(plan)) if plan.model.degrees_included else 1 / d.tensor
    if block == cfg.num_layers and cfg.mtp_layers and moe.is_moe_layer(cfg, cfg.num_layers - 1):
        # the head with its multi-token-prediction modules folded in, each with an MoE block
        layer = plan.model.layers[layer_index]
        held = cfg.mtp_layers * experts * per_rank * element_bytes(plan)
        return min(1.0, held / layer.param_bytes) if layer.param_bytes > 0 else 0.0
    if not 0 <= block < cfg.num_layers or not moe.is_moe_layer(cfg, block):
        return 0.0
    dense = moe.decoder_layer_params(cfg, block) - experts
    if plan.model.degrees_included:  # one rank's profile: E / (e etp) experts beside dense / t
        experts = experts * per_rank * d.tensor
    return experts / (experts + dense)


def context_scale(plan: Plan) -> float:
    """1/c when the profile holds the whole sequence (not ``ModelProfile.degrees_included``, and
    ``tokens_per_sample`` unset or the transformer's ``seq_length``), else 1 (already per context rank).

    Raises:
        InvalidProblemError: a context degree without the plan's transformer.
    """
    c, cfg = plan.degrees.context, plan.transformer
    if c == 1:
        return 1.0
    if cfg is None:
        raise InvalidProblemError(
            f"degrees.context={c} needs the plan's transformer (sequence, K/V widths) to cost the ring attention; "
            "plan from a transformer config or use context 1")
    whole = not plan.model.degrees_included and plan.model.tokens_per_sample in (None, cfg.seq_length)
    return 1.0 / c if whole else 1.0


def expert_tensor_parallel(plan: Plan) -> int:
    """The experts' tensor-parallel degree: ``plan.options["expert_tensor_parallel"]`` (the ptdp
    search's), else t (experts split like the dense FFN)."""
    return int(plan.options.get("expert_tensor_parallel", plan.degrees.tensor))


def expert_share_per_rank(plan: Plan) -> float:
    """What a rank holds of a profile layer's expert weights: t / (e x expert TP) of a whole-model
    profile (every expert split by t), all of a profile already per rank (``degrees_included``)."""
    if plan.model.degrees_included:
        return 1.0
    return plan.degrees.tensor / (plan.degrees.expert * expert_tensor_parallel(plan))


def element_bytes(plan: Plan) -> int:
    return 4 if plan.transformer is not None and plan.transformer.dtype == "fp32" else 2


def _is_attention(layer: LayerProfile) -> bool:
    return layer.kind == "decoder"


def _attention_core_s(layer: LayerProfile) -> float:
    """The attention core's forward time (what selective recompute repeats; 0 when unknown)."""
    option = (layer.recompute or {}).get("selective")
    return option.extra_s if option is not None else 0.0


# ------------------------------------------------------------------------------------------
# Per virtual stage: context ring, expert all-to-all, FSDP gathers
# ------------------------------------------------------------------------------------------


def stage_comm(plan: Plan, chunks: Sequence[Chunk], scale: float) -> list[StageComm]:
    """Per virtual stage, each layer's compute and context, expert and FSDP collectives per microbatch
    (module docstring; ``cost_models.sim.layercomm`` runs them on the engine); ``scale`` is
    ``context_scale(plan)``."""
    home, layers = plan.stage_ranks(), plan.model.layers
    fsdp = plan.zero_stage == 3 and not plan.model.degrees_included
    overlap = bool(plan.options.get("overlap_moe_alltoall"))
    # the hidden all-to-alls hold NCCL's CTAs while the other microbatch computes (compute.collective_sm_share)
    a2a_share = collective_sm_share(plan.cluster.device) if overlap and plan.cluster.device is not None else 0.0
    groups: dict[int, tuple[Group, Group, Group, Group]] = {}
    out = []
    for k, chunk in enumerate(chunks):
        x = home[k]  # Megatron's k % p, or the V placement
        if x not in groups:
            groups[x] = (make_group(plan, context_ranks(plan, x)), make_group(plan, expert_ranks(plan, x)),
                         make_group(plan, data_context_ranks(plan, x)), make_group(plan, expert_data_ranks(plan, x)))
        cp, ep, dense, experts = groups[x]
        fwd, bwd = [], []
        for i in range(*chunk.layers):
            layer = layers[i]
            ring = _ring_parts(plan, layer, cp, scale)
            block, transfer = ring or (0.0, 0.0)
            common = {"gather_s": _layer_gather_s(plan, i, dense, experts) if fsdp else 0.0,
                      "ring_steps": plan.degrees.context - 1 if ring else 0,
                      "alltoall_s": expert_alltoall_s(plan, i, ep), "alltoall_sm_share": a2a_share}
            cast = _fsdp_weight_cast_s(plan, i) if fsdp else 0.0
            fwd.append(LayerComm(compute_s=layer.forward_s * scale + cast, ring_block_s=block, ring_transfer_s=transfer,
                                 alltoall_cover_s=scale * layer.backward_s if overlap else None, **common))
            bwd.append(LayerComm(compute_s=layer.backward_s * scale, ring_block_s=FLASH_BACKWARD_FACTOR * block,
                                 ring_transfer_s=2 * transfer,
                                 alltoall_cover_s=scale * layer.forward_s if overlap else None, **common))
        crosses = dense.num_nodes > 1 or experts.num_nodes > 1
        share = collective_sm_share(plan.cluster.device) if fsdp and plan.cluster.device is not None else 0.0
        out.append(StageComm(forward=tuple(fwd), backward=tuple(bwd), fsdp=fsdp, sm_share=share,
                             fsdp_nic=_node(plan, dense) if fsdp and crosses else None,
                             alltoall_nic=_node(plan, ep) if ep.num_nodes > 1 else None))
    return out


def stage_extras(plan: Plan, chunks: Sequence[Chunk], scale: float) -> tuple[list[float], list[float]]:
    """(forward, backward) seconds each virtual stage adds per microbatch for context, expert and
    FSDP communication without contention (``layercomm.closed_form_extra`` of ``stage_comm``)."""
    return closed_form_extras(stage_comm(plan, chunks, scale))


def closed_form_extras(comm: Sequence[StageComm]) -> tuple[list[float], list[float]]:
    """``stage_extras`` of a ``stage_comm`` result."""
    return ([closed_form_extra(s.forward, s.fsdp, sm_share=s.sm_share) for s in comm],
            [closed_form_extra(s.backward, s.fsdp, backward=True, sm_share=s.sm_share) for s in comm])


def _node(plan: Plan, group: Group) -> int:
    return plan.cluster.node_of(group.ranks[0])


def _ring_parts(plan: Plan, layer: LayerProfile, group: Group, scale: float) -> tuple[float, float] | None:
    """(block compute, block transfer) of one attention layer's forward K/V ring per microbatch, or
    None without a ring: c - 1 steps, each sending a K and a V block of s/c tokens while the
    attention of the block held runs (core / c^2 per block of a whole-sequence profile); the
    backward takes ``FLASH_BACKWARD_FACTOR`` times the block and twice the bytes (the gradients
    return too)."""
    c, cfg = plan.degrees.context, plan.transformer
    if c == 1 or cfg is None or not _is_attention(layer) or plan.model.degrees_included:
        return None
    core = _attention_core_s(layer)
    block_s = core / c**2 if scale < 1 else core  # whole-sequence core split over c x c blocks
    k_width, v_width = moe.attention_kv_widths(cfg)
    split = plan.degrees.tensor if cfg.is_mla else min(plan.degrees.tensor, cfg.kv_heads)
    step_bytes = plan.microbatch_size * (cfg.seq_length // c) * (k_width + v_width) / split * element_bytes(plan)
    return block_s, group.p2p_s(step_bytes)


def expert_alltoall_s(plan: Plan, layer_index: int, group: Group) -> float:
    """One dispatch (or combine) all-to-all of MoE layer ``layer_index`` per microbatch: the rank's
    b s / c tokens (/ t under sequence parallelism) x k copies x h, spread over the e expert ranks.
    Both run in the forward and again in the backward (GShard Sec. 3); with
    ``options["overlap_moe_alltoall"]`` (Megatron's --overlap-moe-expert-parallel-comm, DualPipe) one
    microbatch's all-to-alls run under another's compute of the layer (``LayerComm.alltoall_cover_s``)."""
    cfg, d = plan.transformer, plan.degrees
    if d.expert == 1 or cfg is None or plan.model.degrees_included or expert_fraction(plan, layer_index) == 0.0:
        return 0.0
    split = d.context * (d.tensor if plan.sequence_parallel else 1)
    tokens = plan.microbatch_size * cfg.seq_length / split
    count = cfg.mtp_layers if plan.model.layers[layer_index].kind == "head" else 1  # MTP modules' MoE blocks
    return count * group.alltoall_s(tokens * int(cfg.experts_per_token or 1) * cfg.hidden_size * element_bytes(plan))


def _fsdp_weight_cast_s(plan: Plan, i: int) -> float:
    """FSDP under FP8: profile layer i's gathered weights cast for every microbatch (nothing cached
    across microbatches, ``fp8.weight_cast_s``); 0 for other layers, BF16 and non-per-operation profiles."""
    layer, device = plan.model.layers[i], plan.cluster.device
    if layer.kind != "decoder" or device is None or plan.model.source != "analytic" or not fp8.is_fp8(device):
        return 0.0
    share = expert_fraction(plan, i)
    return fp8.weight_cast_s(layer.param_bytes * (1 - share + share * expert_share_per_rank(plan)) / element_bytes(plan),
                             device)


def _layer_gather_s(plan: Plan, i: int, dense: Group, experts: Group) -> float:
    """FSDP's all-gather of profile layer i's weights: dense part over the data-context group, the
    rank's experts over the expert-data group."""
    share, param = expert_fraction(plan, i), plan.model.layers[i].param_bytes
    return dense.allgather_s(param * (1 - share)) + experts.allgather_s(param * share * expert_share_per_rank(plan))


# ------------------------------------------------------------------------------------------
# Per rank: resident model states, gradient synchronisation, optimizer share
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RankTerms:
    static_bytes: float
    """Weights, gradients and optimizer states resident on the rank (plus FSDP's gathered layers)."""
    sync_s: float
    """Exposed gradient synchronisation (and ZeRO-1/2's weight all-gather) after the last backward."""
    optimizer_static_bytes: float
    """The model-state bytes whose optimizer step the rank runs (its shard under ZeRO >= 1)."""
    reduce_s: float = 0.0
    """The whole gradient reduction (all-reduce, or reduce-scatter under ZeRO >= 1), nothing hidden."""
    gather_s: float = 0.0
    """ZeRO-1/2's weight all-gather after the step, as exposed (``overlap_param_gather``)."""
    overlap_reduce: bool = False
    """The reduction runs bucket by bucket under the backward (``overlap_grad_reduce``, ZeRO-3)."""
    nic: int | None = None
    """The rank's node when its groups span nodes (``sim.sync``), else None."""
    decoder_param_bytes: float = 0.0
    """Weights of the rank's decoder layers (its experts only), what FP8 casts per step (``fp8.step_weight_terms``)."""
    decoder_layers: int = 0
    """How many of the rank's layers are decoder layers (the casts' launches)."""


def rank_terms(plan: Plan, stage_index: int, indices: Sequence[int], *, forward_s: float,
               backward_s: float) -> RankTerms:
    """Model states and gradient synchronisation of pipeline rank ``stage_index`` holding layers
    ``indices`` (module docstring); ``forward_s`` / ``backward_s``: its compute per microbatch for
    the overlap options."""
    layers, z = plan.model.layers, plan.zero_stage
    dc, held = plan.stages[stage_index].replicas * plan.degrees.context, expert_share_per_rank(plan)
    edp = max(1, len(expert_data_ranks(plan, stage_index)))
    shares = [expert_fraction(plan, i) for i in indices]
    dense_params = math.fsum(layers[i].param_bytes * (1 - f) for i, f in zip(indices, shares))
    expert_params = math.fsum(layers[i].param_bytes * f for i, f in zip(indices, shares)) * held
    dense_static = math.fsum(layers[i].static_bytes * (1 - f) for i, f in zip(indices, shares))
    expert_static = math.fsum(layers[i].static_bytes * f for i, f in zip(indices, shares)) * held
    grad = grad_bytes_per_param(plan.options.get("optimizer"))
    static = (dense_static * zero_static_scale(z, dc, grad_bytes=grad)
              + expert_static * zero_static_scale(z, edp, grad_bytes=grad))
    if z == 3 and indices:  # the layer being computed and the prefetched one, unsharded
        static += 2 * max(layers[i].param_bytes * (1 - f + f * held) for i, f in zip(indices, shares))
    dense = make_group(plan, data_context_ranks(plan, stage_index))
    experts = make_group(plan, expert_data_ranks(plan, stage_index))
    reduce, gather, overlap = _sync_parts(plan, dense, experts, dense_params, expert_params, forward_s)
    sync = (exposed_dp_allreduce_s(reduce, backward_s) if overlap else reduce) + gather
    optimizer = dense_static / (dc if z else 1) + expert_static / (edp if z else 1)
    crosses = dense.num_nodes > 1 or (experts.num_nodes > 1 and expert_params > 0)
    decoder = [(i, f) for i, f in zip(indices, shares) if layers[i].kind == "decoder"]
    return RankTerms(static_bytes=static, sync_s=sync, optimizer_static_bytes=optimizer, reduce_s=reduce,
                     gather_s=gather, overlap_reduce=overlap,
                     nic=plan.cluster.node_of(dense.ranks[0]) if crosses and reduce > 0 else None,
                     decoder_param_bytes=math.fsum(layers[i].param_bytes * (1 - f + f * held) for i, f in decoder),
                     decoder_layers=len(decoder))


def _sync_parts(plan: Plan, dense: Group, experts: Group, dense_bytes: float, expert_bytes: float,
                forward_s: float) -> tuple[float, float, bool]:
    """(whole reduction, exposed weight all-gather, whether the reduction overlaps the backward).

    The default (``ring``) model charges the gradient all-reduce as ``collectives.ranks_allreduce_s``
    (the ptdp closed form's); ZeRO-1/2 split it into a reduce-scatter and an all-gather of half
    each (ZeRO Sec. 7.2), ZeRO-3 keeps only the reduce-scatter. DeepSpeed's BF16 optimizer
    (option ``optimizer``) all-reduces fp32 gradients and all-gathers the weights, nothing
    overlapped (``collectives.deepspeed_bf16_sync_s``)."""
    options, z = plan.options, plan.zero_stage
    if dense.model == "ring":
        total = ranks_allreduce_s(plan.cluster, dense_bytes, dense.ranks) + ranks_allreduce_s(
            plan.cluster, expert_bytes, experts.ranks)
        half = total / 2
    else:
        total = dense.allreduce_s(dense_bytes) + experts.allreduce_s(expert_bytes)
        half = dense.allgather_s(dense_bytes) + experts.allgather_s(expert_bytes)
    if options.get("optimizer") == "deepspeed-bf16":  # fp32 all-reduce, then the weights' all-gather
        return 2.0 * total, deepspeed_bf16_sync_s(total, z) - 2.0 * total, False
    if z == 0:
        return total, 0.0, bool(options.get("overlap_grad_reduce"))
    gather = half if z < 3 else 0.0  # ZeRO-3 gathers per layer (stage_extras)
    if options.get("overlap_param_gather"):
        gather = exposed_dp_allreduce_s(gather, forward_s)
    return half, gather, z == 3 or bool(options.get("overlap_grad_reduce"))
