"""ZeRO-Offload-style baseline: data parallelism with parameters, gradients and optimizer on the CPU.

The DeepSpeed baseline of SPipe (seed 003 L279-299: "ZeRO-3 parallelism with offloading support")
as one data-parallel replica per GPU. For every microbatch each layer's fp16 parameters come
from the host (1/G per GPU) and are all-gathered; after the last microbatch each layer's gradients
are reduce-scattered and 1/G is offloaded; the CPU Adam step of each node's partition runs after
all gradients arrived (synchronous overflow check, Fig. 3). The collectives are charged to the host
link, which is what the paper blames for DeepSpeed's slowdown (PCIe congestion, L299).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from planner.errors import InfeasibleError
from planner.schema import PipelineProblem, Plan
from solvers import _spipe_common as common
from solvers.options import parse_options
from solvers.spipe import host_from


@dataclass(frozen=True, slots=True, kw_only=True)
class Options(common.HostOptions):
    microbatch_size: int | None = None


def solve(problem: PipelineProblem, *, options: Mapping[str, Any] | Options | None = None) -> Plan:
    """Plan the fastest ZeRO-Offload-style data-parallel run that fits memory.

    Raises:
        InvalidProblemError: no host link bandwidth, or bad options.
        InfeasibleError: CPU memory too small, or the global batch cannot give every GPU a microbatch.
    """
    opts = parse_options(Options, options, solver="zero-offload")
    common.check_problem(problem, solver="zero-offload")
    host = host_from(problem, opts)
    sizes = (opts.microbatch_size,) if opts.microbatch_size else common.MICROBATCH_SIZES
    g = problem.cluster.num_devices
    configs = [common.OffloadConfig(forward_per_gpu=1, backward_per_forward=1, decoupled=False, microbatch_size=b,
                                    num_microbatches=m, async_optimizer=False, zero=True)
               for b, m in common.microbatch_choices(problem, sizes, replicas=g)]
    kept = _within_bound(problem, configs)
    if configs and not kept:
        raise InfeasibleError(_too_large_message(problem, min(cfg.num_microbatches for cfg in configs)))
    plan = common.sweep(problem, kept, host, solver="zero-offload")
    skipped = sorted({cfg.microbatch_size for cfg in configs} - {cfg.microbatch_size for cfg in kept})
    if not skipped:
        return plan
    note = (f"microbatch sizes {skipped} not simulated: with them the sweep would build more than "
            f"{MAX_SIMULATED_OPS:,} simulator operations (zero-offload simulates every GPU); give "
            "--option microbatch_size=B to simulate one of them alone")
    return plan.model_copy(update={"notes": (*plan.notes, note),
                                   "status": "feasible" if plan.status == "optimal" else plan.status})


MAX_SIMULATED_OPS = 400_000
"""The simulator's operations one sweep may build: each GPU fetches, gathers and runs every
layer for every microbatch in both passes (about 20 us each on a loaded 2-core host, so the
bound keeps the sweep under about 10 s and 1 GB)."""


def _within_bound(problem: PipelineProblem, configs: list[common.OffloadConfig]) -> list[common.OffloadConfig]:
    """The configurations the sweep simulates, cheapest first while their operations together
    stay within ``MAX_SIMULATED_OPS`` (in their original order)."""
    kept, total = set(), 0
    for index in sorted(range(len(configs)), key=lambda i: configs[i].num_microbatches):
        total += simulated_ops(problem, configs[index].num_microbatches)
        if total > MAX_SIMULATED_OPS:
            break
        kept.add(index)
    return [cfg for i, cfg in enumerate(configs) if i in kept]


def simulated_ops(problem: PipelineProblem, num_microbatches: int) -> int:
    """Operations ``cost_models.sim.offload`` builds for one ZeRO-Offload configuration."""
    num_layers = problem.model.num_layers
    return problem.cluster.num_devices * (4 * num_layers * num_microbatches + 2 * num_layers)


def _too_large_message(problem: PipelineProblem, num_microbatches: int) -> str:
    g, num_layers = problem.cluster.num_devices, problem.model.num_layers
    per_gpu = simulated_ops(problem, num_microbatches) // g
    most_gpus = max(MAX_SIMULATED_OPS // per_gpu, 1)
    return (f"zero-offload simulates every GPU's per-layer fetches and passes: {g:,} GPUs x {num_layers:,} layers x "
            f"{num_microbatches} microbatch(es) is {simulated_ops(problem, num_microbatches):,} operations, above its "
            f"bound of {MAX_SIMULATED_OPS:,} (about 10 s); plan ZeRO-Offload on at most {most_gpus:,} GPUs, or use "
            "solver spipe or ptdp at this scale")
