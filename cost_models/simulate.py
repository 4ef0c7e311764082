"""The one simulator's entry point: time a plan on the one engine (architecture.md, simulator).

``simulate(plan)`` picks the model from the plan's types and runs it on the discrete-event
engine of ``cost_models.sim`` (docs/simulator.md has the full statement):

- plans with ``offload`` (SPipe, Mobius, ZeRO-Offload): GPU streams, host links and CPU
  optimizer steps (``cost_models.sim.offload``);
- plans with ``bpipe``: the schedule plus BPipe's evictions and loads on the pair links
  (``cost_models.sim.bpipe``);
- stages replicated differently from ``degrees.data``: PipeDream's 1F1B-RR with weight
  stashing and no flush, reported as a steady state like 2BW (``cost_models.sim.rr``);
- ``2bw``: the steady state per batch of batches run back to back in 1F1B order;
- every other schedule: one flushed iteration of the per-rank action lists
  (``cost_models.sim.pipeline``; ``custom`` runs ``plan.actions``).

Per-virtual-stage costs come from ``pipeline_costs`` (virtual stage k is chunk k // p of rank
k % p, Megatron's placement; the V schedules place it in a V, ``Plan.chunk_of_virtual_stage``,
and DualPipeV's overlapped F&B pairs run as one block, ``cost_models.sim.overlap``);
point-to-point transfers take latency + bytes / bandwidth on the link of their direction, one at
a time; the data-parallel synchronisation, FSDP's per-layer gathers and the expert all-to-alls
run as collectives beside the compute, on the NICs they cross (``cost_models.sim.sync``,
``cost_models.sim.layercomm``). Solvers that try
many candidates call ``simulate_costs`` with a ``PipelineCosts`` directly.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence

from cost_models import extrapolate
from cost_models.sim import bpipe as bpipe_sim
from cost_models.sim import engine as sim_engine
from cost_models.sim import pipeline as engine
from cost_models.sim import layercomm, overlap, report, rr, sync
from cost_models.sim.costs import PipelineCosts, allreduce_link, bottleneck_s, durations, pipeline_costs
from cost_models.schedules import build_actions, overlapped_blocks, validate_actions
from planner.errors import InvalidProblemError
from planner.schema import Action, Plan, Predicted, SimResult

__all__ = [
    "PipelineCosts",
    "link_timelines",
    "memory_timelines",
    "resource_timelines",
    "allreduce_link",
    "check_pipeline_ranks",
    "bottleneck_s",
    "pipeline_costs",
    "plan_actions",
    "predicted",
    "simulate",
    "simulate_2bw",
    "simulate_costs",
]

log = logging.getLogger(__name__)


def simulate(plan: Plan, *, include_events: bool = True, include_bubbles: bool = True) -> SimResult:
    """Simulate one training iteration of a plan (one data-parallel pipeline replica).

    Args:
        plan: the plan; its schedule picks the action lists (``custom`` uses ``plan.actions``).
        include_events: build the per-action timeline (``SimResult.events``).
        include_bubbles: list each rank's idle intervals (``StageResult.bubbles``); solvers that
            only rank candidates by time and memory skip them (offloaded, BPipe and 1F1B-RR
            plans always have them).

    Plans of more than ``extrapolate.MAX_SIMULATED_ACTIONS`` actions on a built-in schedule are
    simulated at three smaller microbatch counts and extrapolated exactly along the periodic
    steady state (``cost_models.extrapolate``), so the cost does not grow with the microbatch count;
    with ``include_events`` they are simulated in full up to ``extrapolate.MAX_EVENT_ACTIONS``.

    Returns:
        Iteration time, bubble fraction, per-rank busy/idle time, peak memory, in-flight
        microbatches and bubbles with their free memory.

    Raises:
        InvalidProblemError: the plan's cluster has no device, a custom action list is malformed
            or deadlocks, or the schedule needs weight-gradient times the profile lacks.
    """
    with sim_engine.gc_paused():
        if extrapolate.needs_extrapolation(plan) and (
                not include_events or extrapolate.num_actions(plan) > extrapolate.MAX_EVENT_ACTIONS):
            exact = functools.partial(_simulate_exact, include_bubbles=include_bubbles)
            return extrapolate.simulate_many(plan, exact, include_events=include_events)
        return _simulate_exact(plan, include_events=include_events, include_bubbles=include_bubbles)


def _simulate_exact(plan: Plan, *, include_events: bool = False, include_bubbles: bool = True) -> SimResult:
    """Every action of the plan's iteration through the engine (``simulate`` without extrapolation)."""
    if plan.bpipe is not None:
        return bpipe_sim.simulate_bpipe(plan, include_events=include_events)  # evictions and loads
    if plan.offload is not None:
        # SPipe / Mobius / ZeRO-Offload plans: host transfers and CPU optimizer steps as resources.
        from cost_models.sim import offload as offload_sim  # loaded on first use: few plans need it

        return offload_sim.simulate_offload(plan, include_events=include_events).sim
    costs = pipeline_costs(plan)
    samples = float(plan.global_batch_size)
    if rr.is_round_robin(plan):
        _check_round_robin(plan)
        return rr.simulate_rr(plan, costs, include_events=include_events)
    if plan.schedule == "2bw":
        if plan.degrees.virtual != 1:
            raise InvalidProblemError(
                f"schedule '2bw' runs one chunk per stage; degrees.virtual={plan.degrees.virtual}, use 1"
            )
        return simulate_2bw(
            costs, num_microbatches=plan.num_microbatches, samples_per_iteration=samples, include_events=include_events,
            include_bubbles=include_bubbles,
        )
    return simulate_costs(
        costs,
        plan_actions(plan),
        num_microbatches=plan.num_microbatches,
        samples_per_iteration=samples,
        include_events=include_events,
        include_bubbles=include_bubbles,
        validate=plan.schedule == "custom",
        overlapped=_overlapped(plan),
    )


