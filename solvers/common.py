"""Pieces every pipeline solver shares: parallel degrees, rank layout, plan assembly.

Rank layout (Megatron-LM's order): tensor-parallel ranks are fastest, then data-parallel
replicas, then pipeline stages, so global rank = stage * (d * t) + replica * t + tp_rank. With
t = devices per node each stage replica fills one node.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from cost_models import simulate as sim
from cost_models.memory import usable_memory_bytes
from cost_models.transformer import attention_core_activation_bytes
from planner.errors import InfeasibleError, InvalidProblemError
from planner.schema import Chunk, Degrees, PipelineProblem, Plan, SimResult, Stage, virtual_stage_home


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """Resolved parallel degrees and batch of a problem."""

    num_stages: int
    num_chunks: int
    data_parallel: int
    tensor_parallel: int
    microbatch_size: int
    num_microbatches: int

    @property
    def global_batch_size(self) -> int:
        return self.num_microbatches * self.microbatch_size * self.data_parallel


def stage_ranks(stage: int, *, data_parallel: int, tensor_parallel: int) -> tuple[int, ...]:
    """Global ranks of one stage: all replicas x tensor-parallel ranks, replica-major."""
    base = stage * data_parallel * tensor_parallel
    return tuple(range(base, base + data_parallel * tensor_parallel))


def resolve_layout(problem: PipelineProblem, num_stages: int) -> Layout:
    """Data parallelism and microbatch count for a given pipeline depth.

    The data-parallel degree is the user's or all devices left after t x p; the microbatch
    count is the user's, or global_batch / (d b), or 4 p when neither is given.

    Raises:
        InvalidProblemError: num_microbatches and global_batch_size contradict each other, or the
            interleaved schedule gets a microbatch count it cannot take.
        InfeasibleError: fewer layers than p v, too few devices for t x p x d, or a global batch
            that d x b does not divide.
    """
    t = problem.model.tensor_parallel
    b = problem.model.microbatch_size
    devices = problem.cluster.num_devices
    v, num_layers = problem.num_chunks, problem.model.num_layers
    if num_stages * v > num_layers:
        raise InfeasibleError(
            f"{num_stages} stages x {v} chunks need at least {num_stages * v} layers but model "
            f"{problem.model.name!r} has {num_layers}; use at most {max(1, num_layers // v)} stages"
            + (" or fewer chunks" if v > 1 else "")
        )
    d_asked = problem.data_parallel or 1
    if num_stages * t * d_asked > devices:
        raise InfeasibleError(
            f"{num_stages} stages x tensor_parallel {t} x data_parallel {d_asked} need "
            f"{num_stages * t * d_asked} devices but cluster {problem.cluster.name!r} has {devices}; use at most "
            f"{max(1, devices // (t * d_asked))} stages or a larger cluster"
        )
    d = problem.data_parallel or max(1, devices // (num_stages * t))
    if problem.num_microbatches is not None:
        m = problem.num_microbatches
        if problem.global_batch_size is not None and problem.global_batch_size != m * b * d:
            raise InvalidProblemError(
                f"global_batch_size={problem.global_batch_size} != num_microbatches {m} x "
                f"microbatch_size {b} x data_parallel {d} = {m * b * d}; give only one of them"
            )
    elif problem.global_batch_size is not None:
        if problem.global_batch_size % (b * d):
            lo = problem.global_batch_size // (b * d) * (b * d)
            raise InfeasibleError(
                f"global_batch_size={problem.global_batch_size} is not divisible by microbatch_size "
                f"{b} x data_parallel {d} = {b * d}; use a multiple of {b * d} ({lo or b * d} or "
                f"{lo + b * d}) or another data-parallel degree"
            )
        m = problem.global_batch_size // (b * d)
    else:
        m = 4 * num_stages
    if problem.schedule == "interleaved-1f1b" and m % num_stages:
        lo = m // num_stages * num_stages
        raise InvalidProblemError(
            f"the interleaved schedule needs the microbatches per replica ({m}) to be a multiple of "
            f"the pipeline depth {num_stages} ([narayanan-thesis] Sec. 4.2.2); use {lo or num_stages} or "
            f"{lo + num_stages} microbatches"
        )
    return Layout(
        num_stages=num_stages,
        num_chunks=problem.num_chunks,
        data_parallel=d,
        tensor_parallel=t,
        microbatch_size=b,
        num_microbatches=m,
    )


def reject_fixed_shape(
    problem: PipelineProblem, *, solver: str, chooses: str, alternative: str, schedule: bool = False
) -> None:
    """Refuse pipeline-shape fields a solver chooses itself, instead of silently overriding them.

    The fields are num_stages, data_parallel, num_chunks > 1, bpipe and, with ``schedule``, a
    schedule other than the CLI default ``1f1b``.

    Raises:
        InvalidProblemError: "solver S <chooses>; remove <field>=<value> (or use <alternative>)".
    """
    fixed = {"num_stages": problem.num_stages, "data_parallel": problem.data_parallel,
             "num_chunks": problem.num_chunks if problem.num_chunks != 1 else None,
             "bpipe": problem.bpipe or None,
             "schedule": problem.schedule if schedule and problem.schedule != "1f1b" else None}
    for name, value in fixed.items():
        if value is not None:
            raise InvalidProblemError(f"solver {solver!r} {chooses}; remove {name}={value!r} (or use {alternative})")


def even_split(num_items: int, num_parts: int) -> list[int]:
    """Sizes of ``num_parts`` contiguous parts as equal as possible (earlier parts get the rest)."""
    base, extra = divmod(num_items, num_parts)
    return [base + (1 if i < extra else 0) for i in range(num_parts)]


def build_plan(
    problem: PipelineProblem,
    layout: Layout,
    *,
    bounds: Sequence[int],
    strategies: Sequence[str],
    solver: str,
    options: dict[str, object],
    status: str = "feasible",
    solve_time_s: float = 0.0,
    notes: Sequence[str] = (),
) -> Plan:
    """Assemble a Plan from virtual-stage boundaries and one recompute strategy per layer.

    Args:
        bounds: p v + 1 layer indices; virtual stage k holds layers [bounds[k], bounds[k+1]).
            Virtual stage k is chunk k // p of stage k % p (V schedules: ``virtual_stage_home``).
        strategies: the recompute strategy of every layer of the model.
    """
    p, v = layout.num_stages, layout.num_chunks
    assert len(bounds) == p * v + 1 and bounds[0] == 0 and bounds[-1] == problem.model.num_layers
    chunks: list[list[Chunk | None]] = [[None] * v for _ in range(p)]
    for k in range(p * v):
        first, last = bounds[k], bounds[k + 1]
        x, c = virtual_stage_home(k, p, problem.schedule)
        chunks[x][c] = Chunk(layers=(first, last), recompute=_recompute_spec(strategies, first, last))
    stages = tuple(
        Stage(
            index=x,
            replicas=layout.data_parallel,
            ranks=stage_ranks(x, data_parallel=layout.data_parallel, tensor_parallel=layout.tensor_parallel),
            chunks=tuple(c for c in chunks[x] if c is not None),
        )
        for x in range(p)
    )
    return Plan(
        solver=solver,
        options=options,
        status=status,  # type: ignore[arg-type]
        solve_time_s=solve_time_s,
        model=problem.model,
        cluster=problem.cluster,
        transformer=problem.transformer,
        degrees=Degrees(data=layout.data_parallel, tensor=layout.tensor_parallel, pipeline=p, virtual=v),
        schedule=problem.schedule,
        microbatch_size=layout.microbatch_size,
        num_microbatches=layout.num_microbatches,
        global_batch_size=layout.global_batch_size,
        stages=stages,
        # The analytic transformer memory model assumes Megatron sequence parallelism whenever t > 1
        # (cost_models.transformer.decoder_activation_bytes); the plan says so, and the exports emit it.
        sequence_parallel=problem.transformer is not None and layout.tensor_parallel > 1,
        notes=tuple(notes),
    )


def _recompute_spec(strategies: Sequence[str], first: int, last: int) -> dict[str, tuple[int, ...]]:
    spec: dict[str, list[int]] = {}
    for i in range(first, last):
        if strategies[i] != "none":
            spec.setdefault(strategies[i], []).append(i)
    return {k: tuple(v) for k, v in spec.items()}


def with_prediction(plan: Plan) -> tuple[Plan, SimResult]:
    """The plan with ``predicted`` filled in by the one simulator, and the simulation (without bubbles)."""
    result = sim.simulate(plan, include_events=False, include_bubbles=False)
    return plan.model_copy(update={"predicted": sim.predicted(plan, result)}), result


def lower_bound_is_exact(plan: Plan) -> bool:
    """Whether ``memory_lower_bound_bytes`` equals the simulated peak (1F1B, one chunk, no BPipe)."""
    return plan.schedule == "1f1b" and plan.degrees.virtual == 1 and plan.bpipe is None


def memory_lower_bound_bytes(plan: Plan) -> float:
    """A lower bound on the plan's simulated peak memory per device (its largest rank), without
    simulating: rank s holds its static bytes plus at least min(p - s, m) activation sets, the
    1F1B warm-up (BPipe, sec. 2, the in-flight count of 1F1B; GPipe, the interleaved and the
    zero-bubble schedules hold at least as many). Exact for 1F1B with one chunk per stage.
    Plans whose memory this does not bound (BPipe moves activations, custom orders, offload)
    get 0.
    """
    if plan.bpipe is not None or plan.schedule == "custom" or plan.offload is not None:
        return 0.0
    costs = sim.pipeline_costs(plan)
    p, m = plan.degrees.pipeline, plan.num_microbatches
    bound, home = 0.0, costs.ranks()
    for s in range(p):
        activation = min(costs.activation_bytes[k] for k in range(costs.num_virtual_stages) if home[k] == s)
        bound = max(bound, costs.static_bytes[s] + min(p - s, m) * activation)
    return bound


def bpipe_would_apply(problem: PipelineProblem, num_stages: int | None = None) -> bool:
    """Whether ``--bpipe`` is a fix worth naming: it is off, the schedule is one BPipe balances
    (1F1B or interleaved 1F1B) and the pipeline has at least 4 stages (below that BPipe moves
    nothing, seed 004 L100). Without a depth, the deepest pipeline the cluster allows is used."""
    from cost_models.bpipe import SUPPORTED_SCHEDULES

    p = num_stages or problem.num_stages or problem.cluster.num_devices // problem.model.tensor_parallel
    return not problem.bpipe and problem.schedule in SUPPORTED_SCHEDULES and p >= 4


def memory_shortfall_message(problem: PipelineProblem, needed_bytes: float, what: str, *,
                             num_stages: int | None = None, at_least: bool = False) -> str:
    """The standard 'does not fit' message: the memory per device it would need, and fixes.

    Args:
        num_stages: the depth that was tried, if not ``problem.num_stages``; decides whether
            BPipe is suggested (``bpipe_would_apply``).
        at_least: ``needed_bytes`` is a lower bound (``memory_lower_bound_bytes``), not a simulated peak.
    """
    device = problem.cluster.device
    assert device is not None
    usable = usable_memory_bytes(device)
    ratio = needed_bytes / usable
    bpipe = ""
    if bpipe_would_apply(problem, num_stages):
        bpipe = ("BPipe (--bpipe: stage s hands activations to stage p-1-s, so no stage holds more than "
                 "about (p+2)/2 microbatches), ")
    return (
        f"{what} does not fit in device memory: it needs {'at least ' if at_least else ''}"
        f"{format_bytes(needed_bytes)} per device but "
        f"{device.name} has {format_bytes(usable)} usable of {format_bytes(device.memory_bytes)} "
        f"(headroom {format_bytes(device.memory_bytes - usable)}, --memory-headroom) ({ratio:.2f}x). To make it feasible: "
        f"use more pipeline stages (about {math.ceil(ratio)}x as many), a larger tensor-parallel "
        f"degree, full recompute, {bpipe}or a device with at least {format_bytes(needed_bytes)}"
    )


def format_bytes(num_bytes: float) -> str:
    """Bytes in the largest binary unit that keeps the number at or above 1."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.1f} {unit}" if unit != "B" else f"{value:.0f} B"
        value /= 1024
    return f"{value:.1f} TiB"


def profile_attention(problem: PipelineProblem) -> str:
    """The attention kind the problem's profile was built with: its decoder layers' ``none`` keeps
    the core's own bytes more than ``selective`` (5as^2b/t unfused, 4asb/t flash)."""
    model, cfg = problem.model, problem.transformer
    layer = next((la for la in model.layers if la.kind == "decoder" and la.recompute), None)
    if cfg is None or layer is None or not {"none", "selective"} <= set(layer.strategies()):
        return "flash"
    options = layer.strategies()
    gap = options["none"].activation_bytes - options["selective"].activation_bytes
    scores = attention_core_activation_bytes(cfg, microbatch_size=model.microbatch_size,
                                                         tensor_parallel=model.tensor_parallel, attention="unfused")
    return "unfused" if abs(gap - scores) <= 1e-9 * scores else "flash"
