"""BPipe plans on the engine: compute plus activation evictions and loads (BPipe, Sec. 3-4).

A plan with ``bpipe`` set runs its 1F1B or interleaved 1F1B action lists as every plan does
(``cost_models.sim.pipeline``), and in addition each evictor of ``plan.bpipe.pairs`` runs the
transfers of ``cost_models.bpipe.schedule_transfers`` with ``target_inflight`` as its cap, as
operations of the same engine graph:

- an eviction issued with op j starts when op j starts (and the set's forward has ended, and
  the previous eviction of that evictor has finished: one evict stream); a load starts with op
  j, or when op j ends for a cooldown load, after its set's eviction and the previous load (one
  load stream). Each takes latency + set bytes / bandwidth of the link between the pair's first
  ranks (``Cluster.link``) and occupies the link resource of its direction, evictor -> acceptor
  or back: the pipeline's own activation and gradient transfers share it when the pair are
  neighbours (one transfer at a time, ``cost_models.sim.engine``);
- the backward of a loaded set waits for its load to end, so a slow link delays the pipeline;
- memory: a set is allocated on its stage when its forward starts and freed when its backward
  ends; an eviction allocates it on the acceptor at its start and frees it on the evictor at
  its end; a load allocates it on the evictor at its start and frees it on the acceptor at its
  end. At equal times frees come first.

Peak memory and ``peak_inflight_microbatches`` count the own and foreign sets a rank holds;
the free memory of a bubble is the least over the bubble. ``run_bpipe`` also returns the
transfers with their times.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from cost_models.bpipe import SUPPORTED_SCHEDULES, Transfer, schedule_transfers
from cost_models.schedules import build_actions
from cost_models.sim import engine, pipeline, report
from cost_models.sim.costs import _replica_rank, durations, pipeline_costs
from cost_models.sim.rr import is_round_robin
from planner.errors import InvalidProblemError
from planner.schema import Plan, SimResult

__all__ = ["BPipeRun", "TransferEvent", "check_bpipe_plan", "run_bpipe", "simulate_bpipe"]

Key = tuple[int, int]


@dataclass(frozen=True, slots=True)
class TransferEvent:
    """One simulated eviction (evictor -> acceptor) or load (acceptor -> evictor)."""

    kind: Literal["evict", "load"]
    evictor: int
    acceptor: int
    stage: int
    """Virtual stage of the activation set."""
    microbatch: int
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class BPipeRun:
    result: SimResult
    transfers: tuple[TransferEvent, ...]
    links: tuple[tuple[str, str, int, int, float, float], ...] = ()
    """Every link transfer, activations and gradients included (``pipeline.link_events``)."""


def check_bpipe_plan(plan: Plan) -> None:
    """Reject BPipe specs the simulator cannot run (schedule, pairs, replication).

    Raises:
        InvalidProblemError: no spec, an unsupported schedule, PipeDream replication, or pairs
            outside the pipeline, pairing a stage with itself or naming a stage twice.
    """
    spec = plan.bpipe
    if spec is None:
        raise InvalidProblemError("the plan has no 'bpipe' spec")
    if plan.schedule not in SUPPORTED_SCHEDULES or is_round_robin(plan):
        raise InvalidProblemError(
            f"bpipe needs schedule '1f1b' or 'interleaved-1f1b' with every stage replicated degrees.data "
            f"times; got schedule {plan.schedule!r}, replicas {[s.replicas for s in plan.stages]}. "
            "Remove 'bpipe' or change the schedule"
        )
    p = plan.degrees.pipeline
    seen: set[int] = set()
    for evictor, acceptor in spec.pairs:
        if evictor >= p or acceptor >= p or evictor == acceptor or {evictor, acceptor} & seen:
            raise InvalidProblemError(
                f"bpipe.pairs entry ({evictor}, {acceptor}) is invalid: each pair needs two distinct stages "
                f"below degrees.pipeline={p}, each stage in at most one pair; BPipe pairs s with p-1-s"
            )
        seen |= {evictor, acceptor}


def simulate_bpipe(plan: Plan, *, include_events: bool = True) -> SimResult:
    """``simulate`` for a plan with ``bpipe`` set (see the module docstring)."""
    return run_bpipe(plan, include_events=include_events).result


def run_bpipe(plan: Plan, *, include_events: bool = True) -> BPipeRun:
    """Simulate a BPipe plan and return the result with every transfer's times.

    Raises:
        InvalidProblemError: see ``check_bpipe_plan``; a target_inflight too small to schedule.
    """
    check_bpipe_plan(plan)
    assert plan.bpipe is not None
    costs = pipeline_costs(plan)
    p, m = plan.degrees.pipeline, plan.num_microbatches
    actions = build_actions(plan.schedule, num_stages=p, num_chunks=plan.degrees.virtual, num_microbatches=m)
    ops = pipeline.compile_actions(actions, stage_rank=[k % p for k in range(costs.num_virtual_stages)])
    built = pipeline.build(ops, num_microbatches=m, durations=durations(costs, actions), sends_as_ops=True)
    memory: list[tuple[float, int, int, float, int]] = []  # (time, 0 free / 1 alloc, rank, bytes, sets)
    added: list[tuple[int, int, int, Transfer]] = []
    for evictor, acceptor in plan.bpipe.pairs:
        bandwidth, latency = plan.cluster.link(_replica_rank(plan, evictor, 0), _replica_rank(plan, acceptor, 0))
        transfers = schedule_transfers(actions[evictor], plan.bpipe.target_inflight)
        added += _add_transfers(built, evictor, acceptor, transfers, costs.activation_bytes, bandwidth, latency)
    schedule = engine.run(built.graph)
    trace = pipeline.finish(built, schedule)
    events = []
    for op, evictor, acceptor, t in added:
        start, end = schedule.start_s[op], schedule.end_s[op]
        set_bytes = costs.activation_bytes[t.stage]
        src, dst = (evictor, acceptor) if t.kind == "evict" else (acceptor, evictor)
        memory += [(start, 1, dst, set_bytes, 1), (end, 0, src, -set_bytes, -1)]
        events.append((start, op, TransferEvent(t.kind, evictor, acceptor, t.stage, t.microbatch, start, end)))
    trace = _with_memory(trace, memory, costs.activation_bytes)
    result = report.flush_result(
        trace,
        recompute_s=costs.recompute_s,
        static_bytes=costs.static_bytes,
        allreduce_s=costs.allreduce_s,
        capacity_bytes=costs.memory_capacity_bytes,
        samples_per_iteration=float(plan.global_batch_size),
        include_events=include_events,
    )
    return BPipeRun(result=result, transfers=tuple(e for _, _, e in sorted(events, key=lambda x: x[:2])),
                    links=tuple(pipeline.link_events(built, schedule)))


def _add_transfers(
    built: pipeline.PipelineGraph,
    evictor: int,
    acceptor: int,
    transfers: tuple[Transfer, ...],
    set_bytes: Sequence[float],
    bandwidth: float,
    latency: float,
) -> list[tuple[int, int, int, Transfer]]:
    """One engine operation per eviction and load of an evictor; loaded backwards wait for them."""
    graph, m, base = built.graph, built.num_microbatches, built.rank_base[evictor]
    evicted: dict[tuple[int, int], int] = {}
    out = []
    for t in transfers:
        idx = t.stage * m + t.microbatch
        issuer = base + t.op_index
        duration = latency + set_bytes[t.stage] / bandwidth
        if t.kind == "evict":
            op = graph.add(duration, deps=[built.f_op[idx]] + ([issuer] if t.after else []),
                           resource=("link", evictor, acceptor), stream=("evict", evictor))
            evicted[(t.stage, t.microbatch)] = op
        else:
            op = graph.add(duration, deps=[evicted[(t.stage, t.microbatch)]] + ([issuer] if t.after else []),
                           resource=("link", acceptor, evictor), stream=("load", evictor))
            graph.add_dep(built.b_op[idx], op)
        if not t.after:
            graph.add_start_dep(op, issuer)
        built.transfers.append((op, "EV" if t.kind == "evict" else "LD", t.stage, t.microbatch))
        out.append((op, evictor, acceptor, t))
    return out


def _with_memory(trace: pipeline.Trace, transfer_memory: list[tuple[float, int, int, float, int]],
                 activation_bytes: Sequence[float]) -> pipeline.Trace:
    """The trace with held bytes and peaks from a time sweep over own and foreign sets."""
    memory = list(transfer_memory)
    for r, rank_ops in enumerate(trace.ops):
        for (code, k, _), start, end in zip(rank_ops, trace.starts[r], trace.ends[r]):
            if code == 0:
                memory.append((start, 1, r, activation_bytes[k], 1))
            else:
                memory.append((end, 0, r, -activation_bytes[k], -1))
    num_ranks = len(trace.ops)
    per_rank: list[list[tuple[float, int, float, int]]] = [[] for _ in range(num_ranks)]
    for time, order, r, delta_bytes, delta_sets in sorted(memory, key=lambda e: (e[0], e[1])):
        per_rank[r].append((time, order, delta_bytes, delta_sets))
    peak_bytes, peak_sets, held_after = [], [], []
    for r in range(num_ranks):
        times, held, top_bytes, top_sets = _sweep(per_rank[r])
        peak_bytes.append(top_bytes)
        peak_sets.append(top_sets)
        held_after.append(_held_after_ops(times, held, trace.starts[r], trace.ends[r]))
    return dataclasses.replace(trace, held_bytes=held_after, peak_activation_bytes=peak_bytes,
                               peak_inflight=peak_sets)


def _sweep(events: list[tuple[float, int, float, int]]) -> tuple[list[float], list[float], float, int]:
    """Cumulative held bytes after each event (time order), and the peak bytes and set count."""
    times, held = [], []
    now_bytes, now_sets, top_bytes, top_sets = 0.0, 0, 0.0, 0
    for time, _, delta_bytes, delta_sets in events:
        now_bytes += delta_bytes
        now_sets += delta_sets
        top_bytes, top_sets = max(top_bytes, now_bytes), max(top_sets, now_sets)
        times.append(time)
        held.append(now_bytes)
    return times, held, top_bytes, top_sets


def _held_after_ops(times: list[float], held: list[float], starts: list[float], ends: list[float]) -> list[float]:
    """Per op, the most bytes held from its end until the next op starts (the bubble's view)."""
    out = []
    for j, end in enumerate(ends):
        nxt = starts[j + 1] if j + 1 < len(starts) else end
        lo = bisect.bisect_right(times, end)  # state after every event at or before the op's end
        hi = max(lo, bisect.bisect_left(times, nxt))
        out.append(max([held[lo - 1] if lo else 0.0] + held[lo:hi]))
    return out
