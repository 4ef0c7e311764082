"""Max-min fairness (least attained service), agnostic, heterogeneity-aware and packed.

Dissertation ch. 5: homogeneous LAS L5285-5310, heterogeneity-aware LAS L5320-5344, with
weights and scale factors L5389-5409, space sharing L5139-5196. The LP is

    maximize z  s.t.  (scale_factor_m / w_m) * thr_m(X) / thr_m(X^equal) >= z   for all m

with the validity constraints (5.1)-(5.3). X^equal_mj = num_workers_j / total workers
(reading sec. 2.9 item 1), so on one accelerator type the ratio is X_m and the policy is
Tiresias-style LAS. Gavel's code normalizes by the throughput under the isolated allocation
X^iso instead (``MaxMinFairnessPolicyWithPerf``: the agnostic LAS allocation's throughput),
option ``las_normalizer="isolated"`` (``Formulation.thr_fair``): the two differ per job by
n x scale_factor_m / total workers, so they agree when every job has the same scale factor,
and Gavel's weighs a multi-GPU job by scale_factor_m^2 where the text's weighs it by
scale_factor_m (which keeps the sharing incentive; docs/gavel-simulator.md). The agnostic
policy solves the same LP with every type given the job's X^equal throughput (it cannot tell
types apart) and spreads each job's time share over the types in proportion to their
capacity, which is what a heterogeneity-blind scheduler achieves on average.

Two backends build the same LP: ``cvxpy`` (the readable reference below) and ``direct``
(scipy.sparse matrices handed to HiGHS's interior-point solver through highspy), which skips
cvxpy's compilation and meets the ~0.05 s target for 1,024 jobs (docs/gavel-scaling.md).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from planner.errors import InfeasibleError
from solvers.gavel.common import Formulation, repair, spread_by_capacity


def fairness_coefficients(f: Formulation) -> np.ndarray:
    """scale_factor_m / (w_m thr_m(X^equal)): the text's fairness level (water-filling)."""
    return f.scale / (f.weight * f.thr_equal)


def las_coefficients(f: Formulation) -> np.ndarray:
    """scale_factor_m / (w_m thr_fair_m): the max-min LP's level (thr_fair: X^equal or X^iso)."""
    return f.scale / (f.weight * f.thr_fair)


def solve_cvxpy(f: Formulation, *, policy: str) -> tuple[np.ndarray, float]:
    """The max-min LP written in cvxpy (the reference formulation)."""
    import cvxpy as cp

    from solvers.gavel.lp import Program, solve_program

    prog = Program(f)
    z = cp.Variable()
    # L5389-5409: every job's weighted, scaled, normalized throughput is at least z
    fair = [cp.multiply(las_coefficients(f), prog.thr) >= z]
    return solve_program(prog, cp.Maximize(z), fair, policy=policy)


def solve_direct(f: Formulation, *, policy: str) -> tuple[np.ndarray, float]:
    """The same LP as ``solve_cvxpy`` built as sparse matrices for HiGHS (no cvxpy compile).

    HiGHS's interior-point method without crossover is about 2.5x faster than its simplex on
    this LP (one dense column z); ``repair`` removes the interior point's round-off.
    """
    num_x = f.num_combos * len(f.types)
    values = highs_ipm(*direct_lp(f), policy=policy)
    x = values[:num_x].reshape((f.num_combos, len(f.types)), order="F")
    return repair(f, x), float(values[-1])


def direct_lp(f: Formulation) -> tuple[np.ndarray, sp.csc_matrix, np.ndarray, np.ndarray]:
    """``solve_direct``'s LP as (cost, A_ub, b_ub, upper): minimize cost @ v s.t. A_ub v <= b_ub,
    0 <= v <= upper, over v = (vec(X), z)."""
    n = f.num_jobs
    a_ub = _constraint_matrix(f, las_coefficients(f))
    b_ub = np.concatenate([np.ones(n), f.capacity, np.zeros(n)])
    upper = np.append(f.mask.reshape(-1, order="F"), np.inf)  # (5.1)
    cost = np.zeros(len(upper))
    cost[-1] = -1.0
    return cost, a_ub, b_ub, upper


