"""PipeDream's top level as a min-max cover (solvers._pipedream_cover): brute force on random
tables, and the same infeasibility verdict and memory figure as the full top-level table."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from planner.errors import InfeasibleError
from planner.schema import PipelineProblem
from solvers._pipedream_artifact import Chain, MemoryLimit, RangeValues, solve_range
from solvers._pipedream_cover import min_max_cover
from solvers.common import format_bytes
from solvers.pipedream_dp import Level, level_costs, memory_needed, partition, solve
from tests.solvers.test_pipedream import _cluster, _layer, _model, _Oracle, _random_case

INF = math.inf


def _brute_cover(value: dict[tuple[int, int], float], num: int, max_parts: int) -> float:
    best = INF
    for k in range(min(num, max_parts)):
        for cuts in itertools.combinations(range(num - 1), k):
            ranges = zip([0] + [c + 1 for c in cuts], list(cuts) + [num - 1])
            best = min(best, max(value[r] for r in ranges))
    return best


def _random_table(rng: random.Random, num: int) -> np.ndarray:
    table = np.full((num, num), INF)
    for a in range(num):
        for b in range(a, num):
            table[a, b] = INF if rng.random() < 0.3 else float(rng.randint(0, 20))
    return table


def test_cover_equals_brute_force_on_random_tables() -> None:
    rng = random.Random(3)
    for trial in range(60):
        num = rng.randint(1, 8)
        table = _random_table(rng, num)
        value = {(a, b): float(table[a, b]) for a in range(num) for b in range(a, num)}
        for max_parts in (1, 2, 3, num, num + 3):
            got = min_max_cover(RangeValues(table=table), num, max_parts)
            assert got == _brute_cover(value, num, max_parts), (trial, max_parts)
        prefix, suffix = table[0].copy(), table[:, num - 1].copy()
        got = min_max_cover(RangeValues(prefix=prefix, suffix=suffix), num, 2)
        assert got == _brute_cover(value, num, 2), trial


_COUNTS = [[2, 2], [3, 2], [2, 3], [3, 3], [2, 2, 2]]


@pytest.mark.parametrize("counts", _COUNTS, ids=lambda c: "x".join(map(str, c)))
def test_memory_needed_equals_the_memory_dp(counts: list[int]) -> None:
    """The figure the infeasibility message quotes: the same float as the full memory DP and
    as brute force."""
    rng = random.Random(f"cover-{counts}")
    for trial in range(6):
        model, levels = _random_case(rng, counts)
        chain, oracle = Chain.from_model(model), _Oracle(model, levels, "memory")
        limit = MemoryLimit(capacity_bytes=INF, num_workers=oracle.num_workers)
        full, _ = partition(chain, levels, mode="memory", memory=limit)
        assert memory_needed(chain, levels, oracle.num_workers) == full == oracle.value(), trial


@pytest.mark.parametrize("mode", ["dissertation", "artifact"])
def test_verdict_equals_the_full_top_table(mode: str) -> None:
    """Larger chains than brute force reaches, memory limits around the smallest that fits: the
    partition (with the cover's early refusal) equals the top-level table read without it, and
    it is infeasible exactly when the memory needed exceeds the capacity."""
    rng = random.Random(mode)
    levels = [Level(num_workers=3, bandwidth_bytes_per_s=5.0, workers_below=1),
              Level(num_workers=5, bandwidth_bytes_per_s=1.0, workers_below=3)]
    verdicts = set()
    for _ in range(8):
        layers = [_layer(i, rng.uniform(0.1, 2), rng.uniform(0.1, 4), w=rng.uniform(0, 30), a=rng.uniform(0, 10),
                         static=rng.uniform(0, 20), act=rng.uniform(0, 5)) for i in range(24)]
        chain = Chain.from_model(_model(layers))
        needed = memory_needed(chain, levels, 15)
        for capacity in (needed * 0.9, needed, needed * 1.2):
            limit = MemoryLimit(capacity_bytes=capacity, num_workers=15)
            top = level_costs(chain, levels, mode=mode, memory=limit)[-1]
            value, stages = partition(chain, levels, mode=mode, memory=limit)
            assert value == solve_range(top, 0, 24)[0]
            assert math.isfinite(value) == (needed <= capacity) == bool(stages)
            verdicts.add(math.isfinite(value))
    assert verdicts == {True, False}


def test_infeasible_message_quotes_the_full_dp_figure() -> None:
    """Through the solver: a two-level cluster whose memory no partition fits; the message's
    figure is the full memory DP's, and that memory makes it feasible."""
    layers = [_layer(i, 1.0, 2.0, w=2, a=1, static=10, act=3) for i in range(9)]
    problem = PipelineProblem(model=_model(layers), cluster=_cluster(2, nodes=3, intra=8.0, inter=1.0, memory=40))
    levels = [Level(num_workers=2, bandwidth_bytes_per_s=8.0, workers_below=1),
              Level(num_workers=3, bandwidth_bytes_per_s=1.0, workers_below=2)]
    full, _ = partition(Chain.from_model(problem.model), levels, mode="memory",
                        memory=MemoryLimit(capacity_bytes=INF, num_workers=6))
    assert full > 40
    with pytest.raises(InfeasibleError) as err:
        solve(problem)
    assert str(err.value).count(format_bytes(full)) == 2
    roomy = problem.model_copy(update={"cluster": _cluster(2, nodes=3, intra=8.0, inter=1.0, memory=full)})
    assert solve(roomy).stages
