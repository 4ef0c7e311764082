"""Gavel's policies as its own code states them, solved with ECOS (option ``lp_solver="ecos"``).

Several of Gavel's LPs have many optimal allocations (agnostic LAS whenever a job's share is
capped at one, the makespan policy's feasibility sets), and the round mechanism turns each
into different rounds. Gavel's simulator takes whichever point cvxpy + ECOS, an interior-point
solver, returns: roughly the centre of the optimal face *of its own formulation*, so other
constraint sets (a bound X <= 1, a vertex from simplex, another interior-point code) give
other points. To reproduce its runs the policies here are written as [gavel-code]'s policies
state them (same variables, constraints, objective expressions and data) and solved with
ECOS, the solver its simulator uses; HiGHS stays the default everywhere else.

Gavel's formulation ([gavel-code], ``scheduler/policies``; [narayanan-thesis] ch. 5 sec. 5.3):
X is (jobs in id order) x (types sorted by name), constraints X >= 0, sum_m s_m X_mj <= N_j
and sum_j X_mj <= 1 (no X <= 1 bound); the returned X is clipped to [0, 1] and nothing else.

- LAS, agnostic: every throughput 1, maximize min_m (s_m / w_m) sum_j X_mj.
- LAS, aware: maximize min_m (s_m / (w_m thr_m(X^iso))) sum_j T_mj X_mj, with X^iso the
  agnostic LAS point (ECOS's) and thr_m(X^iso) = sum_j T_mj X^iso_mj.
- Finish-time fairness: minimize max_m (t_m + N_m / thr_m(X)) / (t_m + N_m / thr_m(X^iso)),
  N_m remaining steps, t_m seconds since arrival; the agnostic form with every throughput 1.
- Makespan: bisection on T in [100 s, 1e6 s] (x10 while none is feasible), halving until the
  bracket is within 5%, each step the feasibility problem thr_m(X) >= N_m / T with a constant
  objective; keeps ECOS's point of the last feasible T.

The module imports cvxpy (and needs ``ecos``) only when a policy runs.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np

from planner.errors import InvalidProblemError
from solvers.gavel.common import Formulation, gavel_bisection

log = logging.getLogger(__name__)

ECOS_PIN = "ecos==2.0.14"
INSTALL_HINT = f"pip install '{ECOS_PIN}' (or the project's `ecos` extra)"


def require_ecos() -> None:
    """Raises InvalidProblemError (CLI exit 2) naming the install when ECOS is missing."""
    try:
        import ecos  # noqa: F401
    except ImportError:
        raise InvalidProblemError(f"lp_solver='ecos' needs the ECOS solver, which is not installed; {INSTALL_HINT}, "
                                  "or use lp_solver='highs'") from None


def _sorted_types(f: Formulation) -> np.ndarray:
    """Column permutation to Gavel's order (type names sorted)."""
    return np.array(sorted(range(len(f.types)), key=lambda j: f.types[j]), dtype=int)


def _unsort(f: Formulation, x_sorted: np.ndarray, perm: np.ndarray) -> np.ndarray:
    x = np.zeros((f.num_jobs, len(f.types)))
    x[:, perm] = x_sorted
    return x


def _base(x, scale: np.ndarray, capacity: np.ndarray, f: Formulation) -> list:  # type: ignore[no-untyped-def]
    """X >= 0, sum_m s_m X_mj <= N_j, sum_j X_mj <= 1, in Gavel's order; plus X = 0 where a job
    cannot run (never the case in Gavel's traces, whose jobs run on every type: its code has no such row)."""
    import cvxpy as cp

    constraints = [x >= 0, cp.sum(cp.multiply(scale, x), axis=0) <= list(capacity), cp.sum(x, axis=1) <= 1]
    unusable = f.throughput[:, _sorted_types(f)] <= 0
    if unusable.any():
        constraints.append(cp.multiply(unusable.astype(float), x) == 0)
    return constraints


def _solve(objective, constraints, x, *, policy: str) -> tuple[np.ndarray, float]:  # type: ignore[no-untyped-def]
    """Solve with ECOS; returns (X clipped to [0, 1], objective). Gavel warns and keeps the
    point when the status is not optimal; so does this (logged)."""
    import cvxpy as cp

    require_ecos()
    problem = cp.Problem(objective, constraints)
    with warnings.catch_warnings():  # an inaccurate optimum is logged below, not warned on stderr
        warnings.filterwarnings("ignore", message="Solution may be inaccurate")
        problem.solve(solver="ECOS")
    if x.value is None:
        raise InvalidProblemError(f"policy {policy!r}: ECOS returned no point (status {problem.status!r})")
    if problem.status != cp.OPTIMAL:
        log.info("policy %s: ECOS status %s; its point is used, as Gavel's code does", policy, problem.status)
    return np.asarray(x.value).clip(min=0.0).clip(max=1.0), float(problem.value)


