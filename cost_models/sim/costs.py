"""Costs the schedule simulator runs on, and how they are derived from a plan.

``PipelineCosts`` holds per-virtual-stage compute times and activation sizes, the
point-to-point transfer times between consecutive virtual stages, and per-rank static memory
and data-parallel all-reduce times. ``pipeline_costs(plan)`` derives them from the plan's layer
profile and cluster:

- virtual stage k = chunk k // p of stage k % p (Megatron placement, dissertation L3594-3600),
  or the V placement of ``Plan.chunk_of_virtual_stage`` for the V schedules (``stage_rank``);
  F_k, B_k, W_k are sums over the chunk's layers, W_k only when every layer of the model has
  ``backward_weight_s``; R_k and the activation bytes come from each layer's planned recompute
  strategy;
- transfer k -> k+1 (and the gradient back): latency + output bytes of k's last layer /
  bandwidth of the link between the two stages' first ranks; zero on the same rank;
- gradient all-reduce of rank x with d replicas (``collectives.ranks_allreduce_s``, the ptdp
  closed form's too): NCCL's ring or tree, whichever is faster, inside a node; hierarchical across
  nodes (reduce-scatter in the node, all-reduce of 1/g on each of the g rails, all-gather), at the
  device's bus-bandwidth fraction; zero without gradient bytes. ``allreduce_s`` is its tail
  without contention; ``sync`` the same collectives as engine operations (``sim.sync``);
- PipeDream-2BW keeps two weight versions (dissertation L2794-2807): its static bytes add one
  more copy of the rank's weights, taken as the layers' ``param_bytes``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from cost_models.collectives import exposed_dp_allreduce_s, ranks_allreduce_s
from cost_models.compute import profile_optimizer_step_s
from cost_models.fp8 import step_weight_terms
from cost_models.memory import grad_bytes_per_param, usable_memory_bytes, zero_static_scale
from cost_models.sim import dims
from cost_models.sim.layercomm import CommSpec, StageComm
from cost_models.sim.pipeline import Durations
from cost_models.sim.sync import RankSync, SyncSpec
from planner.errors import InvalidProblemError
from planner.schema import V_SCHEDULES, Action, Chunk, Cluster, LayerProfile, Plan

__all__ = ["PipelineCosts", "allreduce_link", "bottleneck_s", "durations", "pipeline_costs"]



@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineCosts:
    """Per-microbatch costs of a pipeline, indexed by virtual stage k (on rank k % num_ranks)."""

    forward_s: Sequence[float]
    backward_s: Sequence[float]
    """Whole backward (input and weight gradients), without recompute."""
    backward_weight_s: Sequence[float] | None
    """Weight-gradient part of ``backward_s``; None when unknown (no I/W actions then)."""
    recompute_s: Sequence[float]
    activation_bytes: Sequence[float]
    send_forward_s: Sequence[float]
    """Length K-1: activation transfer from virtual stage k to k+1."""
    send_backward_s: Sequence[float]
    """Length K-1: gradient transfer from virtual stage k+1 back to k."""
    static_bytes: Sequence[float]
    """Per rank: weights, gradients and optimizer state resident on it."""
    allreduce_s: Sequence[float]
    """Per rank: data-parallel gradient all-reduce after its last compute."""
    sync: SyncSpec | None = None
    """Per rank, the synchronisation the engine runs as collectives on shared NICs (``sim.sync``);
    when given it replaces ``allreduce_s`` in ``simulate_costs`` (which equals its no-contention tail)."""
    comm: CommSpec | None = None
    """Per virtual stage, its layers' compute, FSDP gathers and expert all-to-alls, which flushed
    simulations run as collectives on shared NICs (``sim.layercomm``); the forward and backward times
    above include them as their no-contention closed form (``layercomm.closed_form_extra``), which
    every other use of these costs keeps."""
    memory_capacity_bytes: float = math.inf
    stage_rank: Sequence[int] | None = None
    """Rank of each virtual stage; None: k % num_ranks (Megatron). V schedules: ``Plan.stage_ranks``."""
    forward_comm_s: Sequence[float] | None = None
    """Communication inside ``forward_s`` that another microbatch's compute can hide (DualPipe F&B)."""
    backward_comm_s: Sequence[float] | None = None
    """Communication inside ``backward_s`` likewise; None: all compute."""

    def __post_init__(self) -> None:
        num_stages, num_ranks = len(self.forward_s), len(self.static_bytes)
        if num_ranks < 1 or num_stages < 1 or num_stages % num_ranks:
            raise InvalidProblemError(
                f"PipelineCosts has {num_stages} virtual stages on {num_ranks} ranks; give at least one "
                "rank and a whole number of virtual stages per rank"
            )
        per_stage = ["backward_s", "recompute_s", "activation_bytes"]
        per_stage += [name for name in ("backward_weight_s", "stage_rank", "forward_comm_s", "backward_comm_s")
                      if getattr(self, name) is not None]
        checks = [(name, num_stages) for name in per_stage]
        checks += [("send_forward_s", num_stages - 1), ("send_backward_s", num_stages - 1), ("allreduce_s", num_ranks)]
        for name, expected in checks:
            if len(getattr(self, name)) != expected:
                raise InvalidProblemError(
                    f"PipelineCosts.{name} has {len(getattr(self, name))} entries; expected {expected}"
                )

    @property
    def num_ranks(self) -> int:
        return len(self.static_bytes)

    @property
    def num_virtual_stages(self) -> int:
        return len(self.forward_s)

    def ranks(self) -> tuple[int, ...]:
        """Rank of every virtual stage (``stage_rank``, or Megatron's k % num_ranks)."""
        if self.stage_rank is not None:
            return tuple(self.stage_rank)
        p = self.num_ranks
        return tuple(k % p for k in range(self.num_virtual_stages))

    @classmethod
    def uniform(
        cls,
        *,
        num_stages: int,
        num_chunks: int = 1,
        forward_s: float,
        backward_s: float,
        backward_weight_s: float | None = None,
        recompute_s: float = 0.0,
        activation_bytes: float = 0.0,
        send_s: float = 0.0,
        static_bytes: float = 0.0,
        allreduce_s: float = 0.0,
        memory_capacity_bytes: float = math.inf,
        v_shape: bool = False,
        comm_s: float = 0.0,
    ) -> PipelineCosts:
        """Identical virtual stages: the setting of the closed-form bubble formulas.

        ``v_shape``: two chunks per rank in V placement (rank r holds stages r and 2p - 1 - r);
        ``comm_s``: hideable communication inside each forward and backward (DualPipe F&B).
        """
        k, p = num_stages * num_chunks, num_stages
        ranks = tuple(x if x < p else 2 * p - 1 - x for x in range(k)) if v_shape else None
        return cls(
            stage_rank=ranks,
            forward_comm_s=(comm_s,) * k if comm_s else None,
            backward_comm_s=(comm_s,) * k if comm_s else None,
            forward_s=(forward_s,) * k,
            backward_s=(backward_s,) * k,
            backward_weight_s=None if backward_weight_s is None else (backward_weight_s,) * k,
            recompute_s=(recompute_s,) * k,
            activation_bytes=(activation_bytes,) * k,
            send_forward_s=(send_s,) * (k - 1),
            send_backward_s=(send_s,) * (k - 1),
            static_bytes=(static_bytes,) * p,
            allreduce_s=(allreduce_s,) * p,
            memory_capacity_bytes=memory_capacity_bytes,
        )



