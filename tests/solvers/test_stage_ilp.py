"""The stage-ILP: its optimum against brute force of its own model, the returned plan against
brute force in the simulator, the issue's hand case, memory, infeasibility, engines, options."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from cost_models.schedules import build_actions
from cost_models.simulate import pipeline_costs, simulate, simulate_costs
from planner.errors import InfeasibleError, InvalidProblemError
from planner.schema import Cluster, Device, LayerProfile, ModelProfile, PipelineProblem, RecomputeOption
from solvers import _stage_ilp_milp as milp
from solvers import get_solver
from solvers._partition import pipedream_fixed
from solvers._stage_ilp_model import (
    Counts,
    StageModel,
    build_model,
    candidate_costs,
    fits,
    inflight_vectors,
    modelled_time_s,
    objective,
    rank_memory_bytes,
)
from solvers.common import build_plan, format_bytes, resolve_layout
from solvers.stage_ilp import solve


def _cluster(memory_bytes: float, num_devices: int = 8, bandwidth: float = 1e30) -> Cluster:
    return Cluster(name="toy", device=Device(name="gpu", memory_headroom_bytes=0, memory_bytes=memory_bytes, peak_flops=1e12), num_nodes=1,
                   devices_per_node=num_devices, intra_node_bytes_per_s=bandwidth, inter_node_bytes_per_s=bandwidth)


def _decoder(i: int, f: float, b: float, act: float) -> LayerProfile:
    return LayerProfile(
        name=f"d{i}", kind="decoder", forward_s=f, backward_s=b, backward_weight_s=b / 2, static_bytes=10, output_bytes=1,
        recompute={"none": RecomputeOption(activation_bytes=act),
                   "selective": RecomputeOption(activation_bytes=act / 2, extra_s=0.2 * f),
                   "full": RecomputeOption(activation_bytes=act / 8, extra_s=f)})


def _model(rng: random.Random, num_decoders: int) -> ModelProfile:
    f = rng.choice([1.0, 1.5, 2.0])
    embedding = LayerProfile(name="emb", kind="embedding", forward_s=rng.choice([0.5, 1.0]), backward_s=1.0,
                             backward_weight_s=0.5, static_bytes=30, activation_bytes=2, output_bytes=1)
    head = LayerProfile(name="head", kind="head", forward_s=rng.choice([1.0, 2.5]), backward_s=3.0, backward_weight_s=1.0,
                        static_bytes=30, activation_bytes=12)
    decoders = [_decoder(i, f, 2 * f, 16.0) for i in range(num_decoders)]
    return ModelProfile(name="toy", layers=(embedding, *decoders, head))


def _problem(rng: random.Random, *, p: int, v: int, num_decoders: int, memory: float, m: int | None = None,
             schedule: str | None = None) -> PipelineProblem:
    sched = schedule or ("1f1b" if v == 1 else "interleaved-1f1b")
    return PipelineProblem(model=_model(rng, num_decoders), cluster=_cluster(memory), schedule=sched, num_stages=p,
                           num_chunks=v, num_microbatches=m or 2 * p, data_parallel=1)


def _stage_model(problem: PipelineProblem) -> StageModel:
    assert problem.num_stages is not None
    return build_model(problem, resolve_layout(problem, problem.num_stages), strategies=None)


def all_counts(model: StageModel) -> list[Counts]:
    """Every plan: contiguous non-empty chunks x every strategy count per (chunk, type)."""
    num_layers, num_k = model.num_layers, model.num_virtual
    out = []
    for cuts in itertools.combinations(range(1, num_layers), num_k - 1):
        bounds = (0, *cuts, num_layers)
        options = []
        for k in range(num_k):
            per_type = []
            for lt in model.types:
                n = max(0, min(bounds[k + 1], lt.first + lt.num_layers) - max(bounds[k], lt.first))
                per_type.append([c for c in itertools.product(range(n + 1), repeat=len(lt.strategies)) if sum(c) == n])
            options.append(list(itertools.product(*per_type)))
        out.extend(tuple(combo) for combo in itertools.product(*options))
    return out


def _simulated(model: StageModel, counts: Counts) -> float:
    actions = build_actions(model.schedule, num_stages=model.num_stages, num_chunks=model.num_chunks,
                            num_microbatches=model.num_microbatches)
    return simulate_costs(candidate_costs(model, counts), actions, num_microbatches=model.num_microbatches,
                          include_events=False).iteration_time_s


CASES = [(0, 2, 1, 4, 170), (1, 3, 1, 4, 210), (2, 2, 1, 5, 150), (3, 2, 2, 4, 190), (4, 2, 2, 5, 260)]


def test_hand_case_modelled_64_simulated_63() -> None:
    # two stages of 13 and 12 time units per microbatch, 4 microbatches (issue 4)
    layers = (LayerProfile(name="a", forward_s=4, backward_s=9), LayerProfile(name="b", forward_s=4, backward_s=8))
    problem = PipelineProblem(model=ModelProfile(name="hand", layers=layers), cluster=_cluster(1e9), num_stages=2,
                              num_microbatches=4)
    model = _stage_model(problem)
    counts = (((1,), (0,)), ((0,), (1,)))
    assert modelled_time_s(model, counts) == pytest.approx(13 + 12 + 3 * 13)
    assert _simulated(model, counts) == pytest.approx(63)
    plan = solve(problem)
    assert plan.predicted is not None and plan.predicted.iteration_time_s == pytest.approx(63)


@pytest.mark.parametrize("terms", ["tri", "dual"])
@pytest.mark.parametrize("seed,p,v,n,memory", CASES)
def test_ilp_optimum_equals_brute_force_of_its_model(seed: int, p: int, v: int, n: int, memory: float, terms: str) -> None:
    model = _stage_model(_problem(random.Random(seed), p=p, v=v, num_decoders=n, memory=memory))
    feasible = [c for c in all_counts(model) if fits(model, c)]
    assert feasible, "the case must have a feasible plan"
    best = min(objective(model, c, terms) for c in feasible)
    form = milp.formulate(model, terms)
    result = milp.solve_milp(model, form, engine="highs", time_limit_s=30, mip_gap=0.0, start=None)
    assert result.status == "optimal" and result.counts is not None
    assert objective(model, result.counts, terms) == pytest.approx(best, rel=1e-9, abs=1e-9)
    assert result.objective == pytest.approx(best, rel=1e-7, abs=1e-7)


@pytest.mark.parametrize("seed,p,v,n,memory", CASES)
def test_returned_plan_is_the_simulated_optimum(seed: int, p: int, v: int, n: int, memory: float) -> None:
    problem = _problem(random.Random(seed), p=p, v=v, num_decoders=n, memory=memory)
    model = _stage_model(problem)
    best = min(_simulated(model, c) for c in all_counts(model) if fits(model, c))
    plan = solve(problem)
    result = simulate(plan)
    assert result.fits_memory
    assert result.iteration_time_s == pytest.approx(best, rel=1e-12)


def test_modelled_time_error_against_the_simulator() -> None:
    # Exact for uniform stages; for imbalanced ones an estimate, here within 10 % (docs report it)
    rng = random.Random(7)
    uniform = _problem(rng, p=2, v=1, num_decoders=4, memory=1e9)
    model = _stage_model(uniform)
    ratios = []
    for counts in all_counts(model)[:300]:
        ratios.append(modelled_time_s(model, counts) / _simulated(model, counts))
    assert min(ratios) > 0.9 and max(ratios) < 1.1
    layers = tuple(LayerProfile(name=f"l{i}", forward_s=1, backward_s=2) for i in range(4))
    even = PipelineProblem(model=ModelProfile(name="u", layers=layers), cluster=_cluster(1e9), num_stages=2,
                           num_microbatches=6)
    m2 = _stage_model(even)
    counts = (((2,),), ((2,),))
    assert modelled_time_s(m2, counts) == pytest.approx(_simulated(m2, counts)) == pytest.approx((6 + 1) * 6)


def test_inflight_vectors_match_closed_forms() -> None:
    # 1F1B: min(p - x, m) (BPipe L66-75); ZB-H2: at most 2p - 1 (Qi et al. Table 2, (2p - 1) M_B); in
    # our ZB-H2 order every rank reaches it, the W passes delayed 2x on rank x keep their sets alive
    assert inflight_vectors("1f1b", 4, 1, 8) == (((4,),), ((3,),), ((2,),), ((1,),))
    assert inflight_vectors("1f1b", 4, 1, 2) == (((2,),), ((2,),), ((2,),), ((1,),))
    assert [max(v) for v in inflight_vectors("zb-h2", 4, 1, 8)] == [(7,)] * 4
    assert [max(v) for v in inflight_vectors("zb-h1", 4, 1, 8)] == [(4,), (4,), (4,), (4,)]
    # interleaved: peak total = Megatron's warm-up + 1 = (p - x - 1) 2 + (v - 1) p + 1 (BPipe L373)
    for x, vectors in enumerate(inflight_vectors("interleaved-1f1b", 4, 2, 8)):
        assert max(sum(v) for v in vectors) == min((4 - x - 1) * 2 + 4 + 1, 16)


def test_model_memory_equals_simulated_peak_and_costs_equal_pipeline_costs() -> None:
    rng = random.Random(3)
    base = _problem(rng, p=2, v=2, num_decoders=5, memory=1e9)
    problem = base.model_copy(update={"cluster": _cluster(1e9, bandwidth=7.0), "data_parallel": 2})
    model = _stage_model(problem)
    for counts in rng.sample(all_counts(model), 20):
        from solvers._stage_ilp_model import plan_layers

        bounds, strategies = plan_layers(model, counts)
        plan = build_plan(problem, model.layout, bounds=bounds, strategies=strategies, solver="t", options={})
        assert candidate_costs(model, counts) == pytest.approx(pipeline_costs(plan)) or _costs_close(
            candidate_costs(model, counts), pipeline_costs(plan))
        peaks = [s.peak_memory_bytes for s in simulate(plan).stages]
        assert rank_memory_bytes(model, counts) == pytest.approx(peaks)


def _costs_close(a: object, b: object) -> bool:
    for name in ("forward_s", "backward_s", "backward_weight_s", "recompute_s", "activation_bytes", "send_forward_s",
                 "static_bytes", "allreduce_s"):
        assert getattr(a, name) == pytest.approx(getattr(b, name)), name
    return True


def test_cpsat_engine_agrees_with_highs() -> None:
    model = _stage_model(_problem(random.Random(1), p=3, v=1, num_decoders=4, memory=210))
    form = milp.formulate(model, "tri")
    highs = milp.solve_milp(model, form, engine="highs", time_limit_s=30, mip_gap=0.0, start=None)
    cpsat = milp.solve_milp(model, form, engine="cpsat", time_limit_s=30, mip_gap=0.0, start=None)
    assert cpsat.status == "optimal" and cpsat.counts is not None and highs.counts is not None
    assert objective(model, cpsat.counts, "tri") == pytest.approx(objective(model, highs.counts, "tri"), rel=1e-4)


def test_warm_start_is_accepted_and_keeps_the_optimum() -> None:
    problem = _problem(random.Random(2), p=2, v=1, num_decoders=5, memory=150)
    model = _stage_model(problem)
    form = milp.formulate(model, "tri")
    start_counts = next(c for c in all_counts(model) if fits(model, c))
    cold = milp.solve_milp(model, form, engine="highs", time_limit_s=30, mip_gap=0.0, start=None)
    warm = milp.solve_milp(model, form, engine="highs", time_limit_s=30, mip_gap=0.0,
                           start=milp.start_values(model, form, start_counts))
    assert warm.objective == pytest.approx(cold.objective)


def test_infeasible_memory_names_the_smallest_feasible_memory_and_the_fixes() -> None:
    problem = _problem(random.Random(0), p=2, v=1, num_decoders=4, memory=60)
    model = _stage_model(problem)
    smallest = min(max(rank_memory_bytes(model, c)) for c in all_counts(model))
    with pytest.raises(InfeasibleError) as err:
        solve(problem)
    text = str(err.value)
    assert format_bytes(smallest) in text and "stages" in text
    assert "--bpipe" not in text  # two stages: BPipe moves nothing (seed 004 L100), so it is no fix


def test_two_strategy_variant_and_options() -> None:
    problem = _problem(random.Random(4), p=2, v=1, num_decoders=5, memory=160)
    plan = solve(problem, options={"strategies": "none,full"})
    used = {s for st in plan.stages for c in st.chunks for s in c.layer_strategies()}
    assert "selective" not in used and simulate(plan).fits_memory
    with pytest.raises(InvalidProblemError, match="terms"):
        solve(problem, options={"terms": "quad"})
    with pytest.raises(InvalidProblemError, match="engine"):
        solve(problem, options={"engine": "gurobi"})
    with pytest.raises(InvalidProblemError, match="strategies"):
        solve(problem, options={"strategies": "offload"})
    with pytest.raises(InvalidProblemError, match="2bw"):
        solve(problem.model_copy(update={"schedule": "2bw"}))


def test_zero_bubble_schedule_fits_and_beats_even() -> None:
    problem = _problem(random.Random(5), p=3, v=1, num_decoders=4, memory=260, m=6, schedule="zb-h1")
    plan = solve(problem)
    even = get_solver("even")(problem)
    assert simulate(plan).fits_memory
    assert plan.predicted.iteration_time_s <= even.predicted.iteration_time_s + 1e-12  # type: ignore[union-attr]


def test_time_limit_returns_status_and_gap() -> None:
    from cost_models.hardware import cluster_preset
    from cost_models.models import model_preset
    from cost_models.transformer import transformer_profile

    cl = cluster_preset("ascend-910:128")
    prof = transformer_profile(model_preset("llama-175b"), device=cl.device, microbatch_size=1, tensor_parallel=8)
    problem = PipelineProblem(model=prof, cluster=cl, num_stages=16, num_microbatches=64, data_parallel=1,
                              time_limit_s=1.0)
    plan = solve(problem, options={"rerank": 20})
    assert plan.status == "time_limit" and "gap" in plan.notes[0]
    assert simulate(plan).fits_memory
    for name in ("even", "merak", "adapipe"):
        base = get_solver(name)(problem)
        assert plan.predicted.iteration_time_s <= base.predicted.iteration_time_s * (1 + 1e-12)  # type: ignore[union-attr]
    assert plan.predicted.iteration_time_s <= pipedream_fixed(problem).predicted.iteration_time_s * (1 + 1e-12)  # type: ignore[union-attr]
    assert plan.solve_time_s is not None and math.isfinite(plan.solve_time_s)  # its speed: bench/speed_targets.py


class _Ticks:
    """A clock that advances one unit per reading (the search's time source in these tests)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_search_stops_before_a_simulation_would_overrun_its_budget() -> None:
    """Each simulation reads the clock twice (one unit long), the budget check once: with 6 units
    of budget the search starts a simulation only while elapsed + the longest simulation so far
    fits, so it ends within the budget, keeps the first seed (the ILP's plan) whatever the budget,
    and returns the fastest plan it simulated."""
    from solvers._stage_ilp_search import Search

    model = _stage_model(_problem(random.Random(0), p=2, v=1, num_decoders=5, memory=1e9))
    seeds = [("ilp", c) for c in all_counts(model)[:4] if fits(model, c)]
    assert len(seeds) >= 3
    clock = _Ticks()
    search = Search(model, max_simulations=100, time_budget_s=6.0, clock=clock)
    best = search.run(seeds)
    assert clock.now <= 6.0 + 2  # the last check read past the budget and stopped
    assert 1 <= len(search.simulated) < len(seeds) + 100
    assert seeds[0][1] in search.simulated
    assert best == min(search.simulated, key=search.simulated.__getitem__)
    tight = Search(model, max_simulations=100, time_budget_s=0.5, clock=_Ticks())
    assert tight.run(seeds) == seeds[0][1] and list(tight.simulated) == [seeds[0][1]]
