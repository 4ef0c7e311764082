"""Gavel policies: the chapter's worked examples, closed forms, feasibility on random instances."""

from __future__ import annotations

import numpy as np
import pytest

import solvers.gavel as gavel
from planner.errors import InfeasibleError, InvalidProblemError
from planner.schema_gavel import Allocation, ClusterProblem
from solvers.gavel import common
from solvers.gavel.water_filling import water_filling_trace
from tests.solvers.gavel.helpers import assert_feasible, problem, random_problem

# Dissertation L5361-5387: 1 V100 + 1 K80, three jobs.
THREE_JOBS = [{"v100": 40.0, "k80": 10.0}, {"v100": 12.0, "k80": 4.0}, {"v100": 100.0, "k80": 50.0}]
X_HET = [[5 / 11, 0.0], [5 / 11, 1 / 11], [1 / 11, 10 / 11]]


@pytest.mark.parametrize("policy", ["max_min_fairness_perf", "max_min_fairness_packed", "max_min_fairness_water_filling_perf"])
@pytest.mark.parametrize("backend", ["direct", "cvxpy"])
def test_three_job_example_reproduces(policy: str, backend: str) -> None:
    p = problem(THREE_JOBS, {"v100": 1, "k80": 1})
    a = gavel.solve(p, policy=policy, options={"backend": backend})
    got = [[a.allocation[f"j{m}"][t] for t in ("v100", "k80")] for m in range(3)]
    # The optimum is unique; the paper prints it rounded down (0.45, 0.09, 0.91).
    np.testing.assert_allclose(got, X_HET, atol=1e-6)
    assert a.objective == pytest.approx(8 / 11, abs=1e-6)
    # Every job gets 12/11 of its isolated throughput: the chapter's "about 10%" (L5385-5387).
    for m, thr in enumerate(THREE_JOBS):
        isolated = (thr["v100"] + thr["k80"]) / 3
        assert a.effective_throughputs[f"j{m}"] / isolated == pytest.approx(12 / 11, abs=1e-5)


def test_agnostic_gives_equal_time_shares() -> None:
    a = gavel.solve(problem(THREE_JOBS, {"v100": 1, "k80": 1}), policy="max_min_fairness")
    for m in range(3):
        assert a.allocation[f"j{m}"] == pytest.approx({"v100": 1 / 3, "k80": 1 / 3}, abs=1e-6)
    assert a.objective == pytest.approx(2 / 3, abs=1e-6)  # normalized level of the 1/3 split


def test_water_filling_example_levels() -> None:
    # L5619-5628: 4 identical jobs on 4 GPUs, job 1 weight 3: iteration 1 gives 1.0 and 1/3s.
    p = problem([{"gpu": 1.0}] * 4, {"gpu": 4}, weight=[3.0, 1.0, 1.0, 1.0])
    x, history = water_filling_trace(common.build(p), policy="t")
    np.testing.assert_allclose(history[0], [1.0, 1 / 3, 1 / 3, 1 / 3], atol=1e-6)
    np.testing.assert_allclose(history[-1], [1.0] * 4, atol=1e-6)
    assert len(history) == 2
    # Plain max-min stops at the first iteration's level for the low-weight jobs (1/3).
    a = gavel.solve(p, policy="max_min_fairness_perf")
    assert a.objective == pytest.approx(1 / 3, abs=1e-6)


def test_hierarchical_fifo_and_fairness_entities() -> None:
    # Two entities of weight 1 and 2 on 3 GPUs; entity A is FIFO (its first job takes its
    # share), B shares fairly. Jobs can use at most one GPU each.
    p = ClusterProblem.from_dict({
        "worker_types": {"gpu": 3},
        "entities": {"A": {"weight": 1.0, "policy": "fifo"}, "B": {"weight": 2.0, "policy": "fairness"}},
        "jobs": [
            {"id": "a0", "throughputs": {"gpu": 1.0}, "entity": "A", "arrival_time_s": 0},
            {"id": "a1", "throughputs": {"gpu": 1.0}, "entity": "A", "arrival_time_s": 5},
            {"id": "b0", "throughputs": {"gpu": 1.0}, "entity": "B"},
            {"id": "b1", "throughputs": {"gpu": 1.0}, "entity": "B"},
            {"id": "b2", "throughputs": {"gpu": 1.0}, "entity": "B"},
        ],
    })
    x, history = water_filling_trace(common.build(p), policy="hierarchical")
    # Iteration 1: A's weight 1 all to a0, B's 2 split 2/3 each: c = 3/(1 + 2) -> a0 1, b's 2/3.
    np.testing.assert_allclose(history[0], [1.0, 0.0, 2 / 3, 2 / 3, 2 / 3], atol=1e-6)
    np.testing.assert_allclose(history[-1], [1.0, 0.0, 2 / 3, 2 / 3, 2 / 3], atol=1e-6)  # cluster full
    assert x.sum() == pytest.approx(3.0, abs=1e-6)