def bottleneck_s(costs: PipelineCosts) -> float:
    """Steady-state time per microbatch of the slowest rank or link (PipeDream's objective).

    A rank's work is the sum over its virtual stages of F + B + R (dissertation L1237-1245); a
    link's is the sum of the forward and backward transfers of the stage boundaries it carries.
    """
    p, home = costs.num_ranks, costs.ranks()
    work = [0.0] * p
    for k in range(costs.num_virtual_stages):
        work[home[k]] += costs.forward_s[k] + costs.backward_s[k] + costs.recompute_s[k]
    links: dict[tuple[int, int], float] = {}
    for k in range(costs.num_virtual_stages - 1):
        a, b = home[k], home[k + 1]
        if a != b:
            key = (min(a, b), max(a, b))
            links[key] = links.get(key, 0.0) + costs.send_forward_s[k] + costs.send_backward_s[k]
    return max(work + list(links.values()))


def pipeline_costs(plan: Plan) -> PipelineCosts:
    """Per-virtual-stage and per-rank costs of a plan (see the module docstring).

    Raises:
        InvalidProblemError: the plan's cluster has no device (a scheduling-only cluster).
    """
    cluster = plan.cluster
    if cluster.device is None:
        raise InvalidProblemError(
            f"plan.cluster {cluster.name!r} has no 'device'; a pipeline plan needs the device (memory) "
            "and the link bandwidths"
        )
    p = plan.degrees.pipeline
    layers = plan.model.layers
    chunks = plan.virtual_stages()
    has_weight = all(layer.backward_weight_s is not None for layer in layers)
    fwd, bwd, wgt, rec, act = [], [], [], [], []
    new_dims = dims.applies(plan)
    scale = dims.context_scale(plan) if new_dims else 1.0  # 1/c for a whole-sequence profile
    for chunk in chunks:
        own = layers[chunk.layers[0] : chunk.layers[1]]
        options = [layer.strategies()[s] for layer, s in zip(own, chunk.layer_strategies())]
        fwd.append(scale * math.fsum(layer.forward_s for layer in own))
        bwd.append(scale * math.fsum(layer.backward_s for layer in own))
        wgt.append(scale * math.fsum(layer.backward_weight_s or 0.0 for layer in own))
        rec.append(scale * math.fsum(o.extra_s for o in options))
        act.append(scale * math.fsum(o.activation_bytes for o in options))
    extra_f = extra_b = None
    comm: list[StageComm | None] = []
    if new_dims:  # context ring, expert all-to-all, FSDP gathers (cost_models.sim.dims)
        stages = dims.stage_comm(plan, chunks, scale)
        extra_f, extra_b = dims.closed_form_extras(stages)
        comm = [s if s.has_events() else None for s in stages]
        fwd = [f + x for f, x in zip(fwd, extra_f)]
        bwd = [b + x for b, x in zip(bwd, extra_b)]
    # Tensor rank 0 of each stage's first replica (and first context rank: Megatron's tp-cp-ep-dp-pp)
    first_rank = [dims.stage_ranks(plan, x)[0] if new_dims and not plan.stages[x].ranks else _replica_rank(plan, x, 0)
                  for x in range(p)]
    home = plan.stage_ranks()
    send = []
    for k in range(len(chunks) - 1):
        a, b = first_rank[home[k]], first_rank[home[k + 1]]
        if home[k] == home[k + 1]:
            send.append(0.0)
            continue
        bandwidth, latency = cluster.link(a, b)
        send.append(latency + scale * layers[chunks[k].layers[1] - 1].output_bytes / bandwidth)
    share = _gradient_share(plan, chunks, home)
    static, allreduce, syncs = _per_rank_dims(plan, fwd, bwd, home, share) if new_dims else _per_rank(plan, share)
    sync = SyncSpec(ranks=tuple(syncs), node=tuple(cluster.node_of(r) for r in first_rank))
    return PipelineCosts(
        forward_s=tuple(fwd),
        backward_s=tuple(bwd),
        backward_weight_s=tuple(wgt) if has_weight else None,
        recompute_s=tuple(rec),
        activation_bytes=tuple(act),
        send_forward_s=tuple(send),
        send_backward_s=tuple(send),
        static_bytes=tuple(static),
        allreduce_s=tuple(allreduce),
        memory_capacity_bytes=usable_memory_bytes(cluster.device),
        stage_rank=home if plan.schedule in V_SCHEDULES else None,
        sync=sync if any(r.reduce_s > 0 for r in syncs) else None,
        comm=CommSpec(stages=tuple(comm), node=sync.node) if any(s is not None for s in comm) else None,
        **_comm_split(plan, chunks, extra_f, extra_b),
    )


