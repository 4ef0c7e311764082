"""``mechanism="gavel"``: Gavel's simulator code (credits, per-type queues, work conservation,
deficits, allocations at most every 1920 s), hand-checked."""

from __future__ import annotations

import numpy as np
import pytest

from planner.schema_gavel import JobsFile
from solvers.gavel.mechanism import gavel_priorities, select_per_type
from solvers.gavel.simulator import simulate

SINGLES = ((0,), (1,))
SCALE = np.array([1, 1])
CAP = np.array([1.0, 1.0])  # one V100 (column 0), one K80 (column 1)


def _select(x: np.ndarray, deficit: np.ndarray | None = None, order: list[int] | None = None, fifo: bool = False) -> list:
    runnable = np.ones_like(x, dtype=bool)
    prio = gavel_priorities(x, np.full_like(x, 180.0), runnable)  # half-round credits only: share 1/2
    return select_per_type(x, prio, np.zeros_like(x) if deficit is None else deficit, combos=SINGLES,
                           combo_scale=SCALE, capacity=CAP, type_order=order or [0, 1], runnable=runnable,
                           skip_zero_priority=fifo)


def test_credits_give_a_share_and_priority_is_x_over_it() -> None:
    x = np.array([[1.0, 0.0], [0.25, 0.5]])
    prio = gavel_priorities(x, np.array([[180.0, 180.0], [540.0, 180.0]]), np.ones_like(x, dtype=bool))
    np.testing.assert_allclose(prio, [[1.0 / 0.25, 0.0], [0.25 / 0.75, 0.5 / 0.5]], atol=1e-9)
    # X = 0 is X = 1e-12 (Gavel's solver leaves ~1e-10 there): after every real priority, and a
    # cell not yet run on the type (x 1e9) ahead of one that has run (/ its share).
    assert 0 < prio[0, 1] == pytest.approx(1e-12 / 0.5)
    never_run = gavel_priorities(x, np.array([[180.0, 0.0], [540.0, 180.0]]), np.ones_like(x, dtype=bool))
    assert never_run[0, 1] == pytest.approx(1e-3) and never_run[0, 1] < prio[1, 0]


def test_work_conserving_except_fifo() -> None:
    # a has X = 1 on the V100 only, b has X = 0 everywhere: b still gets the idle K80 (priority 0
    # is last in line, not excluded), unless the policy is FIFO.
    x = np.array([[1.0, 0.0], [0.0, 0.0]])
    assert _select(x) == [(0, 0), (1, 1)]
    assert _select(x, fifo=True) == [(0, 0)]


def test_types_are_served_in_order_and_deficit_breaks_ties() -> None:
    x = np.full((2, 2), 0.5)
    assert _select(x, order=[0, 1]) == [(0, 0), (1, 1)]  # V100 queue first: a (job order) wins it
    assert _select(x, order=[1, 0]) == [(0, 1), (1, 0)]  # K80 queue first
    owed = np.array([[0.0, 0.0], [30.0, 0.0]])
    assert _select(x, deficit=owed) == [(1, 0), (0, 1)]  # b is owed V100 time


def _jobs(*specs: tuple[str, float, float]) -> JobsFile:
    return JobsFile.model_validate({"jobs": [
        {"id": i, "throughputs": {"v100": 1.0}, "num_steps": n, "arrival_time_s": t} for i, n, t in specs]})


@pytest.mark.parametrize(("mechanism", "c_done_s"), [("paper", 1810.0), ("gavel", 3250.0)])
def test_allocation_is_recomputed_at_most_every_1920_s(mechanism: str, c_done_s: float) -> None:
    # One V100 at 1 step/s. a (t=0) and b (t=100) alternate from 360 s. c (10 steps) arrives at
    # 800 s. The chapter re-solves at the next round (1080 s): c is third in line, done at 1810 s.
    # Gavel's code re-solved at 360 s and waits 1920 s for the next solve (2520 s); then a, b and c
    # tie (credits, zero deficits, X = 1/3) and run in job order: c ends at 3250 s.
    jobs = _jobs(("a", 3000, 0.0), ("b", 3000, 100.0), ("c", 10, 800.0))
    r = simulate(jobs, worker_types={"v100": 1}, policy="max_min_fairness_perf", mechanism=mechanism)
    assert r.jobs[2].completion_s == pytest.approx(c_done_s)