def _overlapped(plan: Plan) -> tuple[tuple[int, ...], ...] | None:
    """DualPipeV's overlapped F&B blocks (positions in ``plan_actions``), None for other schedules."""
    if plan.schedule != "dualpipe-v":
        return None
    return overlapped_blocks(plan.schedule, num_stages=plan.degrees.pipeline, num_microbatches=plan.num_microbatches)


def _check_round_robin(plan: Plan) -> None:
    if plan.schedule != "1f1b" or plan.degrees.virtual != 1:
        raise InvalidProblemError(
            f"stages replicated differently from degrees.data={plan.degrees.data} run PipeDream's 1F1B-RR, "
            f"which has one chunk per stage and schedule '1f1b'; got schedule {plan.schedule!r} with "
            f"degrees.virtual={plan.degrees.virtual}. Give every stage replicas={plan.degrees.data} or "
            "use schedule '1f1b' with one chunk"
        )


def check_pipeline_ranks(plan: Plan) -> None:
    """Reject plans without one action list per pipeline rank (PipeDream's 1F1B-RR).

    Raises:
        InvalidProblemError: stages are replicated differently from ``degrees.data``, or the plan
            is an offloaded (SPipe-style) pipeline.
    """
    if plan.offload is not None:
        raise InvalidProblemError(
            f"the plan is a GPU/CPU offloaded pipeline (solver {plan.solver!r}): its forward and backward stages "
            "have no per-pipeline-rank action lists and no torch.distributed.pipelining or Megatron-LM "
            "equivalent; run it with runtime_bridge.offload (docs/solver-spipe.md, Runtime)"
        )
    if rr.is_round_robin(plan):
        raise InvalidProblemError(
            "the plan replicates stages differently from degrees.data (PipeDream's 1F1B-RR, replicas "
            f"{[s.replicas for s in plan.stages]}): it has no per-pipeline-rank action lists and no "
            "torch.distributed.pipelining or Megatron-LM equivalent; plan with solver 'even', "
            "'pipedream-2bw' or 'ptdp', or give every stage replicas = degrees.data"
        )


def plan_actions(plan: Plan) -> tuple[tuple[Action, ...], ...]:
    """Per-rank action lists of a plan: its own for ``custom``, else the built-in schedule's.

    Raises:
        InvalidProblemError: the plan replicates stages unequally (PipeDream's 1F1B-RR has one
            action list per worker, not per pipeline rank; ``simulate`` runs it).
    """
    check_pipeline_ranks(plan)
    if plan.schedule == "custom":
        assert plan.actions is not None  # Plan validation requires actions for 'custom'
        return tuple(tuple(Action.parse(text) for text in rank) for rank in plan.actions)
    if plan.actions is not None:
        log.warning("plan.actions is ignored: schedule %r builds its own order (use 'custom')", plan.schedule)
    return _built_in(plan.schedule, plan.degrees.pipeline, plan.degrees.virtual, plan.num_microbatches)


