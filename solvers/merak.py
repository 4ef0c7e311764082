"""Merak baseline: even split with stage-aware recompute (more recompute on early stages).

Merak (Lai et al., IEEE TPDS 2023; cited by the poster, seed 002 L29 and ref. [5]) recomputes a
fraction of each stage's layers that falls with the stage index, since early 1F1B stages hold
more microbatches in flight. Reading stage-ilp-spipe-bpipe.md §A.6.8 gives the rule from the
public code (HPDL-Group/Merak @159304361d, Merak/core/pipeline/module.py L219-232): with
first-stage ratio r_0, stage k < P-1 recomputes the fraction

    r_k = max(0, 1 - (1 - r_0) (P - 1) / (P - 1 - k))

of its layers and the last stage none. Here the layers stay on Megatron-even's split
(``even.even_bounds``), the recomputed layers of each chunk are its first ceil(r_k n) layers that
offer the strategy, and r_0 is the smallest of 0, 1/n_0, ..., 1 (n_0 = such layers on stage 0)
whose simulated peak memory fits every device. Merak checkpoints whole layers (``full``); with
option ``recompute`` unset every strategy but ``none`` is tried and the fastest simulated plan
is kept (with our cost model selective recompute is far cheaper). Merak has no interleaved
schedule: with C > 1 chunks the rule runs over the p C virtual stages in order (k for the
stage index, p C for P), since in-flight counts fall along that order too.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cost_models.memory import usable_memory_bytes
from planner.errors import InfeasibleError, InvalidProblemError
from planner.schema import PipelineProblem, Plan
from solvers.budget import Budget, out_of_time, untried_note
from solvers._partition import fixed_depth_model
from solvers.common import (
    build_plan,
    lower_bound_is_exact,
    memory_lower_bound_bytes,
    memory_shortfall_message,
    with_prediction,
)
from solvers.even import even_bounds
from solvers.options import parse_options


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    recompute: str | None = None
    """The strategy of the recomputed layers (the others keep ``none``); default: try each."""


def stage_fraction(first_ratio: float, stage: int, num_stages: int) -> float:
    """Merak's recompute fraction of stage ``stage`` given the first stage's (module docstring)."""
    if stage >= num_stages - 1:
        return 0.0
    return max(0.0, 1.0 - (1.0 - first_ratio) * (num_stages - 1) / (num_stages - 1 - stage))


def solve(problem: PipelineProblem, *, options: Mapping[str, Any] | Options | None = None) -> Plan:
    """Even split with the smallest stage-aware recompute ratio that fits memory.

    Raises:
        InvalidProblemError: no ``num_stages``, an unsupported schedule, or a strategy no layer offers.
        InfeasibleError: even r_0 = 1 does not fit; the message gives the memory needed.
    """
    opts = parse_options(Options, options, solver="merak")
    began = time.perf_counter()
    model = fixed_depth_model(problem, "merak")
    offered = sorted({s for layer in problem.model.layers for s in layer.strategies()} - {"none"})
    if opts.recompute is not None and opts.recompute not in offered:
        raise InvalidProblemError(f"option recompute={opts.recompute!r}: no layer of {problem.model.name} offers it "
                                  f"as a recompute strategy; choose from {offered}")
    best: Plan | None = None
    smallest, from_bound = math.inf, False
    budget, strategies = Budget.of(problem), [opts.recompute] if opts.recompute else offered or ["none"]
    tried = 0
    for strategy in strategies:
        if budget.stop_before(tried):
            break
        tried += 1
        plan, peak, bounded = _smallest_ratio(problem, model, strategy, budget)
        if peak < smallest:
            smallest, from_bound = peak, bounded
        if plan is not None and (best is None or plan.predicted.iteration_time_s < best.predicted.iteration_time_s):  # type: ignore[union-attr]
            best = plan
    stopped = budget.spent()
    if best is None:
        raise InfeasibleError(memory_shortfall_message(
            problem, smallest, f"the Merak plan of {problem.model.name} on {model.num_stages} stages (r_0 = 1)",
            at_least=from_bound) + (untried_note(problem, tried=tried, total=len(strategies), what="recompute strategies")
                                    if stopped else ""))
    best = out_of_time(best, problem, tried=tried, total=len(strategies), what="recompute strategies") if stopped else best
    return best.model_copy(update={"solve_time_s": time.perf_counter() - began})


def _smallest_ratio(problem: PipelineProblem, model: Any, strategy: str, budget: Budget) -> tuple[Plan | None, float, bool]:
    """The plan of the smallest r_0 that fits with this strategy, or None and the lightest peak;
    and whether that peak is only a lower bound (a candidate not simulated, schedule not 1F1B).
    Stops at the first ratio tried once ``budget`` is spent."""
    layers, num_k = problem.model.layers, model.num_virtual
    bounds = even_bounds(problem.model, num_k)
    offers = [[i for i in range(bounds[k], bounds[k + 1]) if strategy in layers[i].strategies()] for k in range(num_k)]
    depth, position = (model.num_stages, lambda k: k % model.num_stages) if model.num_chunks == 1 else (num_k, lambda k: k)
    n0 = len(offers[0])
    smallest, from_bound = math.inf, False
    for step in range(n0 + 1):
        if budget.stop_before(step):
            break
        ratio = step / n0 if n0 else 1.0
        strategies = ["none"] * len(layers)
        for k, chosen in enumerate(offers):
            for i in chosen[: math.ceil(stage_fraction(ratio, position(k), depth) * len(chosen) - 1e-9)]:
                strategies[i] = strategy
        plan = build_plan(problem, model.layout, bounds=bounds, strategies=strategies, solver="merak",
                          options={"recompute": strategy},
                          notes=(f"first-stage recompute ratio r_0 = {ratio:.4g} ({strategy!r})",))
        lower_bytes = memory_lower_bound_bytes(plan)
        if lower_bytes > usable_memory_bytes(problem.cluster.device):  # type: ignore[arg-type]  # cannot fit: no need to simulate
            if lower_bytes < smallest:
                smallest, from_bound = lower_bytes, not lower_bound_is_exact(plan)
            continue
        plan, result = with_prediction(plan)
        peak = max(s.peak_memory_bytes for s in result.stages)
        if result.fits_memory:
            return plan, peak, False
        if peak < smallest:
            smallest, from_bound = peak, False
    return None, smallest, from_bound
