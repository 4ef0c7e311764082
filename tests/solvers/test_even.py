"""The Megatron-even baseline: hand-checked splits, recompute choice, infeasibility."""

from __future__ import annotations

import pytest

from cost_models.simulate import simulate
from planner.errors import InfeasibleError, InvalidProblemError
from planner.schema import Cluster, Device, LayerProfile, ModelProfile, PipelineProblem, RecomputeOption
from solvers import get_solver
from solvers.even import even_bounds, solve


def _cluster(memory_bytes: float, num_devices: int = 2) -> Cluster:
    return Cluster(
        name="toy",
        device=Device(name="gpu", memory_bytes=memory_bytes, peak_flops=1e12),
        num_nodes=1,
        devices_per_node=num_devices,
        intra_node_bytes_per_s=1e18,
        inter_node_bytes_per_s=1e18,
    )


def _layer(name: str = "l", kind: str = "layer") -> LayerProfile:
    # static 8 bytes; keeps 8 bytes for backward without recompute, 1 byte with full (+1 s)
    return LayerProfile(
        name=name, kind=kind, forward_s=1.0, backward_s=2.0, static_bytes=8,
        recompute={"none": RecomputeOption(activation_bytes=8), "full": RecomputeOption(activation_bytes=1, extra_s=1.0)},
    )


def _model(n: int = 8) -> ModelProfile:
    return ModelProfile(name="toy", layers=tuple(_layer(f"l{i}") for i in range(n)))


def test_even_split_without_recompute_when_memory_is_ample() -> None:
    problem = PipelineProblem(model=_model(), cluster=_cluster(1e9), num_stages=2, num_microbatches=4)
    plan = solve(problem)
    assert [c.layers for s in plan.stages for c in s.chunks] == [(0, 4), (4, 8)]
    assert all(s == "none" for st in plan.stages for c in st.chunks for s in c.layer_strategies())
    # uniform 1F1B: (m + p - 1) x (4 layers x 3 s)
    assert plan.predicted is not None
    assert plan.predicted.iteration_time_s == pytest.approx((4 + 2 - 1) * 12)
    assert plan.predicted.iteration_time_s == pytest.approx(simulate(plan).iteration_time_s)
    assert plan.global_batch_size == 4 and plan.degrees.data == 1
    assert [s.ranks for s in plan.stages] == [(0,), (1,)]


def test_even_picks_the_cheapest_recompute_that_fits() -> None:
    # stage 0 holds min(p - s, m) = 2 microbatches of activations (1F1B):
    # none: 4 x 8 static + 2 x 4 x 8 = 96 bytes; full: 32 + 2 x 4 x 1 = 40 bytes
    problem = PipelineProblem(model=_model(), cluster=_cluster(64), num_stages=2, num_microbatches=4)
    plan = solve(problem)
    assert {s for st in plan.stages for c in st.chunks for s in c.layer_strategies()} == {"full"}
    assert plan.predicted is not None
    assert max(plan.predicted.peak_memory_bytes) == pytest.approx(40)
    roomy = solve(PipelineProblem(model=_model(), cluster=_cluster(96), num_stages=2, num_microbatches=4))
    assert roomy.predicted is not None and max(roomy.predicted.peak_memory_bytes) == pytest.approx(96)


def test_even_infeasible_says_how_much_memory_it_needs() -> None:
    problem = PipelineProblem(model=_model(), cluster=_cluster(20), num_stages=2, num_microbatches=4)
    with pytest.raises(InfeasibleError, match=r"needs 40 B per device but gpu has 20 B"):
        solve(problem)


def test_even_chooses_the_smallest_depth_that_fits() -> None:
    # one stage: 8 x 8 static + 1 x 8 x 8 (m=4, p=1 -> 1 in flight) = 128 > 100
    # two stages: 4 x 8 + 2 x 32 = 96 <= 100
    cluster = _cluster(100, num_devices=4)
    plan = solve(PipelineProblem(model=_model(), cluster=cluster, num_microbatches=4), options={"recompute": "none"})
    assert plan.degrees.pipeline == 2 and plan.degrees.data == 2
    assert plan.stages[1].ranks == (2, 3)


def test_even_bounds_keep_embedding_and_head_at_the_ends() -> None:
    layers = (_layer("emb", "embedding"), *(_layer(f"b{i}", "decoder") for i in range(8)), _layer("head", "head"))
    model = ModelProfile(name="t", layers=layers)
    assert even_bounds(model, 4) == [0, 3, 5, 7, 10]
    assert even_bounds(model, 3) == [0, 4, 7, 10]
    assert even_bounds(_model(8), 3) == [0, 3, 6, 8]


def test_even_interleaved_places_chunks_megatron_style() -> None:
    problem = PipelineProblem(
        model=_model(8), cluster=_cluster(1e9), schedule="interleaved-1f1b", num_stages=2, num_chunks=2,
        num_microbatches=4,
    )
    plan = solve(problem)
    assert [[c.layers for c in s.chunks] for s in plan.stages] == [[(0, 2), (4, 6)], [(2, 4), (6, 8)]]
    assert plan.predicted is not None
    # interleaved bubble (p-1)/(v m) of the ideal time m (t_f + t_b) = 4 x 12
    assert plan.predicted.iteration_time_s == pytest.approx(48 * (1 + 1 / 8))


def test_unknown_solver_and_option_are_clear() -> None:
    with pytest.raises(InvalidProblemError, match=r"unknown solver 'evn'; choose from \[.*'even'"):
        get_solver("evn")
    problem = PipelineProblem(model=_model(), cluster=_cluster(1e9), num_stages=2)
    with pytest.raises(InvalidProblemError, match="has no option 'recomp'; valid options: recompute"):
        solve(problem, options={"recomp": "full"})
    with pytest.raises(InvalidProblemError, match="no layer of toy offers it"):
        solve(problem, options={"recompute": "selective"})


def test_global_batch_must_split() -> None:
    problem = PipelineProblem(model=_model(), cluster=_cluster(1e9), num_stages=2, global_batch_size=6, data_parallel=1)
    assert solve(problem).num_microbatches == 6
    bad = PipelineProblem(model=_model(), cluster=_cluster(1e9, 4), num_stages=2, global_batch_size=5)
    with pytest.raises(InfeasibleError, match=r"global_batch_size=5 is not divisible by .* data_parallel 2 = 2; use a multiple of 2 \(4 or 6\)"):
        solve(bad)
