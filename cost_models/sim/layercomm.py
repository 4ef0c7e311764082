"""FSDP's per-layer gathers and expert parallelism's all-to-alls as engine operations.

``cost_models.sim.dims`` gives, per virtual stage and per layer, what its compute and collectives
cost alone (``LayerComm``); ``closed_form_extra`` sums what the collectives add to a forward or
backward without contention (what ``pipeline_costs`` adds to the compute durations, and what the
ptdp closed forms charge). ``add_layer_comm`` instead splits each forward (F) and backward (B)
action of such a stage into its layers on the rank's compute stream, with the collectives on
communication streams of their own beside it (``("fsdp", r)``, ``("ep", r)``; the data-parallel
reduction keeps ``("comm", r)``, ``cost_models.sim.sync``):

- FSDP (ZeRO-3): layer i's weights are all-gathered before its compute; the gather of the next
  layer is issued when layer i's compute starts (one layer of prefetch, two layers resident), the
  first when the action starts (after a backward's recompute); a layer's compute under the next
  gather runs on the SMs NCCL leaves it (``StageComm.sm_share``). Without link contention the
  action lasts its compute plus ``parallelism.fsdp_exposed_comm_s`` (FSDP Sec. 3.4). FSDP's
  reduce-scatter is the ZeRO-3 reduction of ``sim.sync`` (buckets released as the last backward
  of each virtual stage produces them);
- expert parallelism: the dispatch and the combine all-to-all of an MoE layer run after the
  layer's compute and the next layer waits for them (on the critical path, GShard Sec. 3). The
  profile does not split a layer's compute at the router, so the two are placed back to back
  after it: the same time on the critical path, their position inside the layer approximate.
  With ``overlap_moe_alltoall`` (hidden under another microbatch's compute) the exposed closed
  form stays a plain delay inside the layer, holding no link;
- context parallelism's K/V ring stays its closed form inside the layer's compute
  ((c - 1) max(0, transfer - block), Ring Attention Sec. 3). Its steps are small transfers that
  the NIC interleaves packet by packet with bulk traffic; on the engine's FIFO resources each would
  wait for a whole gradient bucket instead (on the 405B NeMo recipe, c = 2 across nodes: steps of
  0.05-0.1 ms behind 9 ms buckets, 10 % on the step time for that artefact alone;
  docs/simulator.md, "Layer collectives on the engine");
- tensor-parallel collectives are inside the profile's layer times (on the critical path inside
  a layer, over NVLink, which no engine operation holds).

A collective whose group spans nodes holds its node's NICs (``("nic", node, "tx")`` and ``"rx"``)
for its whole duration, as the data-parallel buckets do, and pipeline sends between nodes then
hold them too: a gather and a gradient bucket or an activation send that want one NIC queue (FIFO,
one at a time). Collectives inside one node hold no shared resource (as the DP reduction inside a
node): their stream orders them. Layers without a collective of their own are merged into one
compute operation. Actions split into I and W (zero-bubble schedules), DualPipeV's fused F&B
blocks, BPipe, offloaded, 2BW and 1F1B-RR plans keep the closed form inside their durations.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from cost_models.parallelism import fsdp_exposed_comm_s, overlapped_exposed_s, ring_attention_exposed_s
from cost_models.sim import engine
from cost_models.sim.pipeline import PipelineGraph

__all__ = ["CommSpec", "LayerComm", "StageComm", "add_layer_comm", "closed_form_extra", "holds_nics",
           "split_action_ends"]


@dataclass(frozen=True, slots=True)
class LayerComm:
    """One layer's compute and collectives in one direction (forward or backward), per microbatch."""

    compute_s: float
    """The layer's compute (its ring blocks included)."""
    gather_s: float = 0.0
    """FSDP all-gather of its weights."""
    ring_steps: int = 0
    """Context ring: c - 1 transfers (0: no ring)."""
    ring_block_s: float = 0.0
    ring_transfer_s: float = 0.0
    alltoall_s: float = 0.0
    """One dispatch (= one combine) all-to-all."""
    alltoall_cover_s: float | None = None
    """With ``overlap_moe_alltoall``: the other microbatch's compute of the layer that hides them."""
    alltoall_sm_share: float = 0.0
    """Share of the SMs the hidden all-to-alls hold while that compute runs (it slows by that much)."""

    def ring_exposed_s(self) -> float:
        if not self.ring_steps:
            return 0.0
        return ring_attention_exposed_s(block_compute_s=self.ring_block_s, block_transfer_s=self.ring_transfer_s,
                                        context_parallel=self.ring_steps + 1)

    def alltoall_exposed_s(self) -> float:
        if self.alltoall_cover_s is None:
            return 2 * self.alltoall_s
        return overlapped_exposed_s(2 * self.alltoall_s, self.alltoall_cover_s, sm_share=self.alltoall_sm_share)


@dataclass(frozen=True, slots=True)
class StageComm:
    """A virtual stage's layers in both directions (layer order) and the NICs its groups cross."""

    forward: tuple[LayerComm, ...]
    backward: tuple[LayerComm, ...]
    """In layer order (the backward runs them in reverse)."""
    fsdp: bool = False
    sm_share: float = 0.0
    """Share of the SMs a running FSDP gather holds (``compute.collective_sm_share``): the layer's
    compute under the next layer's gather runs on the rest."""
    fsdp_nic: int | None = None
    """The node whose NICs the FSDP gathers cross (None: inside one node); likewise below."""
    alltoall_nic: int | None = None

    def has_events(self) -> bool:
        return any(x.gather_s > 0 or (x.alltoall_s > 0 and x.alltoall_cover_s is None)
                   for x in self.forward + self.backward)


