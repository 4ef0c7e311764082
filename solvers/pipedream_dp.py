"""PipeDream's partitioning DP (Narayanan's dissertation Sec. 2.4.1, seed 001 L1192-1307).

Splits a chain of layers into contiguous stages and gives each stage a replication factor so
that the slowest stage or boundary is as fast as possible, level by level over a hierarchical
topology (level k = m_k components of level k-1 on links of bandwidth B_k, L1192-1206):

    A^k(i->j, m) = min( T^k(i->j, m),
                        min_{i<=s<j} min_{1<=m'<m} max(A^k(i->s, m-m'), 2 a_s / B_k, T^k(s+1->j, m')) )
    A^0(i->j, 1) = sum_l T_l,   A^k(i->j, 1) = A^{k-1}(i->j, m_{k-1})             (L1247-1291)

with T^k from ``solvers._pipedream_artifact`` (which also holds the public artifact's accounting,
option ``cost_mode=artifact``). The first term, one stage replicated m ways, is not in the
dissertation's min but the optimizer picks pure data parallelism in its evaluation (L1736-1738),
so it is a candidate (digest ``pipedream-2bw.md`` Sec. 2.5.1).

Tie-break (the digest's Sec. 2.5.3 asks for one): among equal values the first candidate in the
order "one replicated stage, then split s ascending, then last-stage replication m' ascending"
wins, at every level and in every sub-problem; the same input always gives the same plan.

Tables are numpy arrays with inf for infeasible entries. The DP stores values only; the plan is
read back by recomputing, along the optimal path, the candidates of each entry and taking the
first that equals the entry (candidate values are recomputed with the same float operations, so
the comparison is exact). Level k < L needs A^k for every layer range (O(N^3 m_k^2)); a top level
of 2 workers only needs prefixes and suffixes, and the top level only ranges from layer 0.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from cost_models.memory import usable_memory_bytes
from planner.errors import InfeasibleError, InvalidProblemError
from planner.schema import Chunk, Degrees, PipelineProblem, Plan, Stage
from solvers import _pipedream_blocks as blocks
from solvers._pipedream_cover import min_max_cover
from solvers._pipedream_artifact import (
    COST_MODES,
    Chain,
    LevelCosts,
    MemoryLimit,
    OutOfTime,
    RangeValues,
    all_range_values,
    forward_values,
    solve_range,
    suffix_values,
)
from solvers.budget import Budget, report_phase
from solvers.common import format_bytes, reject_fixed_shape, with_prediction
from solvers.options import parse_options

log = logging.getLogger(__name__)

StageSpec = tuple[int, int, tuple[int, ...]]
"""(first layer, last layer inclusive, workers holding the stage)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    cost_mode: str = "dissertation"
    """``dissertation`` (the recurrence as written) or ``artifact`` (the public optimizer's sums)."""
    levels: str | None = None
    """Worker counts per topology level, lowest first, e.g. ``4x2``; default: the cluster's
    devices per node x nodes (divided by the tensor-parallel degree)."""
    memory: bool = True
    """Require every stage to fit usable device memory with its stashed weights and activations
    (default on: a plan that does not fit is never returned; ``memory=false`` ignores memory)."""
    activation_compression_ratio: float | None = None
    """Artifact mode only: charge activation transfers, divided by this ratio (the artifact's flag)."""


@dataclass(frozen=True, slots=True)
class Level:
    """One topology level: m_k workers (components of the level below) on links of B_k."""

    num_workers: int
    bandwidth_bytes_per_s: float
    workers_below: int


