"""Seeded random cases: every built-in schedule on random per-stage costs, checked against an
independent reading of the timeline (no overlap on a rank, list order kept, durations and busy
time, every dependency respected and each action as early as allowed, bubbles and memory)."""

from __future__ import annotations

import random

import pytest

from cost_models.schedules import build_actions
from cost_models.simulate import PipelineCosts, simulate_costs
from planner.schema import Action, SimResult

TOL = 1e-9
NUM_CASES = 150


def _case(seed: int) -> tuple[PipelineCosts, tuple[tuple[Action, ...], ...], int]:
    rng = random.Random(seed)
    schedule = rng.choice(["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2"])
    p = rng.randint(1, 4)
    v = rng.randint(2, 3) if schedule == "interleaved-1f1b" else 1
    m = p * rng.randint(1, 3) if schedule == "interleaved-1f1b" else rng.randint(1, 8)
    k = p * v
    backward = [rng.uniform(0.2, 3.0) for _ in range(k)]
    costs = PipelineCosts(
        forward_s=[rng.uniform(0.1, 2.0) for _ in range(k)],
        backward_s=backward,
        backward_weight_s=[rng.uniform(0.0, 0.9) * b for b in backward],
        recompute_s=[rng.choice([0.0, rng.uniform(0.0, 1.0)]) for _ in range(k)],
        activation_bytes=[float(rng.randint(0, 100)) for _ in range(k)],
        send_forward_s=[rng.choice([0.0, rng.uniform(0.0, 0.5)]) for _ in range(k - 1)],
        send_backward_s=[rng.choice([0.0, rng.uniform(0.0, 0.5)]) for _ in range(k - 1)],
        static_bytes=[float(rng.randint(0, 1000)) for _ in range(p)],
        allreduce_s=[rng.choice([0.0, rng.uniform(0.0, 2.0)]) for _ in range(p)],
        memory_capacity_bytes=5000.0,
    )
    return costs, build_actions(schedule, num_stages=p, num_chunks=v, num_microbatches=m), m


def _intervals(result: SimResult, rank: int) -> list[tuple[str, int, int, float, float]]:
    """Compute actions of a rank in time order, each R event folded into its B or I."""
    out: list[tuple[str, int, int, float, float]] = []
    pending_r: float | None = None
    for e in sorted((e for e in result.events if e.rank == rank and e.kind != "AR"), key=lambda e: e.start_s):
        if e.kind == "R":
            pending_r = e.start_s
            continue
        start = e.start_s if pending_r is None else pending_r
        pending_r = None
        out.append((e.kind, e.stage, e.microbatch, start, e.end_s))
    return out


def _duration(costs: PipelineCosts, kind: str, k: int) -> float:
    w = costs.backward_weight_s[k]  # type: ignore[index]
    full = costs.recompute_s[k] + costs.backward_s[k]
    return {"F": costs.forward_s[k], "B": full, "I": full - w, "W": w}[kind]


def _ready(costs: PipelineCosts, end: dict[tuple[str, int, int], float], kind: str, k: int, i: int) -> float:
    """When an action's inputs are available (module docstring of cost_models.sim.pipeline)."""
    last = costs.num_virtual_stages - 1
    if kind == "F":
        return end[("F", k - 1, i)] + costs.send_forward_s[k - 1] if k else 0.0
    if kind == "W":
        return end[("I", k, i)]
    ready = end[("F", k, i)]
    if k < last:
        upstream = end.get(("B", k + 1, i), end.get(("I", k + 1, i)))
        assert upstream is not None
        ready = max(ready, upstream + costs.send_backward_s[k])
    return ready


@pytest.mark.parametrize("seed", range(NUM_CASES))
def test_random_schedules_respect_every_rule(seed: int) -> None:
    costs, actions, m = _case(seed)
    result = simulate_costs(costs, actions, num_microbatches=m)
    p = costs.num_ranks
    per_rank = [_intervals(result, r) for r in range(p)]
    end = {(kind, k, i): e for rank in per_rank for kind, k, i, _, e in rank}
    for r, rank in enumerate(per_rank):
        assert [Action(k, kind, i) for kind, k, i, _, _ in rank] == list(actions[r])  # list order kept
        free = 0.0
        for kind, k, i, start, stop in rank:
            assert stop - start == pytest.approx(_duration(costs, kind, k), abs=TOL)
            # never two things at once, every dependency respected, and no needless waiting
            assert start == pytest.approx(max(free, _ready(costs, end, kind, k, i)), abs=TOL)
            free = stop
        work = sum(_duration(costs, a.kind, a.stage) for a in actions[r])
        stage = result.stages[r]
        assert stage.busy_s == pytest.approx(work + costs.allreduce_s[r], abs=TOL)
        assert result.iteration_time_s >= work + costs.allreduce_s[r] - TOL
        assert stage.idle_s == pytest.approx(result.iteration_time_s - stage.busy_s, abs=TOL)
        _check_bubbles_and_memory(result, costs, r, rank)
    finish = [(rank[-1][4] if rank else 0.0) + costs.allreduce_s[r] for r, rank in enumerate(per_rank)]
    assert result.iteration_time_s == pytest.approx(max(finish), abs=TOL)
    total_idle = sum(s.idle_s for s in result.stages)
    assert result.bubble_fraction == pytest.approx(total_idle / (p * result.iteration_time_s), abs=TOL)


def _check_bubbles_and_memory(result: SimResult, costs: PipelineCosts, r: int, rank: list) -> None:  # noqa: ANN001
    """Memory by an independent sweep; bubbles are exactly the gaps, each with its free bytes."""
    stage, static = result.stages[r], costs.static_bytes[r]
    held, peak, peak_count, count = 0.0, 0.0, 0, 0
    split = {(k, i) for kind, k, i, _, _ in rank if kind == "I"}
    gaps: list[tuple[float, float, float]] = []
    cursor = 0.0
    for kind, k, i, s, e in rank:
        if s - cursor > TOL:
            gaps.append((cursor, s, costs.memory_capacity_bytes - static - held))
        if kind == "F":
            held += costs.activation_bytes[k]
            count += 1
            peak, peak_count = max(peak, held), max(peak_count, count)
        elif kind == "W" or (kind == "B" and (k, i) not in split):
            held -= costs.activation_bytes[k]
            count -= 1
        cursor = e
    cursor += costs.allreduce_s[r]
    if result.iteration_time_s - cursor > TOL:
        gaps.append((cursor, result.iteration_time_s, costs.memory_capacity_bytes - static - held))
    assert stage.peak_memory_bytes == pytest.approx(static + peak, abs=TOL)
    assert stage.peak_inflight_microbatches == peak_count
    got = [(b.start_s, b.end_s, b.free_memory_bytes) for b in stage.bubbles]
    assert len(got) == len(gaps)
    for (a, b, f), (ea, eb, ef) in zip(got, gaps):
        assert (a, b, f) == pytest.approx((ea, eb, ef), abs=1e-6)
    assert sum(b - a for a, b, _ in got) == pytest.approx(stage.idle_s, abs=1e-6)
    assert result.fits_memory == all(s.peak_memory_bytes <= 5000.0 for s in result.stages)
