"""--time-limit is the whole command's budget: depths, baselines, MILP, re-ranking and the
infeasibility explanation share one deadline (checked by status and notes, never wall time)."""

from __future__ import annotations

import random

import pytest

from planner.errors import InfeasibleError
from solvers.budget import Budget
from solvers.stage_ilp import solve
from tests.solvers.test_stage_ilp import _problem


def test_a_spent_budget_returns_the_best_depth_found_with_status_time_limit() -> None:
    free = _problem(random.Random(2), p=2, v=1, num_decoders=6, memory=1e6).model_copy(
        update={"num_stages": None, "num_microbatches": 8})
    plan = solve(free.model_copy(update={"time_limit_s": 1e-6}), options={"rerank": 2})
    assert plan.status == "time_limit"
    assert any("spent before depths" in note for note in plan.notes)
    unlimited = solve(free, options={"rerank": 2})
    assert unlimited.status == "optimal" and not any("spent before depths" in n for n in unlimited.notes)
    assert unlimited.predicted.throughput_samples_per_s >= plan.predicted.throughput_samples_per_s * (1 - 1e-12)  # type: ignore[union-attr]


def test_the_infeasibility_explanation_shares_the_budget() -> None:
    problem = _problem(random.Random(0), p=2, v=1, num_decoders=4, memory=60)
    with pytest.raises(InfeasibleError) as err:
        solve(problem.model_copy(update={"time_limit_s": 1e-6}))
    assert "the time limit left no time to size them" in str(err.value)
    with pytest.raises(InfeasibleError) as full:
        solve(problem)
    assert "left no time" not in str(full.value)


def test_budget_shares_and_limits() -> None:
    assert Budget(None).limit_s(30.0) == 30.0 and not Budget(None).spent()
    spent = Budget(0.0)  # a deadline long past
    assert spent.spent() and spent.limit_s(30.0) == 0.05 and spent.share(3).left_s() == 0.0


def test_ptdp_stops_simulating_candidates_when_the_budget_is_spent() -> None:
    from planner import api
    from solvers import ptdp

    problem = api.make_problem("gpt-1.7b", "a100-80gb:8", global_batch_size=64)
    full = ptdp.solve(problem, options={"num_simulated": 4})
    assert full.status == "feasible" and sum(1 for row in full.candidates if row["simulated"]) == 4
    spent = ptdp.solve(problem.model_copy(update={"time_limit_s": 1e-9}), options={"num_simulated": 4})
    assert spent.status == "time_limit" and any("spent after simulating 1 of the" in n for n in spent.notes)
    assert spent.predicted.iteration_time_s >= full.predicted.iteration_time_s * (1 - 1e-12)  # type: ignore[union-attr]
    assert sum(1 for row in spent.candidates if row["simulated"]) == 1


def test_the_offload_fallback_draws_on_the_same_budget() -> None:
    from planner import api

    problem = api.make_problem("gpt3-175b", "a100-80gb:8", num_microbatches=8, time_limit_s=1e-9)
    with pytest.raises(InfeasibleError, match="fallback \\(solver spipe\\) was not tried: time_limit_s=1e-09 was spent"):
        api.plan(problem, solver="even")