def simulate_costs(
    costs: PipelineCosts,
    actions: Sequence[Sequence[Action]],
    *,
    num_microbatches: int,
    samples_per_iteration: float | None = None,
    include_events: bool = True,
    include_bubbles: bool = True,
    validate: bool = True,
    overlapped: Sequence[Sequence[int]] | None = None,
) -> SimResult:
    """Simulate one flushed iteration of per-rank action lists on given costs.

    Args:
        costs: per-virtual-stage and per-rank costs.
        actions: one list per rank; virtual stage k must be on rank ``costs.ranks()[k]``.
        num_microbatches: m; every (stage, microbatch) needs F and B, or F, I and W.
        samples_per_iteration: for the throughput (default: one sample per microbatch).
        include_events: build the per-action timeline.
        validate: run ``schedules.validate_actions`` first; pass False only for lists from
            ``schedules.build_actions`` (tested there), to save its time in tight loops.
        overlapped: per rank, positions j whose actions j (F) and j + 1 (B) run as one
            overlapped F&B block (``schedules.overlapped_blocks``, ``cost_models.sim.overlap``).

    Raises:
        InvalidProblemError: malformed lists, I/W without weight-gradient times, or a deadlock.
    """
    with sim_engine.gc_paused():
        trace, tail = _run(costs, actions, num_microbatches, validate=validate, overlapped=overlapped,
                           with_sync=True)
        return report.flush_result(
            trace,
            recompute_s=costs.recompute_s,
            static_bytes=costs.static_bytes,
            allreduce_s=tail,
            capacity_bytes=costs.memory_capacity_bytes,
            samples_per_iteration=float(num_microbatches if samples_per_iteration is None else samples_per_iteration),
            include_events=include_events,
            include_bubbles=include_bubbles,
        )


