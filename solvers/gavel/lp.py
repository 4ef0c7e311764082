"""cvxpy pieces every Gavel policy shares: the allocation variable and constraints (5.1)-(5.3).

Dissertation ch. 5, L5113-5137 (validity) and L5168-5196 (their space-sharing form). Each
policy module builds ``Program(f)``, adds its objective and constraints, and calls
``solve_program``; the status is checked, never assumed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import cvxpy as cp
import numpy as np

from planner.errors import InfeasibleError
from solvers.gavel.common import Formulation, repair

log = logging.getLogger(__name__)

# HiGHS for LPs and MILPs; CLARABEL for the conic problems (inv_pos in finish-time fairness).
LP_SOLVER = "HIGHS"
CONIC_SOLVER = "CLARABEL"


@dataclass
class Program:
    """The allocation X (K combinations x J types), its effective throughput, and (5.1)-(5.3)."""

    f: Formulation
    x: cp.Variable = field(init=False)
    thr: cp.Expression = field(init=False)
    constraints: list[cp.Constraint] = field(init=False)

    def __post_init__(self) -> None:
        f = self.f
        self.x = cp.Variable((f.num_combos, len(f.types)), nonneg=True)
        self.thr = f.throughput_matrix() @ cp.vec(self.x, order="F")
        self.constraints = [
            # (5.1) 0 <= X_kj <= 1, and 0 where no member of k can run on j (T = -inf, L5088-5092)
            self.x <= f.mask,
            # (5.2) each job's time over all its combinations and types is at most one
            f.membership() @ cp.sum(self.x, axis=1) <= 1,
            # (5.3) accelerators of type j in use: sum_k X_kj scale_factor_k <= num_workers_j
            self.x.T @ f.combo_scale <= f.capacity,
        ]


def solve_program(
    prog: Program, objective: cp.Objective, extra: list[cp.Constraint], *, policy: str, solver: str = LP_SOLVER
) -> tuple[np.ndarray, float]:
    """Solve; return the repaired X and the objective value.

    Raises:
        InfeasibleError: the solver found no optimum (status named in the message).
    """
    problem = cp.Problem(objective, prog.constraints + extra)
    problem.solve(solver=solver)
    if problem.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) or prog.x.value is None:
        raise InfeasibleError(f"policy {policy!r}: the solver ended with status {problem.status!r}")
    if problem.status == cp.OPTIMAL_INACCURATE:
        log.warning("policy %s: solver %s reports an inaccurate optimum", policy, solver)
    return repair(prog.f, np.asarray(prog.x.value)), float(problem.value)
