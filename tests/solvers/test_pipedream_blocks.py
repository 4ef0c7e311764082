"""PipeDream's DP on blocks of identical layers (deep models): valid plans, the ungrouped optimum
when it lies on block edges, never better than it, and a note saying so."""

from __future__ import annotations

import random

import pytest

from planner.schema import PipelineProblem
from solvers import _pipedream_blocks as blocks
from solvers.pipedream_dp import solve
from tests.solvers.test_pipedream import _cluster, _layer, _model


def _deep(num_body: int, rng: random.Random | None = None) -> PipelineProblem:
    head = [_layer(0, 3.0, 5.0, w=4, a=2)]
    body = [_layer(i, 1.0, 2.0, w=1, a=1) for i in range(1, num_body + 1)]
    tail = [_layer(num_body + 1, 2.0, 2.0 if rng is None else rng.uniform(1, 4), w=2, a=1)]
    return PipelineProblem(model=_model(head + body + tail), cluster=_cluster(4, intra=50.0))


def test_block_starts_split_runs_evenly() -> None:
    problem = _deep(30)
    assert blocks.block_starts(problem.model, max_layers=40) is None
    starts = blocks.block_starts(problem.model, max_layers=12)
    assert starts is not None and starts[0] == 0 and starts[-1] == 32 and len(starts) - 1 <= 12
    assert starts[1] == 1 and starts[-2] == 31  # the distinct first and last layers stay single
    sizes = [b - a for a, b in zip(starts[1:-2], starts[2:-1])]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grouped_dp_is_valid_and_never_beats_the_exact_one(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    problem = _deep(24, random.Random(seed))
    exact = solve(problem)
    monkeypatch.setattr(blocks, "MAX_DP_LAYERS", 8)
    grouped = solve(problem)
    assert grouped.status == "feasible" and any("grouped into" in note for note in grouped.notes)
    covered = [i for st in grouped.stages for c in st.chunks for i in range(*c.layers)]
    assert covered == list(range(problem.model.num_layers))
    assert grouped.predicted.bottleneck_s >= exact.predicted.bottleneck_s * (1 - 1e-12)  # type: ignore[union-attr]


def test_grouped_dp_finds_the_exact_optimum_on_block_edges(monkeypatch: pytest.MonkeyPatch) -> None:
    body = [_layer(i, 1.0, 2.0, w=1, a=1) for i in range(32)]
    problem = PipelineProblem(model=_model(body), cluster=_cluster(4, intra=50.0))
    exact = solve(problem)
    monkeypatch.setattr(blocks, "MAX_DP_LAYERS", 8)  # blocks of 4 identical layers
    grouped = solve(problem)
    assert grouped.predicted.bottleneck_s == pytest.approx(exact.predicted.bottleneck_s, rel=1e-12)  # type: ignore[union-attr]
