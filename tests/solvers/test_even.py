"""The Megatron-even baseline: hand-checked splits, recompute choice, infeasibility."""

from __future__ import annotations

from pathlib import Path

import pytest

from cost_models.simulate import simulate
from planner.cli import main
from planner.errors import InfeasibleError, InvalidProblemError
from planner.schema import Cluster, Device, LayerProfile, ModelProfile, PipelineProblem, Plan, RecomputeOption
from solvers import get_solver
from solvers.even import even_bounds, solve


def _cluster(memory_bytes: float, num_devices: int = 2) -> Cluster:
    return Cluster(
        name="toy",
        device=Device(name="gpu", memory_headroom_bytes=0, memory_bytes=memory_bytes, peak_flops=1e12),
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


# ---------------------------------------------------------------- BPipe (seed 004, docs/bpipe.md)


def _plain_layer(name: str) -> LayerProfile:
    # static 8 bytes, keeps 8 bytes for backward, no recompute strategy to fall back on
    return LayerProfile(name=name, forward_s=1.0, backward_s=2.0, static_bytes=8, activation_bytes=8)


def _bpipe_problem(memory_bytes: float, *, bpipe: bool, bandwidth: float = 1e18, **kwargs: object) -> PipelineProblem:
    # p = 4, m = 8, two layers per stage: 16 static bytes and 16 bytes per activation set.
    # 1F1B holds 4, 3, 2, 1 sets (stage 0: 16 + 4 x 16 = 80 bytes); BPipe holds 3, 3, 2, 1 + 2 (64 bytes).
    model = kwargs.pop("model", ModelProfile(name="toy", layers=tuple(_plain_layer(f"l{i}") for i in range(8))))
    cluster = Cluster(
        name="toy", device=Device(name="gpu", memory_headroom_bytes=0, memory_bytes=memory_bytes, peak_flops=1e12), num_nodes=1,
        devices_per_node=4, intra_node_bytes_per_s=bandwidth, inter_node_bytes_per_s=bandwidth,
    )
    return PipelineProblem(model=model, cluster=cluster, num_stages=4, num_microbatches=8, bpipe=bpipe, **kwargs)


def test_bpipe_fits_where_the_plain_even_plan_does_not() -> None:
    with pytest.raises(InfeasibleError, match="needs 80 B per device"):
        solve(_bpipe_problem(64, bpipe=False))
    plan = solve(_bpipe_problem(64, bpipe=True))
    assert plan.bpipe is not None
    assert plan.bpipe.pairs == ((0, 3), (1, 2)) and plan.bpipe.target_inflight == 3
    assert [s.ranks for s in plan.stages] == [(0,), (2,), (3,), (1,)]  # pair-adjacent: [0, 3, 1, 2]
    result = simulate(plan)
    assert result.fits_memory and [s.peak_memory_bytes for s in result.stages] == [64, 64, 48, 64]
    assert plan.predicted is not None and plan.predicted.iteration_time_s == pytest.approx((8 + 3) * 6)
    assert any(n.startswith("bpipe: pairs [[0, 3], [1, 2]]") for n in plan.notes)
    again = Plan.from_json(plan.to_json())
    assert again == plan and simulate(again).iteration_time_s == result.iteration_time_s


def test_bpipe_picks_recompute_with_the_balanced_counts() -> None:
    # With full recompute offered (1 byte per layer, +1 s): plain needs full (none peaks at 80 > 64);
    # with BPipe none fits (64), so the plan runs (m + p - 1)(F + B) = 11 x 6 instead of 11 x 8.
    plain = solve(_bpipe_problem(64, bpipe=False, model=_model(8)))
    balanced = solve(_bpipe_problem(64, bpipe=True, model=_model(8)))
    assert {s for st in plain.stages for c in st.chunks for s in c.layer_strategies()} == {"full"}
    assert {s for st in balanced.stages for c in st.chunks for s in c.layer_strategies()} == {"none"}
    assert plain.predicted is not None and balanced.predicted is not None
    assert (plain.predicted.iteration_time_s, balanced.predicted.iteration_time_s) == pytest.approx((88, 66))


def test_bpipe_link_check_rejects_or_warns() -> None:
    # A set of 16 bytes over the pair link; stage F = 2 s, B = 4 s.
    # 4 bytes/s: 4 s per transfer, 2 x 4 > F + B: rejected (App. B relaxed bound).
    with pytest.raises(InfeasibleError, match="pair link too slow for stage 0 -> 3"):
        solve(_bpipe_problem(1e9, bpipe=True, bandwidth=4.0))
    # 6.4 bytes/s: 2.5 s > F but 2 x 2.5 <= F + B: planned, with a warning note.
    plan = solve(_bpipe_problem(1e9, bpipe=True, bandwidth=6.4))
    assert plan.bpipe is not None and any("longer than the forward" in n for n in plan.notes)


def test_bpipe_below_four_stages_and_unsupported_schedules() -> None:
    # a fixed depth below 4 is refused (BPipe would move nothing); a depth the solver picks gets a note
    with pytest.raises(ValueError, match="num_stages >= 4"):
        PipelineProblem(model=_model(), cluster=_cluster(1e9), num_stages=2, num_microbatches=4, bpipe=True)
    plan = solve(PipelineProblem(model=_model(), cluster=_cluster(1e9, num_devices=1), num_microbatches=4, bpipe=True))
    assert plan.bpipe is None and any("planned without it" in n for n in plan.notes)
    with pytest.raises(InvalidProblemError, match="bpipe balances the 1F1B"):
        solve(_bpipe_problem(1e9, bpipe=True, schedule="gpipe"))


def test_cli_plan_with_bpipe(tmp_path: Path) -> None:
    problem = _bpipe_problem(64, bpipe=True)
    model, cluster = tmp_path / "model.json", tmp_path / "cluster.json"
    model.write_text(problem.model.to_json())
    cluster.write_text(problem.cluster.to_json())
    args = ["plan", "--model", str(model), "--cluster", str(cluster), "--pipeline", "4", "--microbatches", "8"]
    assert main(args) == 3  # the plain even plan does not fit
    out = tmp_path / "plan.json"
    assert main([*args, "--bpipe", "-o", str(out)]) == 0
    plan = Plan.from_json(out.read_text())
    assert plan.bpipe is not None and simulate(plan).fits_memory
    assert main(["simulate", str(out), "--json"]) == 0