def test_gavel_mechanism_conserves_work_on_a_mixed_trace() -> None:
    from solvers.gavel.workload import generate_jobs

    workers = {"v100": 8, "p100": 8, "k80": 8}
    trace = generate_jobs(30, rate_per_hour=3.0, seed=5, worker_types=workers, multi_gpu=True)
    for policy in ("max_min_fairness", "fifo_perf"):
        r = simulate(trace, worker_types=workers, policy=policy, mechanism="gavel", seed=5)
        assert all(j.steps_done == j.num_steps for j in r.jobs)


def test_las_heterogeneity_gain_is_gavels_on_each_of_its_traces() -> None:
    # Gavel's own simulator on its five physical-cluster traces (4 V100 + 4 P100 + 4 K80, 360 s
    # rounds, seed 0; tests/data/gavel_reference): LAS agnostic/aware average JCT 1.183, 1.207,
    # 1.316, 1.140, 2.114. Ours with Gavel's mechanism: 1.225, 1.209, 1.309, 1.140, 2.097 (the
    # chapter's mechanism: 1.06-1.84).
    import json
    from pathlib import Path

    from solvers.gavel.throughputs import read_trace

    root = Path(__file__).resolve().parents[3]
    ref = {(c["trace"], c["policy"]): c["avg_jct_s"] for c in json.loads(
        (root / "tests" / "data" / "gavel_reference" / "physical_cluster_traces.json").read_text())["cells"]}
    workers = {"v100": 4, "p100": 4, "k80": 4}
    for name in ("artifact_evaluation", "debug", "debug_v2", "medium_test", "small_test"):
        jobs = read_trace(root / "solvers" / "gavel" / "data" / "traces" / f"{name}.trace", worker_types=workers)
        jct = [simulate(jobs, worker_types=workers, policy=p, seed=0).avg_jct_s
               for p in ("max_min_fairness", "max_min_fairness_perf")]
        gavels = ref[name, "max_min_fairness"] / ref[name, "max_min_fairness_perf"]
        assert jct[0] / jct[1] == pytest.approx(gavels, rel=0.05), name


def test_greedy_fifo_is_gavels_fifo_perf() -> None:
    # Gavel's code's fifo_perf: in arrival order, all of the free type where the job is fastest;
    # the first job that fits nowhere stops the queue (d would fit the K80 but may not jump c).
    import solvers.gavel as gavel
    from tests.solvers.gavel.helpers import problem

    p = problem([{"v100": 3.0, "k80": 1.0}, {"v100": 2.0, "k80": 1.5}, {"v100": 1.0, "k80": 1.0},
                 {"v100": 1.0, "k80": 1.0}], {"v100": 1, "k80": 2}, scale_factor=[1, 1, 2, 1])
    x = gavel.solve(p, policy="fifo_perf", options={"fifo": "greedy"}).allocation
    assert [{t: v for t, v in x[j].items() if v > 0} for j in ("j0", "j1", "j2", "j3")] == [
        {"v100": 1.0}, {"k80": 1.0}, {}, {}]
    lp = gavel.solve(p, policy="fifo_perf").allocation  # the chapter's LP (default) differs
    assert lp != x


def test_makespan_bisection_stops_within_5_percent_like_gavels() -> None:
    from solvers.gavel.makespan import gavel_bisection_s

    for optimum in (50.0, 2297.0, 3.0e5, 2.5e6):
        t = gavel_bisection_s(optimum)
        assert optimum <= t <= optimum * 1.05 or (optimum < 100 and 100 <= t <= 105)
    # Gavel's first allocation on artifact_evaluation settled on 2297.0459 s (optimum just below)
    assert gavel_bisection_s(2290.0) == pytest.approx(2297.0458984375)
