"""Water-filling max-min fairness and hierarchical policies, dissertation ch. 5 L5522-5676.

Each iteration solves (L5577-5598)

    maximize c  s.t.  level_m(X) >= level_m^prev + c w_m   (jobs with weight w_m > 0)
                      level_m(X) >= level_m^prev            (every job: nobody loses)

with level_m(X) = scale_factor_m thr_m(X) / thr_m(X^equal) (the max-min fairness level) and
the validity constraints. Then a MILP (L5636-5676) finds the bottlenecked jobs, those whose
level cannot rise while every other job keeps its level: z_m = 1 iff job m can gain; the
others are frozen (priority 0) and leave later iterations. It ends when every job is frozen.
The result is Pareto efficient (L5700-5705).

Hierarchy (L5552-5575): entity s has weight w_s; inside it the weight goes to its unfrozen
jobs in proportion to their own weights (fairness) or all to the first unfrozen job in
arrival order (FIFO). A frozen job's weight thus moves to its entity's other jobs
(L5602-5612). Without entities every job is its own entity with its own weight, which is
single-level weighted max-min fairness raised by water-filling (L5630-5634).

The strict "<" of the MILP is implemented as a gain of at least ``GAIN_REL`` x the job's
level (Gavel's code uses a 1e-4 relative slack); a job that could gain less than that is
treated as bottlenecked.
"""

from __future__ import annotations

import numpy as np

from solvers.gavel.common import Formulation
from solvers.gavel.max_min_fairness import agnostic_formulation, fairness_coefficients, spread_or_keep

GAIN_REL = 1e-4
GAIN_ABS = 1e-6


def job_weights(f: Formulation, frozen: np.ndarray) -> np.ndarray:
    """Per-job weights of this iteration: entity weight split among its unfrozen jobs."""
    specs = {name: (weight, policy) for name, weight, policy in f.entity_specs}
    weights = np.zeros(f.num_jobs)
    for entity in dict.fromkeys(f.entity_of):
        members = [m for m in range(f.num_jobs) if f.entity_of[m] == entity and not frozen[m]]
        if not members:
            continue
        if entity not in specs:  # a job without an entity is its own entity of its own weight
            weights[members] = f.weight[members]
            continue
        total, policy = specs[entity]
        if policy == "fifo":
            first = min(members, key=lambda m: (f.arrival_s[m], m))
            weights[first] = total
        else:
            weights[members] = total * f.weight[members] / f.weight[members].sum()
    return weights


def water_filling_perf(f: Formulation, *, policy: str) -> tuple[np.ndarray, float]:
    """Heterogeneity-aware water-filling (pairs when ``f`` has them); objective = min level."""
    x, history = water_filling_trace(f, policy=policy)
    return x, float(history[-1].min())


def water_filling_trace(f: Formulation, *, policy: str) -> tuple[np.ndarray, list[np.ndarray]]:
    """Water-filling with the levels after every iteration (the chapter's L5619-5628 example).

    Returns:
        The final X and, per iteration, every job's level
        scale_factor_m thr_m(X) / thr_m(X^equal).
    """
    import cvxpy as cp

    from solvers.gavel.lp import Program, solve_program

    coef = fairness_coefficients(f) * f.weight  # scale_m / thr_equal_m: the unweighted level
    level = np.zeros(f.num_jobs)
    frozen = np.zeros(f.num_jobs, dtype=bool)
    x = np.zeros((f.num_combos, len(f.types)))
    history: list[np.ndarray] = []
    while not frozen.all():
        w = job_weights(f, frozen)
        active = np.flatnonzero(w > 0)
        prog = Program(f)
        lev = cp.multiply(coef, prog.thr)
        c = cp.Variable(nonneg=True)
        # L5588-5594: raise active jobs by c times their weight; no job falls below its level
        rise = [lev[active] >= level[active] + c * w[active], lev >= level]
        x, gain = solve_program(prog, cp.Maximize(c), rise, policy=policy)
        level[active] += gain * w[active]
        stuck = ~_can_gain(f, coef, level, active, policy=policy)
        if not stuck[active].any():  # LP optimality says one must be stuck; guard round-off
            stuck[active] = True
        frozen |= stuck
        history.append(level.copy())
    return x, history


def _can_gain(f: Formulation, coef: np.ndarray, level: np.ndarray, active: np.ndarray, *, policy: str) -> np.ndarray:
    """The bottleneck MILP (L5636-5676): True for jobs whose level can still rise."""
    import cvxpy as cp

    from solvers.gavel.lp import Program, solve_program

    prog = Program(f)
    lev = cp.multiply(coef, prog.thr)
    z = cp.Variable(len(active), boolean=True)
    need = level * (1 - 1e-7) - 1e-9  # the levels just reached, less the solver's round-off
    step = GAIN_REL * level[active] + GAIN_ABS
    # z_m = 1 only if job m gains at least ``step`` while every job keeps its level
    cons = [lev >= need, lev[active] >= need[active] + cp.multiply(step, z)]
    solve_program(prog, cp.Maximize(cp.sum(z)), cons, policy=policy)
    # Jobs with weight 0 this iteration (behind a FIFO head) are not judged: True keeps them.
    out = np.ones(f.num_jobs, dtype=bool)
    out[active] = np.asarray(z.value) > 0.5
    return out


def water_filling(f: Formulation, *, policy: str) -> tuple[np.ndarray, float]:
    """Heterogeneity-agnostic water-filling: levels are scaled time shares."""
    g = agnostic_formulation(f)
    x, value = water_filling_perf(g, policy=policy)
    return spread_or_keep(g, x), value
