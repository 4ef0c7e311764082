"""Baselines of the stage-ILP: the partition DP, the recompute knapsack, Merak, AdaPipe, pipedream-fixed."""

from __future__ import annotations

import itertools
import math
from typing import Any
import random

import pytest

from cost_models.simulate import simulate
from planner.errors import InfeasibleError, InvalidProblemError
from planner.schema import Cluster, Device, LayerProfile, ModelProfile, PipelineProblem, RecomputeOption
from solvers import get_solver
from solvers._partition import parametric_partition, partition_bounds, pipedream_fixed, recompute_frontier
from solvers._stage_ilp_model import layer_types
from solvers.merak import stage_fraction


def _cluster(memory_bytes: float) -> Cluster:
    return Cluster(name="toy", device=Device(name="gpu", memory_headroom_bytes=0, memory_bytes=memory_bytes, peak_flops=1e12), num_nodes=1,
                   devices_per_node=8, intra_node_bytes_per_s=1e30, inter_node_bytes_per_s=1e30)


def _layer(i: int, f: float = 1.0) -> LayerProfile:
    return LayerProfile(name=f"l{i}", forward_s=f, backward_s=2 * f, static_bytes=8, recompute={
        "none": RecomputeOption(activation_bytes=8), "selective": RecomputeOption(activation_bytes=4, extra_s=0.25 * f),
        "full": RecomputeOption(activation_bytes=1, extra_s=f)})


def _problem(memory: float, n: int = 8, p: int = 2, m: int = 4, sizes: list[float] | None = None) -> PipelineProblem:
    layers = tuple(_layer(i, (sizes or [1.0] * n)[i]) for i in range(n))
    return PipelineProblem(model=ModelProfile(name="toy", layers=layers), cluster=_cluster(memory), num_stages=p,
                           num_microbatches=m)


def _reference_partition(n: int, parts: int, cost: Any) -> tuple[float, list[int]]:
    """The plain O(P N^2) min-max DP, smallest last boundary on ties."""
    best = [[math.inf] * (n + 1) for _ in range(parts + 1)]
    arg = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for q in range(1, parts + 1):
        for j in range(q, n - (parts - q) + 1):
            for i in range(q - 1, j):
                value = max(best[q - 1][i], cost(i, j, q - 1))
                if value < best[q][j]:
                    best[q][j], arg[q][j] = value, i
    if math.isinf(best[parts][n]):
        return math.inf, []
    bounds = [n]
    for q in range(parts, 0, -1):
        bounds.append(arg[q][bounds[-1]])
    return best[parts][n], bounds[::-1]


def test_partition_dp_equals_brute_force() -> None:
    rng = random.Random(0)
    for _ in range(200):
        n, parts = rng.randint(3, 12), rng.randint(1, 4)
        w = [rng.randint(1, 4) for _ in range(n)]  # small integers: many ties
        mem = [rng.randint(1, 5) for _ in range(n)]
        cap = [rng.randint(4, 16) for _ in range(parts)]  # a per-part memory limit (monotone in the range)

        def cost(i: int, j: int, q: int) -> float:
            return math.inf if sum(mem[i:j]) > cap[q] else sum(w[i:j]) * (1 + 0.5 * q)

        best = math.inf
        for cuts in itertools.combinations(range(1, n), parts - 1):
            b = (0, *cuts, n)
            best = min(best, max(cost(b[q], b[q + 1], q) for q in range(parts)))
        value, bounds = partition_bounds(n, parts, cost)
        assert value == best
        if math.isfinite(best):
            assert max(cost(bounds[q], bounds[q + 1], q) for q in range(parts)) == best
        assert (value, bounds) == _reference_partition(n, parts, cost)  # the same tie-break


def test_parametric_partition_equals_brute_force() -> None:
    """The long-chain search finds the DP's optimum when a range's cost moves one way with the part."""
    rng = random.Random(1)
    for case in range(300):
        n, parts = rng.randint(3, 12), rng.randint(1, 4)
        w = [rng.randint(1, 4) for _ in range(n)]
        mem = [rng.randint(1, 5) for _ in range(n)]
        trend = "increasing" if case % 2 else "decreasing"
        cap = sorted((rng.randint(4, 16) for _ in range(parts)), reverse=trend == "increasing")
        slow = sorted((rng.choice([1.0, 1.5, 2.0]) for _ in range(parts)), reverse=trend == "decreasing")

        def cost(i: int, j: int, q: int) -> float:
            return math.inf if sum(mem[i:j]) > cap[q] else sum(w[i:j]) * slow[q]

        best, _ = _reference_partition(n, parts, cost)
        got, cuts = parametric_partition(n, parts, cost, part_trend=trend)
        assert got == best
        if math.isfinite(best):
            assert cuts[0] == 0 and cuts[-1] == n and all(a < b for a, b in zip(cuts, cuts[1:]))
            assert max(cost(cuts[q], cuts[q + 1], q) for q in range(parts)) == best


