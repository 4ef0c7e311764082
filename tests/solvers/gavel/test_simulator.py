"""Cluster simulator: work conservation, determinism, and the chapter's qualitative result."""

from __future__ import annotations

import pytest

from planner.schema_gavel import JobsFile
from solvers.gavel.simulator import simulate
from solvers.gavel.workload import duration_s, generate_jobs

WORKERS = {"v100": 8, "p100": 8, "k80": 8}


@pytest.fixture(scope="module")
def trace() -> JobsFile:
    return generate_jobs(40, rate_per_hour=2.0, seed=3, worker_types=WORKERS, multi_gpu=True)


def test_every_job_finishes_with_exactly_its_steps(trace: JobsFile) -> None:
    r = simulate(trace, worker_types=WORKERS, policy="max_min_fairness_perf", seed=3)
    assert r.num_jobs == 40
    for job in r.jobs:
        assert job.steps_done == job.num_steps
        assert job.completion_s > job.arrival_s
    assert all(0.0 < u <= 1.0 + 1e-9 for u in r.utilization.values())
    assert r.makespan_s >= max(j.jct_s for j in r.jobs)


def test_single_job_completion_time_is_exact() -> None:
    # One job on one V100 at 2 steps/s, 1000 steps: done after 500 s (the second round).
    jobs = JobsFile.model_validate({"jobs": [{"id": "a", "throughputs": {"v100": 2.0}, "num_steps": 1000}]})
    r = simulate(jobs, worker_types={"v100": 1}, policy="max_min_fairness_perf")
    assert r.jobs[0].jct_s == pytest.approx(500.0)
    assert r.num_rounds == 2
    assert r.utilization["v100"] == pytest.approx(1.0)
    assert r.total_cost_usd == pytest.approx(2.48 * 500 / 3600)


def test_same_seed_same_result(trace: JobsFile) -> None:
    a = simulate(trace, worker_types=WORKERS, policy="fifo_perf", seed=3)
    b = simulate(generate_jobs(40, rate_per_hour=2.0, seed=3, worker_types=WORKERS, multi_gpu=True),
                 worker_types=WORKERS, policy="fifo_perf", seed=3)
    assert a == b
    c = generate_jobs(40, rate_per_hour=2.0, seed=4, worker_types=WORKERS, multi_gpu=True)
    assert c != trace


@pytest.mark.parametrize("family", ["max_min_fairness", "fifo"])
def test_heterogeneity_aware_lowers_average_jct(trace: JobsFile, family: str) -> None:
    # Ch. 5 sec. 5.6 (Figs. 5.9-5.11): the _perf policy beats its agnostic version on one trace.
    agnostic = simulate(trace, worker_types=WORKERS, policy=family)
    aware = simulate(trace, worker_types=WORKERS, policy=f"{family}_perf")
    assert aware.avg_jct_s < agnostic.avg_jct_s


def test_duration_distribution_matches_the_chapter() -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    minutes = np.array([duration_s(rng) / 60 for _ in range(4000)])
    assert minutes.min() >= 10**1.5 - 1e-9 and minutes.max() <= 10**4 + 1e-9
    assert (minutes > 1000).mean() == pytest.approx(0.2, abs=0.03)  # the U[3, 4] branch