def _gradient_share(plan: Plan, chunks: Sequence[Chunk], home: Sequence[int]) -> list[tuple[float, ...]]:
    """Per pipeline rank, each of its virtual stages' share of its weight bytes (virtual-stage order)."""
    params = [math.fsum(layer.param_bytes for layer in plan.model.layers[c.layers[0]:c.layers[1]]) for c in chunks]
    out = []
    for x in range(plan.degrees.pipeline):
        mine = [params[k] for k, rank in enumerate(home) if rank == x]
        total = math.fsum(mine)
        out.append(tuple(v / total if total > 0 else 1.0 / len(mine) for v in mine))
    return out


def _comm_split(plan: Plan, chunks: Sequence[Chunk], extra_f: Sequence[float] | None = None,
                extra_b: Sequence[float] | None = None) -> dict[str, tuple[float, ...] | None]:
    """Per virtual stage, the hideable communication inside F and B (``LayerProfile.*_comm_s``, plus
    the context ring, expert all-to-alls and FSDP gathers ``dims.closed_form_extras`` added); only
    DualPipeV's overlapped F&B blocks use it."""
    layers = plan.model.layers
    added = {"forward_comm_s": extra_f, "backward_comm_s": extra_b}
    if plan.schedule != "dualpipe-v" or (all(
            layer.forward_comm_s is None and layer.backward_comm_s is None for layer in layers) and not (
            any(extra_f or ()) or any(extra_b or ()))):
        return {"forward_comm_s": None, "backward_comm_s": None}
    out: dict[str, tuple[float, ...] | None] = {}
    for name in ("forward_comm_s", "backward_comm_s"):
        extra = added[name] or [0.0] * len(chunks)
        out[name] = tuple(math.fsum(getattr(layer, name) or 0.0 for layer in layers[c.layers[0]:c.layers[1]]) + x
                          for c, x in zip(chunks, extra))
    return out


