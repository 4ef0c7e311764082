"""The fill simulator: a main-job plan, its bubbles, fill jobs, Executor plans and the schedule
(seed 000 Sec. 5 simulator, L199; reading Sec. 4.2 and 4.5).

Like the paper's simulator it is event-driven on fill-job arrivals and completions only, and it
simulates one data-parallel replica of the main job: p stages x t tensor-parallel GPUs, each GPU
an Executor with its stage's bubble cycle (the t GPUs of a stage have the same bubbles). Metrics:
- main-job FLOP/s per GPU: the plan's model FLOPs (recomputation not counted) per iteration
  over p t GPUs and the simulated iteration time;
- fill FLOP/s per GPU: useful FLOPs of the fill work done inside [0, horizon) (a job running at
  the horizon counts pro rata), averaged over all GPUs ("recovered TFLOPS", L219);
- ``recovered_utilization`` = fill / main FLOP/s (the paper's utilization increase, L27);
- ``main_job_slowdown``: measured on the engine (``cost_models.sim.fill``): one iteration of
  the main job in which every GPU runs, in each bubble of its cycle, a switch of
  ``context_switch_s`` (freeing the cache and signalling the Executor, L117) and then the
  longest piece any of its jobs places in that bubble, on the GPU's compute stream; the main
  job's next action waits for it. The iteration's increase is weighted by the share of the
  horizon the GPUs spend on fill work. A piece plus its switch that fits its bubble costs
  nothing; one that overruns delays the main job along the pipeline's dependencies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from cost_models import extrapolate, transformer
from cost_models.schedules import overlapped_blocks
from cost_models.sim import rr
from cost_models.sim.fill import FilledIteration, simulate_filled
from cost_models.simulate import pipeline_costs, plan_actions, simulate
from planner.errors import InfeasibleError, InvalidProblemError
from planner.schema import Plan, SimResult
from planner.schema_fill import ExecutorPlan, FillAssignment, FillJob, FillPlan, StageBubbles
from solvers.fill.bubbles import BubbleOptions, stage_bubbles
from solvers.fill.executor import plan_executor
from solvers.fill.jobs import job_chains
from solvers.fill.scheduler import schedule

DEFAULT_CONTEXT_SWITCH_S = 1e-3
"""Main-job time lost per filled bubble: torch.cuda.empty_cache() plus waking the Executor (L117).
The paper gives no number; it measures < 2% overhead in total at 68% fill (L231)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FillOptions:
    policy: str = "sjf"
    bubbles: BubbleOptions = field(default_factory=BubbleOptions)
    efficiency: float = transformer.DEFAULT_EFFICIENCY
    """Achieved fraction of peak of fill-job kernels (the cost model's default)."""
    context_switch_s: float = DEFAULT_CONTEXT_SWITCH_S
    horizon_s: float | None = None
    """Stop starting jobs at this time (None: run every job to completion)."""


def main_flops_per_device_s(plan: Plan, sim: SimResult) -> float:
    """Model FLOPs of one iteration per GPU of a replica, per second of the iteration."""
    layer_flops = [layer.flops for layer in plan.model.layers]
    if any(f is None for f in layer_flops):
        busy = math.fsum(s.busy_s for s in sim.stages)  # measured profile: count busy time at half of peak
        return busy * plan.cluster.device.peak_flops * 0.5 / (sim.iteration_time_s * len(sim.stages))  # type: ignore[union-attr]
    per_mb = math.fsum(f for f in layer_flops if f is not None)
    return per_mb * plan.num_microbatches / (plan.degrees.pipeline * sim.iteration_time_s)