def test_homogeneous_cluster_perf_equals_agnostic() -> None:
    # L5678-5690: on one type the heterogeneity-aware policies reduce to the baselines.
    p = problem([{"gpu": 3.0}, {"gpu": 7.0}, {"gpu": 1.0}], {"gpu": 2}, weight=[1.0, 2.0, 1.0])
    a = gavel.solve(p, policy="max_min_fairness")
    b = gavel.solve(p, policy="max_min_fairness_perf")
    for job in a.allocation:
        assert a.allocation[job]["gpu"] == pytest.approx(b.allocation[job]["gpu"], abs=1e-6)
    # Weighted shares x_m = w_m z with sum 2: z = 1/2 -> (0.5, 1.0, 0.5).
    assert [b.allocation[f"j{m}"]["gpu"] for m in range(3)] == pytest.approx([0.5, 1.0, 0.5], abs=1e-6)


def test_makespan_closed_form_one_gpu() -> None:
    # One GPU, jobs run back to back: the makespan is sum of steps / thr = 100/10 + 300/30 + 50/5.
    p = problem([{"gpu": 10.0}, {"gpu": 30.0}, {"gpu": 5.0}], {"gpu": 1}, num_steps=[100.0, 300.0, 50.0])
    for policy in ("min_total_duration", "min_total_duration_perf"):
        a = gavel.solve(p, policy=policy)
        assert a.objective == pytest.approx(30.0, rel=1e-6)


def test_fifo_serves_the_first_arrival() -> None:
    p = problem([{"v100": 4.0, "k80": 1.0}] * 3, {"v100": 1, "k80": 1}, arrival_time_s=[2.0, 0.0, 1.0])
    a = gavel.solve(p, policy="fifo_perf")
    assert a.allocation["j1"]["v100"] == pytest.approx(1.0)  # first arrival: the V100
    assert a.allocation["j2"]["k80"] == pytest.approx(1.0)  # second: the K80
    assert sum(a.allocation["j0"].values()) == pytest.approx(0.0, abs=1e-9)


def test_shortest_job_first_orders_by_remaining_time() -> None:
    p = problem([{"gpu": 1.0}] * 3, {"gpu": 1}, num_steps=[300.0, 100.0, 200.0])
    a = gavel.solve(p, policy="shortest_job_first_perf")
    assert a.allocation["j1"]["gpu"] == pytest.approx(1.0)


def test_finish_time_fairness_equalizes_rho() -> None:
    # Two jobs, one GPU, no history: rho_m = (steps_m / (thr_m x_m)) / (steps_m / (thr_m / 2)),
    # so minimizing the max gives x = 1/2 each and rho = 1 (the isolated share).
    p = problem([{"gpu": 2.0}, {"gpu": 8.0}], {"gpu": 1}, num_steps=[100.0, 100.0])
    a = gavel.solve(p, policy="finish_time_fairness_perf")
    assert a.allocation["j0"]["gpu"] == pytest.approx(0.5, abs=1e-4)
    assert a.objective == pytest.approx(1.0, abs=1e-4)


def test_min_cost_prefers_throughput_per_dollar() -> None:
    # Job on K80 gives 10 steps/s for $0.45/h (22.2 steps/$/h), on V100 40 for $2.48 (16.1).
    p = problem([{"v100": 40.0, "k80": 10.0}], {"v100": 1, "k80": 1})
    a = gavel.solve(p, policy="min_cost")
    assert a.allocation["j0"]["k80"] == pytest.approx(1.0)


def test_min_cost_with_slo_moves_to_the_fast_type() -> None:
    # The SLO needs 20 steps/s: K80 alone cannot give it, so time moves to the V100.
    p = problem([{"v100": 40.0, "k80": 10.0}], {"v100": 1, "k80": 1}, num_steps=[2000.0], slo_s=[100.0])
    a = gavel.solve(p, policy="min_cost_slo")
    assert a.effective_throughputs["j0"] >= 20.0 - 1e-6
    # Cheapest mix meeting 20 steps/s: 40 v + 10 k >= 20 with v + k <= 1 -> v = 1/3, k = 2/3.
    assert a.allocation["j0"]["v100"] == pytest.approx(1 / 3, abs=1e-5)


