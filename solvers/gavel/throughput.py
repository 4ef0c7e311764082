"""Total throughput and cost policies, dissertation ch. 5 L5113-5137 and L5514-5520 (ch. 6).

- ``max_sum_throughput_perf``: maximize sum_m thr_m(X) (L5113-5137), steps/s as the text
  writes it (jobs with more steps per second weigh more).
- ``max_sum_throughput_normalized_by_cost_perf`` (alias ``min_cost``): the text calls
  "sum_m thr_m / cost_m" a linear-fractional program, but a sum of ratios is not one (reading
  sec. 2.9 item 3). paraplan follows Gavel's code: maximize the throughput per dollar,
  sum_m sum_j T_mj X_mj / (scale_factor_m price_j), which is linear.
- ``..._SLOs`` (alias ``min_cost_slo``): the same with thr_m(X) >= num_steps_m / slo_m for
  every job with a deadline. Gavel's code silently drops the SLOs when they cannot all hold;
  paraplan raises ``InfeasibleError`` naming the jobs (issue 5), since a silent miss is a
  wrong answer.
"""

from __future__ import annotations

import numpy as np

from planner.errors import InfeasibleError, InvalidProblemError
from solvers.gavel.common import Formulation


def max_sum_throughput_perf(f: Formulation, *, policy: str) -> tuple[np.ndarray, float]:
    """Maximize the total effective throughput (steps/s)."""
    import cvxpy as cp

    from solvers.gavel.lp import Program, solve_program

    prog = Program(f)
    # L5113-5119: the sum of every job's effective throughput
    return solve_program(prog, cp.Maximize(cp.sum(prog.thr)), [], policy=policy)


def _dollar_throughput(f: Formulation, *, policy: str) -> np.ndarray:
    """(K, J) steps per dollar of each combination on each type (members summed)."""
    prices = f.prices_per_hour
    bad = [t for t, p in zip(f.types, prices) if not np.isfinite(p) or p <= 0]
    if bad:
        raise InvalidProblemError(
            f"policy {policy!r} needs a positive price for every accelerator type; prices_per_hour "
            f"lacks or zeroes {bad} (give dollars per accelerator-hour in the problem)"
        )
    per_hour = f.combo_scale[:, None] * prices[None, :] / 3600.0  # dollars per second held
    return f.combo_throughput.sum(axis=2) / per_hour


def min_cost(f: Formulation, *, policy: str) -> tuple[np.ndarray, float]:
    """Maximize steps per dollar (Gavel's linear form of the cost policy)."""
    import cvxpy as cp

    from solvers.gavel.lp import Program, solve_program

    prog = Program(f)
    # L5514-5520 with reading sec. 2.9 item 3: throughput per dollar, summed over jobs and types
    value = cp.sum(cp.multiply(_dollar_throughput(f, policy=policy) / 1e3, prog.x))
    return solve_program(prog, cp.Maximize(value), [], policy=policy)


def min_cost_slo(f: Formulation, *, policy: str) -> tuple[np.ndarray, float]:
    """``min_cost`` subject to every job finishing before its SLO.

    Raises:
        InfeasibleError: a job's SLO needs more than its fastest type gives, or the SLOs
            cannot all hold at once; the message names the jobs and the throughput needed.
    """
    import cvxpy as cp

    from solvers.gavel.lp import Program, solve_program

    needed = np.where(np.isfinite(f.slo_s), f.num_steps / f.slo_s, 0.0)
    _check_single_slos(f, needed)
    prog = Program(f)
    has = np.flatnonzero(needed > 0)
    # SLOs (ch. 6 via L5518): thr_m(X) >= num_steps_m / slo_m for every job with a deadline
    slo = [prog.thr[has] >= needed[has]] if len(has) else []
    value = cp.sum(cp.multiply(_dollar_throughput(f, policy=policy) / 1e3, prog.x))
    try:
        return solve_program(prog, cp.Maximize(value), slo, policy=policy)
    except InfeasibleError:
        raise _joint_slo_error(f, needed, policy=policy) from None


def _check_single_slos(f: Formulation, needed: np.ndarray) -> None:
    for m in np.flatnonzero(needed > f.thr_fastest * (1 + 1e-9)):
        raise InfeasibleError(
            f"job {f.job_ids[m]!r} cannot meet its SLO: it needs {needed[m]:.4g} steps/s "
            f"({f.num_steps[m]:.6g} steps in {f.slo_s[m]:.6g} s) but its fastest accelerator type "
            f"gives {f.thr_fastest[m]:.4g}; relax slo_s to at least {f.num_steps[m] / f.thr_fastest[m]:.6g} s"
        )


def _joint_slo_error(f: Formulation, needed: np.ndarray, *, policy: str) -> InfeasibleError:
    """Which jobs fall short when the SLOs are relaxed as little as possible (elastic LP)."""
    import cvxpy as cp

    from solvers.gavel.lp import Program, solve_program

    prog = Program(f)
    has = np.flatnonzero(needed > 0)
    short = cp.Variable(len(has), nonneg=True)
    relaxed = [prog.thr[has] + cp.multiply(needed[has], short) >= needed[has]]
    x, _ = solve_program(prog, cp.Minimize(cp.sum(short)), relaxed, policy=policy)
    late = [f.job_ids[has[i]] for i, s in enumerate(short.value) if s > 1e-6]
    return InfeasibleError(
        f"policy {policy!r}: the SLOs cannot all hold at once on this cluster; at least one of "
        f"{late} misses its deadline; relax their slo_s or add accelerators"
    )