def _data(f: Formulation, throughput: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(T, scale array, 1/w, capacity) in Gavel's column order; T = 1 everywhere when None."""
    if any(len(c) > 1 for c in f.combos):
        raise InvalidProblemError("lp_solver='ecos' solves single-job allocations only; drop the space-sharing pairs "
                                  "or use lp_solver='highs'")
    perm = _sorted_types(f)
    thr = np.ones((f.num_jobs, len(f.types))) if throughput is None else throughput[:, perm]
    scale = np.repeat(f.scale[:, None], len(f.types), axis=1)
    return thr, scale, np.array([1.0 / w for w in f.weight]), f.capacity[perm]


def las_agnostic(f: Formulation, *, policy: str) -> tuple[np.ndarray, float]:
    """Agnostic LAS: equal weighted, scaled time shares, every type alike."""
    x, value = _las(f, None, np.ones(f.num_jobs), policy=policy)
    return _unsort(f, x, _sorted_types(f)), value


def _las(
    f: Formulation, throughput: np.ndarray | None, iso_thr: np.ndarray, *, policy: str
) -> tuple[np.ndarray, float]:
    import cvxpy as cp

    thr, scale, inv_w, capacity = _data(f, throughput)
    weights = np.multiply(inv_w.reshape((-1, 1)), 1.0 / iso_thr.reshape((-1, 1)))
    x = cp.Variable(thr.shape)
    coefficient = np.multiply(thr * weights.reshape((-1, 1)), scale)
    objective = cp.Maximize(cp.min(cp.sum(cp.multiply(coefficient, x), axis=1)))
    return _solve(objective, _base(x, scale, capacity, f), x, policy=policy)


def _isolated_thr(f: Formulation, *, policy: str) -> np.ndarray:
    """thr_m(X^iso) with X^iso the agnostic LAS point, on the real throughputs."""
    thr, *_ = _data(f, f.throughput)
    x_iso, _ = _las(f, None, np.ones(f.num_jobs), policy=policy)
    return np.sum(np.multiply(thr, x_iso), axis=1)


def las_perf(f: Formulation, *, policy: str) -> tuple[np.ndarray, float]:
    """Heterogeneity-aware LAS normalized by thr(X^iso) (Gavel's ``MaxMinFairnessPolicyWithPerf``)."""
    x, value = _las(f, f.throughput, _isolated_thr(f, policy=policy), policy=policy)
    return _unsort(f, x, _sorted_types(f)), value


def _ftf(
    f: Formulation, throughput: np.ndarray | None, iso_thr: np.ndarray, *, policy: str
) -> tuple[np.ndarray, float]:
    import cvxpy as cp

    thr, scale, _, capacity = _data(f, throughput)
    x = cp.Variable(thr.shape)
    fractions = []
    for m in range(f.num_jobs):
        alloc_thr = cp.sum(cp.multiply(thr[m], x[m]))
        isolated_s = f.elapsed_s[m] + f.num_steps[m] / iso_thr[m]
        allocated_s = f.elapsed_s[m] + f.num_steps[m] * cp.inv_pos(alloc_thr)
        fractions.append(allocated_s / isolated_s)
    objective = cp.Minimize(fractions[0] if len(fractions) == 1 else cp.maximum(*fractions))
    return _solve(objective, _base(x, scale, capacity, f), x, policy=policy)


def ftf_perf(f: Formulation, *, policy: str) -> tuple[np.ndarray, float]:
    """Heterogeneity-aware finish-time fairness (Gavel's ``FinishTimeFairnessPolicyWithPerf``)."""
    x, value = _ftf(f, f.throughput, _isolated_thr(f, policy=policy), policy=policy)
    return _unsort(f, x, _sorted_types(f)), value


def ftf_agnostic(f: Formulation, *, policy: str) -> tuple[np.ndarray, float]:
    """Agnostic finish-time fairness: every throughput 1 (steps counted at one step per second)."""
    x_iso, _ = _las(f, None, np.ones(f.num_jobs), policy=policy)
    x, value = _ftf(f, None, x_iso.sum(axis=1), policy=policy)
    return _unsort(f, x, _sorted_types(f)), value


def _feasible(f: Formulation, target_s: float, *, policy: str) -> np.ndarray | None:
    """ECOS's point of {X: base constraints, thr_m(X) >= N_m / T}, or None unless 'optimal'."""
    import cvxpy as cp

    require_ecos()
    thr, scale, _, capacity = _data(f, f.throughput)
    x = cp.Variable(thr.shape)
    finish = cp.sum(cp.multiply(thr, x), axis=1) >= f.num_steps / target_s
    problem = cp.Problem(cp.Maximize(1), _base(x, scale, capacity, f) + [finish])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Solution may be inaccurate")
        problem.solve(solver="ECOS")
    if problem.status != cp.OPTIMAL:
        return None
    return np.asarray(x.value).clip(min=0.0).clip(max=1.0)


def makespan_bisection(f: Formulation, *, policy: str) -> tuple[np.ndarray, float]:
    """Gavel's makespan policy: the bisection above, ECOS's point at the last feasible T."""
    found = gavel_bisection(lambda t: _feasible(f, t, policy=policy), limit_s=1e12)
    if found is None:
        raise InvalidProblemError(f"policy {policy!r}: no makespan below 1e12 s is feasible")
    target_s, x = found
    return _unsort(f, x, _sorted_types(f)), target_s
