"""Data-parallel gradient synchronisation as engine operations on each rank's communication stream.

Every pipeline rank (one data-parallel replica of a stage) synchronises its gradients with the
other replicas of its stage after the iteration's backward passes. The cost of each collective is
``cost_models.collectives`` (``ranks_allreduce_s``: NCCL's ring or tree inside a node,
hierarchical across nodes, at the device's bus-bandwidth fraction); this module places them on
the engine (``cost_models.sim.engine``):

- each rank has a communication stream ``("comm", r)``: its collectives run in order, beside the
  compute stream;
- without ``overlap``, one reduction starts when the rank's last action ends (the all-reduce of
  DDP's ``no_sync`` accumulation / Megatron's ``finalize_model_grads``);
- with ``overlap`` (Megatron's ``--overlap-grad-reduce``, PyTorch DDP's buckets; ZeRO-3 / FSDP
  always), each virtual stage's gradients are reduced in ``num_buckets`` equal buckets: bucket j
  of virtual stage k starts when the last backward (or weight-gradient) action of k has produced
  it, i.e. (j + 1) / num_buckets of the way through that action's gradient computation (after its
  recompute), so all but the last bucket of the rank's last backward run under compute;
- a collective whose group spans nodes holds its node's NICs (``("nic", node, "tx")`` and
  ``"rx"``: the rails of the stage's GPUs carry a rail-aligned ring's traffic both ways) for its
  whole duration; pipeline sends between nodes then hold the sender's ``tx`` and the receiver's
  ``rx`` too, so a gradient bucket and an activation or gradient send that want one NIC queue
  (FIFO, one at a time, as every engine resource);
- after the reduction the rank's optimizer step (compute) and, under ZeRO-1/2, the all-gather of
  the updated weights (``gather_s``, its exposed part when ``overlap_param_gather`` hides it under
  the next forward: that forward is not simulated).

Without overlap a rank's reduction starts after its last send, so it never waits for one; with
overlap, buckets and the pipeline's sends of the drain share the NICs.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from cost_models.collectives import DP_NUM_BUCKETS
from cost_models.sim import engine
from cost_models.sim.pipeline import PipelineGraph

__all__ = ["RankSync", "SyncSpec", "add_sync", "hold_nics_on_sends", "needs_nic_sends"]

NUM_BUCKETS = DP_NUM_BUCKETS


@dataclass(frozen=True, slots=True)
class RankSync:
    """One pipeline rank's gradient synchronisation (durations alone, without contention)."""

    reduce_s: float
    """The whole gradient reduction (all-reduce; reduce-scatter under ZeRO >= 1)."""
    optimizer_s: float = 0.0
    gather_s: float = 0.0
    """ZeRO-1/2: all-gather of the updated weights after the step (its exposed part)."""
    stage_share: tuple[float, ...] = ()
    """Per virtual stage of the rank (in virtual-stage order): its share of the gradient bytes."""
    overlap: bool = False
    nic: Hashable | None = None
    """The node whose NICs the group's traffic crosses; None when the group is inside one node."""


@dataclass(frozen=True, slots=True)
class SyncSpec:
    """Every rank's synchronisation plus each rank's node (for the NICs pipeline sends cross)."""

    ranks: tuple[RankSync, ...]
    node: tuple[int, ...]
    num_buckets: int = NUM_BUCKETS

    def closed_form_tail_s(self) -> list[float]:
        """Per rank: reduction + optimizer + gather back to back (the time without overlap)."""
        return [s.reduce_s + s.optimizer_s + s.gather_s for s in self.ranks]


def needs_nic_sends(spec: SyncSpec) -> bool:
    """Whether some overlapped collective holds NICs, so that sends between nodes must hold them too."""
    return any(s.overlap and s.nic is not None and s.reduce_s > 0 for s in spec.ranks)


def add_sync(built: PipelineGraph, spec: SyncSpec, recompute_s: Sequence[float]) -> list[int]:
    """Add every rank's collectives to ``built.graph`` (module docstring); returns per rank the op
    id of its last synchronisation operation (-1 if none). ``recompute_s`` per virtual stage."""
    graph = built.graph
    if needs_nic_sends(spec) and built.sends_as_ops:  # (DualPipeV's fused blocks keep light transfers)
        hold_nics_on_sends(built, spec.node)
    last_ops = []
    for r, sync in enumerate(spec.ranks):
        ops = built.ops[r]
        if not ops:
            last_ops.append(-1)
            continue
        last_action = built.rank_base[r] + len(ops) - 1
        stream = ("comm", r)
        nic = () if sync.nic is None else (("nic", sync.nic, "tx"), ("nic", sync.nic, "rx"))
        first, also = (nic[0], nic[1:]) if nic else (None, ())
        op = -1
        if sync.reduce_s > 0 and sync.overlap:
            for position, k, share in _last_gradient_ops(ops, sync):
                grad_op = built.rank_base[r] + position
                compute = graph.duration_s[grad_op]
                lead = min(recompute_s[k], compute) if ops[position][0] != 3 else 0.0
                for j in range(spec.num_buckets):
                    delay = graph.add(lead + (compute - lead) * (j + 1) / spec.num_buckets)
                    graph.add_start_dep(delay, grad_op)
                    op = graph.add(sync.reduce_s * share / spec.num_buckets, deps=[delay], resource=first,
                                   also=also, stream=stream)
        elif sync.reduce_s > 0:
            op = graph.add(sync.reduce_s, deps=[last_action], resource=first, also=also, stream=stream)
        if sync.optimizer_s > 0 or sync.gather_s > 0 or op < 0:
            op = graph.add(sync.optimizer_s, deps=[last_action], stream=stream)
            if sync.gather_s > 0:
                op = graph.add(sync.gather_s, resource=first, also=also, stream=stream)
        last_ops.append(op)
    return last_ops


def _last_gradient_ops(ops: list[tuple[int, int, int]], sync: RankSync) -> list[tuple[int, int, float]]:
    """(position, virtual stage, share) of the last B or W action of each of the rank's virtual
    stages, in the order they run (the order their buckets are launched)."""
    stages = sorted({k for _, k, _ in ops})
    share = dict(zip(stages, sync.stage_share)) if len(sync.stage_share) == len(stages) else {
        k: 1.0 / len(stages) for k in stages}
    last: dict[int, int] = {}
    for position, (code, k, _) in enumerate(ops):
        if code in (1, 3):
            last[k] = position
    return sorted((position, k, share[k]) for k, position in last.items())


def hold_nics_on_sends(built: PipelineGraph, node: Sequence[int]) -> None:
    """Sends between ranks on different nodes (``node``: per pipeline rank) also hold the sender's NIC
    tx and the receiver's rx (``built`` with ``sends_as_ops``)."""
    graph = built.graph
    for op, _, _, _ in built.transfers:
        rid = graph.resource[op]
        if rid < 0:
            continue
        _, src, dst = graph.resource_names[rid]
        a, b = node[src], node[dst]
        if a != b:
            graph.ordered[rid] = False  # timed on the heap, where held resources are arbitrated
            graph.also_holds[op] = (graph.resource_id(("nic", a, "tx")), graph.resource_id(("nic", b, "rx")))