def test_parametric_partition_with_a_largest_end_oracle_is_unchanged() -> None:
    """A caller's ``largest_end`` (here a linear scan) gives the same value and bounds as the
    generic bisection over cost calls."""
    rng = random.Random(2)
    for _ in range(200):
        n, parts = rng.randint(3, 14), rng.randint(1, 5)
        w = [rng.choice([0.5, 1.0, 1.25, 3.0]) for _ in range(n)]
        mem = [rng.randint(1, 5) for _ in range(n)]
        cap = sorted(rng.randint(4, 16) for _ in range(parts))

        def cost(i: int, j: int, q: int) -> float:
            return math.inf if sum(mem[i:j]) > cap[q] else math.fsum(w[i:j])

        def largest_end(first: int, last: int, q: int, limit: float) -> int:
            ends = [j for j in range(first + 1, last + 1) if cost(first, j, q) <= limit]
            return max(ends, default=first)

        assert parametric_partition(n, parts, cost, largest_end=largest_end) == parametric_partition(n, parts, cost)


def test_recompute_frontier_is_the_pareto_set_of_all_assignments() -> None:
    layers = [_layer(i) for i in range(4)] + [LayerProfile(name="h", kind="head", forward_s=1, backward_s=1,
                                                           activation_bytes=3)]
    types = layer_types(layers, None)
    front = recompute_frontier(types, (4, 1))
    points = set()
    for assign in itertools.product(range(3), repeat=4):
        act = 3 + sum([8, 4, 1][a] for a in assign)
        extra = sum([0.0, 0.25, 1.0][a] for a in assign)
        points.add((act, extra))
    pareto = sorted(p for p in points if not any(q != p and q[0] <= p[0] and q[1] <= p[1] for q in points))
    assert [(a, pytest.approx(e)) for a, e, _ in front] == [(a, pytest.approx(e)) for a, e in pareto]


def test_merak_stage_fractions_hand_values() -> None:
    # r_k = max(0, 1 - (1 - r_0)(P - 1)/(P - 1 - k)), last stage none (reading §A.6.8)
    assert [stage_fraction(0.5, k, 4) for k in range(4)] == [0.5, 0.25, 0.0, 0.0]
    assert [stage_fraction(1.0, k, 4) for k in range(4)] == [1.0, 1.0, 1.0, 0.0]
    assert stage_fraction(0.0, 0, 4) == 0.0


def test_merak_uses_the_smallest_ratio_that_fits() -> None:
    # p = 2, 4 layers per stage; stage 0 holds 2 microbatches: 32 static + 2 x act. With 'full' on j
    # layers act = 8 (4 - j) + j: 70 bytes -> j = 3 (32 + 2 x 11 = 54 fits, j = 2: 32 + 36 = 68 fits)
    plan = get_solver("merak")(_problem(68), options={"recompute": "full"})
    assert [s for c in plan.stages[0].chunks for s in c.layer_strategies()] == ["full", "full", "none", "none"]
    assert all(s == "none" for c in plan.stages[1].chunks for s in c.layer_strategies())
    assert simulate(plan).fits_memory
    with pytest.raises(InfeasibleError, match="needs"):
        get_solver("merak")(_problem(30))
    with pytest.raises(InvalidProblemError, match="recompute"):
        get_solver("merak")(_problem(68), options={"recompute": "offload"})


def test_adapipe_equals_brute_force_of_its_objective() -> None:
    # largest stage time F + B + R over partitions and per-layer strategies that fit, C = 1
    sizes = [1.0, 2.0, 1.0, 1.5, 1.0, 0.5]
    problem = _problem(60, n=6, sizes=sizes)
    best = math.inf
    for cut in range(1, 6):
        for assign in itertools.product(range(3), repeat=6):
            times, ok = [], True
            for q, (i, j) in enumerate([(0, cut), (cut, 6)]):
                act = sum([8, 4, 1][assign[a]] for a in range(i, j))
                ok &= 8 * (j - i) + (2 - q) * act <= 60
                times.append(sum(3 * sizes[a] + [0, 0.25, 1][assign[a]] * sizes[a] for a in range(i, j)))
            if ok:
                best = min(best, max(times))
    plan = get_solver("adapipe")(problem)
    stage_times = []
    for st in plan.stages:
        chunk = st.chunks[0]
        stage_times.append(sum(3 * sizes[i] + {"none": 0, "selective": 0.25, "full": 1}[s] * sizes[i]
                               for i, s in zip(range(*chunk.layers), chunk.layer_strategies())))
    assert max(stage_times) == pytest.approx(best)
    assert simulate(plan).fits_memory


def test_pipedream_fixed_balances_unequal_layers_with_one_strategy() -> None:
    plan = pipedream_fixed(_problem(1e9, n=4, sizes=[3.0, 1.0, 1.0, 1.0]))
    assert [c.layers for s in plan.stages for c in s.chunks] == [(0, 1), (1, 4)]
    assert plan.options == {"recompute": "none"}
    # memory 40: with none every split overflows a stage (3 layers on stage 1: 24 + 24 = 48); selective fits
    tight = pipedream_fixed(_problem(40, n=4, sizes=[3.0, 1.0, 1.0, 1.0]))
    assert {s for st in tight.stages for c in st.chunks for s in c.layer_strategies()} == {"selective"}
    assert simulate(tight).fits_memory


def test_baselines_need_a_fixed_depth_and_run_interleaved() -> None:
    with pytest.raises(InvalidProblemError, match="num_stages"):
        get_solver("adapipe")(_problem(1e9).model_copy(update={"num_stages": None}))
    inter = PipelineProblem(model=_problem(1e9).model, cluster=_cluster(200), schedule="interleaved-1f1b",
                            num_stages=2, num_chunks=2, num_microbatches=4)
    for name in ("merak", "adapipe"):
        plan = get_solver(name)(inter)
        assert plan.degrees.virtual == 2 and simulate(plan).fits_memory
