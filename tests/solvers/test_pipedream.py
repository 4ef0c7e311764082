"""PipeDream's partitioning DP (solvers.pipedream_dp): brute force, hand examples, the public
artifact's VGG-16 and GNMT decisions, branchy profiles, memory and error messages."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterator

import pytest

from cost_models.profiles import list_pipedream_profiles, pipedream_profile
from planner import api
from cost_models.simulate import simulate
from planner.errors import InfeasibleError, InvalidProblemError
from planner.schema import Cluster, Device, LayerProfile, ModelProfile, PipelineProblem, Plan
from solvers._pipedream_artifact import Chain, LevelCosts, MemoryLimit, forward_values, solve_range, suffix_values
from solvers.common import format_bytes
from solvers.pipedream_dp import Level, level_costs, partition, solve, upper_bound_s

INF = math.inf


def _cluster(
    per_node: int, nodes: int = 1, *, intra: float = 1.0, inter: float | None = None, memory: float = 1e18
) -> Cluster:
    return Cluster(
        name="toy", device=Device(name="gpu", memory_headroom_bytes=0, memory_bytes=memory, peak_flops=1e12), num_nodes=nodes,
        devices_per_node=per_node, intra_node_bytes_per_s=intra, inter_node_bytes_per_s=inter or intra,
    )


def _layer(
    i: int, fwd: float, bwd: float, *, w: float = 0, a: float = 0, static: float = 0, act: float = 0
) -> LayerProfile:
    return LayerProfile(name=f"l{i}", forward_s=fwd, backward_s=bwd, param_bytes=w, output_bytes=a,
                        static_bytes=static, activation_bytes=act)


def _model(layers: list[LayerProfile]) -> ModelProfile:
    return ModelProfile(name="toy", layers=tuple(layers))


def _config(plan: Plan) -> list[tuple[tuple[int, int], int]]:
    return [(s.chunks[0].layers, s.replicas) for s in plan.stages]


# --------------------------------------------------------------------------------------
# Brute force: every partition into contiguous stages x every composition of the workers
# --------------------------------------------------------------------------------------


def _partitions(first: int, last: int) -> Iterator[tuple[list[tuple[int, int]], tuple[int, ...]]]:
    for k in range(last - first + 1):
        for cuts in itertools.combinations(range(first, last), k):
            yield list(zip([first] + [c + 1 for c in cuts], list(cuts) + [last])), cuts


def _compositions(total: int, parts: int) -> Iterator[list[int]]:
    for bars in itertools.combinations(range(1, total), parts - 1):
        edges = (0, *bars, total)
        yield [edges[i + 1] - edges[i] for i in range(parts)]


def _brute(first: int, last: int, workers: int, stage: Callable[[int, int, int, int], float],
           cut: Callable[[int], float]) -> float:
    """min over configurations of the max of every stage term (stage a..b, y replicas, u workers
    before it) and every boundary term."""
    best = INF
    for stages, cuts in _partitions(first, last):
        if len(stages) > workers:
            continue
        for replicas in _compositions(workers, len(stages)):
            before = list(itertools.accumulate([0] + replicas[:-1]))
            terms = [stage(a, b, y, u) for (a, b), y, u in zip(stages, replicas, before)]
            best = min(best, max(terms + [cut(c) for c in cuts]))
    return best


class _Oracle:
    """The accountings written out independently of the solver (same float operations)."""

    def __init__(self, model: ModelProfile, levels: list[Level], mode: str, *, capacity: float | None = None,
                 ratio: float | None = None) -> None:
        self.layers, self.levels, self.mode, self.capacity, self.ratio = model.layers, levels, mode, capacity, ratio
        self.num_workers = math.prod(lv.num_workers for lv in levels)

    def _sum(self, field: str, a: int, b: int) -> float:
        if field == "compute":
            return sum(lay.forward_s + lay.backward_s for lay in self.layers[a : b + 1])
        return sum(getattr(lay, field) or 0.0 for lay in self.layers[a : b + 1])

    def _memory(self, a: int, b: int, y: int, u: int) -> float:
        n = math.ceil((self.num_workers - u) / y)
        return (self._sum("static_bytes", a, b) + (n - 1) * self._sum("param_bytes", a, b)
                + n * self._sum("activation_bytes", a, b))

    def stage_fn(self, k: int, lower: dict[tuple[int, int], float] | None) -> Callable[[int, int, int, int], float]:
        level = self.levels[k]
        bw, last_layer = level.bandwidth_bytes_per_s, len(self.layers) - 1

        def stage(a: int, b: int, y: int, u: int) -> float:
            if self.mode == "memory":
                return lower[(a, b)] if lower is not None else self._memory(a, b, y, u)
            c = lower[(a, b)] if lower is not None else self._sum("compute", a, b)
            w = self._sum("param_bytes", a, b)
            if self.mode == "dissertation":
                t = max(c, 2.0 * (y - 1) * w / bw) / y
            else:
                allreduce = 4 * (y - 1) * w / (bw * y)
                t = (c + allreduce / level.workers_below) / y if u == 0 else (c + allreduce) / y
                if self.ratio is not None and u > 0:
                    t_in = 2.0 * self.layers[a - 1].output_bytes / (bw * y * self.ratio)
                    t_out = 2.0 * self.layers[b].output_bytes / (bw * y * self.ratio) if b < last_layer else 0.0
                    t = max(t, t_in, t_out)
            if self.capacity is not None and lower is None and self._memory(a, b, y, u) > self.capacity:
                return INF
            return t

        return stage

    def cut_fn(self, k: int) -> Callable[[int], float]:
        bw = self.levels[k].bandwidth_bytes_per_s
        if self.mode == "dissertation":
            return lambda s: 2.0 * self.layers[s].output_bytes / bw
        return lambda s: 0.0

    def value(self) -> float:
        num = len(self.layers)
        lower: dict[tuple[int, int], float] | None = None
        for k in range(len(self.levels) - 1):
            stage, cut = self.stage_fn(k, lower), self.cut_fn(k)
            n = self.levels[k].num_workers
            lower = {(a, b): _brute(a, b, n, stage, cut) for a in range(num) for b in range(a, num)}
        k = len(self.levels) - 1
        return _brute(0, num - 1, self.levels[k].num_workers, self.stage_fn(k, lower), self.cut_fn(k))


def _random_case(rng: random.Random, counts: list[int]) -> tuple[ModelProfile, list[Level]]:
    num = rng.randint(1, 7)
    layers = [
        _layer(i, rng.randint(1, 5), rng.randint(1, 8), w=rng.choice([0, 0, rng.randint(1, 20)]),
               a=rng.randint(0, 12), static=rng.randint(0, 30), act=rng.randint(0, 10))
        for i in range(num)
    ]
    levels, below = [], 1
    for count in counts:
        bandwidth = float(rng.choice([1, 2, 3, 8]))
        levels.append(Level(num_workers=count, bandwidth_bytes_per_s=bandwidth, workers_below=below))
        below = count
    return _model(layers), levels


_COUNTS = [[1], [2], [3], [4], [5], [6], [2, 2], [3, 2], [2, 3], [3, 3], [1, 2]]


@pytest.mark.parametrize("mode", ["dissertation", "artifact"])
@pytest.mark.parametrize("counts", _COUNTS, ids=lambda c: "x".join(map(str, c)))
def test_dp_equals_brute_force(mode: str, counts: list[int]) -> None:
    rng = random.Random(f"{mode}-{counts}")
    for trial in range(10):
        model, levels = _random_case(rng, counts)
        memory = rng.choice([None, rng.randint(20, 150)]) if trial % 2 else None
        ratio = rng.choice([None, 0.5, 2.0]) if mode == "artifact" else None
        oracle = _Oracle(model, levels, mode, capacity=memory, ratio=ratio)
        limit = None if memory is None else MemoryLimit(capacity_bytes=memory, num_workers=oracle.num_workers)
        value, stages = partition(Chain.from_model(model), levels, mode=mode, memory=limit, compression_ratio=ratio)
        expected = oracle.value()
        assert value == expected, (trial, model, levels, memory, ratio)
        if not math.isfinite(expected):
            assert stages == []
            continue
        # the returned stages cover the layers, use every worker once and attain the value
        assert [a for a, _, _ in stages] == [0] + [b + 1 for _, b, _ in stages[:-1]]
        assert stages[-1][1] == model.num_layers - 1
        assert sorted(w for _, _, ws in stages for w in ws) == list(range(oracle.num_workers))
        if len(levels) == 1:
            stage, cut = oracle.stage_fn(0, None), oracle.cut_fn(0)
            before = list(itertools.accumulate([0] + [len(ws) for _, _, ws in stages[:-1]]))
            terms = [stage(a, b, len(ws), u) for (a, b, ws), u in zip(stages, before)]
            assert max(terms + [cut(b) for _, b, _ in stages[:-1]]) == value


@pytest.mark.parametrize("mode", ["dissertation", "artifact"])
def test_pruning_and_suffix_tables_agree_with_the_plain_dp(mode: str) -> None:
    """Larger random chains than brute force reaches: the pruned top level equals the unpruned
    one (value and stages), and the suffix table equals forward DPs from every start."""
    rng = random.Random(mode)
    for _ in range(3):
        layers = [_layer(i, rng.uniform(0.1, 2), rng.uniform(0.1, 4), w=rng.uniform(0, 30), a=rng.uniform(0, 10),
                         static=rng.uniform(0, 20), act=rng.uniform(0, 5)) for i in range(40)]
        chain = Chain.from_model(_model(layers))
        limit = MemoryLimit(capacity_bytes=rng.uniform(150, 400), num_workers=12) if rng.random() < 0.5 else None
        costs = LevelCosts(chain=chain, mode=mode, num_workers=12, bandwidth_bytes_per_s=rng.uniform(1, 20),
                           memory=limit, compression_ratio=2.0 if mode == "artifact" else None)
        bound = upper_bound_s(costs)
        assert solve_range(costs, 0, 40, bound_s=bound) == solve_range(costs, 0, 40)
        small = LevelCosts(chain=chain, mode=mode, num_workers=4, bandwidth_bytes_per_s=3.0, memory=limit,
                           workers_below=1)
        tails = suffix_values(small)
        for first in range(0, 40, 7):
            assert tails[first] == forward_values(small, first, 40, max_workers=4)[4, -1]
    levels = [Level(num_workers=3, bandwidth_bytes_per_s=5.0, workers_below=1),
              Level(num_workers=4, bandwidth_bytes_per_s=1.0, workers_below=3)]
    top = level_costs(chain, levels, mode=mode)[-1]
    assert solve_range(top, 0, 40, bound_s=upper_bound_s(top)) == solve_range(top, 0, 40)


def test_brute_force_on_the_memory_requirement() -> None:
    rng = random.Random(7)
    for counts in ([4], [2, 2], [3, 2]):
        for _ in range(4):
            model, levels = _random_case(rng, counts)
            oracle = _Oracle(model, levels, "memory")
            limit = MemoryLimit(capacity_bytes=INF, num_workers=oracle.num_workers)
            value, _ = partition(Chain.from_model(model), levels, mode="memory", memory=limit)
            assert value == oracle.value()


# --------------------------------------------------------------------------------------
# Hand examples
# --------------------------------------------------------------------------------------


def _fig27() -> ModelProfile:
    # Fig. 2.7 (L1292-1296): stage 1 forward 2 / backward 4, stage 2 forward 1 / backward 2;
    # digest Sec. 6.2: w = [0, 10], B = 1, a_1 = 1.5 so that pure DP does not tie
    return _model([_layer(0, 2, 4, w=0, a=1.5), _layer(1, 1, 2, w=10)])


def test_fig_2_7_two_one_configuration() -> None:
    plan = solve(PipelineProblem(model=_fig27(), cluster=_cluster(3)))
    # 2-1: max(6 / 2, 2 x 1.5 / 1, 3) = 3; 1-2 = 10; pure DP = max(9, 40) / 3 = 13.3
    assert _config(plan) == [((0, 1), 2), ((1, 2), 1)]
    assert [s.ranks for s in plan.stages] == [(0, 1), (2,)]
    assert plan.predicted is not None and plan.predicted.bottleneck_s == 3.0
    assert plan.options["noam"] == 2 and plan.degrees.data == 1 and plan.degrees.pipeline == 2
    assert any("NOAM = ceil(3 workers / 2 input-stage replicas) = 2" in n for n in plan.notes)
    # 1F1B-RR steady state: 4 x NOAM = 8 microbatches per input replica, 16 inputs, one every
    # 3 s; both replicas of stage 0 (6 s per input, every other input) and stage 1 (3 s) are busy
    assert plan.num_microbatches == 8 and plan.global_batch_size == 16
    assert plan.predicted.iteration_time_s == pytest.approx(16 * 3)
    assert plan.predicted.bubble_fraction == pytest.approx(0.0, abs=1e-12)
    sim = simulate(plan)
    # NOAM per stage: ceil(3 / 2) = 2 in flight on a stage-0 replica, ceil(1 / 1) = 1 on stage 1
    assert [s.peak_inflight_microbatches for s in sim.stages] == [2, 1]


def test_pure_data_parallelism_when_communication_is_cheap() -> None:
    layers = [_layer(i, t / 2, t / 2, w=1, a=1e6) for i, t in enumerate([1, 2, 3, 4])]
    plan = solve(PipelineProblem(model=_model(layers), cluster=_cluster(4, intra=1e9)))
    # DP: max(10, 2 x 3 x 4 / 1e9) / 4 = 2.5; any pipeline has a stage of >= 3 per input
    assert _config(plan) == [((0, 4), 4)]
    assert plan.predicted is not None and plan.predicted.bottleneck_s == 2.5
    assert plan.options["noam"] == 1 and plan.degrees.data == 4
    assert plan.predicted.iteration_time_s == pytest.approx(simulate(plan).iteration_time_s)


def test_straight_pipeline_when_weights_are_huge() -> None:
    layers = [_layer(i, 0.5, 0.5, w=1e12, a=1.0) for i in range(4)]
    plan = solve(PipelineProblem(model=_model(layers), cluster=_cluster(4, intra=1e9)))
    # any replication costs 2 (y-1) 1e12 / 1e9 / y >= 1000 s; straight: max(1, 2 x 1 / 1e9) = 1
    assert _config(plan) == [((i, i + 1), 1) for i in range(4)]
    assert plan.options["noam"] == 4  # 4-stage straight pipeline: NOAM = 4 (L1334-1336)
    assert plan.predicted is not None and plan.predicted.bottleneck_s == 1.0
    sim = simulate(plan)
    assert plan.predicted.iteration_time_s == pytest.approx(sim.iteration_time_s)
    assert plan.num_microbatches == 16  # 4 x NOAM


def test_ties_prefer_one_stage_then_the_earliest_split() -> None:
    free = [_layer(i, 0.5, 0.5) for i in range(2)]  # no weights, no activations: DP ties a pipeline
    assert _config(solve(PipelineProblem(model=_model(free), cluster=_cluster(2)))) == [((0, 2), 2)]
    heavy = [_layer(i, 0.5, 0.5, w=1e9) for i in range(3)]  # splits after layer 0 and 1 both give 2
    assert _config(solve(PipelineProblem(model=_model(heavy), cluster=_cluster(2)))) == [((0, 1), 1), ((1, 3), 1)]


def test_same_input_same_plan() -> None:
    problem = PipelineProblem(model=pipedream_profile("resnet50"), cluster=_cluster(8, 2, intra=1e10, inter=1e9))
    first, second = solve(problem), solve(problem)
    assert first.model_copy(update={"solve_time_s": 0.0}) == second.model_copy(update={"solve_time_s": 0.0})


def test_hierarchical_ranks_follow_the_topology() -> None:
    # slow links inside a node keep each node straight; fast links between the 2 nodes make
    # replicating the whole node pipeline cheapest: T^2 = max(1, 2 x 1 x 2 / 1e9) / 2 = 0.5
    layers = [_layer(i, 0.5, 0.5, w=1) for i in range(2)]
    plan = solve(PipelineProblem(model=_model(layers), cluster=_cluster(2, 2, intra=1.0, inter=1e9)))
    assert _config(plan) == [((0, 1), 2), ((1, 2), 2)]
    assert [s.ranks for s in plan.stages] == [(0, 2), (1, 3)]
    assert plan.options["levels"] == "2x2" and plan.degrees.data == 2
    assert plan.predicted is not None and plan.predicted.bottleneck_s == 0.5


def test_levels_option_overrides_the_cluster() -> None:
    layers = [_layer(i, 0.5, 0.5, w=1e12) for i in range(4)]
    plan = solve(PipelineProblem(model=_model(layers), cluster=_cluster(8)), options={"levels": "2x2"})
    assert plan.options["levels"] == "2x2" and sum(s.replicas for s in plan.stages) == 4
    assert any("uses 4 of the cluster's 8 workers" in n for n in plan.notes)


# --------------------------------------------------------------------------------------
# The public artifact (msr-fiddle/pipedream) on its own profiles
# --------------------------------------------------------------------------------------


def test_artifact_vgg16_on_four_workers_is_three_one() -> None:
    """The repo ships VGG-16 gpus=4 as 3-1 (digest Sec. 8.1; hybrid_conf.json stage_to_rank_map
    {0: [0, 1, 2], 1: [3]}). The artifact's accounting at its default 1e9 B/s splits the profile
    after node16 (a conv); its pipeline time is stage 0 = (C + 4 x 2 x W / (1e9 x 3)) / 3."""
    model = pipedream_profile("vgg16")
    problem = PipelineProblem(model=model, cluster=_cluster(4, intra=1e9))
    plan = solve(problem, options={"cost_mode": "artifact"})
    assert _config(plan) == [((0, 15), 3), ((15, 36), 1)]
    assert model.layers[14].name == "node16:Conv2d" and model.layers[15].name == "node17:ReLU"
    compute = sum(layer.forward_s + layer.backward_s for layer in model.layers[:15])
    weights = sum(layer.param_bytes for layer in model.layers[:15])
    assert plan.predicted is not None
    assert plan.predicted.bottleneck_s == pytest.approx((compute + 4 * 2 * weights / (1e9 * 3)) / 3, rel=1e-12)
    assert plan.predicted.bottleneck_s == pytest.approx(0.175732624, abs=1e-9)
    # the dissertation's accounting also charges 2 a_s / B and moves the cut to the smallest
    # activation, after node18's max-pool: the shipped runtime's stage 1 starts with node19
    # (runtime/image_classification/models/vgg16/gpus=4/stage1.py, Conv2d(256, 512))
    paper = solve(problem)
    assert _config(paper) == [((0, 17), 3), ((17, 36), 1)]
    assert model.layers[17].name == "node19:Conv2d"
    assert paper.predicted is not None and paper.predicted.bottleneck_s == pytest.approx(2 * 102760448 / 1e9)


def test_artifact_gnmt8_on_four_workers_is_straight() -> None:
    # the repo ships GNMT-8 gpus=4 as a 4-stage straight pipeline (digest Sec. 8.1, L1964-1969)
    plan = solve(PipelineProblem(model=pipedream_profile("gnmt"), cluster=_cluster(4, intra=1e9)),
                 options={"cost_mode": "artifact"})
    assert [s.replicas for s in plan.stages] == [1, 1, 1, 1]
    assert plan.options["noam"] == 4


def test_artifact_transfers_only_with_a_compression_ratio() -> None:
    model = pipedream_profile("vgg16")
    problem = PipelineProblem(model=model, cluster=_cluster(4, intra=1e9))
    plan = solve(problem, options={"cost_mode": "artifact", "activation_compression_ratio": "1"})
    assert plan.predicted is not None and plan.predicted.bottleneck_s > 0.175732624
    assert plan.options["activation_compression_ratio"] == 1.0


@pytest.mark.parametrize("name", ["inception_v3", "densenet121", "nasnetalarge"])
def test_branchy_profiles_solve(name: str) -> None:
    model = pipedream_profile(name)
    for cluster in (_cluster(16, intra=1e10), _cluster(8, 2, intra=1e10, inter=1e9)):
        plan = solve(PipelineProblem(model=model, cluster=cluster))  # its speed: bench/speed_targets.py
        assert sum(s.replicas for s in plan.stages) == 16
        assert plan.stages[-1].chunks[0].layers[1] == model.num_layers


# --------------------------------------------------------------------------------------
# Memory, options and errors
# --------------------------------------------------------------------------------------


def _memory_model() -> ModelProfile:
    # 10 bytes static, 1 byte of weights and 1 of activations per layer
    return _model([_layer(i, 0.5, 0.5, w=1, a=0, static=10, act=1) for i in range(4)])


def test_memory_constraint_forces_more_stages() -> None:
    problem = PipelineProblem(model=_memory_model(), cluster=_cluster(4, intra=1e9, memory=25))
    free = solve(problem, options={"memory": "false"})  # the check is on by default
    assert _config(free) == [((0, 4), 4)]  # pure DP needs 40 bytes of static memory per device
    assert _config(solve(problem)) != [((0, 4), 4)]
    plan = solve(problem, options={"memory": "true"})
    assert len(plan.stages) > 1 and plan.options["memory"] is True
    chain, num_workers, before = Chain.from_model(problem.model), 4, 0
    for stage in plan.stages:
        a, b = stage.chunks[0].layers
        n = math.ceil((num_workers - before) / stage.replicas)
        used = 10 * (b - a) + (n - 1) * (b - a) + n * (b - a)
        assert used <= 25
        before += stage.replicas
    limit = MemoryLimit(capacity_bytes=25, num_workers=4)
    levels = [Level(num_workers=4, bandwidth_bytes_per_s=1e9, workers_below=1)]
    assert plan.predicted is not None
    assert plan.predicted.bottleneck_s == partition(chain, levels, memory=limit)[0]


def test_memory_too_small_names_the_smallest_that_fits() -> None:
    problem = PipelineProblem(model=_memory_model(), cluster=_cluster(4, intra=1e9, memory=12))
    levels = [Level(num_workers=4, bandwidth_bytes_per_s=1e9, workers_below=1)]
    needed = _Oracle(problem.model, levels, "memory").value()
    # a stage of L layers holds L (10 + (n-1) + n) bytes; straight: the first stage has n = 4
    # in-flight inputs, 17 bytes; replicating layer 0 twice (13 bytes) leaves 3 layers on 2
    # workers, which needs at least 22
    assert needed == 17
    with pytest.raises(InfeasibleError, match=f"at least {format_bytes(needed)}"):
        solve(problem, options={"memory": True})
    roomy = problem.model_copy(update={"cluster": _cluster(4, intra=1e9, memory=needed)})
    fits = solve(roomy, options={"memory": True})
    assert fits.predicted is not None and math.isfinite(fits.predicted.bottleneck_s)


def test_levels_needing_more_workers_are_infeasible() -> None:
    problem = PipelineProblem(model=_fig27(), cluster=_cluster(4))
    with pytest.raises(InfeasibleError, match="need 16 workers .* has 4"):
        solve(problem, options={"levels": "4x4"})


@pytest.mark.parametrize(
    ("options", "update", "match"),
    [
        ({"cost_mode": "paper"}, {}, "cost_mode='paper'"),
        ({"levels": "4by2"}, {}, "levels='4by2'"),
        ({"activation_compression_ratio": 2.0}, {}, "needs cost_mode=artifact"),
        ({"bogus": 1}, {}, "no option 'bogus'"),
        ({}, {"num_stages": 2}, "remove num_stages=2"),
        ({}, {"schedule": "gpipe"}, "schedule='gpipe'"),
    ],
)
def test_invalid_inputs(options: dict[str, object], update: dict[str, object], match: str) -> None:
    problem = PipelineProblem(model=_fig27(), cluster=_cluster(3)).model_copy(update=update)
    with pytest.raises(InvalidProblemError, match=match):
        solve(problem, options=options)


def test_global_batch_no_replication_can_form_is_infeasible() -> None:
    # the 2-1 configuration takes inputs in pairs (2 input-stage replicas)
    problem = PipelineProblem(model=_fig27(), cluster=_cluster(3), global_batch_size=3)
    with pytest.raises(InfeasibleError, match=r"global_batch_size=3 is not a multiple of .* = 2; use 2 or 4"):
        solve(problem)


@pytest.mark.parametrize("cluster_spec", ["v100:32", "v100:2x8"])
def test_plans_simulate_to_the_dp_steady_state(cluster_spec: str) -> None:
    """Tolerance: 5 % between the simulator and the DP's n x bottleneck for unequal replication
    (1F1B-RR steady state; the gap is the DP charging each boundary 2 a_s / B as a busy link),
    and the flush's (m + p - 1) / m on top for equal replication (parallel pipelines with flush)."""
    for name in list_pipedream_profiles():
        if cluster_spec == "v100:32" and name.startswith("nasnet"):
            # 809 and 1,103 distinct layers: the exact DP's O(N^3) all-range tables over 4 x 8 workers
            # take 13 and 31 s; both run in the v100:2x8 case, where the steady-state check is the same
            continue
        # memory=false: the steady state of the unconstrained partition (memory-constrained
        # partitions replicate unequally in ways this ratio does not cover, see the report)
        plan = solve(api.make_problem(f"pipedream:{name}", cluster_spec), options={"memory": "false"})
        assert plan.predicted is not None
        replicas = [s.replicas for s in plan.stages]
        n = plan.num_microbatches * replicas[0]
        sim = simulate(plan)
        assert sim.iteration_time_s == pytest.approx(plan.predicted.iteration_time_s, rel=1e-12)
        ratio = sim.iteration_time_s / (n * plan.predicted.bottleneck_s)
        if len(set(replicas)) > 1:
            assert abs(ratio - 1) <= 0.05, (name, replicas, ratio)
        else:
            m, p = plan.num_microbatches, len(replicas)
            assert 0.95 <= ratio <= (m + p - 1) / m + 0.05, (name, replicas, ratio)


def test_memory_constrained_plans_fit_in_simulation() -> None:
    for name in ("vgg16", "resnet50", "gnmt"):
        plan = solve(api.make_problem(f"pipedream:{name}", "v100:2x8"), options={"memory": True})
        assert simulate(plan).fits_memory, name