@dataclass(frozen=True, slots=True)
class CommSpec:
    """Per virtual stage its ``StageComm`` (None: nothing to split) and each pipeline rank's node."""

    stages: tuple[StageComm | None, ...]
    node: tuple[int, ...]


def closed_form_extra(layers: Sequence[LayerComm], fsdp: bool, *, backward: bool = False,
                      sm_share: float = 0.0) -> float:
    """What the collectives add to one pass over ``layers`` (layer order; ``backward`` runs them in
    reverse) without link contention: the ring's and the all-to-alls' exposed parts, then FSDP's with
    one layer prefetched and ``sm_share`` of each gather's overlap with compute."""
    extra = 0.0
    for x in layers:
        extra = extra + x.ring_exposed_s() + x.alltoall_exposed_s()
    if fsdp:
        order = layers[::-1] if backward else layers
        extra = extra + fsdp_exposed_comm_s([x.gather_s for x in order], [x.compute_s for x in order],
                                            sm_share=sm_share)
    return extra


def holds_nics(spec: CommSpec | None) -> bool:
    """Whether some collective of ``spec`` crosses a node's NICs (pipeline sends must hold them too)."""
    return spec is not None and any(
        s is not None and s.has_events() and (s.fsdp_nic, s.alltoall_nic) != (None, None)
        for s in spec.stages)


def add_layer_comm(built: PipelineGraph, spec: CommSpec, recompute_s: Sequence[float]) -> list[tuple[int, int]]:
    """Split every F and B action of a stage with collectives into its layers (module docstring).

    Call after ``sync.add_sync`` (which reads each action's whole duration). Returns (action op,
    last op of its layers) pairs for ``split_action_ends``.
    """
    graph, split = built.graph, []
    active = [s if s is not None and s.has_events() else None for s in spec.stages]
    for r, ops in enumerate(built.ops):
        base = built.rank_base[r]
        for j, (code, k, _) in enumerate(ops):
            stage = active[k]
            if code > 1 or stage is None:
                continue
            op = base + j
            forward = code == 0
            graph.duration_s[op] = 0.0 if forward else recompute_s[k]
            layers = stage.forward if forward else stage.backward[::-1]
            outgoing, graph.children[op] = graph.children[op], None
            last = _layers(graph, op, layers, stage, r)
            _move_outgoing(graph, op, last, outgoing)
            split.append((op, last))
    return split


def split_action_ends(schedule: engine.Schedule, split: Sequence[tuple[int, int]]) -> None:
    """An action split into layers ends when its last layer ends (the trace reads the action's op)."""
    for op, last in split:
        schedule.end_s[op] = schedule.end_s[last]


def _nic(node: int | None) -> tuple[Hashable | None, tuple[Hashable, ...]]:
    if node is None:
        return None, ()
    return ("nic", node, "tx"), (("nic", node, "rx"),)


def _layers(graph: engine.Graph, start: int, layers: Sequence[LayerComm], stage: StageComm, r: int) -> int:
    """The layers' operations after ``start``; returns the last compute-stream operation."""
    gather_nic, a2a_nic = _nic(stage.fsdp_nic), _nic(stage.alltoall_nic)
    prev, gather = start, -1
    if stage.fsdp:
        gather = graph.add(layers[0].gather_s, deps=[start], resource=gather_nic[0], also=gather_nic[1],
                           stream=("fsdp", r))
    pending = 0.0  # compute not yet on the graph (layers without an operation of their own)
    for i, x in enumerate(layers):
        pending += x.compute_s + x.ring_exposed_s()  # the K/V ring stays closed form (module docstring)
        if stage.fsdp and i + 1 < len(layers):  # under the next layer's gather, on the SMs NCCL leaves
            pending += stage.sm_share * min(layers[i + 1].gather_s, x.compute_s / (1.0 - stage.sm_share))
        if x.alltoall_cover_s is not None:
            pending += x.alltoall_exposed_s()
        on_path = x.alltoall_s > 0 and x.alltoall_cover_s is None
        if not (stage.fsdp or on_path or i + 1 == len(layers)):
            continue
        prev, pending = graph.add(pending, deps=[prev, gather]), 0.0
        if stage.fsdp and i + 1 < len(layers):
            gather = graph.add(layers[i + 1].gather_s, resource=gather_nic[0], also=gather_nic[1],
                               stream=("fsdp", r))
            graph.add_start_dep(gather, prev)
        if on_path:
            for _ in range(2):  # dispatch, combine
                prev = graph.add(x.alltoall_s, deps=[prev], resource=a2a_nic[0], also=a2a_nic[1], stream=("ep", r))
    return prev


def _move_outgoing(graph: engine.Graph, op: int, last: int, outgoing: list[int] | None) -> None:
    """What waited for the action's end (its stream successor, receivers, sends) now waits for ``last``."""
    kids = graph.children[last]
    if kids is None:
        kids = graph.children[last] = []
    kids.extend(outgoing or ())
    if graph.chained[op]:
        graph.chained[op] = False
        kids.append(op + 1)
    graph.transfers_out[last], graph.transfers_out[op] = graph.transfers_out[op], None
