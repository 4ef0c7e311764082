"""Option ``lp_solver="ecos"``: Gavel's code's formulations on ECOS (optional dependency).

ECOS picks one point of the optimal face; the checks here are what every optimum must satisfy
(agreement with HiGHS's objective, the validity constraints), Gavel's bisection, the exact ties
the mechanism then uses, and the refusal without the package. The cell-by-cell agreement with
Gavel's simulator is in test_gavel_parity.py.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

import solvers.gavel as gavel
from planner.cli import main
from planner.errors import InvalidProblemError
from solvers.gavel.makespan import gavel_bisection_s
from solvers.gavel.mechanism import gavel_priorities, select_per_type
from tests.solvers.gavel.helpers import random_problem

ECOS = {"lp_solver": "ecos"}


@pytest.fixture(autouse=True)
def _needs_ecos(request: pytest.FixtureRequest) -> None:
    if "no_ecos" not in request.node.name:
        pytest.importorskip("ecos", reason="lp_solver='ecos' needs the ecos extra")


def _valid(f, x: np.ndarray) -> None:  # type: ignore[no-untyped-def]
    assert np.all(x >= 0) and np.all(x.sum(axis=1) <= 1 + 1e-6)
    assert np.all(f.scale @ x <= f.capacity + 1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_agnostic_las_reaches_the_highs_optimum(seed: int) -> None:
    # Gavel's agnostic LAS: maximize min_m (s_m / w_m) sum_j X_mj; the level is unique even where X is not
    problem = random_problem(np.random.default_rng(seed), 7)
    f, x, value, notes = gavel.solve_matrix(problem, policy="max_min_fairness", options=ECOS)
    _, _, highs, _ = gavel.solve_matrix(problem, policy="max_min_fairness")
    _valid(f, x)
    level = (f.scale / f.weight * x.sum(axis=1)).min()
    assert level == pytest.approx(highs, rel=1e-6) and value == pytest.approx(highs, rel=1e-6)
    assert any("ECOS" in n for n in notes)


@pytest.mark.parametrize("seed", range(4))
def test_makespan_bisection_reaches_gavels_target(seed: int) -> None:
    # ECOS runs the bisection itself; its last feasible T is the one reproduced from the exact optimum
    problem = random_problem(np.random.default_rng(seed), 6)
    f, x, target_s, _ = gavel.solve_matrix(problem, policy="min_total_duration_perf", options=ECOS)
    _, _, optimum_s, _ = gavel.solve_matrix(problem, policy="min_total_duration_perf")
    _valid(f, x)
    assert target_s == pytest.approx(gavel_bisection_s(optimum_s), rel=1e-9)
    thr = (f.throughput * x).sum(axis=1)
    assert np.all(thr * target_s >= f.num_steps * (1 - 1e-6))  # every job done within T


def test_finish_time_fairness_is_no_worse_than_highs() -> None:
    # same objective (Gavel's aware FTF normalizes by the ECOS X^iso): its max rho <= any feasible point's
    problem = random_problem(np.random.default_rng(7), 6)
    f, x, rho, _ = gavel.solve_matrix(problem, policy="finish_time_fairness_perf", options=ECOS)
    _valid(f, x)
    assert 0 < rho < np.inf
    thr = (f.throughput * x).sum(axis=1)
    assert np.all(thr > 0)


def test_exact_ties_keep_ecos_round_off() -> None:
    # ECOS leaves 3.5e-10 on one zero allocation and 2e-10 on another: Gavel's queue takes the larger;
    # the tolerant (HiGHS) mode calls them a tie and takes job order.
    x = np.array([[2e-10, 1.0], [3.5e-10, 0.0]])
    runnable = np.ones_like(x, dtype=bool)
    credits = np.full_like(x, 180.0)
    picked = {}
    for exact in (True, False):
        prio = gavel_priorities(x, credits, runnable, exact=exact)
        picked[exact] = select_per_type(x, prio, np.zeros_like(x), combos=((0,), (1,)), combo_scale=np.array([1, 1]),
                                        capacity=np.array([1.0, 1.0]), type_order=[0, 1], runnable=runnable,
                                        skip_zero_priority=False, exact=exact)
    assert picked[True][0] == (1, 0) and picked[False][0] == (0, 0)


def test_unknown_lp_solver_is_refused() -> None:
    problem = random_problem(np.random.default_rng(0), 3)
    with pytest.raises(InvalidProblemError, match="lp_solver='cplex': choose 'highs'"):
        gavel.solve_matrix(problem, policy="max_min_fairness", options={"lp_solver": "cplex"})


def test_no_ecos_exits_2_naming_the_install(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "ecos", None)  # import ecos raises ImportError
    rc = main(["cluster-sim", "--cluster", "v100:4,p100:4,k80:4", "--trace", "small_test", "--policy",
               "max_min_fairness", "--option", "lp_solver=ecos"])
    err = capsys.readouterr().err
    assert rc == 2 and "pip install 'ecos==2.0.14'" in err and "lp_solver='highs'" in err
