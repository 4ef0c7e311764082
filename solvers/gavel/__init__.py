"""Gavel: heterogeneity-aware cluster scheduling policies ([gavel]; dissertation ch. 5, [narayanan-thesis]).

Every policy takes a ``ClusterProblem`` and returns an ``Allocation``; they are
interchangeable by name through one registry (``REGISTRY``/``POLICIES``: Gavel's names, the
``_perf`` variants heterogeneity-aware, ``_packed`` with space sharing), whose entries carry the
solve function, capabilities and how the partitioned mode combines group objectives. ``solve`` also runs the partitioned
(POP) mode with ``num_partitions > 1``. cvxpy is imported only when a policy runs.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from planner.errors import InvalidProblemError
from planner.schema_gavel import Allocation, ClusterProblem
from solvers.gavel import common
from solvers.options import parse_options

log = logging.getLogger(__name__)


PolicyFn = Callable[..., tuple[np.ndarray, float]]
"""fn(formulation, *, policy, backend) -> (X over the formulation's combinations, objective)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyInfo:
    """One registered Gavel policy: its solve function, capabilities and how POP combines it."""

    name: str
    solve: PolicyFn
    description: str
    objective: str
    """What the objective value measures (printed in the allocation's notes)."""
    aggregate: Literal["min", "max", "sum"]
    """How the partitioned mode (POP) combines the groups' objectives: the lowest level of a
    max-min objective, the largest makespan or rho, or the sum of an additive one."""
    heterogeneity_aware: bool
    packed: bool = False
    """Space sharing: pairs of jobs on one accelerator (adds pair combinations to the formulation)."""
    backends: tuple[str, ...] = ("direct",)
    """LP backends the policy's own LP honours (option ``backend``; others solve with cvxpy and ignore it)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    num_partitions: int = 1
    """k > 1 solves k random sub-problems on 1/k of the cluster each (POP)."""
    seed: int = 0
    """Seed of the random job split of the partitioned mode."""
    backend: str = "direct"
    """Max-min fairness only: 'direct' (sparse matrices to HiGHS) or 'cvxpy' (reference)."""
    las_normalizer: str = "equal"
    """Max-min fairness only: 'equal' (the text's thr(X^equal)) or 'isolated' (Gavel's code:
    thr(X^iso); the ``gavel`` simulation mechanism's default). They differ for multi-GPU jobs."""
    fifo: str = "lp"
    """fifo_perf only: 'lp' (the chapter's LP) or 'greedy' (Gavel's code; the ``gavel``
    simulation mechanism's default)."""
    makespan: str = "lp"
    """min_total_duration(_perf) only: 'lp' (the exact optimum) or 'bisection' (Gavel's code:
    within 5%, an interior point; the ``gavel`` simulation mechanism's default)."""
    lp_solver: str = "highs"
    """'highs' (default) or 'ecos': the LAS, finish-time-fairness and makespan policies written
    as Gavel's code writes them (LAS normalized by thr(X^iso), the makespan by its bisection,
    whatever ``las_normalizer``/``makespan`` say) and solved with ECOS, the solver its simulator
    uses, to pick the same one of several optimal allocations (``ecos_lp``; the ``ecos`` extra)."""


# The solve functions import their module (and cvxpy) on the first call: ``import solvers.gavel`` stays cheap.
def _mmf_agnostic(f: common.Formulation, *, policy: str, backend: str) -> tuple[np.ndarray, float]:
    from solvers.gavel import max_min_fairness
    return max_min_fairness.max_min_agnostic(f, policy=policy, backend=backend)


def _mmf_perf(f: common.Formulation, *, policy: str, backend: str) -> tuple[np.ndarray, float]:
    from solvers.gavel import max_min_fairness
    return max_min_fairness.max_min_perf(f, policy=policy, backend=backend)


def _water_filling(f: common.Formulation, *, policy: str, backend: str) -> tuple[np.ndarray, float]:
    from solvers.gavel import water_filling
    return water_filling.water_filling(f, policy=policy)


def _water_filling_perf(f: common.Formulation, *, policy: str, backend: str) -> tuple[np.ndarray, float]:
    from solvers.gavel import water_filling
    return water_filling.water_filling_perf(f, policy=policy)


def _makespan(f: common.Formulation, *, policy: str, backend: str) -> tuple[np.ndarray, float]:
    from solvers.gavel import makespan
    return makespan.min_total_duration(f, policy=policy)


def _makespan_perf(f: common.Formulation, *, policy: str, backend: str) -> tuple[np.ndarray, float]:
    from solvers.gavel import makespan
    return makespan.min_total_duration_perf(f, policy=policy)


def _ftf(f: common.Formulation, *, policy: str, backend: str) -> tuple[np.ndarray, float]:
    from solvers.gavel import finish_time_fairness
    return finish_time_fairness.finish_time_fairness(f, policy=policy)


def _ftf_perf(f: common.Formulation, *, policy: str, backend: str) -> tuple[np.ndarray, float]:
    from solvers.gavel import finish_time_fairness
    return finish_time_fairness.finish_time_fairness_perf(f, policy=policy)


def _fifo(f: common.Formulation, *, policy: str, backend: str) -> tuple[np.ndarray, float]:
    from solvers.gavel import fifo
    return fifo.fifo(f, policy=policy)


def _fifo_perf(f: common.Formulation, *, policy: str, backend: str) -> tuple[np.ndarray, float]:
    from solvers.gavel import fifo
    return fifo.fifo_perf(f, policy=policy)


def _fifo_greedy_perf(f: common.Formulation, *, policy: str, backend: str) -> tuple[np.ndarray, float]:
    from solvers.gavel import fifo
    return fifo.fifo_greedy_perf(f, policy=policy)


def _makespan_bisection(f: common.Formulation, *, policy: str, backend: str) -> tuple[np.ndarray, float]:
    from solvers.gavel import makespan
    return makespan.min_total_duration_bisection_agnostic(f, policy=policy)


def _makespan_bisection_perf(f: common.Formulation, *, policy: str, backend: str) -> tuple[np.ndarray, float]:
    from solvers.gavel import makespan
    return makespan.min_total_duration_bisection(f, policy=policy)


# Policies as Gavel's code runs them, by (policy, option fifo, option makespan).
_GAVEL_CODE: dict[tuple[str, str, str], PolicyFn] = {
    **{("fifo_perf", "greedy", m): _fifo_greedy_perf for m in ("lp", "bisection")},
    **{("min_total_duration", f, "bisection"): _makespan_bisection for f in ("lp", "greedy")},
    **{("min_total_duration_perf", f, "bisection"): _makespan_bisection_perf for f in ("lp", "greedy")},
}


def _ecos(name: str) -> PolicyFn:
    def fn(f: common.Formulation, *, policy: str, backend: str) -> tuple[np.ndarray, float]:
        from solvers.gavel import ecos_lp
        return getattr(ecos_lp, name)(f, policy=policy)
    return fn


# lp_solver="ecos": Gavel's code's formulations (its makespan policy is the bisection; it has no
# agnostic makespan policy, so min_total_duration keeps HiGHS).
_ECOS: dict[str, PolicyFn] = {
    "max_min_fairness": _ecos("las_agnostic"),
    "max_min_fairness_perf": _ecos("las_perf"),
    "finish_time_fairness": _ecos("ftf_agnostic"),
    "finish_time_fairness_perf": _ecos("ftf_perf"),
    "min_total_duration_perf": _ecos("makespan_bisection"),
}


def solved_by_ecos(policy: str, options: Mapping[str, Any] | Options | None) -> bool:
    """Whether ``solve`` hands this policy to ECOS (option lp_solver="ecos" and a Gavel formulation)."""
    opts = parse_options(Options, options, solver=policy)
    return opts.lp_solver == "ecos" and get_policy(policy).name in _ECOS


def _sjf(f: common.Formulation, *, policy: str, backend: str) -> tuple[np.ndarray, float]:
    from solvers.gavel import fifo
    return fifo.shortest_job_first(f, policy=policy)


def _sjf_perf(f: common.Formulation, *, policy: str, backend: str) -> tuple[np.ndarray, float]:
    from solvers.gavel import fifo
    return fifo.shortest_job_first_perf(f, policy=policy)


def _max_throughput(f: common.Formulation, *, policy: str, backend: str) -> tuple[np.ndarray, float]:
    from solvers.gavel import throughput
    return throughput.max_sum_throughput_perf(f, policy=policy)


def _min_cost(f: common.Formulation, *, policy: str, backend: str) -> tuple[np.ndarray, float]:
    from solvers.gavel import throughput
    return throughput.min_cost(f, policy=policy)


def _min_cost_slo(f: common.Formulation, *, policy: str, backend: str) -> tuple[np.ndarray, float]:
    from solvers.gavel import throughput
    return throughput.min_cost_slo(f, policy=policy)


def _isolated(f: common.Formulation, *, policy: str, backend: str) -> tuple[np.ndarray, float]:
    from solvers.gavel import isolated
    return isolated.isolated(f, policy=policy)


_LEVEL = "min over jobs of scale_factor * thr / thr(X^equal) / weight"
_FIFO = "weighted normalized throughput"
_DOLLARS = "steps per 1000 $"
_MMF_BACKENDS = ("direct", "cvxpy")

REGISTRY: tuple[PolicyInfo, ...] = (
    PolicyInfo(name="max_min_fairness", solve=_mmf_agnostic, objective=_LEVEL.replace("thr / thr(X^equal)", "time share"),
               aggregate="min", heterogeneity_aware=False, backends=_MMF_BACKENDS,
               description="LAS, heterogeneity-agnostic: equal scaled time shares"),
    PolicyInfo(name="max_min_fairness_perf", solve=_mmf_perf, objective=_LEVEL, aggregate="min",
               heterogeneity_aware=True, backends=_MMF_BACKENDS,
               description="heterogeneity-aware LAS on normalized throughput"),
    PolicyInfo(name="max_min_fairness_packed", solve=_mmf_perf, objective=_LEVEL, aggregate="min",
               heterogeneity_aware=True, packed=True, backends=_MMF_BACKENDS,
               description="heterogeneity-aware LAS with space sharing of job pairs"),
    PolicyInfo(name="max_min_fairness_water_filling", solve=_water_filling, objective="min level", aggregate="min",
               heterogeneity_aware=False, description="agnostic LAS raised by water-filling; entities -> hierarchical"),
    PolicyInfo(name="max_min_fairness_water_filling_perf", solve=_water_filling_perf, objective="min level",
               aggregate="min", heterogeneity_aware=True,
               description="heterogeneity-aware water-filling / hierarchical"),
    PolicyInfo(name="max_min_fairness_water_filling_packed", solve=_water_filling_perf, objective="min level",
               aggregate="min", heterogeneity_aware=True, packed=True, description="water-filling with space sharing"),
    PolicyInfo(name="hierarchical", solve=_water_filling_perf, objective="min level", aggregate="min",
               heterogeneity_aware=True,
               description="alias of max_min_fairness_water_filling_perf: entity weights, fairness/FIFO inside"),
    PolicyInfo(name="min_total_duration", solve=_makespan, objective="makespan_s", aggregate="max",
               heterogeneity_aware=False, description="minimize makespan, heterogeneity-agnostic"),
    PolicyInfo(name="min_total_duration_perf", solve=_makespan_perf, objective="makespan_s", aggregate="max",
               heterogeneity_aware=True, description="minimize makespan on effective throughput"),
    PolicyInfo(name="min_total_duration_packed", solve=_makespan_perf, objective="makespan_s", aggregate="max",
               heterogeneity_aware=True, packed=True, description="minimize makespan with space sharing"),
    PolicyInfo(name="finish_time_fairness", solve=_ftf, objective="max rho", aggregate="max",
               heterogeneity_aware=False, description="Themis finish-time fairness, heterogeneity-agnostic"),
    PolicyInfo(name="finish_time_fairness_perf", solve=_ftf_perf, objective="max rho", aggregate="max",
               heterogeneity_aware=True, description="Themis finish-time fairness on effective throughput"),
    PolicyInfo(name="finish_time_fairness_packed", solve=_ftf_perf, objective="max rho", aggregate="max",
               heterogeneity_aware=True, packed=True, description="finish-time fairness with space sharing"),
    PolicyInfo(name="fifo", solve=_fifo, objective=_FIFO, aggregate="sum", heterogeneity_aware=False,
               description="FIFO as the chapter's LP, heterogeneity-agnostic"),
    PolicyInfo(name="fifo_perf", solve=_fifo_perf, objective=_FIFO, aggregate="sum", heterogeneity_aware=True,
               description="heterogeneity-aware FIFO"),
    PolicyInfo(name="fifo_packed", solve=_fifo_perf, objective=_FIFO, aggregate="sum", heterogeneity_aware=True,
               packed=True, description="heterogeneity-aware FIFO with space sharing"),
    PolicyInfo(name="shortest_job_first", solve=_sjf, objective=_FIFO, aggregate="sum", heterogeneity_aware=False,
               description="SJF as FIFO's LP ordered by remaining time, agnostic"),
    PolicyInfo(name="shortest_job_first_perf", solve=_sjf_perf, objective=_FIFO, aggregate="sum",
               heterogeneity_aware=True, description="heterogeneity-aware SJF"),
    PolicyInfo(name="max_sum_throughput_perf", solve=_max_throughput, objective="sum of steps/s", aggregate="sum",
               heterogeneity_aware=True, description="maximize total effective throughput"),
    PolicyInfo(name="max_sum_throughput_normalized_by_cost_perf", solve=_min_cost, objective=_DOLLARS,
               aggregate="sum", heterogeneity_aware=True, description="maximize throughput per dollar (min cost)"),
    PolicyInfo(name="max_sum_throughput_normalized_by_cost_perf_SLOs", solve=_min_cost_slo, objective=_DOLLARS,
               aggregate="sum", heterogeneity_aware=True, description="min cost subject to every job's SLO"),
    PolicyInfo(name="min_cost", solve=_min_cost, objective=_DOLLARS, aggregate="sum", heterogeneity_aware=True,
               description="alias of max_sum_throughput_normalized_by_cost_perf"),
    PolicyInfo(name="min_cost_slo", solve=_min_cost_slo, objective=_DOLLARS, aggregate="sum", heterogeneity_aware=True,
               description="alias of max_sum_throughput_normalized_by_cost_perf_SLOs"),
    PolicyInfo(name="isolated", solve=_isolated, objective="none", aggregate="sum", heterogeneity_aware=False,
               description="1/n of every accelerator type per job, no LP (the sharing-incentive baseline)"),
)

POLICIES: dict[str, PolicyInfo] = {info.name: info for info in REGISTRY}
"""Gavel's policy names (the ``_perf`` variants are heterogeneity-aware, ``_packed`` add space sharing)."""


def get_policy(name: str) -> PolicyInfo:
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
        options: ``num_partitions``, ``seed``, ``backend``, ``las_normalizer``, ``fifo``,
            ``makespan``, ``lp_solver`` (see ``Options``).

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
    if opts.las_normalizer not in ("equal", "isolated"):
        raise InvalidProblemError(f"las_normalizer={opts.las_normalizer!r}: choose 'equal' or 'isolated'")
    if opts.fifo not in ("lp", "greedy"):
        raise InvalidProblemError(f"fifo={opts.fifo!r}: choose 'lp' or 'greedy'")
    if opts.makespan not in ("lp", "bisection"):
        raise InvalidProblemError(f"makespan={opts.makespan!r}: choose 'lp' or 'bisection'")
    f = common.build(problem, packed=spec.packed).with_las_normalizer(opts.las_normalizer)
    solve_fn = _GAVEL_CODE.get((spec.name, opts.fifo, opts.makespan), spec.solve)
    notes = [f"objective: {spec.objective}"]
    if opts.lp_solver not in ("highs", "ecos"):
        raise InvalidProblemError(f"lp_solver={opts.lp_solver!r}: choose 'highs' (default) or 'ecos'")
    if opts.lp_solver == "ecos":
        from solvers.gavel.ecos_lp import require_ecos

        require_ecos()
        if spec.name in _ECOS:
            solve_fn = _ECOS[spec.name]
            notes.append("lp_solver=ecos: Gavel's code's formulation solved with ECOS")
        else:
            notes.append(f"lp_solver=ecos: no Gavel ECOS formulation for {spec.name!r}; solved as without it")

    def fn(sub: common.Formulation, *, policy: str) -> tuple[np.ndarray, float]:
        return solve_fn(sub, policy=policy, backend=opts.backend)

    if opts.num_partitions == 1:
        x, value = fn(f, policy=policy)
        return f, x, float(value), notes
    from solvers.gavel.partitioned import solve_partitioned

    x, value, parts = solve_partitioned(f, fn, policy=policy, num_partitions=opts.num_partitions, seed=opts.seed)
    notes.append(f"partitioned into {len(parts)} sub-problems (POP); objectives {[round(v, 6) for v in parts]}")
    # POP: the lowest level of a max-min objective, the worst makespan or rho, additive objectives add up
    value = {"min": min, "max": max, "sum": math.fsum}[spec.aggregate](parts)
    return f, x, float(value), notes