def _per_rank(plan: Plan, share: Sequence[tuple[float, ...]]) -> tuple[list[float], list[float], list[RankSync]]:
    """Static bytes, closed-form synchronisation tail and engine synchronisation of each pipeline
    rank; ``share``: per rank, each of its virtual stages' share of its gradient bytes."""
    layers = plan.model.layers
    overlap = bool(plan.options.get("overlap_grad_reduce"))
    static, allreduce, syncs = [], [], []
    grad = grad_bytes_per_param(plan.options.get("optimizer"))
    for x, stage in enumerate(plan.stages):
        own = [layers[i] for chunk in stage.chunks for i in range(*chunk.layers)]
        params = math.fsum(layer.param_bytes for layer in own)
        extra = params if plan.schedule == "2bw" else 0.0  # the second weight version
        d = stage.replicas  # differs from degrees.data in PipeDream's 1F1B-RR (cost_models.sim.rr)
        zero = zero_static_scale(plan.zero_stage, d, grad_bytes=grad)  # ZeRO sharding over d
        decoder = [layer for layer in own if layer.kind == "decoder"]
        cast_s, copies = _fp8_weights(plan, math.fsum(layer.param_bytes for layer in decoder), len(decoder))
        static.append((math.fsum(layer.static_bytes for layer in own) + _mtp_embedding_copy(plan, own)) * zero
                      + extra + copies)
        optimizer = _optimizer_s(plan, own, d) + cast_s
        reduce, nic = 0.0, None
        if d > 1 and params > 0:
            ranks = [_replica_rank(plan, x, j) for j in range(d)]
            reduce = ranks_allreduce_s(plan.cluster, params, ranks)
            nic = _nic(plan.cluster, ranks)
        tail = exposed_dp_allreduce_s(reduce, math.fsum(layer.backward_s for layer in own)) if overlap else reduce
        allreduce.append(tail + optimizer)
        syncs.append(RankSync(reduce_s=reduce, optimizer_s=optimizer, stage_share=share[x], overlap=overlap, nic=nic))
    return static, allreduce, syncs


def _nic(cluster: Cluster, ranks: Sequence[int]) -> int | None:
    """The first member's node when the group spans nodes (its traffic then crosses that node's NICs)."""
    nodes = {cluster.node_of(r) for r in ranks}
    return cluster.node_of(ranks[0]) if len(nodes) > 1 else None


def _per_rank_dims(plan: Plan, forward_s: Sequence[float], backward_s: Sequence[float],
                   home: Sequence[int], share: Sequence[tuple[float, ...]]
                   ) -> tuple[list[float], list[float], list[RankSync]]:
    """``_per_rank`` for plans with ZeRO, context or expert parallelism (``cost_models.sim.dims``);
    ``home``: the rank of each virtual stage."""
    static: list[float] = []
    sync: list[float] = []
    syncs: list[RankSync] = []
    for x, stage in enumerate(plan.stages):
        indices = [i for chunk in stage.chunks for i in range(*chunk.layers)]
        mine = [k for k, rank in enumerate(home) if rank == x]
        terms = dims.rank_terms(plan, x, indices, forward_s=math.fsum(forward_s[k] for k in mine),
                                backward_s=math.fsum(backward_s[k] for k in mine))
        extra = math.fsum(plan.model.layers[i].param_bytes for i in indices) if plan.schedule == "2bw" else 0.0
        cast_s, copies = _fp8_weights(plan, terms.decoder_param_bytes, terms.decoder_layers)
        mtp = _mtp_embedding_copy(plan, [plan.model.layers[i] for i in indices])
        if mtp:
            zero = zero_static_scale(plan.zero_stage, stage.replicas * plan.degrees.context,
                                     grad_bytes=grad_bytes_per_param(plan.options.get("optimizer")))
            mtp *= zero
        static.append(terms.static_bytes + extra + copies + mtp)
        device = plan.cluster.device
        optimizer = cast_s + (0.0 if device is None else profile_optimizer_step_s(
            plan.model.source, terms.optimizer_static_bytes, device))
        sync.append(terms.sync_s + optimizer)
        syncs.append(RankSync(reduce_s=terms.reduce_s, optimizer_s=optimizer, gather_s=terms.gather_s,
                              stage_share=share[x], overlap=terms.overlap_reduce, nic=terms.nic))
    return static, sync, syncs


