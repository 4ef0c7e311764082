"""The three formulations of ch. 6 sec. 6.4: hand-checked optima, bisection against oracles."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import solvers.cloud as cloud
from planner.errors import InfeasibleError, InvalidProblemError
from solvers.cloud import formulations as f
from solvers.cloud.catalogue import build_options
from solvers.cloud.matrix import build_matrix
from tests.solvers.cloud.helpers import catalogue, job, problem

CAT = catalogue(("slow", "aws", "k80", 1, 1.0, None), ("fast", "aws", "v100", 1, 4.0, None))


def test_switching_example_is_a_60_40_split() -> None:
    # K80 1 step/s at $1/h, V100 2.5 steps/s at $4/h: the K80 is cheaper per step. A job of
    # 1.6 K80-hours of work... per hour of deadline needs x_v = (1.6 - 1)/(2.5 - 1) = 0.4 on the V100.
    j = job("a", {"k80": 1.0, "v100": 2.5}, 1.6 * 10 * 3600, slo_h=10)
    plan = cloud.solve(problem(j, markets=["on-demand"]), catalogue=CAT)
    fractions = plan.jobs["a"].fractions
    assert fractions["aws/r1/slow:on-demand"] == pytest.approx(0.6, abs=1e-7)
    assert fractions["aws/r1/fast:on-demand"] == pytest.approx(0.4, abs=1e-7)
    assert plan.total_usd == pytest.approx(10 * (0.6 * 1.0 + 0.4 * 4.0), rel=1e-7)
    assert plan.jobs["a"].duration_h == pytest.approx(10.0)


def test_min_cost_without_deadline_takes_the_cheapest_per_step() -> None:
    j = job("a", {"k80": 1.0, "v100": 2.5}, 3600 * 8)
    plan = cloud.solve(problem(j, markets=["on-demand"]), catalogue=CAT)
    assert plan.jobs["a"].fractions == {"aws/r1/slow:on-demand": 1.0}
    assert plan.total_usd == pytest.approx(8.0)


def test_max_throughput_gives_the_scarce_fast_instance_to_the_job_that_gains_most() -> None:
    # quota 1 fast instance; job a gains 1 step/s there, job b gains 2: b gets it, a the K80.
    a, b = job("a", {"k80": 1.0, "v100": 2.0}, 1e4), job("b", {"k80": 1.0, "v100": 3.0}, 1e4)
    plan = cloud.solve(problem(a, b, objective="max-throughput", markets=["on-demand"], quotas={"fast": 1}), catalogue=CAT)
    assert plan.objective_value == pytest.approx((1.0 + 3.0) * 3600)
    assert plan.jobs["b"].fractions == {"aws/r1/fast:on-demand": 1.0}
    assert plan.jobs["a"].fractions == {"aws/r1/slow:on-demand": 1.0}


def test_max_throughput_under_a_spending_rate() -> None:
    # $2.5/h buys X_fast = 0.5 of the V100 (2 $/h) plus 0.5 of the K80 (0.5 $/h): 0.5*2.5 + 0.5*1 = 1.75 steps/s.
    j = job("a", {"k80": 1.0, "v100": 2.5}, 1e4)
    plan = cloud.solve(problem(j, objective="max-throughput", markets=["on-demand"], budget_usd_per_h=2.5), catalogue=CAT)
    assert plan.objective_value == pytest.approx(1.75 * 3600)
    assert plan.jobs["a"].cost_usd_per_h == pytest.approx(2.5)


def test_dataset_egress_keeps_a_job_home_until_moving_pays() -> None:
    cat = catalogue(("home", "aws", "v100", 1, 3.0, None), ("away", "azure", "v100", 1, 2.9, None))
    # 10 h of work: staying costs $30, moving $29 + 100 GB x $0.09 = $38 -> stays
    j = job("a", {"v100": 1.0}, 36000, dataset_gb=100, dataset_cloud="aws")
    plan = cloud.solve(problem(j, markets=["on-demand"]), catalogue=cat)
    assert plan.jobs["a"].fractions == {"aws/r1/home:on-demand": 1.0}
    assert plan.total_usd == pytest.approx(30.0)
    # 100 h of work: $300 at home vs $290 + $9 away -> moves and pays the egress once
    plan = cloud.solve(problem(job("a", {"v100": 1.0}, 360000, dataset_gb=100, dataset_cloud="aws"),
                               markets=["on-demand"]), catalogue=cat)
    assert plan.jobs["a"].fractions == {"azure/r1/away:on-demand": 1.0}
    assert plan.jobs["a"].egress_usd == pytest.approx(9.0)
    assert plan.total_usd == pytest.approx(299.0)


def test_spot_throughput_is_discounted_by_preemptions() -> None:
    cat = catalogue(("v", "aws", "v100", 1, 3.0, 1.0, 0.5))
    # 0.5 preemptions/h x (360 s restart + 1800 s lost: the 600 s checkpoint misses the 120 s notice) = 0.3 of each hour
    j = job("a", {"v100": 1.0}, 3600 * 7, restart_s=360, checkpoint_s=600, checkpoint_interval_s=3600)
    plan = cloud.solve(problem(j, markets=["spot"]), catalogue=cat)
    assert plan.jobs["a"].duration_h == pytest.approx(10.0)
    assert plan.total_usd == pytest.approx(10.0)


def test_multi_gpu_instances_are_shared_by_packed_jobs() -> None:
    cat = catalogue(("one", "aws", "v100", 1, 3.0, None), ("eight", "aws", "v100", 8, 20.0, None))
    plan = cloud.solve(problem(job("a", {"v100": 1.0}, 3600), markets=["on-demand"]), catalogue=cat)
    assert plan.jobs["a"].fractions == {"aws/r1/eight:on-demand": 1.0}
    assert plan.jobs["a"].jobs_per_instance == {"aws/r1/eight:on-demand": 8}
    assert plan.total_usd == pytest.approx(2.5)


def test_unmeetable_deadline_names_the_earliest_one() -> None:
    with pytest.raises(InfeasibleError, match=r"slo_h=1 but it needs at least 4.00 h"):
        cloud.solve(problem(job("a", {"k80": 1.0, "v100": 2.5}, 3600 * 10, slo_h=1), markets=["on-demand"]), catalogue=CAT)


def test_budget_below_the_cheapest_allocation_gives_the_cheapest_budget() -> None:
    j = job("a", {"k80": 1.0, "v100": 2.5}, 3600 * 8)
    with pytest.raises(InfeasibleError, match=r"at least \$8\.00"):
        cloud.solve(problem(j, objective="min-makespan", budget_usd=7.0, markets=["on-demand"]), catalogue=CAT)
    with pytest.raises(InfeasibleError, match=r"at least \$8\.00"):
        cloud.solve(problem(j, budget_usd=7.0, markets=["on-demand"]), catalogue=CAT)


def test_min_makespan_hand_checked() -> None:
    # 8 K80-hours of work, $12: all on V100 costs 8/2.5*4 = $12.8 > 12; the makespan M with
    # x_k + 2.5 x_v = 8/M, M (x_k + 4 x_v) = 12, x_k + x_v = 1 gives x_v = 2/3 -> M = 8 / (1 + 1.5 * 2/3) = 4 h.
    j = job("a", {"k80": 1.0, "v100": 2.5}, 3600 * 8)
    plan = cloud.solve(problem(j, objective="min-makespan", budget_usd=12.0, markets=["on-demand"]), catalogue=CAT)
    assert plan.objective_value == pytest.approx(4.0, rel=1e-5)
    assert plan.total_usd == pytest.approx(12.0, rel=1e-5)


def _random_matrix(rng: np.random.Generator, num_jobs: int):
    cat = catalogue(*[(f"i{k}", "aws", acc, int(rng.choice([1, 2])), float(rng.uniform(0.5, 5)), None)
                      for k, acc in enumerate(["k80", "p100", "v100", "v100"])])
    jobs = tuple(job(f"j{m}", {a: float(rng.uniform(0.5, 4)) for a in ("k80", "p100", "v100")},
                     float(rng.uniform(1e4, 1e5))) for m in range(num_jobs))
    options = build_options(cat, markets=("on-demand",))
    return build_matrix(jobs, options, cat), f.egress_table(jobs, options, cat), len(options)


@pytest.mark.parametrize("seed", range(6))
def test_bisection_matches_the_exact_lp(seed: int) -> None:
    rng = np.random.default_rng(seed)
    mx, eg, num_opts = _random_matrix(rng, 3)
    quotas = rng.choice([0.5, 1.0, np.inf], size=num_opts) if seed % 2 else None
    cheapest = f.min_cost(mx, eg, deadlines_h=np.full(3, np.inf)).objective
    budget = cheapest * float(rng.uniform(1.05, 2.0))
    makespan, sol = f.min_makespan(mx, eg, budget_usd=budget, quotas=quotas, rel_tol=1e-7)
    assert makespan == pytest.approx(f.min_makespan_lp(mx, budget_usd=budget, quotas=quotas), rel=1e-5)
    assert sol.objective <= budget * (1 + 1e-6)
    assert (sol.hours.sum(axis=1) <= makespan * (1 + 1e-6)).all()


@pytest.mark.parametrize("seed", range(3))
def test_bisection_matches_brute_force_on_a_grid(seed: int) -> None:
    """One job, two options: enumerate time splits on a fine grid, keep the fastest within budget."""
    rng = np.random.default_rng(100 + seed)
    mx, eg, _ = _random_matrix(rng, 1)
    thr, cost = mx.steps_per_h[0], mx.usd_per_h[0]
    budget = f.min_cost(mx, eg, deadlines_h=np.full(1, np.inf)).objective * 1.3
    best = np.inf
    for j, k in itertools.combinations(range(len(thr)), 2):
        for x in np.linspace(0, 1, 20001):  # x of the time on j, 1 - x on k, makespan = work / speed
            speed = x * thr[j] + (1 - x) * thr[k]
            m_h = mx.num_steps[0] / speed
            if m_h * (x * cost[j] + (1 - x) * cost[k]) <= budget:
                best = min(best, m_h)
    makespan, _ = f.min_makespan(mx, eg, budget_usd=budget, rel_tol=1e-8)
    assert makespan <= best * (1 + 1e-9)
    assert makespan == pytest.approx(best, rel=1e-3)


def test_unknown_instance_type_lists_the_valid_ones() -> None:
    with pytest.raises(InvalidProblemError, match=r"unknown instance type 'p9.xlarge'; valid ones: \['aws/r1/fast'"):
        cloud.solve(problem(job("a", {"k80": 1.0}, 10), instances=["p9.xlarge"]), catalogue=CAT)


def test_job_that_runs_nowhere_is_refused() -> None:
    with pytest.raises(InvalidProblemError, match="can run on no offered instance type"):
        cloud.solve(problem(job("a", {"k80": 1.0}, 10, num_accelerators=2)), catalogue=CAT)


def test_a_maximum_lifetime_is_at_least_one_preemption_per_lifetime() -> None:
    from solvers.cloud.catalogue import load_catalogue

    options = build_options(load_catalogue("ch6-2020"), markets=("spot",), clouds=("gcp",))
    assert {round(o.preemption_rate_per_h, 6) for o in options.values()} == {round(1 / 24, 6)}


def test_zero_quotas_everywhere_a_job_runs_are_infeasible_not_a_hang() -> None:
    j = job("a", {"k80": 1.0, "v100": 2.5}, 3600 * 8)
    with pytest.raises(InfeasibleError, match=r"the quotas leave jobs \['a'\] no instance type"):
        cloud.solve(problem(j, objective="min-makespan", budget_usd=100.0, markets=["on-demand"],
                            quotas={"slow": 0, "fast": 0}), catalogue=CAT)


def test_zero_quotas_in_min_cost_are_named() -> None:
    j = job("a", {"k80": 1.0, "v100": 2.5}, 3600 * 8)
    with pytest.raises(InfeasibleError, match=r"the quotas leave jobs \['a'\] no instance type"):
        cloud.solve(problem(j, markets=["on-demand"], quotas={"slow": 0, "fast": 0}), catalogue=CAT)
    # a zero quota on one type only moves the job to the other
    plan = cloud.solve(problem(j, markets=["on-demand"], quotas={"slow": 0}), catalogue=CAT)
    assert plan.jobs["a"].fractions == {"aws/r1/fast:on-demand": 1.0}


@pytest.mark.parametrize("seed", range(4))
def test_min_cost_matches_brute_force_on_a_grid(seed: int) -> None:
    """One job under a deadline: enumerate hours on one option of each pair, the other finishes the work."""
    rng = np.random.default_rng(200 + seed)
    mx, eg, _ = _random_matrix(rng, 1)
    thr, cost, work = mx.steps_per_h[0], mx.usd_per_h[0], mx.num_steps[0]
    deadline = work / thr.max() * float(rng.uniform(1.05, 2.0))
    best = np.inf
    for j, k in itertools.permutations(range(len(thr)), 2):
        y_j = np.linspace(0, work / thr[j], 20001)
        y_k = np.maximum(work - thr[j] * y_j, 0) / thr[k]
        ok = y_j + y_k <= deadline
        if ok.any():
            best = min(best, float((cost[j] * y_j + cost[k] * y_k)[ok].min()))
    sol = f.min_cost(mx, eg, deadlines_h=np.array([deadline]))
    assert sol.objective <= best * (1 + 1e-9)
    assert sol.objective == pytest.approx(best, rel=1e-3)


def test_min_makespan_keeps_a_jobs_own_tighter_deadline() -> None:
    # Each job has 8 K80-hours of work; at deadline D (3.2 <= D <= 8) its cheapest cost is 16 - D
    # (D - Y_v hours on the K80, Y_v = (8 - D)/1.5 on the V100). b keeps D = 4 ($12), so with
    # $22 a gets 16 - M = 10: M = 6 h.
    a, b = job("a", {"k80": 1.0, "v100": 2.5}, 3600 * 8), job("b", {"k80": 1.0, "v100": 2.5}, 3600 * 8, slo_h=4)
    plan = cloud.solve(problem(a, b, objective="min-makespan", budget_usd=22.0, markets=["on-demand"]), catalogue=CAT)
    assert plan.objective_value == pytest.approx(6.0, rel=1e-5)
    assert plan.jobs["b"].duration_h == pytest.approx(4.0, rel=1e-6)
    assert plan.jobs["b"].compute_usd == pytest.approx(12.0, rel=1e-5)
    assert plan.total_usd == pytest.approx(22.0, rel=1e-5)