def _constraint_matrix(f: Formulation, coefficients: np.ndarray) -> sp.csc_matrix:
    """The rows of ``solve_direct``'s LP over columns vec(X) (index k + j K) and z, assembled in one
    coordinate list (no block stacking):

    - job m's time, (5.2): sum over the combinations k holding m and every type j of X_kj <= 1;
    - type j's capacity, (5.3): sum_k scale_k X_kj <= capacity_j;
    - job m's level: z - coefficient_m thr_m(X) <= 0.
    """
    num_k, num_j, n = f.num_combos, len(f.types), f.num_jobs
    member, thr = f.membership().tocoo(), f.throughput_matrix().tocoo()
    shift = num_k * np.arange(num_j)
    scaled = np.nonzero(f.combo_scale)[0]
    rows = np.concatenate([np.tile(member.row, num_j), n + np.repeat(np.arange(num_j), len(scaled)),
                           n + num_j + thr.row, n + num_j + np.arange(n)])
    cols = np.concatenate([(member.col[None, :] + shift[:, None]).ravel(), (scaled[None, :] + shift[:, None]).ravel(),
                           thr.col, np.full(n, num_k * num_j)])
    values = np.concatenate([np.ones(len(member.row) * num_j), np.tile(f.combo_scale[scaled], num_j),
                             -coefficients[thr.row] * thr.data, np.ones(n)])
    a_ub = sp.csc_matrix((values, (rows, cols)), shape=(2 * n + num_j, num_k * num_j + 1))
    a_ub.sort_indices()
    return a_ub


def highs_ipm(cost: np.ndarray, a_ub: sp.csc_matrix, b_ub: np.ndarray, upper: np.ndarray, *, policy: str) -> np.ndarray:
    """minimize cost @ v s.t. a_ub v <= b_ub, 0 <= v <= upper, with HiGHS's IPM (no crossover).

    HiGHS's presolve stays on: on the max-min LP it only drops the columns fixed at zero, but
    on small ones it reduces more, and skipping it moves the interior point by round-off, which
    flips the simulator's exact ties (tests/solvers/gavel/test_mechanism_gavel.py).
    """
    import highspy

    inf = highspy.kHighsInf
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("solver", "ipm")
    h.setOptionValue("run_crossover", "off")
    # the arrays go to HiGHS as numpy buffers (a HighsLp's fields would copy them element by element)
    num_row, num_col = a_ub.shape
    passed = h.passModel(
        num_col, num_row, a_ub.nnz, int(highspy.MatrixFormat.kColwise), int(highspy.ObjSense.kMinimize), 0.0,
        np.ascontiguousarray(cost, dtype=float), np.zeros(num_col), np.where(np.isfinite(upper), upper, inf),
        np.full(num_row, -inf), np.ascontiguousarray(b_ub, dtype=float), a_ub.indptr.astype(np.int32, copy=False),
        a_ub.indices.astype(np.int32, copy=False), np.ascontiguousarray(a_ub.data, dtype=float),
        np.zeros(num_col, dtype=np.int32),  # every column continuous
    )
    assert passed == highspy.HighsStatus.kOk, f"HiGHS refused the LP ({passed})"
    h.run()
    status = h.getModelStatus()
    if status != highspy.HighsModelStatus.kOptimal:
        raise InfeasibleError(f"policy {policy!r}: HiGHS ended with status {h.modelStatusToString(status)}")
    return np.asarray(h.getSolution().col_value)


def max_min_perf(f: Formulation, *, policy: str, backend: str = "direct") -> tuple[np.ndarray, float]:
    """Heterogeneity-aware (and, with pair rows in ``f``, space-sharing) max-min fairness."""
    solve = solve_cvxpy if backend == "cvxpy" else solve_direct
    return solve(f, policy=policy)


def agnostic_formulation(f: Formulation) -> Formulation:
    """What a heterogeneity-blind policy sees: every usable type gives the X^equal throughput."""
    return f.with_throughput(np.where(f.throughput > 0, f.thr_equal[:, None], 0.0))


def spread_or_keep(f: Formulation, x: np.ndarray) -> np.ndarray:
    """Spread each job's time share by capacity when that fits (5.3); else keep the LP's X."""
    spread = spread_by_capacity(f, x.sum(axis=1))
    if np.all(f.scale @ spread <= f.capacity * (1 + 1e-9)):
        return repair(f, spread)
    return x


def max_min_agnostic(f: Formulation, *, policy: str, backend: str = "direct") -> tuple[np.ndarray, float]:
    """Heterogeneity-agnostic LAS (L5285-5310): equalizes scaled time shares, not throughput.

    Normalized by thr(X^equal), i.e. not at all in the agnostic view (as Gavel's code: throughput
    1 on every type and no normalization), whichever ``thr_fair`` the aware policy uses.
    """
    g = agnostic_formulation(f).with_las_normalizer("equal")
    x, z = max_min_perf(g, policy=policy, backend=backend)
    return spread_or_keep(g, x), z
