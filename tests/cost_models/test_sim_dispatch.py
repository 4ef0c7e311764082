"""The engine's dispatch mode (cost_models.sim.dispatch): hand-timed list scheduling."""

from __future__ import annotations

from cost_models.sim.dispatch import Started, dispatch


def _first_queued(queue: list[int], server: int, now: float, busy_until: list[float]) -> int | None:
    return 0


def test_servers_take_released_jobs_in_index_order_and_wait_for_releases() -> None:
    # jobs 0, 1 at t=0 on servers 0, 1 (2 s and 3 s); job 2 released at 1 waits for server 0 (free at 2)
    durations = {0: 2.0, 1: 3.0, 2: 1.0, 3: 4.0}
    started = dispatch(2, [0.0, 0.0, 1.0, 10.0], lambda j, s: durations[j], _first_queued)
    assert started == [Started(0, 0, 0.0, 2.0), Started(1, 1, 0.0, 3.0), Started(2, 0, 2.0, 3.0),
                       Started(3, 0, 10.0, 14.0)]


def test_horizon_and_a_policy_that_leaves_a_server_idle() -> None:
    only_server_1 = lambda queue, server, now, busy: 0 if server == 1 else None  # noqa: E731
    started = dispatch(2, [0.0, 0.0, 0.0], lambda j, s: 5.0, only_server_1, horizon_s=6.0)
    assert started == [Started(0, 1, 0.0, 5.0), Started(1, 1, 5.0, 10.0)]  # job 2 would start at 10 > 6