def _mtp_embedding_copy(plan: Plan, own: Sequence[LayerProfile]) -> float:
    """The embedding's model states again on the rank that holds the head but not the embedding, when
    the model has multi-token-prediction modules (folded into the head): they look up the next tokens'
    embeddings there, from a copy Megatron-Core keeps on the last stage."""
    cfg = plan.transformer
    kinds = {layer.kind for layer in own}
    if cfg is None or not cfg.mtp_layers or "head" not in kinds or "embedding" in kinds:
        return 0.0
    return next((layer.static_bytes for layer in plan.model.layers if layer.kind == "embedding"), 0.0)


def _fp8_weights(plan: Plan, decoder_param_bytes: float, num_layers: int) -> tuple[float, float]:
    """(per-step cast seconds, resident bytes) of the rank's FP8 weight copies (``fp8.step_weight_terms``)."""
    return step_weight_terms(plan.model.source, decoder_param_bytes, dims.element_bytes(plan), plan.cluster.device,
                             zero_stage=plan.zero_stage, num_layers=num_layers)


def _optimizer_s(plan: Plan, own: Sequence[LayerProfile], num_replicas: int) -> float:
    """Adam step of the rank's parameters after its gradient reduction (``compute.profile_optimizer_step_s``)."""
    device = plan.cluster.device
    if device is None:
        return 0.0
    return profile_optimizer_step_s(plan.model.source, math.fsum(layer.static_bytes for layer in own), device,
                                    shard=num_replicas if plan.zero_stage >= 1 else 1)


def allreduce_link(cluster: Cluster, ranks: Sequence[int]) -> tuple[float, float]:
    """Bandwidth and latency of a ring all-reduce over the given ranks (one per replica).

    Inside one node: the intra-node link. Across nodes the ring's slowest hop is the inter-node
    link, whose bandwidth is per device; the k ring members that share a node drive k links at
    once (NCCL runs one ring per NIC; Selene has one NIC per GPU, dissertation L4081-4086), so
    the ring gets min(intra, k x inter), k counted on the first rank's node.
    """
    nodes = [cluster.node_of(r) for r in ranks]
    if len(set(nodes)) == 1:
        return cluster.link(ranks[0], ranks[-1])
    intra, _ = cluster.link(ranks[0], ranks[0])
    inter, latency = cluster.link(ranks[0], next(r for r, n in zip(ranks, nodes) if n != nodes[0]))
    per_node = nodes.count(nodes[0])
    return (min(intra, per_node * inter) if intra > 0 else per_node * inter), latency


def _replica_rank(plan: Plan, stage_index: int, replica: int) -> int:
    """Global rank of tensor-parallel rank 0 of a stage's replica.

    ``Stage.ranks`` lists replicas x tensor ranks replica-major; without it Megatron's order is
    used (tensor fastest, then data, then pipeline).
    """
    t, d = plan.degrees.tensor, plan.degrees.data
    ranks = plan.stages[stage_index].ranks
    if len(ranks) > replica * t:
        return ranks[replica * t]
    return stage_index * d * t + replica * t


def durations(costs: PipelineCosts, actions: Sequence[Sequence[Action]]) -> Durations:
    """What each action kind costs per virtual stage: B = R + B, I = R + B - W, W.

    Raises:
        InvalidProblemError: the lists split a backward into I and W but the weight-gradient
            time is unknown.
    """
    num_stages = costs.num_virtual_stages
    weight = costs.backward_weight_s
    if weight is None:
        split = next((a for rank in actions for a in rank if a.kind in "IW"), None)
        if split is not None:
            raise InvalidProblemError(
                f"action {split} splits the backward into I and W but the weight-gradient time is "
                "unknown; give backward_weight_s for every layer of the profile, or use B actions"
            )
        weight = (0.0,) * num_stages
    rec, bwd = costs.recompute_s, costs.backward_s
    return Durations(
        forward_s=costs.forward_s,
        backward_s=[rec[k] + bwd[k] for k in range(num_stages)],
        input_s=[rec[k] + bwd[k] - weight[k] for k in range(num_stages)],
        weight_s=weight,
        activation_bytes=costs.activation_bytes,
        send_forward_s=costs.send_forward_s,
        send_backward_s=costs.send_backward_s,
    )
