"""The one schedule simulator: time a plan's per-rank action lists (architecture.md, simulator).

``simulate(plan)`` derives per-virtual-stage costs from the plan (``pipeline_costs``), builds
the schedule's per-rank action lists (``cost_models.schedules``, or the plan's own for
``custom``) and runs them dependency-driven (``cost_models._sim_engine``). Solvers that try
many candidates call ``simulate_costs`` with a ``PipelineCosts`` directly.

Model (docs/simulator.md has the full statement and the closed forms it reproduces):
- virtual stage k is chunk k // p of rank k % p (Megatron placement, dissertation L3594-3600);
- F = F_k, B = R_k + B_k (recompute runs inside the backward), I = R_k + B_k - W_k, W = W_k;
- point-to-point transfers take latency + bytes / bandwidth and delay the consumer only;
- the data-parallel gradient all-reduce is a ring, 2 (d-1)/d x gradient bytes / bandwidth plus
  2 (d-1) latencies (PipeDream's 2(m-1)/m |w| traffic, dissertation L1168-1180), run by each rank
  after its last compute;
- stages replicated differently from ``degrees.data`` run PipeDream's 1F1B-RR with weight
  stashing and no flush (``cost_models._sim_rr``), reported as a steady state like 2BW;
- plans with ``bpipe`` set also run BPipe's activation evictions and loads between paired
  stages as timed link transfers (``cost_models._sim_bpipe``, seed 004);
- 2BW (no flush) reports the steady state per batch: batches run back to back in 1F1B order
  and the iteration is the time between the completions of two consecutive batches past the
  pipeline fill.
Closed forms it reproduces: fill-drain (p-1)/(m+p-1) for GPipe and 1F1B (dissertation L3512-3588),
interleaved (p-1)/(v m) of the ideal time (L3590-3652), PipeFill's per-stage bubbles (seed
pipefill, L180), 1F1B in-flight min(p-s, m) (BPipe, L66-75), ZB-H1/H2 (Qi et al. 2023, Table 2).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from cost_models import _sim_bpipe as bpipe_sim
from cost_models import _sim_engine as engine
from cost_models import _sim_report as report
from cost_models import _sim_rr as rr
from cost_models import extrapolate
from cost_models._sim_costs import PipelineCosts, allreduce_link, bottleneck_s, pipeline_costs
from cost_models.schedules import build_actions, validate_actions
from planner.errors import InvalidProblemError
from planner.schema import Action, Plan, Predicted, SimResult

__all__ = [
    "PipelineCosts",
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


def simulate(plan: Plan, *, include_events: bool = True) -> SimResult:
    """Simulate one training iteration of a plan (one data-parallel pipeline replica).

    Args:
        plan: the plan; its schedule picks the action lists (``custom`` uses ``plan.actions``).
        include_events: build the per-action timeline (``SimResult.events``).

    Plans of more than ``extrapolate.MAX_SIMULATED_ACTIONS`` actions on a built-in schedule are
    simulated at three smaller microbatch counts and extrapolated exactly along the periodic
    steady state (``cost_models.extrapolate``), so the cost does not grow with the microbatch count.

    Returns:
        Iteration time, bubble fraction, per-rank busy/idle time, peak memory, in-flight
        microbatches and bubbles with their free memory.

    Raises:
        InvalidProblemError: the plan's cluster has no device, a custom action list is malformed
            or deadlocks, or the schedule needs weight-gradient times the profile lacks.
    """
    if extrapolate.needs_extrapolation(plan):
        return extrapolate.simulate_many(plan, _simulate_exact, include_events=include_events)
    return _simulate_exact(plan, include_events=include_events)


def _simulate_exact(plan: Plan, *, include_events: bool = False) -> SimResult:
    """Every action of the plan's iteration through the engine (``simulate`` without extrapolation)."""
    if plan.bpipe is not None:
        return bpipe_sim.simulate_bpipe(plan, include_events=include_events)  # evictions and loads
    if "offload" in plan.options:
        # SPipe / Mobius / ZeRO-Offload plans: host transfers and CPU optimizer steps as resources.
        from cost_models import _sim_offload

        return _sim_offload.simulate_offload(plan, include_events=include_events).sim
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
            costs, num_microbatches=plan.num_microbatches, samples_per_iteration=samples, include_events=include_events
        )
    return simulate_costs(
        costs,
        plan_actions(plan),
        num_microbatches=plan.num_microbatches,
        samples_per_iteration=samples,
        include_events=include_events,
        validate=plan.schedule == "custom",
    )


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
    if "offload" in plan.options:
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
    return build_actions(
        plan.schedule,
        num_stages=plan.degrees.pipeline,
        num_chunks=plan.degrees.virtual,
        num_microbatches=plan.num_microbatches,
    )


