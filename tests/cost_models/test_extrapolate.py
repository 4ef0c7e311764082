"""Extrapolated simulation of many microbatches agrees with the full simulation."""

from __future__ import annotations

import random

import pytest

from cost_models import extrapolate
from cost_models import simulate as sim
from planner.errors import InvalidProblemError
from planner.schema import LayerProfile
from tests.cost_models import sim_helpers as h

SCHEDULES = [("1f1b", 1), ("gpipe", 1), ("interleaved-1f1b", 2), ("zb-h1", 1), ("zb-h2", 1), ("2bw", 1)]


def _random_layers(rng: random.Random, num: int) -> list[LayerProfile]:
    return [
        LayerProfile(name=f"l{i}", forward_s=rng.uniform(0.5, 2.0), backward_s=rng.uniform(2.5, 4.0),
                     backward_weight_s=rng.uniform(0.5, 1.5), activation_bytes=rng.uniform(1, 10),
                     static_bytes=rng.uniform(0, 5), output_bytes=rng.uniform(0, 3), param_bytes=rng.uniform(0, 3))
        for i in range(num)
    ]


@pytest.mark.parametrize(("schedule", "chunks"), SCHEDULES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_extrapolation_equals_full_simulation(
    monkeypatch: pytest.MonkeyPatch, schedule: str, chunks: int, seed: int
) -> None:
    rng = random.Random(seed)
    p = rng.choice([2, 3, 4])
    m = p * rng.randint(80, 100) + (0 if chunks > 1 else rng.randint(0, p - 1))
    cluster = h.cluster(intra_bytes_per_s=rng.uniform(1, 4), intra_latency_s=0.01, devices_per_node=8)
    plan = h.plan(_random_layers(rng, p * chunks * 2), num_stages=p, num_chunks=chunks, num_microbatches=m,
                  schedule=schedule, data_parallel=2, the_cluster=cluster)
    exact = sim.simulate(plan, include_events=False)
    monkeypatch.setattr(extrapolate, "MAX_SIMULATED_ACTIONS", 10)
    assert extrapolate.needs_extrapolation(plan)
    sizes: list[int] = []
    original = extrapolate._with_microbatches
    monkeypatch.setattr(extrapolate, "_with_microbatches", lambda pl, mm: sizes.append(mm) or original(pl, mm))
    approx = sim.simulate(plan, include_events=False)
    assert sizes and max(sizes) < m  # extrapolated, not simulated in full
    assert approx.iteration_time_s == pytest.approx(exact.iteration_time_s, rel=1e-9)
    assert approx.bubble_fraction == pytest.approx(exact.bubble_fraction, rel=1e-9, abs=1e-12)
    for a, e in zip(approx.stages, exact.stages, strict=True):
        assert a.busy_s == pytest.approx(e.busy_s, rel=1e-9)
        assert a.peak_memory_bytes == pytest.approx(e.peak_memory_bytes, rel=1e-9)
        assert a.peak_inflight_microbatches == e.peak_inflight_microbatches


def test_the_largest_microbatch_count_is_extrapolated_exactly() -> None:
    plan = h.plan(h.uniform_layers(4, 1.0, 2.0), num_stages=4, num_microbatches=16_384)
    assert extrapolate.needs_extrapolation(plan)
    result = sim.simulate(plan, include_events=False)
    # 1F1B on identical stages: (m + p - 1) (F + B)  (dissertation ch. 4 bubble formula)
    assert result.iteration_time_s == pytest.approx((16_384 + 3) * 3.0, rel=1e-12)
    assert result.stages[0].peak_inflight_microbatches == 4


def test_timelines_are_built_in_full_up_to_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = h.plan(h.uniform_layers(4, 1.0, 2.0), num_stages=4, num_microbatches=16_384)
    full = sim.simulate(plan, include_events=True)  # below MAX_EVENT_ACTIONS: every event
    assert len(full.events) == extrapolate.num_actions(plan)
    monkeypatch.setattr(extrapolate, "MAX_EVENT_ACTIONS", 1000)
    with pytest.raises(InvalidProblemError, match="num_microbatches=16384"):
        sim.simulate(plan, include_events=True)


def test_bpipe_plans_extrapolate_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    from planner import api

    problem = api.make_problem("gpt-1.7b", "a100-80gb:8", bpipe=True, num_stages=4, num_microbatches=96)
    plan = api.plan(problem, solver="even")
    assert plan.bpipe is not None
    exact = sim.simulate(plan, include_events=False)
    monkeypatch.setattr(extrapolate, "MAX_SIMULATED_ACTIONS", 10)
    approx = sim.simulate(plan, include_events=False)
    assert approx.iteration_time_s == pytest.approx(exact.iteration_time_s, rel=1e-9)
    assert [s.peak_memory_bytes for s in approx.stages] == pytest.approx([s.peak_memory_bytes for s in exact.stages])


def test_a_retry_simulates_each_microbatch_count_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the first window is not affine the retry's window overlaps it: the shared counts are
    simulated once, and the result is the one the retry's three runs give."""
    plan = h.plan(h.uniform_layers(4, 1.0, 2.0), num_stages=4, num_microbatches=404)
    calls: list[int] = []

    def simulate(pl):  # noqa: ANN001, ANN202
        calls.append(pl.num_microbatches)
        return sim.simulate(pl, include_events=False)

    original = extrapolate._extrapolate
    windows: list[int] = []

    def first_window_fails(pl, runs, m_a, step):  # noqa: ANN001, ANN202
        windows.append(m_a)
        return None if len(windows) == 1 else original(pl, runs, m_a, step)

    monkeypatch.setattr(extrapolate, "_extrapolate", first_window_fails)
    result = extrapolate.simulate_many(plan, simulate)
    step = 12
    first, second = windows
    assert (first, second) == (8, 20)  # base 8, then 16: windows 8, 20, 32 and 20, 32, 44
    assert sorted(calls) == [first, first + step, first + 2 * step, first + 3 * step]
    runs = [sim.simulate(extrapolate._with_microbatches(plan, second + j * step), include_events=False)
            for j in range(3)]
    assert result == original(plan, runs, second, step)
