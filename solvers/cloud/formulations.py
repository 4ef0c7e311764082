"""The three formulations of ch. 6 sec. 6.4 as LPs/MILPs on HiGHS (``scipy.optimize.milp``).

- ``max_throughput`` (sec. 6.4.1): maximize sum_m sum_j T_mj X_mj subject to sum_j X_mj <= 1,
  sum_m X_mj share_mj <= quota_j and, optionally, a spending rate sum c_mj X_mj <= budget/h.
- ``min_cost`` (sec. 6.4.2-6.4.3): the chapter's objective, a sum of samples-per-dollar
  ratios, is not convex; for one job maximizing the ratio is minimizing the job's dollars, so
  we minimize total dollars. With hours Y_mj = X_mj SLO_m spent by job m on option j the SLO
  constraint throughput_T(m, X) >= num_steps_m / SLO_m reads sum_j T_mj Y_mj >= num_steps_m,
  sum_j Y_mj <= SLO_m, the quota sum_m share_mj Y_mj / SLO_m <= quota_j, and the dollars
  sum_mj c_mj Y_mj are linear. Dataset and checkpoint egress add binaries z_mc (job m uses
  cloud c): the dataset's egress to every cloud but its own, and one checkpoint transfer per
  cloud beyond the first.
- ``min_makespan`` (sec. 6.4.3): the smallest M with num_steps_m / M <= throughput_T(m, X) and
  M sum_m cost_T(m, X) <= budget, by bisection on M (each M is the ``min_cost`` problem with
  every SLO = M; its optimum falls as M grows, so bisection is exact to the tolerance).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, milp

from planner.errors import InfeasibleError
from planner.schema_cloud import Catalogue, CloudJob, Option
from solvers.cloud.matrix import Matrix, egress_usd


@dataclass(frozen=True)
class Solution:
    """Hours (or time fractions for max-throughput) per job and option, and the dollars."""

    hours: np.ndarray
    egress_usd: np.ndarray
    objective: float


@dataclass(frozen=True)
class Egress:
    """Per job and cloud: dollars to enter the cloud; per job: one checkpoint move."""

    clouds: tuple[str, ...]
    enter_usd: np.ndarray
    checkpoint_usd: np.ndarray
    column_cloud: np.ndarray = field(repr=False)

    @property
    def active(self) -> np.ndarray:
        """Jobs with any egress cost (they get binaries)."""
        return (self.enter_usd.sum(axis=1) > 0) | (self.checkpoint_usd > 0)


def egress_table(jobs: tuple[CloudJob, ...], options: dict[str, Option], catalogue: Catalogue) -> Egress:
    clouds = tuple(sorted({o.cloud for o in options.values()}))
    enter = np.array([[egress_usd(job, c, catalogue) for c in clouds] for job in jobs]).reshape(len(jobs), len(clouds))
    top = max((catalogue.clouds[c].egress_usd_per_gb for c in clouds), default=0.0)
    ckpt = np.array([job.checkpoint_gb * top if len(clouds) > 1 else 0.0 for job in jobs])
    col = np.array([clouds.index(o.cloud) for o in options.values()])
    return Egress(clouds=clouds, enter_usd=enter, checkpoint_usd=ckpt, column_cloud=col)


def max_throughput(mx: Matrix, *, quotas: np.ndarray | None = None, budget_usd_per_h: float | None = None) -> Solution:
    """Sec. 6.4.1; returns time fractions X (in ``hours``) and the total steps per hour."""
    num_jobs, num_opts = mx.steps_per_h.shape
    n = num_jobs * num_opts
    upper = mx.runnable.astype(float).ravel()  # X_mj = 0 where job m cannot run on j
    rows, lower_b, upper_b = [], [], []
    # sum_j X_mj <= 1: a job is on one instance at a time
    rows.append(_per_job(num_jobs, num_opts))
    lower_b.append(np.full(num_jobs, -np.inf))
    upper_b.append(np.ones(num_jobs))
    if quotas is not None:  # sum_m share_mj X_mj <= quota_j (instances of type j)
        rows.append(_column_sums(mx.share))
        lower_b.append(np.full(num_opts, -np.inf))
        upper_b.append(quotas)
    if budget_usd_per_h is not None:  # spending rate sum c_mj X_mj <= budget per hour
        rows.append(mx.usd_per_h.ravel()[None, :])
        lower_b.append([-np.inf])
        upper_b.append([budget_usd_per_h])
    a, lo, hi, bounds = sp.vstack(rows).tocsr(), np.concatenate(lower_b), np.concatenate(upper_b), Bounds(np.zeros(n), upper)
    res = milp(-mx.steps_per_h.ravel(), constraints=LinearConstraint(a, lo, hi), bounds=bounds)
    _check(res, "max-throughput")
    best = -res.fun
    # second pass: the cheapest of the maximum-throughput allocations (ties are common: equal GPUs)
    keep = LinearConstraint(mx.steps_per_h.ravel()[None, :], [best * (1 - 1e-9)], [np.inf])
    cheap = milp(mx.usd_per_h.ravel(), constraints=[LinearConstraint(a, lo, hi), keep], bounds=bounds)
    x = cheap.x if cheap.status == 0 else res.x
    return Solution(hours=x.reshape(num_jobs, num_opts), egress_usd=np.zeros(num_jobs), objective=best)


def min_cost(mx: Matrix, eg: Egress, *, deadlines_h: np.ndarray, quotas: np.ndarray | None = None) -> Solution | None:
    """Sec. 6.4.2-6.4.3 in hours; None when no allocation meets the deadlines and quotas."""
    num_jobs, num_opts = mx.steps_per_h.shape
    active = np.flatnonzero(eg.active)
    num_clouds = len(eg.clouds)
    n_y, n_z = num_jobs * num_opts, len(active) * num_clouds
    thr = mx.steps_per_h
    with np.errstate(divide="ignore"):
        alone_h = np.where(mx.runnable, mx.num_steps[:, None] / np.where(thr > 0, thr, 1), 0.0)
    upper_y = np.minimum(alone_h, np.where(np.isfinite(deadlines_h), deadlines_h, np.inf)[:, None]).ravel()
    if quotas is not None:
        upper_y[np.tile(quotas == 0, num_jobs)] = 0.0  # no time at all on a type with a zero quota
    rows, lo, hi = [], [], []

    def add(block: np.ndarray, low: np.ndarray, high: np.ndarray) -> None:
        rows.append(sp.hstack([block, sp.csr_matrix((block.shape[0], n_z))]) if n_z else block)
        lo.append(low)
        hi.append(high)

    # work: sum_j T_mj Y_mj >= num_steps_m (the SLO constraint of sec. 6.4.3 times SLO_m)
    add(_per_job(num_jobs, num_opts, thr), mx.num_steps, np.full(num_jobs, np.inf))
    finite = np.isfinite(deadlines_h)
    if finite.any():  # one instance at a time: sum_j Y_mj <= SLO_m
        add(_per_job(num_jobs, num_opts)[finite], np.full(finite.sum(), -np.inf), deadlines_h[finite])
        if quotas is not None:  # sum_m share_mj Y_mj / SLO_m <= quota_j, times the longest SLO (scaling)
            longest = float(deadlines_h[finite].max())
            weights = np.where(finite, longest / np.where(finite, deadlines_h, 1.0), 0.0)[:, None] * mx.share
            add(_column_sums(weights), np.full(num_opts, -np.inf), quotas * longest)
    if n_z:  # Y_mj <= (hours alone on j) z_m,cloud(j): no time in a cloud the job does not enter
        link = _link_rows(active, eg.column_cloud, upper_y, num_opts=num_opts, num_clouds=num_clouds)
        rows.append(link)
        lo.append(np.full(link.shape[0], -np.inf))
        hi.append(np.zeros(link.shape[0]))
    cost_z = np.concatenate([eg.enter_usd[m] + eg.checkpoint_usd[m] for m in active]) if n_z else np.zeros(0)
    c = np.concatenate([mx.usd_per_h.ravel(), cost_z])
    integrality = np.concatenate([np.zeros(n_y), np.ones(n_z)])
    res = milp(c, constraints=LinearConstraint(sp.vstack(rows).tocsr(), np.concatenate(lo), np.concatenate(hi)),
               bounds=Bounds(np.zeros(n_y + n_z), np.concatenate([upper_y, np.ones(n_z)])), integrality=integrality)
    if res.status == 2 or res.x is None:
        return None
    _check(res, "min-cost")
    hours = res.x[:n_y].reshape(num_jobs, num_opts)
    egress = np.zeros(num_jobs)
    for a, m in enumerate(active):  # dataset into each entered cloud, a checkpoint per cloud beyond the first
        used = np.round(res.x[n_y + a * num_clouds: n_y + (a + 1) * num_clouds])
        egress[m] = float(used @ eg.enter_usd[m] + max(used.sum() - 1, 0) * eg.checkpoint_usd[m])
    return Solution(hours=hours, egress_usd=egress, objective=float((mx.usd_per_h * hours).sum() + egress.sum()))


def _link_rows(active: np.ndarray, column_cloud: np.ndarray, upper_y: np.ndarray, *, num_opts: int,
               num_clouds: int) -> sp.csr_matrix:
    """Rows Y_mj - upper_mj z_m,cloud(j) <= 0 for the jobs with egress (variables: all Y, then their z)."""
    n_y = len(upper_y)
    row = np.arange(len(active) * num_opts)
    y_col = (active[:, None] * num_opts + np.arange(num_opts)[None, :]).ravel()
    z_col = n_y + (np.arange(len(active))[:, None] * num_clouds + column_cloud[None, :]).ravel()
    return sp.csr_matrix((np.concatenate([np.ones(len(row)), -upper_y[y_col]]),
                          (np.concatenate([row, row]), np.concatenate([y_col, z_col]))),
                         shape=(len(row), n_y + len(active) * num_clouds))


def deadline_scale(mx: Matrix, *, deadlines_h: np.ndarray, quotas: np.ndarray | None) -> float:
    """The smallest factor alpha such that every deadline times alpha can be met (LP)."""
    num_jobs, num_opts = mx.steps_per_h.shape
    n = num_jobs * num_opts
    finite = np.isfinite(deadlines_h)
    block = _per_job(num_jobs, num_opts)
    rows = [sp.hstack([_per_job(num_jobs, num_opts, mx.steps_per_h), sp.csr_matrix((num_jobs, 1))]),
            sp.hstack([block[finite], -deadlines_h[finite][:, None]])]  # sum_j Y_mj <= alpha SLO_m
    lo = [mx.num_steps, np.full(finite.sum(), -np.inf)]
    hi = [np.full(num_jobs, np.inf), np.zeros(finite.sum())]
    if quotas is not None and np.isfinite(quotas).any():
        longest = float(deadlines_h[finite].max()) if finite.any() else 1.0
        weights = np.where(finite, longest / np.where(finite, deadlines_h, 1.0), 0.0)[:, None] * mx.share
        limited = np.isfinite(quotas)
        rows.append(sp.hstack([_column_sums(weights)[limited], -longest * quotas[limited][:, None]]))
        lo.append(np.full(limited.sum(), -np.inf))
        hi.append(np.zeros(limited.sum()))
    c = np.concatenate([np.zeros(n), [1.0]])
    res = milp(c, constraints=LinearConstraint(sp.vstack(rows).tocsr(), np.concatenate(lo), np.concatenate(hi)),
               bounds=Bounds(np.zeros(n + 1), np.concatenate([mx.runnable.astype(float).ravel() * 1e12, [np.inf]])))
    _check(res, "deadline scale")
    return float(res.x[-1])


def min_makespan(mx: Matrix, eg: Egress, *, budget_usd: float, quotas: np.ndarray | None = None,
                 deadlines_h: np.ndarray | None = None, rel_tol: float = 1e-6) -> tuple[float, Solution]:
    """Sec. 6.4.3: bisection for the smallest makespan M (hours) whose cheapest allocation fits the budget.

    Jobs with their own deadline (``deadlines_h``, inf = none) keep it when it is below M.

    Raises:
        InfeasibleError: no makespan fits the budget (the message gives the cheapest feasible budget).
    """
    own = np.full(len(mx.job_ids), np.inf) if deadlines_h is None else deadlines_h

    def fits(m_h: float) -> Solution | None:
        sol = min_cost(mx, eg, deadlines_h=np.minimum(own, m_h), quotas=quotas)
        return sol if sol is not None and sol.objective <= budget_usd * (1 + 1e-9) else None

    cheapest = min_cost(mx, eg, deadlines_h=own, quotas=quotas)
    if cheapest is None:
        raise InfeasibleError("no makespan fits: the jobs' own deadlines or the quotas cannot be met at any "
                              "makespan; plan with --objective min-cost to see which")
    if cheapest.objective > budget_usd * (1 + 1e-9):
        longest = float(cheapest.hours.sum(axis=1).max())
        raise InfeasibleError(
            f"budget ${budget_usd:,.2f} is below the cheapest allocation of these jobs, ${cheapest.objective:,.2f} "
            f"(makespan {longest:.2f} h); raise the budget to at least ${math.ceil(cheapest.objective * 100) / 100:,.2f}")
    lo = float((mx.num_steps / mx.steps_per_h.max(axis=1)).max())
    best = fits(lo)
    if best is not None:
        return lo, best
    hi = lo * 2
    while (best := fits(hi)) is None:
        assert hi < lo * 2**80, "min_cost at a long makespan reaches the cheapest allocation"
        hi *= 2
    while hi - lo > rel_tol * hi:
        mid = (lo + hi) / 2
        sol = fits(mid)
        if sol is None:
            lo = mid
        else:
            hi, best = mid, sol
    return hi, best


def min_makespan_lp(mx: Matrix, *, budget_usd: float, quotas: np.ndarray | None = None) -> float:
    """The same optimum as one LP in (Y, M), without egress: an oracle for the bisection."""
    num_jobs, num_opts = mx.steps_per_h.shape
    n = num_jobs * num_opts
    block = _per_job(num_jobs, num_opts)
    rows = [sp.hstack([_per_job(num_jobs, num_opts, mx.steps_per_h), sp.csr_matrix((num_jobs, 1))]),
            sp.hstack([block, -np.ones((num_jobs, 1))]),
            sp.csr_matrix(np.concatenate([mx.usd_per_h.ravel(), [0.0]])[None, :])]
    lo = [mx.num_steps, np.full(num_jobs, -np.inf), [-np.inf]]
    hi = [np.full(num_jobs, np.inf), np.zeros(num_jobs), [budget_usd]]
    if quotas is not None and np.isfinite(quotas).any():
        limited = np.isfinite(quotas)
        rows.append(sp.hstack([_column_sums(mx.share)[limited], -quotas[limited][:, None]]))
        lo.append(np.full(limited.sum(), -np.inf))
        hi.append(np.zeros(limited.sum()))
    c = np.concatenate([np.zeros(n), [1.0]])
    res = milp(c, constraints=LinearConstraint(sp.vstack(rows).tocsr(), np.concatenate(lo), np.concatenate(hi)),
               bounds=Bounds(np.zeros(n + 1), np.concatenate([mx.runnable.astype(float).ravel() * 1e12, [np.inf]])))
    _check(res, "min-makespan LP")
    return float(res.x[-1])


def _per_job(num_jobs: int, num_opts: int, values: np.ndarray | None = None) -> sp.csr_matrix:
    """Rows m: sum over options j of values_mj x var_mj (variables flattened job-major)."""
    data = np.ones(num_jobs * num_opts) if values is None else values.ravel()
    return sp.csr_matrix((data, (np.repeat(np.arange(num_jobs), num_opts), np.arange(num_jobs * num_opts))),
                         shape=(num_jobs, num_jobs * num_opts))


def _column_sums(weights: np.ndarray) -> sp.csr_matrix:
    """Rows j: sum over jobs m of weights_mj x var_mj (variables flattened job-major)."""
    num_jobs, num_opts = weights.shape
    return sp.csr_matrix((weights.ravel(), (np.tile(np.arange(num_opts), num_jobs), np.arange(num_jobs * num_opts))),
                         shape=(num_opts, num_jobs * num_opts))


def _check(res: object, what: str) -> None:
    status = getattr(res, "status", None)
    if status != 0:
        raise InfeasibleError(f"{what}: HiGHS ended with status {status} ({getattr(res, 'message', '')})")