def simulate_costs(
    costs: PipelineCosts,
    actions: Sequence[Sequence[Action]],
    *,
    num_microbatches: int,
    samples_per_iteration: float | None = None,
    include_events: bool = True,
    validate: bool = True,
) -> SimResult:
    """Simulate one flushed iteration of per-rank action lists on given costs.

    Args:
        costs: per-virtual-stage and per-rank costs.
        actions: one list per rank; virtual stage k must be on rank k % num_ranks.
        num_microbatches: m; every (stage, microbatch) needs F and B, or F, I and W.
        samples_per_iteration: for the throughput (default: one sample per microbatch).
        include_events: build the per-action timeline.
        validate: run ``schedules.validate_actions`` first; pass False only for lists from
            ``schedules.build_actions`` (tested there), to save its time in tight loops.

    Raises:
        InvalidProblemError: malformed lists, I/W without weight-gradient times, or a deadlock.
    """
    trace = _run(costs, actions, num_microbatches, validate=validate)
    return report.flush_result(
        trace,
        recompute_s=costs.recompute_s,
        static_bytes=costs.static_bytes,
        allreduce_s=costs.allreduce_s,
        capacity_bytes=costs.memory_capacity_bytes,
        samples_per_iteration=float(num_microbatches if samples_per_iteration is None else samples_per_iteration),
        include_events=include_events,
    )


def simulate_2bw(
    costs: PipelineCosts,
    *,
    num_microbatches: int,
    samples_per_iteration: float | None = None,
    include_events: bool = True,
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
    actions = build_actions("1f1b", num_stages=costs.num_ranks, num_microbatches=total)
    trace = _run(costs, actions, total, validate=False)
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
    )


def _run(costs: PipelineCosts, actions: Sequence[Sequence[Action]], m: int, *, validate: bool) -> engine.Trace:
    num_ranks, num_stages = costs.num_ranks, costs.num_virtual_stages
    if len(actions) != num_ranks:
        raise InvalidProblemError(f"{len(actions)} action lists for {num_ranks} pipeline ranks; give one per rank")
    if validate:
        validate_actions(actions, num_virtual_stages=num_stages, num_microbatches=m)
    else:
        # Built-in lists are checked by their own tests; a count mismatch would be our bug.
        assert sum(len(rank) for rank in actions) in (2 * num_stages * m, 3 * num_stages * m)
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
    durations = engine.Durations(
        forward_s=costs.forward_s,
        backward_s=[rec[k] + bwd[k] for k in range(num_stages)],
        input_s=[rec[k] + bwd[k] - weight[k] for k in range(num_stages)],
        weight_s=weight,
        activation_bytes=costs.activation_bytes,
        send_forward_s=costs.send_forward_s,
        send_backward_s=costs.send_backward_s,
    )
    ops = engine.compile_actions(actions, stage_rank=[k % num_ranks for k in range(num_stages)])
    return engine.run(ops, num_microbatches=m, durations=durations)


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


def resource_timelines(plan: Plan) -> dict[str, list[tuple[str, float, float]]]:
    """Rows of the timeline picture beside the ranks: label -> (kind, start, end) intervals.

    Offloaded plans: each host link (P prefetch, G gradient offload) and each node's CPU (O
    optimizer step). BPipe plans: each pair's link (EV evict, LD load). Other plans: none.
    """
    rows: dict[str, list[tuple[str, float, float]]] = {}
    if "offload" in plan.options:
        from cost_models import _sim_offload

        result = _sim_offload.simulate_offload(plan, include_events=True)
        for event in (*result.transfers, *result.cpu):
            rows.setdefault(event.resource, []).append((event.kind, event.start_s, event.end_s))
    elif plan.bpipe is not None:
        for t in bpipe_sim.run_bpipe(plan).transfers:
            label = f"link {min(t.evictor, t.acceptor)}<->{max(t.evictor, t.acceptor)}"
            rows.setdefault(label, []).append(("EV" if t.kind == "evict" else "LD", t.start_s, t.end_s))
    return dict(sorted(rows.items()))
