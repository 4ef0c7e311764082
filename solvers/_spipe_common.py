"""Shared pieces of the offloading solvers (spipe, mobius, zero-offload): plan assembly and sweeps.

How a Plan says an offloaded pipeline (docs/solver-spipe.md): the forward stages are the plan's
virtual stages (chunk c of stage x is forward stage c G + x, on GPU x: the placement rule
``i mod G`` of seed 003 L96-105 coincides with Megatron's), schedule ``gpipe`` (AFAB), and
``Plan.offload`` (``planner.schema.OffloadSpec``) holds the rest: ``mode``, ``placement``,
``forward_stages_per_gpu``, ``backward_stages_per_gpu``, ``backward_stages`` (layer ranges in
model order), ``backward_gpus``, ``async_optimizer``, ``prefetch``, ``recompute`` and ``host``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from cost_models.memory import usable_memory_bytes
from cost_models import offload, transformer
from cost_models.sim.offload import OffloadResult, simulate_offload
from planner.errors import InfeasibleError
from planner.schema import Chunk, Degrees, ModelProfile, OffloadHost, OffloadSpec, PipelineProblem, Plan, Predicted, Stage
from solvers._offload_bound import iteration_lower_bound
from solvers.budget import Budget, out_of_time, report_phase, untried_note
from solvers.common import profile_attention
from solvers.common import reject_fixed_shape

MICROBATCH_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True, slots=True, kw_only=True)
class OffloadConfig:
    """One candidate: stages per GPU, placement, microbatching and the optimizer mode."""

    forward_per_gpu: int
    backward_per_forward: int
    """d of seed 003 Eq. 1: backward stages per forward stage."""
    decoupled: bool
    microbatch_size: int
    num_microbatches: int
    async_optimizer: bool
    recompute: str = "full"
    zero: bool = False


def default_global_batch(problem: PipelineProblem) -> int:
    """The problem's global batch, else SPipe's 16 x nodes (seed 003 L287)."""
    return problem.global_batch_size or 16 * problem.cluster.num_nodes


def profile_for(problem: PipelineProblem, microbatch_size: int) -> ModelProfile | None:
    """The layer profile at a microbatch size (re-derived from the transformer), None if not available."""
    if microbatch_size == problem.model.microbatch_size:
        return problem.model
    if problem.transformer is None:
        return None
    cluster = problem.cluster
    return transformer.transformer_profile(problem.transformer, device=cluster.device,  # type: ignore[arg-type]
                                           microbatch_size=microbatch_size, attention=profile_attention(problem),
                                           intra_node_bytes_per_s=cluster.intra_node_bytes_per_s)


def microbatch_choices(problem: PipelineProblem, sizes: Iterable[int], *, replicas: int = 1) -> list[tuple[int, int]]:
    """(microbatch size, microbatches) pairs that make up the global batch exactly."""
    batch = default_global_batch(problem)
    out = []
    for b in sorted(set(sizes) | ({problem.model.microbatch_size} if problem.transformer is None else set())):
        if problem.transformer is None and b != problem.model.microbatch_size:
            continue
        if batch % (b * replicas) == 0:
            m = batch // (b * replicas)
            if problem.num_microbatches is None or problem.num_microbatches == m:
                out.append((b, m))
    return out


def build_plan(problem: PipelineProblem, model: ModelProfile, cfg: OffloadConfig, host: offload.HostSpec,
               *, solver: str) -> Plan:
    """Assemble the plan of one configuration (no prediction yet)."""
    g = problem.cluster.num_devices
    if cfg.zero:
        stages = (Stage(index=0, replicas=g, ranks=tuple(range(g)), chunks=(_chunk(model, (0, model.num_layers), cfg),)),)
        degrees = Degrees(data=g, pipeline=1, virtual=1)
        section: dict[str, Any] = {"mode": "zero-offload"}
        batch = cfg.microbatch_size * cfg.num_microbatches * g
    else:
        v = cfg.forward_per_gpu
        forward = offload.split_layers(model, g * v)
        backward = offload.split_backward(forward, cfg.backward_per_forward, model)
        rule = offload.spipe_backward_gpu if cfg.decoupled else (lambda n, gg: offload.forward_gpu(n, gg))
        stages = tuple(Stage(index=x, replicas=1, ranks=(x,),
                             chunks=tuple(_chunk(model, forward[c * g + x], cfg) for c in range(v))) for x in range(g))
        degrees = Degrees(data=1, pipeline=g, virtual=v)
        section = {"mode": "pipeline", "placement": "decoupled" if cfg.decoupled else "coupled",
                   "forward_stages_per_gpu": v, "backward_stages_per_gpu": v * cfg.backward_per_forward,
                   "backward_stages": [list(r) for r in backward],
                   "backward_gpus": [rule(n, g) for n in range(len(backward))]}
        batch = cfg.microbatch_size * cfg.num_microbatches
    section.update(async_optimizer=cfg.async_optimizer, prefetch=True, recompute=cfg.recompute,
                   host=OffloadHost(**host.to_dict()))
    return Plan(solver=solver, offload=OffloadSpec(**section), model=model, cluster=problem.cluster,
                transformer=problem.transformer, degrees=degrees, schedule="gpipe",
                microbatch_size=cfg.microbatch_size, num_microbatches=cfg.num_microbatches,
                global_batch_size=batch, stages=stages)


def _chunk(model: ModelProfile, layers: tuple[int, int], cfg: OffloadConfig) -> Chunk:
    chosen = tuple(i for i in range(*layers) if cfg.recompute in model.layers[i].strategies() and cfg.recompute != "none")
    return Chunk(layers=layers, recompute={cfg.recompute: chosen} if chosen else {})


def evaluate(plan: Plan) -> tuple[Plan, OffloadResult]:
    """Simulate a plan and attach its prediction (which keeps no bubble list: none is built)."""
    result = simulate_offload(plan, include_events=False, include_bubbles=False)
    sim = result.sim
    pred = Predicted(iteration_time_s=sim.iteration_time_s, throughput_samples_per_s=sim.throughput_samples_per_s,
                     bubble_fraction=sim.bubble_fraction, bottleneck_s=max(st.busy_s for st in sim.stages)
                     / plan.num_microbatches, peak_memory_bytes=tuple(result.gpu_memory_bytes))
    return plan.model_copy(update={"predicted": pred}), result


def row(cfg: OffloadConfig, plan: Plan, result: OffloadResult) -> dict[str, Any]:
    """One flat row of the candidate table."""
    return {
        "forward_per_gpu": cfg.forward_per_gpu,
        "backward_per_gpu": cfg.forward_per_gpu * cfg.backward_per_forward,
        "placement": "zero" if cfg.zero else ("decoupled" if cfg.decoupled else "coupled"),
        "microbatch_size": cfg.microbatch_size, "num_microbatches": cfg.num_microbatches,
        "async_optimizer": cfg.async_optimizer,
        "iteration_time_s": result.sim.iteration_time_s, "gpu_makespan_s": result.gpu_makespan_s,
        "cpu_exposed_s": result.cpu_exposed_s, "bubble_fraction": result.sim.bubble_fraction,
        "peak_gpu_memory_gib": max(result.gpu_memory_bytes) / 2**30,
        "fits": result.sim.fits_memory and result.fits_cpu_memory,
    }


def sweep(problem: PipelineProblem, configs: Iterable[OffloadConfig], host: offload.HostSpec, *, solver: str,
          keep: Callable[[OffloadConfig], bool] = lambda cfg: True, prune: bool = True) -> Plan:
    """Simulate the configurations, return the fastest that fits GPU and CPU memory (ties: the first given).

    Configurations run in increasing order of ``_offload_bound.iteration_lower_bound``; with
    ``prune`` those whose bound exceeds the best time simulated are skipped (the same plan as
    simulating every one; the candidate table then lists only the simulated ones).

    Raises:
        InfeasibleError: CPU memory cannot hold the model states, or no configuration fits the
            GPUs (the message gives the smallest peak found and the capacity).
    """
    start = time.perf_counter()
    _check_cpu(problem, host)
    models: dict[int, ModelProfile | None] = {}
    order = []
    for index, cfg in enumerate(configs):
        if cfg.microbatch_size not in models:
            models[cfg.microbatch_size] = profile_for(problem, cfg.microbatch_size)
        model = models[cfg.microbatch_size]
        if model is not None and keep(cfg):
            bound = iteration_lower_bound(model, cfg, problem.cluster.num_devices, problem.cluster, host) if prune else 0.0
            order.append((bound, index, cfg, model))
    order.sort(key=lambda x: (x[0], x[1]))
    best: tuple[float, int, Plan] | None = None
    rows: list[tuple[int, dict[str, Any]]] = []
    smallest = float("inf")
    budget, total = Budget.of(problem), len(order)
    tried, pruned, stopped, shape_error = 0, 0, False, ""
    for bound, index, cfg, model in order:
        if best is not None and (bound, index) > best[:2]:
            pruned += 1
            continue
        if budget.stop_before(tried):
            stopped = True
            break
        report_phase(f"{solver}: configuration {tried + 1}", tried, total)
        tried += 1
        try:
            plan, result = evaluate(build_plan(problem, model, cfg, host, solver=solver))
        except InfeasibleError as e:
            shape_error = shape_error or str(e)
            continue  # a shape the model cannot take (more stages than layers)
        rows.append((index, row(cfg, plan, result)))
        smallest = min(smallest, max(result.gpu_memory_bytes))
        if rows[-1][1]["fits"] and (best is None or (result.sim.iteration_time_s, index) < best[:2]):
            best = (result.sim.iteration_time_s, index, plan)
    if best is None:
        raise InfeasibleError(_no_fit_message(problem, solver, smallest if rows else None, shape_error)
                              + (untried_note(problem, tried=tried, total=total, what="configurations") if stopped else ""))
    rows.sort(key=lambda r: (not r[1]["fits"], r[1]["iteration_time_s"], r[0]))
    notes = best[2].notes + ((f"{pruned} of {total} configurations not simulated: a lower bound on their iteration "
                              "time (each GPU's compute plus the pipeline's fill and drain) exceeds the chosen "
                              "plan's",) if pruned else ())
    plan = best[2].model_copy(update={"candidates": tuple(r for _, r in rows), "notes": notes,
                                      "solve_time_s": time.perf_counter() - start, "status": "optimal"})
    return out_of_time(plan, problem, tried=tried, total=total, what="configurations") if stopped else plan


def _no_fit_message(problem: PipelineProblem, solver: str, smallest_bytes: float | None, shape_error: str) -> str:
    """Why the sweep found nothing: the smallest GPU peak simulated, or why no shape was possible."""
    if smallest_bytes is not None:
        cap = usable_memory_bytes(problem.cluster.device)  # type: ignore[arg-type]
        return (f"no {solver} configuration fits GPU memory: the smallest peak found is {smallest_bytes / 2**30:.1f} GiB "
                f"per GPU, the device has {cap / 2**30:.1f} GiB; use more GPUs, a smaller microbatch size or a "
                "smaller global batch")
    text = f"{solver} found no stage configuration for this model and batch"
    if shape_error:
        text += f": {shape_error} (every GPU holds at least one forward stage: use at most as many GPUs as decoder layers)"
    return text


def check_problem(problem: PipelineProblem, *, solver: str) -> None:
    """Reject the pipeline-shape fields an offload solver chooses itself (no silent override).

    Raises:
        InvalidProblemError: num_stages, data_parallel, chunks, BPipe or a schedule other than the
            CLI default was given; the message names the field and the fix.
    """
    reject_fixed_shape(problem, solver=solver, chooses="places its forward and backward stages on every GPU itself",
                       alternative="solver 'even' or 'stage-ilp' for a fixed GPU-resident pipeline", schedule=True)


def _check_cpu(problem: PipelineProblem, host: offload.HostSpec) -> None:
    """Model states spread evenly over the nodes must fit their CPU memory."""
    total = offload.cpu_state_bytes(offload.range_num_params(problem.model, (0, problem.model.num_layers)))
    nodes = problem.cluster.num_nodes
    offload.check_cpu_memory([total / nodes] * nodes, host)


@dataclass(frozen=True, slots=True, kw_only=True)
class HostOptions:
    """Host overrides shared by the offload solvers (defaults: ``cost_models.offload``)."""

    host_link_bytes_per_s: float | None = None
    gpus_per_host_link: int | None = None
    cpu_optimizer_params_per_s: float | None = None
    cpu_memory_bytes: float | None = None
    pinned: bool | None = None
    peer_over_host_link: bool | None = None
    """GPU peer copies and collectives use the host links (no NVLink; default False)."""