def solve(problem: PipelineProblem, *, options: Mapping[str, Any] | Options | None = None) -> Plan:
    """Plan PipeDream stages and replication factors with the partitioning DP.

    Raises:
        InvalidProblemError: an option or problem field PipeDream cannot honour.
        InfeasibleError: the levels need more workers than the cluster has, or (``memory``) no
            partition fits device memory; the message gives the smallest memory that would fit.
    """
    opts = parse_options(Options, options, solver="pipedream")
    start = time.perf_counter()
    _check_problem(problem, opts)
    levels = topology(problem, opts.levels)
    starts = blocks.block_starts(problem.model)
    chain = Chain.from_model(problem.model if starts is None else blocks.grouped_model(problem.model, starts))
    num_workers = int(np.prod([lv.num_workers for lv in levels]))
    memory = None
    if opts.memory:
        assert problem.cluster.device is not None  # PipelineProblem requires a device
        capacity = usable_memory_bytes(problem.cluster.device)
        # the whole model with every worker's inputs in flight on one device: if even that fits,
        # the constraint cannot bind and the faster unconstrained DP gives the same answer
        n = num_workers
        worst = (chain.static_prefix_bytes[-1] + (n - 1) * chain.param_prefix_bytes[-1]
                 + n * chain.activation_prefix_bytes[-1])
        if worst > capacity:
            memory = MemoryLimit(capacity_bytes=capacity, num_workers=num_workers)
    budget = Budget.of(problem)
    report_phase(f"partitioning DP over {problem.model.num_layers} layers and {num_workers} workers")
    try:
        value, stages = partition(chain, levels, mode=opts.cost_mode, memory=memory,
                                  compression_ratio=opts.activation_compression_ratio, deadline=budget.deadline)
    except OutOfTime:
        return _data_parallel_plan(problem, chain, levels, memory, opts).model_copy(
            update={"solve_time_s": time.perf_counter() - start})
    if not np.isfinite(value):
        raise InfeasibleError(_memory_message(problem, chain, levels, num_workers, budget))
    if starts is not None:
        stages = [(starts[a], starts[b + 1] - 1, workers) for a, b, workers in stages]
    plan = build_plan(problem, stages, bottleneck_s=value, options=_plan_options(opts, levels))
    if starts is not None:
        note = (f"{problem.model.num_layers} layers grouped into {len(starts) - 1} blocks of identical layers to bound "
                "the DP: stage boundaries on block edges, the optimum over those")
        plan = plan.model_copy(update={"status": "feasible", "notes": (*plan.notes, note)})
    return plan.model_copy(update={"solve_time_s": time.perf_counter() - start})


def _plan_options(opts: Options, levels: list[Level]) -> dict[str, Any]:
    out: dict[str, Any] = {"cost_mode": opts.cost_mode, "levels": "x".join(str(lv.num_workers) for lv in levels),
                           "memory": opts.memory}
    if opts.activation_compression_ratio is not None:
        out["activation_compression_ratio"] = opts.activation_compression_ratio
    return out


def _check_problem(problem: PipelineProblem, opts: Options) -> None:
    if opts.cost_mode not in COST_MODES:
        raise InvalidProblemError(
            f"option cost_mode={opts.cost_mode!r} of solver 'pipedream'; choose from {list(COST_MODES)}")
    ratio = opts.activation_compression_ratio
    if ratio is not None and (opts.cost_mode != "artifact" or ratio <= 0):
        raise InvalidProblemError(
            f"option activation_compression_ratio={ratio} needs cost_mode=artifact and a value > 0 "
            "(the dissertation's accounting always charges 2 a_s / B_k)")
    reject_fixed_shape(problem, solver="pipedream", chooses="chooses stages and replication itself",
                       alternative="solver 'even' for a fixed pipeline")
    if problem.schedule != "1f1b":
        raise InvalidProblemError(
            f"solver 'pipedream' plans PipeDream's 1F1B with weight stashing; schedule={problem.schedule!r} "
            "is not supported, use '1f1b'")


def topology(problem: PipelineProblem, levels: str | None) -> list[Level]:
    """Topology levels, lowest first; levels of one worker are dropped (A^k = A^{k-1} there).

    A level's bandwidth is the intra-node one while one of its components fits in a node.

    Raises:
        InvalidProblemError: malformed ``levels`` or a tensor-parallel degree that splits a node
            unevenly.
        InfeasibleError: the levels need more workers than the cluster has.
    """
    cluster, t = problem.cluster, problem.model.tensor_parallel
    if cluster.devices_per_node % t:
        raise InvalidProblemError(
            f"tensor_parallel={t} does not divide devices_per_node={cluster.devices_per_node}; "
            "a PipeDream worker is t devices of one node")
    per_node, available = cluster.devices_per_node // t, cluster.num_devices // t
    counts = [per_node, cluster.num_nodes] if levels is None else _parse_levels(levels)
    needed = int(np.prod(counts))
    if needed > available:
        raise InfeasibleError(
            f"levels={'x'.join(map(str, counts))} need {needed} workers of {t} device(s) but cluster "
            f"{cluster.name!r} has {available}; use levels whose product is at most {available} or a "
            f"larger cluster")
    out: list[Level] = []
    below, span = 1, 1
    for count in counts:
        span *= count
        intra = span <= per_node
        bandwidth = cluster.intra_node_bytes_per_s if intra else cluster.inter_node_bytes_per_s
        if count > 1:
            assert bandwidth is not None  # Cluster validation requires both with a device
            out.append(Level(num_workers=count, bandwidth_bytes_per_s=float(bandwidth), workers_below=below))
        below = count
    return out or [Level(num_workers=1, bandwidth_bytes_per_s=float(cluster.intra_node_bytes_per_s or 1.0),
                         workers_below=1)]


