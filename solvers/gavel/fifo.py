"""FIFO and shortest-job-first as LPs, dissertation ch. 5 L5479-5512.

FIFO (L5479-5500):

    maximize_X  sum_m  thr_m(X) / thr_m(X^fastest) * (M - m)

with jobs numbered m = 0..M-1 in arrival order. The text numbers jobs from 1, which gives
the last job weight 0 and so no accelerator time; the 0-based index fixes that (reading sec. 2.9
item 5). Ties in arrival time keep the input order. Gavel's code runs FIFO as a greedy
heuristic instead of this LP (``fifo_greedy_perf``, option ``fifo="greedy"``, the ``gavel``
simulation mechanism's default); the LP is what the chapter states, and like the greedy it
serves earlier jobs first at equal normalized throughput.

Shortest job first (L5502-5512) is written "minimize_X min_m num_steps_m / thr_m(X)", a
min-of-min that is degenerate as a policy (it rewards finishing one job fast and nothing
else; reading sec. 2.9 item 4). paraplan settles it as FIFO's LP with jobs ordered by their
shortest possible remaining time num_steps_m / thr_m(X^fastest) (the agnostic variant uses
the X^equal throughput), so the shortest job gets the highest weight.
"""

from __future__ import annotations

import numpy as np

from solvers.gavel.common import Formulation
from solvers.gavel.max_min_fairness import agnostic_formulation, spread_or_keep


def ordered_weights(order_key: np.ndarray) -> np.ndarray:
    """(M - m) for each job, m its 0-based rank by ``order_key`` (stable: ties keep input order)."""
    rank = np.empty(len(order_key), dtype=int)
    rank[np.argsort(order_key, kind="stable")] = np.arange(len(order_key))
    return (len(order_key) - rank).astype(float)


def priority_lp(f: Formulation, weights: np.ndarray, normalizer: np.ndarray, *, policy: str) -> tuple[np.ndarray, float]:
    """maximize sum_m weights_m thr_m(X) / normalizer_m under (5.1)-(5.3)."""
    import cvxpy as cp

    from solvers.gavel.lp import Program, solve_program

    prog = Program(f)
    # L5491-5496: normalized throughput weighted by queue position
    objective = cp.Maximize((weights / normalizer) @ prog.thr)
    return solve_program(prog, objective, [], policy=policy)


def fifo_perf(f: Formulation, *, policy: str) -> tuple[np.ndarray, float]:
    """Heterogeneity-aware FIFO (space sharing when ``f`` has pair rows)."""
    return priority_lp(f, ordered_weights(f.arrival_s), f.thr_fastest, policy=policy)


def fifo_greedy_perf(f: Formulation, *, policy: str) -> tuple[np.ndarray, float]:
    """Gavel's code's heterogeneity-aware FIFO (``FIFOPolicyWithPerf``), a greedy assignment.

    In arrival order each job gets X = 1 on the type of highest throughput among those with at
    least its scale factor of free accelerators (ties: type names in sorted order); the first job
    that fits nowhere stops the queue (no job jumps ahead). Objective: the LP's, at this X.
    """
    x = np.zeros((f.num_combos, len(f.types)))
    free = f.capacity.astype(float).copy()
    by_name = sorted(range(len(f.types)), key=lambda j: f.types[j])
    for m in np.argsort(f.arrival_s, kind="stable"):
        fits = [j for j in by_name if free[j] >= f.scale[m] and f.throughput[m, j] > 0]
        if not fits:
            break
        best = max(fits, key=lambda j: f.throughput[m, j])  # first of the sorted names on ties
        x[m, best] = 1.0
        free[best] -= f.scale[m]
    weights = ordered_weights(f.arrival_s)
    return x, float(weights @ ((f.throughput * x[: f.num_jobs]).sum(axis=1) / f.thr_fastest))


def fifo(f: Formulation, *, policy: str) -> tuple[np.ndarray, float]:
    """Heterogeneity-agnostic FIFO: time shares by arrival order, spread by capacity."""
    g = agnostic_formulation(f)
    x, value = priority_lp(g, ordered_weights(f.arrival_s), f.thr_equal, policy=policy)
    return spread_or_keep(g, x), value


def shortest_job_first_perf(f: Formulation, *, policy: str) -> tuple[np.ndarray, float]:
    """Heterogeneity-aware SJF: FIFO's LP ordered by the shortest possible remaining time."""
    return priority_lp(f, ordered_weights(f.num_steps / f.thr_fastest), f.thr_fastest, policy=policy)


def shortest_job_first(f: Formulation, *, policy: str) -> tuple[np.ndarray, float]:
    """Heterogeneity-agnostic SJF: remaining time estimated at the X^equal throughput."""
    g = agnostic_formulation(f)
    x, value = priority_lp(g, ordered_weights(f.num_steps / f.thr_equal), f.thr_equal, policy=policy)
    return spread_or_keep(g, x), value
