"""Cloud-pricing planner: Narayanan's dissertation, ch. 6 ("exploiting dynamic pricing").

``solve(problem, catalogue=...)`` runs one of the three formulations of sec. 6.4 over the
catalogue's (instance type, market) options and returns a ``CloudPlan``; ``replay`` (in
``solvers.cloud.replay``) runs the end-to-end strategies of sec. 6.3.2 over a price trace.
"""

from __future__ import annotations

import math
import time

import numpy as np

from planner.errors import InfeasibleError, InvalidProblemError
from planner.schema_cloud import Catalogue, CloudPlan, CloudProblem, JobAllocation, Option
from solvers.cloud import formulations as f
from solvers.cloud.catalogue import DEFAULT_CATALOGUE, build_options, load_catalogue
from solvers.cloud.matrix import Matrix, build_matrix, resolve_throughputs

__all__ = ["solve", "load_catalogue", "build_options", "DEFAULT_CATALOGUE"]


def solve(problem: CloudProblem, *, catalogue: str | Catalogue = DEFAULT_CATALOGUE,
          spot_prices: dict[str, float] | None = None) -> CloudPlan:
    """Plan the jobs over the catalogue's options with the problem's objective.

    Args:
        spot_prices: instance key -> spot $/h replacing the catalogue's (e.g. a trace's mean).

    Raises:
        InvalidProblemError: unknown instance types, clouds, markets or accelerator types.
        InfeasibleError: deadlines, quotas or budget no allocation meets; the message gives the
            cheapest feasible budget or the deadlines that can be met.
    """
    cat = load_catalogue(catalogue)
    options = build_options(cat, markets=tuple(problem.markets), clouds=problem.clouds, instances=problem.instances,
                            spot_prices=spot_prices)
    jobs = resolve_throughputs(problem.jobs, {o.accelerator for o in options.values()})
    mx = build_matrix(jobs, options, cat, preemption=problem.preemption)
    eg = f.egress_table(jobs, options, cat)
    quotas = _quotas(problem, cat, options)
    started = time.perf_counter()
    if problem.objective == "max-throughput":
        sol = f.max_throughput(mx, quotas=quotas, budget_usd_per_h=problem.budget_usd_per_h)
        plan_jobs = _fractions_out(mx, sol.hours)
        value = sol.objective
    else:
        deadlines = np.array([j.slo_h if j.slo_h is not None else math.inf for j in jobs])
        if problem.objective == "min-makespan":
            assert problem.budget_usd is not None
            _min_cost(mx, eg, deadlines, quotas, problem.budget_usd)  # names unmeetable deadlines, quotas, budget
            makespan_h, sol = f.min_makespan(mx, eg, budget_usd=problem.budget_usd, quotas=quotas, deadlines_h=deadlines)
            value = makespan_h
        else:
            sol = _min_cost(mx, eg, deadlines, quotas, problem.budget_usd)
            value = sol.objective
        plan_jobs = _hours_out(mx, sol)
    total = sum(j.compute_usd or 0.0 for j in plan_jobs.values()) + sum(j.egress_usd for j in plan_jobs.values())
    makespan = max((j.duration_h for j in plan_jobs.values() if j.duration_h is not None), default=None)
    return CloudPlan(objective=problem.objective, catalogue=cat.name, options={k: options[k] for k in _used(plan_jobs)},
                     jobs=plan_jobs, total_usd=total, makespan_h=makespan, objective_value=value,
                     solve_time_s=time.perf_counter() - started, notes=_notes(spot_prices))


