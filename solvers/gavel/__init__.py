"""Gavel: heterogeneity-aware cluster scheduling policies (dissertation ch. 5, [narayanan-thesis]).

Every policy takes a ``ClusterProblem`` and returns an ``Allocation``; they are
interchangeable by name (``POLICIES``, Gavel's names: the ``_perf`` variants are
heterogeneity-aware, ``_packed`` add space sharing). ``solve`` also runs the partitioned
(POP) mode with ``num_partitions > 1``. cvxpy is imported only when a policy runs.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from planner.errors import InvalidProblemError
from planner.schema_gavel import Allocation, ClusterProblem
from solvers.gavel import common
from solvers.options import parse_options

log = logging.getLogger(__name__)


class PolicySpec(NamedTuple):
    """Where a policy lives and how it reads the problem."""

    module: str
    function: str
    packed: bool
    objective: str
    description: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    num_partitions: int = 1
    """k > 1 solves k random sub-problems on 1/k of the cluster each (POP)."""
    seed: int = 0
    """Seed of the random job split of the partitioned mode."""
    backend: str = "direct"
    """Max-min fairness only: 'direct' (sparse matrices to HiGHS) or 'cvxpy' (reference)."""


_MMF = "max_min_fairness"
_LEVEL = "min over jobs of scale_factor * thr / thr(X^equal) / weight"
POLICIES: dict[str, PolicySpec] = {
    "max_min_fairness": PolicySpec(_MMF, "max_min_agnostic", False, _LEVEL.replace("thr / thr(X^equal)", "time share"),
                                   "LAS, heterogeneity-agnostic: equal scaled time shares ([narayanan-thesis] ch. 5)"),
    "max_min_fairness_perf": PolicySpec(_MMF, "max_min_perf", False, _LEVEL,
                                        "heterogeneity-aware LAS on normalized throughput ([narayanan-thesis] ch. 5)"),
    "max_min_fairness_packed": PolicySpec(_MMF, "max_min_perf", True, _LEVEL,
                                          "heterogeneity-aware LAS with space sharing of job pairs ([narayanan-thesis] ch. 5)"),
    "max_min_fairness_water_filling": PolicySpec("water_filling", "water_filling", False, "min level",
                                                 "agnostic LAS raised by water-filling; entities -> hierarchical"),
    "max_min_fairness_water_filling_perf": PolicySpec("water_filling", "water_filling_perf", False, "min level",
                                                      "heterogeneity-aware water-filling / hierarchical ([narayanan-thesis] ch. 5)"),
    "max_min_fairness_water_filling_packed": PolicySpec("water_filling", "water_filling_perf", True, "min level",
                                                        "water-filling with space sharing"),
    "hierarchical": PolicySpec("water_filling", "water_filling_perf", False, "min level",
                               "alias of max_min_fairness_water_filling_perf: entity weights, fairness/FIFO inside"),
    "min_total_duration": PolicySpec("makespan", "min_total_duration", False, "makespan_s",
                                     "minimize makespan, heterogeneity-agnostic ([narayanan-thesis] ch. 5)"),
    "min_total_duration_perf": PolicySpec("makespan", "min_total_duration_perf", False, "makespan_s",
                                          "minimize makespan on effective throughput"),
    "min_total_duration_packed": PolicySpec("makespan", "min_total_duration_perf", True, "makespan_s",
                                            "minimize makespan with space sharing"),
    "finish_time_fairness": PolicySpec("finish_time_fairness", "finish_time_fairness", False, "max rho",
                                       "Themis finish-time fairness, heterogeneity-agnostic ([narayanan-thesis] ch. 5)"),
    "finish_time_fairness_perf": PolicySpec("finish_time_fairness", "finish_time_fairness_perf", False, "max rho",
                                            "Themis finish-time fairness on effective throughput"),
    "finish_time_fairness_packed": PolicySpec("finish_time_fairness", "finish_time_fairness_perf", True, "max rho",
                                              "finish-time fairness with space sharing"),
    "fifo": PolicySpec("fifo", "fifo", False, "weighted normalized throughput",
                       "FIFO as the chapter's LP, heterogeneity-agnostic ([narayanan-thesis] ch. 5)"),
    "fifo_perf": PolicySpec("fifo", "fifo_perf", False, "weighted normalized throughput",
                            "heterogeneity-aware FIFO"),
    "fifo_packed": PolicySpec("fifo", "fifo_perf", True, "weighted normalized throughput",
                              "heterogeneity-aware FIFO with space sharing"),
    "shortest_job_first": PolicySpec("fifo", "shortest_job_first", False, "weighted normalized throughput",
                                     "SJF ([narayanan-thesis] ch. 5) as FIFO's LP ordered by remaining time, agnostic"),
    "shortest_job_first_perf": PolicySpec("fifo", "shortest_job_first_perf", False, "weighted normalized throughput",
                                          "heterogeneity-aware SJF"),
    "max_sum_throughput_perf": PolicySpec("throughput", "max_sum_throughput_perf", False, "sum of steps/s",
                                          "maximize total effective throughput ([narayanan-thesis] ch. 5)"),
    "max_sum_throughput_normalized_by_cost_perf": PolicySpec("throughput", "min_cost", False, "steps per 1000 $",
                                                             "maximize throughput per dollar (min cost, [narayanan-thesis] ch. 5)"),
    "max_sum_throughput_normalized_by_cost_perf_SLOs": PolicySpec("throughput", "min_cost_slo", False,
                                                                  "steps per 1000 $",
                                                                  "min cost subject to every job's SLO"),
    "min_cost": PolicySpec("throughput", "min_cost", False, "steps per 1000 $",
                           "alias of max_sum_throughput_normalized_by_cost_perf"),
    "min_cost_slo": PolicySpec("throughput", "min_cost_slo", False, "steps per 1000 $",
                               "alias of max_sum_throughput_normalized_by_cost_perf_SLOs"),
    "isolated": PolicySpec("isolated", "isolated", False, "none",
                           "1/n of every accelerator type per job, no LP (the sharing-incentive baseline)"),
}


def get_policy(name: str) -> PolicySpec:
    """Look a policy up by name.

    Raises:
        InvalidProblemError: unknown name; the message lists the valid names.
    """
    try:
        return POLICIES[name]
    except KeyError:
        raise InvalidProblemError(f"unknown policy {name!r}; choose from {sorted(POLICIES)}") from None


def solve(
    problem: ClusterProblem, *, policy: str, options: Mapping[str, Any] | Options | None = None
) -> Allocation:
    """Compute one allocation of the cluster among the problem's jobs.

    Args:
        problem: jobs (with throughputs) and accelerator counts by type.
        policy: a name of ``POLICIES``.
        options: ``num_partitions``, ``seed``, ``backend`` (see ``Options``).

    Returns:
        The allocation: time fraction per job and type, effective throughputs, objective.

    Raises:
        InvalidProblemError: unknown policy or option.
        InfeasibleError: a job cannot run anywhere, or the policy's constraints (SLOs) cannot hold.
    """
    start = time.perf_counter()
    f, x, value, notes = solve_matrix(problem, policy=policy, options=options)
    opts = parse_options(Options, options, solver=policy)
    return common.to_allocation(
        f, x, policy=policy, start_s=start, objective=value, notes=notes, num_partitions=opts.num_partitions
    )


def solve_matrix(
    problem: ClusterProblem, *, policy: str, options: Mapping[str, Any] | Options | None = None
) -> tuple[common.Formulation, np.ndarray, float, list[str]]:
    """``solve`` without the Allocation: the formulation, X over its combinations, the
    objective and notes (the cluster simulator reads X directly)."""
    spec = get_policy(policy)
    opts = parse_options(Options, options, solver=policy)
    if opts.num_partitions < 1:
        raise InvalidProblemError(f"num_partitions={opts.num_partitions} must be at least 1")
    if opts.backend not in ("direct", "cvxpy"):
        raise InvalidProblemError(f"backend={opts.backend!r}: choose 'direct' or 'cvxpy'")
    f = common.build(problem, packed=spec.packed)
    fn = getattr(importlib.import_module(f"solvers.gavel.{spec.module}"), spec.function)
    if spec.module == "max_min_fairness":
        fn = _with_backend(fn, opts.backend)
    notes = [f"objective: {spec.objective}"]
    if opts.num_partitions == 1:
        x, value = fn(f, policy=policy)
        return f, x, float(value), notes
    from solvers.gavel.partitioned import solve_partitioned

    x, value, parts = solve_partitioned(f, fn, policy=policy, num_partitions=opts.num_partitions, seed=opts.seed)
    notes.append(f"partitioned into {len(parts)} sub-problems (POP); objectives {[round(v, 6) for v in parts]}")
    if spec.objective in ("makespan_s", "max rho"):
        value = max(parts)  # the worst group decides a makespan or the largest rho
    elif spec.objective.startswith("min") or spec.objective == "min level":
        value = min(parts)  # max-min: the lowest level over all groups
    else:
        value = float(sum(parts))  # additive objectives add up over groups
    return f, x, float(value), notes


def _with_backend(fn: Any, backend: str) -> Any:
    def call(f: common.Formulation, *, policy: str) -> tuple[np.ndarray, float]:
        return fn(f, policy=policy, backend=backend)

    return call