def executor_table(
    jobs: Sequence[FillJob], stages: Sequence[StageBubbles], plan: Plan, iteration_s: float, efficiency: float
) -> tuple[list[list[ExecutorPlan | None]], list[str]]:
    """Executor plan of every job on every stage (None where it fits no bubble), and the reasons."""
    device = plan.cluster.device
    assert device is not None  # Plan validation requires a pipeline cluster with a device
    table: list[list[ExecutorPlan | None]] = []
    reasons: list[str] = []
    cache: dict[tuple, list[ExecutorPlan | None]] = {}
    for job in jobs:
        key = (job.model_copy(update={"id": "", "num_samples": 1.0, "arrival_time_s": 0.0}).model_dump_json(),)
        if key not in cache:
            chains = job_chains(job, device, efficiency)
            row: list[ExecutorPlan | None] = []
            why = ""
            for sb in stages:
                try:
                    row.append(plan_executor(job.id, sb.stage, chains, sb.bubbles, iteration_s))
                except InfeasibleError as e:
                    row.append(None)
                    why = str(e)
            cache[key] = row
            reasons.append(why)
        else:
            reasons.append("")
        table.append([p.model_copy(update={"job_id": job.id}) if p else None for p in cache[key]])
    return table, reasons


def proc_time_s(job: FillJob, ep: ExecutorPlan | None, iteration_s: float) -> float:
    """ceil(N / (k b)) x n x T_iter (reading Sec. 2.3); inf when the job cannot run there."""
    if ep is None:
        return math.inf
    periods = math.ceil(job.num_samples / (ep.num_iterations * ep.batch_size) - 1e-9)
    return periods * ep.num_cycles * iteration_s


def fill_plan(plan: Plan, jobs: Sequence[FillJob], options: FillOptions = FillOptions()) -> FillPlan:
    """Fill a main-job plan's bubbles with ``jobs``.

    Raises:
        InvalidProblemError: no jobs, bad options, or a plan without bubbles.
        InfeasibleError: a fill job fits no bubble of any stage (larger than any free memory or
            with a node longer than every usable bubble); the message says which node.
    """
    if not jobs:
        raise InvalidProblemError("no fill jobs given; pass --fill-jobs with a preset or a JSON list")
    if not 0 < options.efficiency <= 1:
        raise InvalidProblemError(f"efficiency={options.efficiency} must be in (0, 1]")
    if options.context_switch_s < 0:
        raise InvalidProblemError(f"context_switch_s={options.context_switch_s} must be >= 0 (default 1e-3)")
    _check_flushed(plan)
    sim = simulate(plan, include_events=False)
    stages = stage_bubbles(sim, options.bubbles)
    iteration = sim.iteration_time_s
    table, reasons = executor_table(jobs, stages, plan, iteration, options.efficiency)
    for job, row, why in zip(jobs, table, reasons):
        if all(p is None for p in row):
            raise InfeasibleError(f"fill job {job.id!r} fits no bubble of any stage: {why}")
    t = plan.degrees.tensor
    device_stage = [s for s in range(len(stages)) for _ in range(t)]
    proc = [[proc_time_s(job, row[s], iteration) for s in device_stage] for job, row in zip(jobs, table)]
    done = schedule(proc, [j.arrival_time_s for j in jobs], policy=options.policy,
                    horizon_s=options.horizon_s or math.inf, job_names=[j.id for j in jobs])
    filled = _filled_iteration(plan, stages, table, done, options.context_switch_s)
    return _result(plan, sim, stages, jobs, table, done, device_stage, options, filled)


def _check_flushed(plan: Plan) -> None:
    """PipeFill fills the bubbles of a flushed pipeline (GPipe, 1F1B, ...: [pipefill] Sec. 2).

    Raises:
        InvalidProblemError: a plan without per-rank flushed iterations.
    """
    kind = ("BPipe" if plan.bpipe is not None else "offloaded" if plan.offload is not None
            else "1F1B-RR" if rr.is_round_robin(plan) else "2BW" if plan.schedule == "2bw" else None)
    if kind is not None:
        raise InvalidProblemError(
            f"the main job is a {kind} plan (solver {plan.solver!r}, schedule {plan.schedule!r}); PipeFill fills the "
            "bubbles of a flushed pipeline schedule (gpipe, 1f1b, flush, interleaved-1f1b, zb-h1, zb-h2, zb-v, dualpipe-v, "
            "custom): plan the main "
            "job with one of those"
        )