def _parse_levels(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.lower().replace(" ", "").split("x")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise InvalidProblemError(
            f"option levels={text!r} of solver 'pipedream' must be worker counts per level, lowest "
            "first, joined by 'x' (e.g. '4x2': 4 workers per node, 2 nodes)")
    return counts


# --------------------------------------------------------------------------------------
# The DP
# --------------------------------------------------------------------------------------


def partition(
    chain: Chain, levels: list[Level], *, mode: str = "dissertation", memory: MemoryLimit | None = None,
    compression_ratio: float | None = None, deadline: float | None = None,
) -> tuple[float, list[StageSpec]]:
    """A^L(0 -> N-1, m_L) and its stages (layer ranges and global worker indices).

    Returns inf and no stages when no partition is feasible (memory).

    Raises:
        OutOfTime: ``deadline`` (a ``time.perf_counter()`` value) passed before the tables were done.
    """
    costs = level_costs(chain, levels, mode=mode, memory=memory, compression_ratio=compression_ratio,
                        deadline=deadline)
    top_lower = costs[-1].lower
    if top_lower is not None and not np.isfinite(min_max_cover(top_lower, chain.num_layers, costs[-1].num_workers)):
        return np.inf, []  # no cover by finite ranges of the level below: the top level is all inf
    bound = upper_bound_s(costs[-1]) if mode != "memory" else np.inf
    value, top = solve_range(costs[-1], 0, chain.num_layers, bound_s=bound)
    if not np.isfinite(value):
        return float(value), []
    return float(value), _expand(costs, len(costs) - 1, top)


def upper_bound_s(costs: LevelCosts) -> float:
    """The best of a few feasible configurations (one replicated stage; p stages of equal
    replication split at compute quantiles), to prune the top level's table."""
    prefix, num, top = costs.chain.compute_prefix_s, costs.chain.num_layers, costs.num_workers
    best = float(costs.stage_s(0, num - 1, top, 0))
    for replicas in (r for r in range(1, top) if top % r == 0 and top // r <= num):
        p = top // replicas
        cuts: list[int] = []
        for k, quantile in enumerate(np.searchsorted(prefix, prefix[-1] * np.arange(1, p) / p) - 1):
            cuts.append(int(min(max(quantile, cuts[-1] + 1 if cuts else 0), num - p + k)))
        bounds = list(zip([0] + [c + 1 for c in cuts], cuts + [num - 1]))
        terms = [float(costs.stage_s(a, b, replicas, x * replicas)) for x, (a, b) in enumerate(bounds)]
        best = min(best, max(terms + [float(costs.cut_s(c)) for c in cuts]))
    return best


def level_costs(
    chain: Chain, levels: list[Level], *, mode: str, memory: MemoryLimit | None = None,
    compression_ratio: float | None = None, deadline: float | None = None,
) -> list[LevelCosts]:
    """Cost terms of every level, computing the lower levels' tables the level above reads."""
    out: list[LevelCosts] = []
    lower: RangeValues | None = None
    for k, level in enumerate(levels):
        costs = LevelCosts(
            chain=chain, mode=mode, num_workers=level.num_workers,
            bandwidth_bytes_per_s=level.bandwidth_bytes_per_s, workers_below=level.workers_below,
            lower=lower, compression_ratio=compression_ratio, memory=memory,
            component_workers=int(np.prod([lv.num_workers for lv in levels[:k]])), deadline=deadline,
        )
        out.append(costs)
        if k + 1 < len(levels):
            if k + 2 == len(levels) and levels[-1].num_workers == 2:
                prefix = forward_values(costs, 0, chain.num_layers, max_workers=level.num_workers)
                lower = RangeValues(prefix=prefix[-1], suffix=suffix_values(costs))
            else:
                lower = RangeValues(table=all_range_values(costs))
    return out


def _expand(costs: list[LevelCosts], k: int, stages: list[tuple[int, int, int]]) -> list[StageSpec]:
    """Flatten a level-(k+1) pipeline: each stage's y components run the level-k optimum for its
    layers; workers are numbered within the pipeline, replica-major."""
    block = int(np.prod([c.num_workers for c in costs[:k]]))  # workers in one level-k component
    out: list[StageSpec] = []
    offset = 0
    for a, b, y in stages:
        sub = [(a, b, (0,))] if k == 0 else _expand(costs, k - 1, solve_range(costs[k - 1], a, b + 1)[1])
        for sa, sb, workers in sub:
            out.append((sa, sb, tuple((offset + c) * block + w for c in range(y) for w in workers)))
        offset += y
    return out


def _data_parallel_plan(problem: PipelineProblem, chain: Chain, levels: list[Level], memory: MemoryLimit | None,
                        opts: Options) -> Plan:
    """The plan when the time limit cuts the DP short: PipeDream's first candidate, one stage
    replicated on every worker (data parallelism), status ``time_limit``."""
    num_workers = int(np.prod([lv.num_workers for lv in levels]))
    one_device_bytes = chain.static_prefix_bytes[-1] + chain.activation_prefix_bytes[-1]
    if memory is not None and one_device_bytes > memory.capacity_bytes:
        raise InfeasibleError(
            f"time_limit_s={problem.time_limit_s:g} was spent in PipeDream's partitioning DP before it found a "
            f"partition of {problem.model.name} that fits memory, and the data-parallel plan needs "
            f"{format_bytes(one_device_bytes)} per device of {format_bytes(memory.capacity_bytes)} usable: raise --time-limit")
    bandwidth = levels[-1].bandwidth_bytes_per_s
    sync_s = 2.0 * (num_workers - 1) * chain.param_prefix_bytes[-1] / bandwidth
    bottleneck_s = max(float(chain.compute_prefix_s[-1]), sync_s) / num_workers
    plan = build_plan(problem, [(0, problem.model.num_layers - 1, tuple(range(num_workers)))],
                      bottleneck_s=bottleneck_s, options=_plan_options(opts, levels))
    note = (f"time_limit_s={problem.time_limit_s:g} spent in the partitioning DP: the data-parallel plan (one stage "
            f"on all {num_workers} workers, PipeDream's first candidate) is returned, gap unknown; raise --time-limit")
    return plan.model_copy(update={"status": "time_limit", "notes": (*plan.notes, note)})


def memory_needed(chain: Chain, levels: list[Level], num_workers: int, *, deadline: float | None = None) -> float:
    """The smallest per-device memory of any partition: ``partition`` in the memory accounting,
    whose top level, above a level that prices every range, is a min-max cover
    (``solvers._pipedream_cover``, the same float without the top-level table).

    Raises:
        OutOfTime: ``deadline`` passed before the tables were done.
    """
    limit = MemoryLimit(capacity_bytes=np.inf, num_workers=num_workers)
    costs = level_costs(chain, levels, mode="memory", memory=limit, deadline=deadline)
    lower = costs[-1].lower
    if lower is None:
        return partition(chain, levels, mode="memory", memory=limit, deadline=deadline)[0]
    return min_max_cover(lower, chain.num_layers, costs[-1].num_workers)


def _memory_message(problem: PipelineProblem, chain: Chain, levels: list[Level], num_workers: int,
                    budget: Budget) -> str:
    """Why no partition fits: the smallest per-device memory any partition needs (the same DP
    with a stage's memory as its cost, within what is left of the time limit)."""
    device = problem.cluster.device
    assert device is not None
    try:
        needed = memory_needed(chain, levels, num_workers, deadline=budget.deadline)
    except OutOfTime:
        return (f"no PipeDream partition of {problem.model.name} over {num_workers} workers fits in device memory "
                f"({device.name}, {format_bytes(usable_memory_bytes(device))} usable); time_limit_s="
                f"{problem.time_limit_s:g} was spent before the memory any partition needs was sized: use a device "
                "with more memory, a smaller microbatch, or drop option memory=true")
    return (
        f"no PipeDream partition of {problem.model.name} over {num_workers} workers fits in device memory: "
        f"{device.name} has {format_bytes(usable_memory_bytes(device))} usable of {format_bytes(device.memory_bytes)} "
        f"(--memory-headroom) but the best partition needs "
        f"{format_bytes(needed)} per device (weights, a stashed weight version and an activation set per "
        f"in-flight input). To make it feasible: use a device with at least {format_bytes(needed)}, a "
        "smaller microbatch, or drop option memory=true"
    )


# --------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------


def build_plan(
    problem: PipelineProblem, stages: list[StageSpec], *, bottleneck_s: float, options: dict[str, Any]
) -> Plan:
    """The Plan of a partition: per-stage replication, 1F1B, NOAM in the options and notes.

    ``num_microbatches`` counts the inputs each input-stage replica admits per iteration: the
    problem's, else global batch / (microbatch x input-stage replicas), else 4 x NOAM (as many as
    PipeDream keeps in flight, four times over). Equal replication r is r parallel pipelines
    (``degrees.data`` = r, dissertation Sec. 3.2.3), simulated as 1F1B with a flush per iteration;
    unequal replication sets ``degrees.data`` = 1 and the simulator runs PipeDream's 1F1B-RR with
    weight stashing and no flush (``cost_models.sim.rr``). ``predicted`` comes from the
    simulator, except ``bottleneck_s``, which is the DP's objective.

    Raises:
        InvalidProblemError: the global batch is not a multiple of microbatch x input-stage replicas.
    """
    t, b = problem.model.tensor_parallel, problem.model.microbatch_size
    replicas = [len(workers) for _, _, workers in stages]
    num_workers, r0 = sum(replicas), replicas[0]
    noam = -(-num_workers // r0)  # NOAM = ceil(workers / input-stage replicas), L1313-1319
    m = _num_microbatches(problem, noam, r0)
    plan = Plan(
        solver="pipedream", options={**options, "noam": noam}, status="optimal",
        model=problem.model, cluster=problem.cluster, transformer=problem.transformer,
        degrees=Degrees(data=r0 if len(set(replicas)) == 1 else 1, tensor=t, pipeline=len(stages)),
        schedule="1f1b", microbatch_size=b, num_microbatches=m, global_batch_size=m * b * r0,
        stages=tuple(
            Stage(index=x, replicas=len(workers), ranks=tuple(w * t + d for w in workers for d in range(t)),
                  chunks=(Chunk(layers=(first, last + 1)),))
            for x, (first, last, workers) in enumerate(stages)
        ),
        notes=_notes(problem, replicas, noam, m, bottleneck_s, options),
        sequence_parallel=problem.transformer is not None and t > 1,  # the analytic memory model assumes it
    )
    report_phase(f"simulating 1F1B-RR over {num_workers} workers")
    plan, _ = with_prediction(plan)
    assert plan.predicted is not None
    return plan.model_copy(update={"predicted": plan.predicted.model_copy(update={"bottleneck_s": bottleneck_s})})


def _num_microbatches(problem: PipelineProblem, noam: int, r0: int) -> int:
    unit = problem.model.microbatch_size * r0
    if problem.num_microbatches is not None:
        if problem.global_batch_size not in (None, problem.num_microbatches * unit):
            raise InvalidProblemError(
                f"global_batch_size={problem.global_batch_size} != num_microbatches {problem.num_microbatches} x "
                f"microbatch_size {problem.model.microbatch_size} x {r0} input-stage replicas = "
                f"{problem.num_microbatches * unit}; give only one of them")
        return problem.num_microbatches
    if problem.global_batch_size is not None:
        if problem.global_batch_size % unit:
            lo = problem.global_batch_size // unit * unit
            raise InfeasibleError(
                f"global_batch_size={problem.global_batch_size} is not a multiple of microbatch_size "
                f"{problem.model.microbatch_size} x {r0} input-stage replicas = {unit}; use "
                f"{lo or unit} or {lo + unit}")
        return problem.global_batch_size // unit
    return 4 * noam


def _notes(
    problem: PipelineProblem, replicas: list[int], noam: int, m: int, bottleneck_s: float, options: dict[str, Any]
) -> tuple[str, ...]:
    num_workers = sum(replicas)
    notes = [
        f"configuration {'-'.join(map(str, replicas))}: replicas per stage, input stage first "
        f"([narayanan-thesis] Sec. 2.5); levels {options['levels']}, {options['cost_mode']} accounting",
        f"bottleneck {bottleneck_s:.6g} s per input = A^L(0 -> N, m_L), the slowest stage or boundary "
        "([narayanan-thesis] Sec. 2.4.1)",
        f"NOAM = ceil({num_workers} workers / {replicas[0]} input-stage replicas) = {noam} in-flight inputs per "
        f"input-stage replica ([narayanan-thesis] Sec. 2.4.2); num_microbatches {m} per input-stage replica",
        "schedule 1F1B with weight stashing (PipeDream); replicated stages take inputs round-robin (1F1B-RR)",
    ]
    available = problem.cluster.num_devices // problem.model.tensor_parallel
    if num_workers < available:
        notes.append(f"uses {num_workers} of the cluster's {available} workers (option levels)")
    if len(set(replicas)) > 1:
        notes.append(f"predicted: the simulator's 1F1B-RR steady state for {m * replicas[0]} inputs per iteration "
                     "(no flush, weight stashing: static memory + (in-flight - 1) weight versions)")
    else:
        notes.append(f"predicted: the simulator's 1F1B with a flush per iteration over {replicas[0]} parallel "
                     "pipelines (PipeDream-Flush; PipeDream itself does not flush, so its steady state is "
                     "faster by the fill and drain)")
    return tuple(notes)