def simulate_2bw(
    costs: PipelineCosts,
    *,
    num_microbatches: int,
    samples_per_iteration: float | None = None,
    include_events: bool = True,
    include_bubbles: bool = True,
) -> SimResult:
    """Steady-state time per batch of PipeDream-2BW (1F1B order, no flush between batches).

    Runs 2 w + 1 batches back to back (1F1B over (2 w + 1) m microbatches, w = ceil(p / m) batches
    to fill the pipeline) and reports the window between the completions of batches w - 1 and
    w (0-based), which lies between the fill and the drain; for identical stages that is
    m (t_f + t_b). The all-reduce overlaps the next batch (iteration = max(window, all-reduce)).
    """
    if costs.num_virtual_stages != costs.num_ranks:
        raise InvalidProblemError(
            f"2BW runs one chunk per rank; the costs have {costs.num_virtual_stages} virtual stages "
            f"on {costs.num_ranks} ranks"
        )
    m = num_microbatches
    fill = -(-costs.num_ranks // m)
    total = (2 * fill + 1) * m
    with sim_engine.gc_paused():
        actions = _built_in("1f1b", costs.num_ranks, 1, total)
        trace, _ = _run(costs, actions, total, validate=False)
        return report.steady_result(
            trace,
            num_microbatches=m,
            measured_batch=fill,
            recompute_s=costs.recompute_s,
            static_bytes=costs.static_bytes,
            allreduce_s=costs.allreduce_s,
            capacity_bytes=costs.memory_capacity_bytes,
            samples_per_iteration=float(m if samples_per_iteration is None else samples_per_iteration),
            include_events=include_events,
            include_bubbles=include_bubbles,
        )


def _run(costs: PipelineCosts, actions: Sequence[Sequence[Action]], m: int, *, validate: bool,
         overlapped: Sequence[Sequence[int]] | None = None,
         with_sync: bool = False) -> tuple[engine.Trace, Sequence[float]]:
    """The timed trace and, per rank, the synchronisation time after its last action: the
    collectives of ``costs.sync`` run on the engine (``with_sync``), else ``costs.allreduce_s``."""
    num_ranks, num_stages = costs.num_ranks, costs.num_virtual_stages
    if len(actions) != num_ranks:
        raise InvalidProblemError(f"{len(actions)} action lists for {num_ranks} pipeline ranks; give one per rank")
    if validate:
        validate_actions(actions, num_virtual_stages=num_stages, num_microbatches=m)
    else:
        # Built-in lists are checked by their own tests; a count mismatch would be our bug.
        # (DualPipeV splits some backwards into I and W and keeps others whole.)
        assert 2 * num_stages * m <= sum(len(rank) for rank in actions) <= 3 * num_stages * m
    durs = durations(costs, actions)
    ops = _compiled(actions, costs.ranks())
    spec = costs.sync if with_sync else None
    fused = bool(overlapped and any(overlapped))
    comm = costs.comm if with_sync and not fused else None  # (DualPipeV's fused blocks keep the closed form)
    if spec is None and comm is None:
        built = engine.build(ops, num_microbatches=m, durations=durs, shared=True, trusted=not validate)
    else:  # collectives extend the graph: a private copy of the structure
        nic_sends = not fused and (layercomm.holds_nics(comm) or (spec is not None and sync.needs_nic_sends(spec)))
        built = engine.build(ops, num_microbatches=m, durations=durs, trusted=not validate, sends_as_ops=nic_sends)
        if nic_sends:
            sync.hold_nics_on_sends(built, comm.node if comm is not None else spec.node)  # type: ignore[union-attr]
    if fused:
        overlap.fuse_blocks(built, overlapped, forward_comm_s=costs.forward_comm_s,
                            backward_comm_s=costs.backward_comm_s)
    last_sync = sync.add_sync(built, spec, costs.recompute_s) if spec is not None else None
    split = layercomm.add_layer_comm(built, comm, costs.recompute_s) if comm is not None else ()
    schedule = sim_engine.run(built.graph)
    layercomm.split_action_ends(schedule, split)
    trace = engine.finish(built, schedule)
    if fused:
        overlap.split_fused_trace(trace, built, overlapped)
    if last_sync is None:
        return trace, costs.allreduce_s
    return trace, _sync_tails(trace, schedule, last_sync, costs.allreduce_s)


def _sync_tails(trace: engine.Trace, schedule: sim_engine.Schedule, last_sync: Sequence[int],
                closed_form: Sequence[float]) -> list[float]:
    """Per rank, how long its synchronisation runs past its last action. A tail equal to the closed
    form's (no overlap, no contention) up to float rounding is reported as that value, so plans
    without contention keep their values to the last digit."""
    tails = []
    for op, ends, expected in zip(last_sync, trace.ends, closed_form):
        last = ends[-1] if ends else 0.0
        tail = max(0.0, schedule.end_s[op] - last) if op >= 0 else 0.0
        tails.append(expected if abs(tail - expected) <= 1e-12 * max(1.0, schedule.end_s[op]) else tail)
    return tails


_COMPILED: dict[int, tuple[object, list[list[tuple[int, int, int]]]]] = {}


def _compiled(actions: Sequence[Sequence[Action]], stage_rank: tuple[int, ...]) -> list[list[tuple[int, int, int]]]:
    """Engine ops of action lists, kept for the last few list objects (solvers reuse one schedule)."""
    hit = _COMPILED.get(id(actions))
    if hit is not None and hit[0] is actions and len(hit[1]) == len(set(stage_rank)):
        return hit[1]
    ops = engine.compile_actions(actions, stage_rank=stage_rank)
    if len(_COMPILED) >= 4:
        _COMPILED.pop(next(iter(_COMPILED)))
    _COMPILED[id(actions)] = (actions, ops)
    return ops


@functools.lru_cache(maxsize=4)
def _built_in(schedule: str, num_stages: int, num_chunks: int, num_microbatches: int) -> tuple[tuple[Action, ...], ...]:
    """A built-in schedule's action lists, built once per shape (they are immutable)."""
    return build_actions(schedule, num_stages=num_stages, num_chunks=num_chunks, num_microbatches=num_microbatches)


def predicted(plan: Plan, sim: SimResult) -> Predicted:
    """The plan's ``predicted`` block from a simulation of it."""
    return Predicted(
        iteration_time_s=sim.iteration_time_s,
        throughput_samples_per_s=plan.global_batch_size / sim.iteration_time_s if sim.iteration_time_s > 0 else 0.0,
        bubble_fraction=sim.bubble_fraction,
        bottleneck_s=_plan_bottleneck_s(plan),
        peak_memory_bytes=tuple(s.peak_memory_bytes for s in sim.stages),
    )


def _plan_bottleneck_s(plan: Plan) -> float:
    costs = pipeline_costs(plan)
    if rr.is_round_robin(plan):
        return rr.rr_bottleneck_s(costs, [stage.replicas for stage in plan.stages])
    return bottleneck_s(costs)


def link_timelines(plan: Plan) -> dict[str, list[tuple[str, int, int, float, float]]]:
    """Every point-to-point transfer of a plan per directed link: label -> (kind, stage, microbatch, start, end).

    Kinds: SF activation, SB gradient, EV / LD BPipe eviction / load, A / C offloaded activation
    / checkpoint. Flushed plans only: 2BW and PipeDream's 1F1B-RR report a steady-state window
    whose transfers are not kept (empty).
    """
    if plan.offload is not None:
        from cost_models.sim import offload as offload_sim

        events = offload_sim.simulate_offload(plan, include_events=True).links
    elif plan.bpipe is not None:
        events = bpipe_sim.run_bpipe(plan, include_events=False).links
    elif rr.is_round_robin(plan) or plan.schedule == "2bw":
        return {}
    else:
        costs = pipeline_costs(plan)
        actions = plan_actions(plan)
        if plan.schedule == "custom":
            validate_actions(actions, num_virtual_stages=costs.num_virtual_stages, num_microbatches=plan.num_microbatches)
        ops = engine.compile_actions(actions, stage_rank=costs.ranks())
        built = engine.build(ops, num_microbatches=plan.num_microbatches, durations=durations(costs, actions))
        blocks = _overlapped(plan)
        if blocks:
            overlap.fuse_blocks(built, blocks, forward_comm_s=costs.forward_comm_s,
                                backward_comm_s=costs.backward_comm_s)
        events = engine.link_events(built, sim_engine.run(built.graph))
    rows: dict[str, list[tuple[str, int, int, float, float]]] = {}
    for label, kind, stage, microbatch, start, end in events:
        rows.setdefault(label, []).append((kind, stage, microbatch, start, end))
    return dict(sorted(rows.items()))


def memory_timelines(plan: Plan, sim: SimResult) -> dict[int, list[tuple[float, float]]]:
    """Per pipeline rank, the memory in use over time as (time, bytes) steps from ``sim.events``.

    Static bytes plus the activations held: (k, i) from the start of F(k, i) to the end of its
    B (or W when the backward is split), as the simulator counts them. Flushed plans without
    BPipe or offload only (their sets move between ranks or live on the host): empty otherwise.
    """
    if plan.offload is not None or plan.bpipe is not None or rr.is_round_robin(plan) or plan.schedule == "2bw":
        return {}
    costs = pipeline_costs(plan)
    split = {(e.stage, e.microbatch) for e in sim.events if e.kind == "W"}  # DualPipeV splits only some
    deltas: dict[int, list[tuple[float, float]]] = {r: [] for r in range(costs.num_ranks)}
    for e in sim.events:
        if e.kind == "F":
            deltas[e.rank].append((e.start_s, costs.activation_bytes[e.stage]))
        elif e.kind == ("W" if (e.stage, e.microbatch) in split else "B"):
            deltas[e.rank].append((e.end_s, -costs.activation_bytes[e.stage]))
    out: dict[int, list[tuple[float, float]]] = {}
    for r, changes in deltas.items():
        held, steps = costs.static_bytes[r], [(0.0, costs.static_bytes[r])]
        for time, delta in sorted(changes, key=lambda c: (c[0], c[1])):  # frees first at equal times
            held += delta
            if steps[-1][0] == time:
                steps[-1] = (time, held)
            else:
                steps.append((time, held))
        out[r] = steps
    return out


def resource_timelines(plan: Plan) -> dict[str, list[tuple[str, float, float]]]:
    """Rows of the timeline picture beside the ranks: label -> (kind, start, end) intervals.

    Offloaded plans: each host link (P prefetch, G gradient offload) and each node's CPU (O
    optimizer step). BPipe plans: each pair's link (EV evict, LD load). Other plans: none.
    """
    rows: dict[str, list[tuple[str, float, float]]] = {}
    if plan.offload is not None:
        from cost_models.sim import offload as offload_sim

        result = offload_sim.simulate_offload(plan, include_events=True)
        for event in (*result.transfers, *result.cpu):
            rows.setdefault(event.resource, []).append((event.kind, event.start_s, event.end_s))
    elif plan.bpipe is not None:
        for t in bpipe_sim.run_bpipe(plan).transfers:
            label = f"link {min(t.evictor, t.acceptor)}<->{max(t.evictor, t.acceptor)}"
            rows.setdefault(label, []).append(("EV" if t.kind == "evict" else "LD", t.start_s, t.end_s))
    return dict(sorted(rows.items()))