def test_impossible_slo_names_the_job() -> None:
    p = problem([{"v100": 40.0, "k80": 10.0}], {"v100": 1, "k80": 1}, num_steps=[5000.0], slo_s=[100.0])
    with pytest.raises(InfeasibleError, match="job 'j0' cannot meet its SLO.*125 s"):
        gavel.solve(p, policy="min_cost_slo")


def test_joint_slos_infeasible_names_jobs() -> None:
    p = problem([{"v100": 10.0}, {"v100": 10.0}], {"v100": 1}, num_steps=[800.0, 800.0], slo_s=[100.0, 100.0])
    with pytest.raises(InfeasibleError, match="cannot all hold.*'j"):
        gavel.solve(p, policy="min_cost_slo")


def test_job_asking_too_many_accelerators_is_infeasible() -> None:
    p = problem([{"v100": 10.0, "k80": 2.0}], {"v100": 4, "k80": 4}, scale_factor=[8])
    with pytest.raises(InfeasibleError, match="job 'j0' asks scale_factor=8"):
        gavel.solve(p, policy="max_min_fairness_perf")


def test_zero_throughput_everywhere_is_infeasible() -> None:
    p = problem([{"v100": 0.0, "k80": 0.0}, {"v100": 1.0}], {"v100": 1, "k80": 1})
    with pytest.raises(InfeasibleError, match="job 'j0' has zero throughput"):
        gavel.solve(p, policy="fifo_perf")


def test_unknown_type_and_unknown_policy_are_invalid() -> None:
    with pytest.raises(InvalidProblemError, match="unknown accelerator type.*'a100'"):
        problem([{"a100": 1.0}], {"v100": 1})
    with pytest.raises(InvalidProblemError, match="unknown policy 'las'.*max_min_fairness"):
        gavel.solve(problem([{"v100": 1.0}], {"v100": 1}), policy="las")


ALL_POLICIES = sorted(set(gavel.POLICIES) - {"hierarchical", "min_cost_slo", "max_sum_throughput_normalized_by_cost_perf_SLOs"})


@pytest.mark.parametrize("seed", range(3))
def test_every_policy_is_feasible_on_random_instances(seed: int) -> None:
    rng = np.random.default_rng(seed)
    p = random_problem(rng, 6, pairs=True)
    for policy in ALL_POLICIES:
        if "water_filling" in policy and seed > 0:
            continue  # the MILP loop is the slowest; one instance is enough
        assert_feasible(p, gavel.solve(p, policy=policy))


@pytest.mark.parametrize("seed", range(5))
def test_sharing_incentive_and_backends_agree(seed: int) -> None:
    # L5690-5695: every job does at least as well as with 1/n of the cluster.
    p = random_problem(np.random.default_rng(100 + seed), 8)
    iso = gavel.solve(p, policy="isolated")
    a = gavel.solve(p, policy="max_min_fairness_perf")
    b = gavel.solve(p, policy="max_min_fairness_perf", options={"backend": "cvxpy"})
    assert a.objective == pytest.approx(b.objective, rel=1e-5)
    f = common.build(p)
    level = {j: f.scale[m] * a.effective_throughputs[j] / f.thr_equal[m] / f.weight[m] for m, j in enumerate(f.job_ids)}
    level_iso = [f.scale[m] * iso.effective_throughputs[j] / f.thr_equal[m] / f.weight[m] for m, j in enumerate(f.job_ids)]
    assert min(level.values()) >= min(level_iso) - 1e-6


def test_space_sharing_is_at_least_as_good() -> None:
    # L5700-5705: with co-location allowed the optimum can only improve.
    p = random_problem(np.random.default_rng(7), 8, pairs=True)
    plain = gavel.solve(p, policy="max_min_fairness_perf")
    packed = gavel.solve(p, policy="max_min_fairness_packed")
    assert packed.objective >= plain.objective - 1e-6


@pytest.mark.parametrize("policy", ["max_min_fairness_packed", "fifo_packed", "isolated"])
def test_allocations_validate_as_the_schema_says(policy: str) -> None:
    # to_allocation builds the Allocation without validation: it must still be one that validates,
    # field for field (JSON round trip through the strict schema).
    a = gavel.solve(random_problem(np.random.default_rng(3), 8, pairs=True), policy=policy)
    again = Allocation.from_json(a.to_json())
    assert again == a and again.allocation == a.allocation and again.pairs == a.pairs
    assert all(type(v) is float for row in a.allocation.values() for v in row.values())
    assert all(type(v) is float for v in a.effective_throughputs.values())
