"""Minimize makespan (``min_total_duration``), dissertation ch. 5 L5424-5441.

    minimize_X  max_m  num_steps_m / thr_m(X)

is the LP ``maximize z s.t. thr_m(X) >= z num_steps_m`` with makespan 1/z (reading sec. 2.3,
[DERIVED]); Gavel's code bisects on the makespan with a feasibility LP instead, stopping within
5% of the optimum and keeping its interior-point solver's point of that feasible set (spread
over the types, where the exact LP gives a vertex): option ``makespan="bisection"``
(``min_total_duration_bisection``, the ``gavel`` simulation mechanism's default). The objective
reported is the makespan in seconds if the allocation were held until every job finished.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from solvers.gavel.common import Formulation, gavel_bisection, repair
from solvers.gavel.max_min_fairness import agnostic_formulation, highs_ipm, spread_or_keep


def min_total_duration_perf(f: Formulation, *, policy: str) -> tuple[np.ndarray, float]:
    """Heterogeneity-aware makespan (space sharing when ``f`` has pair rows)."""
    import cvxpy as cp

    from solvers.gavel.lp import Program, solve_program

    prog = Program(f)
    z = cp.Variable(nonneg=True)  # 1 / makespan in 1/hours (hours keep HiGHS well scaled)
    # L5424-5441: every job finishes its num_steps within the makespan 1/z
    finish = [prog.thr >= z * (f.num_steps / 3600.0)]
    x, value = solve_program(prog, cp.Maximize(z), finish, policy=policy)
    return x, (3600.0 / value if value > 0 else float("inf"))


def min_total_duration(f: Formulation, *, policy: str) -> tuple[np.ndarray, float]:
    """Heterogeneity-agnostic makespan: types look alike, time spread by capacity."""
    g = agnostic_formulation(f)
    x, value = min_total_duration_perf(g, policy=policy)
    return spread_or_keep(g, x), value


def gavel_bisection_s(optimum_s: float) -> float:
    """The makespan Gavel's bisection settles on (``common.gavel_bisection``) when every T at or above
    the optimum is feasible: the smallest feasible T it tries (T >= the optimum)."""
    found = gavel_bisection(lambda t: True if t >= optimum_s * (1 + 1e-9) else None)
    assert found is not None
    return found[0]


def min_total_duration_bisection(f: Formulation, *, policy: str) -> tuple[np.ndarray, float]:
    """Gavel's code's makespan policy: an interior point of {X: (5.1)-(5.3), thr_m(X) >= N_m / T}
    at the T its bisection reaches (HiGHS's interior-point method without crossover)."""
    _, optimum_s = min_total_duration_perf(f, policy=policy)
    target_s = gavel_bisection_s(optimum_s)
    num_k, num_j = f.num_combos, len(f.types)
    a_ub = sp.vstack([
        sp.hstack([f.membership()] * num_j),  # (5.2)
        sp.kron(sp.eye(num_j), sp.csr_matrix(f.combo_scale[None, :])),  # (5.3)
        -f.throughput_matrix(),  # every job done within target_s
    ]).tocsc()
    b_ub = np.concatenate([np.ones(f.num_jobs), f.capacity, -f.num_steps / target_s])
    values = highs_ipm(np.zeros(num_k * num_j), a_ub, b_ub, f.mask.reshape(-1, order="F"), policy=policy)
    return repair(f, values.reshape((num_k, num_j), order="F")), target_s


def min_total_duration_bisection_agnostic(f: Formulation, *, policy: str) -> tuple[np.ndarray, float]:
    """The agnostic view of ``min_total_duration_bisection``."""
    g = agnostic_formulation(f)
    x, value = min_total_duration_bisection(g, policy=policy)
    return spread_or_keep(g, x), value