def _min_cost(mx: Matrix, eg: f.Egress, deadlines: np.ndarray, quotas: np.ndarray | None,
              budget_usd: float | None) -> f.Solution:
    sol = f.min_cost(mx, eg, deadlines_h=deadlines, quotas=quotas)
    if sol is None:
        fastest = mx.num_steps / mx.steps_per_h.max(axis=1)
        if quotas is None:  # jobs are independent: each misses only if its fastest option is too slow
            late = "; ".join(f"job {job}: slo_h={d:g} but it needs at least {h:.2f} h on "
                             f"{mx.option_keys[int(mx.steps_per_h[m].argmax())]}"
                             for m, (job, d, h) in enumerate(zip(mx.job_ids, deadlines, fastest)) if h > d * (1 + 1e-9))
            raise InfeasibleError(f"no allocation meets the deadlines: {late}; relax slo_h to at least these")
        if quotas is not None:
            stranded = [job for m, job in enumerate(mx.job_ids) if not (quotas[mx.runnable[m]] > 0).any()]
            if stranded:
                raise InfeasibleError(f"the quotas leave jobs {stranded} no instance type they can run on; raise the "
                                      "quotas (--quota) of the types their throughputs cover")
        scale = f.deadline_scale(mx, deadlines_h=deadlines, quotas=quotas)
        meetable = ", ".join(f"{job} {d * scale:.2f} h" for job, d in zip(mx.job_ids, deadlines) if math.isfinite(d))
        raise InfeasibleError(
            f"no allocation meets the deadlines (slo_h) within the quotas; they can be met all scaled by {scale:.4f}: "
            f"{meetable}; relax slo_h to these or raise the quotas")
    if budget_usd is not None and sol.objective > budget_usd * (1 + 1e-9):
        what = "allocation meeting the deadlines" if np.isfinite(deadlines).any() else "allocation of these jobs"
        raise InfeasibleError(f"the cheapest {what} costs ${sol.objective:,.2f}, above the budget ${budget_usd:,.2f}; "
                              f"{'relax the deadlines or ' if np.isfinite(deadlines).any() else ''}raise the budget "
                              f"to at least ${math.ceil(sol.objective * 100) / 100:,.2f}")
    return sol


def _quotas(problem: CloudProblem, cat: Catalogue, options: dict[str, Option]) -> np.ndarray | None:
    if not problem.quotas:
        return None
    out = np.full(len(options), np.inf)
    for name, count in problem.quotas.items():
        try:
            key = cat.instance(name).key
        except KeyError as e:
            raise InvalidProblemError(f"quotas: {e.args[0]}") from None
        for j, option in enumerate(options.values()):
            if option.instance == key:
                out[j] = count
    return out


def _notes(spot_prices: dict[str, float] | None) -> tuple[str, ...]:
    if not spot_prices:
        return ()
    return (f"spot prices of {len(spot_prices)} instance types are their time-weighted means over the given trace",)


def _fractions_out(mx: Matrix, x: np.ndarray) -> dict[str, JobAllocation]:
    out = {}
    for m, job in enumerate(mx.job_ids):
        thr_h = float(mx.steps_per_h[m] @ x[m])
        rate = float(mx.usd_per_h[m] @ x[m])
        duration = mx.num_steps[m] / thr_h if thr_h > 0 else None
        out[job] = JobAllocation(
            fractions=_nonzero(mx, x[m]), throughput_steps_per_s=thr_h / 3600.0, cost_usd_per_h=rate,
            duration_h=duration, compute_usd=rate * duration if duration is not None else None,
            jobs_per_instance=_packing(mx, m, x[m]))
    return out


def _hours_out(mx: Matrix, sol: f.Solution) -> dict[str, JobAllocation]:
    out = {}
    for m, job in enumerate(mx.job_ids):
        hours = sol.hours[m]
        duration = float(hours.sum())
        compute = float(mx.usd_per_h[m] @ hours)
        fractions = hours / duration if duration > 0 else hours
        out[job] = JobAllocation(
            fractions=_nonzero(mx, fractions), throughput_steps_per_s=mx.num_steps[m] / duration / 3600.0,
            cost_usd_per_h=compute / duration, duration_h=duration, compute_usd=compute,
            egress_usd=float(sol.egress_usd[m]), jobs_per_instance=_packing(mx, m, fractions))
    return out


def _nonzero(mx: Matrix, row: np.ndarray) -> dict[str, float]:
    return {mx.option_keys[j]: round(float(v), 6) for j, v in enumerate(row) if v > 5e-7}


def _packing(mx: Matrix, m: int, row: np.ndarray) -> dict[str, int]:
    return {mx.option_keys[j]: int(round(1 / mx.share[m, j])) for j, v in enumerate(row) if v > 5e-7}


def _used(jobs: dict[str, JobAllocation]) -> list[str]:
    return sorted({k for j in jobs.values() for k in j.fractions})
