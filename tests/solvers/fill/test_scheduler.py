"""The Fill Job Scheduler's score functions and tie-break (pipefill.md Sec. 3)."""

from __future__ import annotations

import math

import pytest

from planner.errors import InfeasibleError, InvalidProblemError
from solvers.fill.scheduler import schedule

INF = math.inf


def _order(done) -> list[tuple[int, int, float]]:  # noqa: ANN001
    return [(d.job, d.device, d.start_s) for d in done]


def test_sjf_fifo_and_makespan_on_one_device() -> None:
    proc = [[5.0], [1.0], [3.0]]
    arrival = [0.0, 0.0, 0.0]
    assert _order(schedule(proc, arrival, policy="sjf")) == [(1, 0, 0.0), (2, 0, 1.0), (0, 0, 4.0)]
    assert _order(schedule(proc, arrival, policy="fifo")) == [(0, 0, 0.0), (1, 0, 5.0), (2, 0, 6.0)]


def test_sjf_uses_the_minimum_over_all_devices() -> None:
    # job 0 is slow on device 0 but the fastest anywhere (L161): SJF still picks it first
    proc = [[10.0, 0.5], [2.0, 2.0]]
    done = schedule(proc, [0.0, 0.0], policy="sjf")
    assert _order(done)[0] == (0, 0, 0.0)


def test_makespan_ties_fall_back_to_arrival_then_input_order() -> None:
    # job 0 keeps device 1 busy until 10; at t=1 jobs 1-3 wait for device 0 with max remaining 9:
    # jobs 1 (4 s) and 2 (2 s) both score 1/max(proc, 9) = 1/9 -> same arrival -> input order
    proc = [[INF, 10.0], [4.0, INF], [2.0, INF], [12.0, INF]]
    done = schedule(proc, [0.0, 1.0, 1.0, 1.0], policy="makespan")
    assert _order(done)[:2] == [(0, 1, 0.0), (1, 0, 1.0)]
    # at t=5 the remaining busy time is 5: job 2 scores 1/5, job 3 1/12
    assert _order(done)[2:] == [(2, 0, 5.0), (3, 0, 7.0)]


def test_jobs_wait_for_arrival_and_horizon_stops_starts() -> None:
    done = schedule([[1.0], [1.0]], [0.0, 5.0], policy="fifo")
    assert _order(done) == [(0, 0, 0.0), (1, 0, 5.0)]
    assert _order(schedule([[1.0], [1.0]], [0.0, 5.0], policy="fifo", horizon_s=3.0)) == [(0, 0, 0.0)]


def test_bad_policy_and_unrunnable_job() -> None:
    with pytest.raises(InvalidProblemError, match="choose from"):
        schedule([[1.0]], [0.0], policy="lifo")
    with pytest.raises(InfeasibleError, match="'big' fits the bubbles of no device"):
        schedule([[INF, INF]], [0.0], policy="sjf", job_names=["big"])