def _filled_iteration(plan: Plan, stages: Sequence[StageBubbles], table: list[list[ExecutorPlan | None]],
                      done: list, switch_s: float) -> FilledIteration:
    """The main job's iteration with each GPU's longest piece per bubble on its compute stream.

    Raises:
        InvalidProblemError: a plan too large to simulate action by action.
    """
    if extrapolate.num_actions(plan) > extrapolate.MAX_EVENT_ACTIONS:
        raise InvalidProblemError(
            f"the main job has {extrapolate.num_actions(plan):,} actions; the filled iteration is simulated action "
            f"by action, at most {extrapolate.MAX_EVENT_ACTIONS:,}: plan with fewer microbatches")
    t = plan.degrees.tensor
    longest: list[dict[int, float]] = [{} for _ in range(len(stages) * t)]
    for d in done:
        ep = table[d.job][d.device // t]
        assert ep is not None  # the scheduler only starts jobs with a finite time
        mine = longest[d.device]
        for piece in ep.pieces:
            mine[piece.bubble] = max(mine.get(piece.bubble, 0.0), piece.duration_s)
    pieces = [[[(stages[s].bubbles[b].start_s, dur) for b, dur in longest[s * t + g].items()] for g in range(t)]
              for s in range(len(stages))]
    blocks = (overlapped_blocks(plan.schedule, num_stages=plan.degrees.pipeline, num_microbatches=plan.num_microbatches)
              if plan.schedule == "dualpipe-v" else None)  # DualPipeV's F&B blocks, as the simulator runs them
    return simulate_filled(pipeline_costs(plan), plan_actions(plan), num_microbatches=plan.num_microbatches,
                           pieces=pieces, switch_s=switch_s, trusted=plan.schedule != "custom", overlapped=blocks)


def _result(plan: Plan, sim: SimResult, stages: Sequence[StageBubbles], jobs: Sequence[FillJob],
            table: list[list[ExecutorPlan | None]], done: list, device_stage: list[int],
            options: FillOptions, filled: FilledIteration) -> FillPlan:
    assignments, used, fill_flops = [], {}, 0.0
    horizon = options.horizon_s or max((d.end_s for d in done), default=0.0)
    busy_by_stage = [0.0] * len(stages)
    for d in done:
        job, stage = jobs[d.job], device_stage[d.device]
        ep = table[d.job][stage]
        assert ep is not None  # the scheduler only starts jobs with a finite time
        flops = job.num_samples * ep.flops_per_s / ep.throughput_samples_per_s
        inside = max(0.0, min(d.end_s, horizon) - d.start_s)
        share = inside / (d.end_s - d.start_s) if d.end_s > d.start_s else 1.0
        fill_flops += flops * share
        busy_by_stage[stage] += inside
        used[(job.id, stage)] = ep
        assignments.append(FillAssignment(job_id=job.id, device=d.device, stage=stage, start_s=d.start_s,
                                          end_s=d.end_s, samples=job.num_samples, flops=flops))
    num_devices = len(device_stage)
    main = main_flops_per_device_s(plan, sim)
    fill = fill_flops / (num_devices * horizon) if horizon > 0 else 0.0
    t = plan.degrees.tensor
    occupancy = math.fsum(busy_by_stage) / (num_devices * horizon) if horizon > 0 else 0.0
    ends = [a.end_s for a in assignments]
    return FillPlan(
        policy=options.policy, fill_fraction=options.bubbles.fill_fraction, num_devices=num_devices,  # type: ignore[arg-type]
        iteration_time_s=sim.iteration_time_s, bubble_fraction=sim.bubble_fraction, stages=tuple(stages),
        executor_plans=tuple(used.values()), assignments=tuple(assignments),
        makespan_s=max(ends, default=0.0),
        mean_completion_time_s=math.fsum(a.end_s - jobs[i].arrival_time_s for a, i in
                                         zip(assignments, (d.job for d in done))) / max(1, len(done)),
        main_flops_per_device_s=main, fill_flops_per_device_s=fill,
        recovered_utilization=fill / main if main > 0 else 0.0,
        main_job_slowdown=filled.slowdown * occupancy, filled_iteration_time_s=filled.iteration_s,
        notes=(f"{len(done)} of {len(jobs)} fill jobs started; one replica simulated "
               f"({plan.degrees.pipeline} stages x {t} GPUs)",),
    )
