"""Finish-time fairness (Themis), dissertation ch. 5 L5443-5477.

    rho_m(X) = (t_m + num_steps_m / thr_m(X)) / (t^iso_m + num_steps_m / thr_m(X^iso))
    minimize_X  max_m rho_m(X)

t_m is the time since job m arrived (``Job.elapsed_s``). X^iso gives each job 1/n of the
cluster (``common.build``: (num_workers_j / n) / scale_factor_m, rows scaled to at most one,
reading sec. 2.9 item 2). The text leaves t^iso_m (the elapsed time had the job always held its
isolated share) to bookkeeping; paraplan takes t^iso_m = t_m, i.e. it treats the past as
fair and equalizes the future. rho is convex in X because 1/thr is (L5470-5473), so the
problem is solved directly with cvxpy's ``inv_pos`` on CLARABEL, as Gavel's code does,
rather than by bisection.
"""

from __future__ import annotations

import numpy as np

from solvers.gavel.common import Formulation
from solvers.gavel.max_min_fairness import agnostic_formulation, spread_or_keep


def finish_time_fairness_perf(f: Formulation, *, policy: str) -> tuple[np.ndarray, float]:
    """Heterogeneity-aware FTF: minimize the largest finish-time ratio rho_m."""
    import cvxpy as cp

    from solvers.gavel.lp import CONIC_SOLVER, Program, solve_program

    prog = Program(f)
    denom_s = f.elapsed_s + f.num_steps / f.thr_isolated  # Themis's denominator D_m
    rho_max = cp.Variable()
    # L5456-5468: rho_m = t_m / D_m + (num_steps_m / D_m) / thr_m(X) <= rho_max for every job
    ratio = [f.elapsed_s / denom_s + cp.multiply(f.num_steps / denom_s, cp.inv_pos(prog.thr)) <= rho_max]
    return solve_program(prog, cp.Minimize(rho_max), ratio, policy=policy, solver=CONIC_SOLVER)


def finish_time_fairness(f: Formulation, *, policy: str) -> tuple[np.ndarray, float]:
    """Heterogeneity-agnostic FTF: rho computed as if every type ran at the X^equal speed."""
    g = agnostic_formulation(f)
    x, value = finish_time_fairness_perf(g, policy=policy)
    return spread_or_keep(g, x), value
