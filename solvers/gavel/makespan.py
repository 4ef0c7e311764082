"""Minimize makespan (``min_total_duration``), dissertation ch. 5 L5424-5441.

    minimize_X  max_m  num_steps_m / thr_m(X)

is the LP ``maximize z s.t. thr_m(X) >= z num_steps_m`` with makespan 1/z (reading sec. 2.3,
[DERIVED]); Gavel's code bisects on the makespan with a feasibility LP instead, which gives
the same optimum. The objective reported is the makespan in seconds if the allocation were
held until every job finished.
"""

from __future__ import annotations

import numpy as np

from solvers.gavel.common import Formulation
from solvers.gavel.max_min_fairness import agnostic_formulation, spread_or_keep


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
