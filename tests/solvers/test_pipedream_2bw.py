"""PipeDream-2BW's planner: weight versions, closed forms by hand, brute force, simulator, errors."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from cost_models.simulate import simulate
from cost_models.transformer import allreduce_time_s, transformer_profile
from planner import api, cli
from planner.errors import InfeasibleError, InvalidProblemError
from planner.schema import (
    Cluster,
    Device,
    LayerProfile,
    ModelProfile,
    PipelineProblem,
    RecomputeOption,
    TransformerConfig,
)
from solvers import _pipedream_2bw_model as cm
from solvers.pipedream_2bw import evaluate, max_live_weight_versions, solve, weight_version

GIB = 2.0**30
SIM_TOLERANCE = 0.05
"""Closed form vs simulator, relative, on the chosen plans of GPT presets: the closed form charges
both transfers of a boundary to every microbatch of the receiving stage and the flush's fill and
drain at the slowest stage's pace, so it is at most a few percent pessimistic (measured <= 3%)."""
KERNELS_2020 = "unfused"
"""The chapter's runs (2020 Megatron-LM kernels) saved the s x s attention scores for the backward."""


def _cluster(num_devices: int, *, memory_bytes: float = 1e18, bandwidth: float = 1e18, per_node: int | None = None,
             latency_s: float = 0.0) -> Cluster:
    per_node = per_node or num_devices
    return Cluster(
        name="toy", device=Device(name="gpu", memory_headroom_bytes=0, memory_bytes=memory_bytes, peak_flops=1e12),
        num_nodes=num_devices // per_node, devices_per_node=per_node, intra_node_bytes_per_s=bandwidth,
        inter_node_bytes_per_s=bandwidth / 4, intra_node_latency_s=latency_s, inter_node_latency_s=latency_s,
    )


def _layer(i: int, *, f: float = 1.0, b: float = 2.0, static: float = 0.0, params: float = 0.0, act: float = 0.0,
           full_act: float | None = None, out: float = 0.0) -> LayerProfile:
    recompute = {"none": RecomputeOption(activation_bytes=act)}
    if full_act is not None:
        recompute["full"] = RecomputeOption(activation_bytes=full_act, extra_s=f)
    return LayerProfile(name=f"l{i}", forward_s=f, backward_s=b, static_bytes=static, param_bytes=params,
                        output_bytes=out, recompute=recompute)


# --------------------------------------------------------------------------------------
# Weight versions (Sec. 3.2.1, L2289-2312)
# --------------------------------------------------------------------------------------


def test_weight_version_matches_the_chapter() -> None:
    # m = 4: microbatches 1-8 use version 0, 9-12 version 1 (W^(4) first used by input 9, Fig 3.2)
    assert [weight_version(k, 4) for k in range(1, 17)] == [0] * 8 + [1] * 4 + [2] * 4
    assert weight_version(8, 4) == 0 and weight_version(9, 4) == 1
    # m = 8 (p = 4, two accumulation rounds): 1-16 -> 0, 17-24 -> 1
    assert {weight_version(k, 8) for k in range(1, 17)} == {0}
    assert {weight_version(k, 8) for k in range(17, 25)} == {1}
    with pytest.raises(InvalidProblemError, match="1-based"):
        weight_version(0, 4)


def test_at_most_two_live_versions_when_m_at_least_p() -> None:
    for p, m in [(4, 4), (4, 8), (3, 5), (2, 2)]:
        live = max_live_weight_versions(p, m)
        assert max(live) == 2, (p, m, live)  # two are needed (shadow + new) and suffice (L2295)
    # m < p breaks the rule: the first stage holds microbatches of three batches at once
    assert max_live_weight_versions(4, 2)[0] > 2


# --------------------------------------------------------------------------------------
# Closed forms by hand (digest Sec. 6, examples 6 and 7)
# --------------------------------------------------------------------------------------


def test_throughput_closed_form_worked_example() -> None:
    # p = 2, T^comp = [3, 3], T^comm_{1->2} = 1 (both directions): t = max(3, 3 + 1) = 4;
    # recompute (c_extra = 4/3 from extra_s = forward): t = max(4, 4 + 1) = 5
    bandwidth = 1e9
    layers = tuple(_layer(i, act=1.0, full_act=0.5, out=0.5 * bandwidth, params=8 * bandwidth) for i in range(2))
    model = ModelProfile(name="toy", layers=layers)
    cluster = _cluster(4, bandwidth=bandwidth)
    plain = cm.stage_terms(model, cluster, [0, 1, 2], recompute="none", data_parallel=1, tensor_parallel=1)
    assert plain.compute_s == (3.0, 3.0) and plain.comm_in_s == (0.0, 1.0)
    assert cm.time_per_microbatch_s(plain, 8) == pytest.approx(4.0)
    again = cm.stage_terms(model, cluster, [0, 1, 2], recompute="full", data_parallel=1, tensor_parallel=1)
    assert cm.time_per_microbatch_s(again, 8) == pytest.approx(5.0)
    # d = 2: all-reduce of 8 GB-seconds per stage over m = 8 microbatches adds 1 <= 4: no change
    wide = cm.stage_terms(model, cluster, [0, 1, 2], recompute="none", data_parallel=2, tensor_parallel=1)
    assert wide.allreduce_s == pytest.approx((8.0, 8.0))
    assert cm.time_per_microbatch_s(wide, 8) == pytest.approx(4.0)
    assert cm.iteration_time_s(wide, "2bw", 8) == pytest.approx(32.0)
    # Flush: (m - 1) x 4 + (3 + 4) fill and drain + the all-reduce after the flush
    assert cm.iteration_time_s(wide, "flush", 8) == pytest.approx(7 * 4 + 7 + 8)
    # with m = 1 the all-reduce dominates 2BW's batch: max(m t, 8)
    assert cm.iteration_time_s(wide, "2bw", 1) == pytest.approx(8.0)


def test_memory_closed_form_worked_example() -> None:
    # |W| = 8, p = 4, |A_total| = 4, |A_input| = 0.1 (digest Sec. 6 ex. 6), weights only (static = W):
    # 2BW no recompute 2 8/4 + 4 4/4 + 4 0.1 = 8.4; with recompute 4 + 1 + 0.4 = 5.4 (stage 0 holds p)
    layers = tuple(_layer(i, static=2.0, params=2.0, act=1.1, full_act=0.1) for i in range(4))
    model = ModelProfile(name="toy", layers=layers)
    bounds = [0, 1, 2, 3, 4]
    plain = cm.stage_terms(model, _cluster(4), bounds, recompute="none", data_parallel=1, tensor_parallel=1)
    again = cm.stage_terms(model, _cluster(4), bounds, recompute="full", data_parallel=1, tensor_parallel=1)
    assert cm.stage_memory_bytes(plain, "2bw", 8)[0] == pytest.approx(8.4)
    assert cm.stage_memory_bytes(again, "2bw", 8)[0] == pytest.approx(5.4)
    # Flush keeps one weight version: 2 + 4.4; the last stage holds one microbatch: 4 + 1.1
    assert cm.stage_memory_bytes(plain, "flush", 8) == pytest.approx((6.4, 5.3, 4.2, 3.1))
    assert cm.stage_memory_bytes(plain, "2bw", 8)[3] == pytest.approx(5.1)
    # m < p caps the in-flight microbatches at m
    assert cm.stage_memory_bytes(plain, "flush", 2)[0] == pytest.approx(2 + 2 * 1.1)
    # per-layer checkpoints: the backward re-materializes one layer at a time, the largest one
    two = ModelProfile(name="two", layers=(_layer(0, act=3.0, full_act=0.5), _layer(1, act=2.0, full_act=0.25)))
    terms = cm.stage_terms(two, _cluster(1), [0, 2], recompute="full", data_parallel=1, tensor_parallel=1)
    assert terms.working_bytes == (2.5,) and terms.activation_bytes == (0.75,)
    assert cm.stage_memory_bytes(terms, "flush", 3) == (0.75 + 2.5,)


# --------------------------------------------------------------------------------------
# Brute force: an independent enumeration of the same model
# --------------------------------------------------------------------------------------


def _bounds(kinds: list[str], p: int) -> list[int]:
    """Embedding/head (other kinds at the ends) stay with the first/last stage; blocks split evenly."""
    body = [i for i, k in enumerate(kinds) if k == "decoder"] or list(range(len(kinds)))
    lead, count = body[0], len(body)
    if count < p:
        lead, count = 0, len(kinds)
    sizes = [count // p + (1 if i < count % p else 0) for i in range(p)]
    cuts = [lead + sum(sizes[:i]) for i in range(p + 1)]
    cuts[0], cuts[-1] = 0, len(kinds)
    return cuts


def _closed_form(cluster: Cluster, model: ModelProfile, cuts: list[int], sched: str, r: str, d: int,
                 m: int, mixed: bool = False) -> tuple[float, float]:
    """(seconds per batch, peak bytes) of one placement, from the formulas written out here.
    ``mixed``: 16-bit weights on the chapter's runtime, which adds fp32 main gradients (4 B per
    parameter) and makes 2BW's second version an fp32 copy (4 B instead of the 2 of a 16-bit one)."""
    p = len(cuts) - 1
    per_stage, mem, ar = [], [], []
    for x in range(p):
        own = model.layers[cuts[x] : cuts[x + 1]]
        opt = [layer.strategies().get(r, layer.strategies()["none"]) for layer in own]
        none = [layer.strategies()["none"].activation_bytes for layer in own]
        bw, lat = cluster.link(0, 1)  # one node: every link is the intra-node one
        comm = 0.0 if x == 0 else 2 * (lat + model.layers[cuts[x] - 1].output_bytes / bw)
        per_stage.append(sum(la.forward_s + la.backward_s + o.extra_s for la, o in zip(own, opt)) + comm)
        w = sum(la.param_bytes for la in own)
        ar.append(2 * (d - 1) / d * w / bw + 2 * (d - 1) * lat if d > 1 else 0.0)
        extra = max((a - o.activation_bytes for a, o in zip(none, opt) if o.extra_s > 0), default=0.0)
        runtime = (w / 2 * 4 + (w / 2 * 4 - w if sched == "2bw" else 0)) if mixed else 0.0
        mem.append(sum(la.static_bytes for la in own) + (w if sched == "2bw" else 0) + runtime
                   + min(p - x, m) * sum(o.activation_bytes for o in opt) + extra)
    if sched == "2bw":
        return m * max(max(t, a / m) for t, a in zip(per_stage, ar)), max(mem)
    return (m - 1) * max(per_stage) + sum(per_stage) + max(ar), max(mem)


def _brute(problem: PipelineProblem, profiles: dict[int, ModelProfile], batch: int,
           mixed: bool = False) -> dict[tuple, tuple]:
    """Every configuration -> (fits, samples/s, peak bytes): the better of the even split and the
    solver's balanced placement (itself checked against exhaustive enumeration below)."""
    cluster, n = problem.cluster, problem.cluster.num_devices
    out = {}
    for p, (b, model) in itertools.product(range(1, n + 1), profiles.items()):
        d = n // p
        if n % p or p > model.num_layers or batch % (b * d):
            continue
        m = batch // (b * d)
        for sched, r in itertools.product(("2bw", "flush"), ("none", "full")):
            if sched == "2bw" and m < p or not any(r in layer.strategies() for layer in model.layers):
                continue
            cuts = [_bounds([layer.kind for layer in model.layers], p)]
            runtime = cm.runtime_profile(model, sched, bytes_per_element=2 if mixed else 4)
            balanced = cm.balanced_bounds(runtime, p, recompute=r, schedule=sched, num_microbatches=m,
                                          capacity_bytes=cluster.device.memory_bytes)
            cuts += [balanced] if balanced is not None else []
            options = []
            for c in cuts:
                iteration, peak = _closed_form(cluster, model, c, sched, r, d, m, mixed)
                options.append((peak <= cluster.device.memory_bytes, b * d * m / iteration, peak))
            # equal throughputs (up to summation order) tie-break on memory, as the solver does
            out[(sched, p, d, b, m, r)] = min(options, key=lambda o: (not o[0], -float(f"{o[1]:.9g}"), o[2]))
    return out


def _random_profile(rng: random.Random, num_layers: int) -> ModelProfile:
    layers = tuple(
        _layer(i, f=rng.uniform(0.5, 2), b=rng.uniform(1, 4), static=rng.uniform(0, 10), params=rng.uniform(0, 5),
               act=rng.uniform(1, 5), full_act=rng.uniform(0, 1), out=rng.uniform(0, 3))
        for i in range(num_layers)
    )
    return ModelProfile(name="rand", layers=layers)


def _check_against_brute(problem: PipelineProblem, profiles: dict[int, ModelProfile], batch: int,
                         mixed: bool = False) -> None:
    expected = _brute(problem, profiles, batch, mixed)
    fitting = {k: v for k, v in expected.items() if v[0]}
    if not fitting:
        with pytest.raises(InfeasibleError):
            solve(problem, options={"max_microbatch_size": max(profiles)})
        return
    plan = solve(problem, options={"max_microbatch_size": max(profiles)})
    rows = {(r["schedule"], r["p"], r["d"], r["b"], r["m"], r["recompute"]): r for r in plan.candidates}
    assert rows.keys() == expected.keys()
    for key, (fits, throughput, memory) in expected.items():
        assert rows[key]["fits"] == fits
        assert rows[key]["samples_per_s"] == pytest.approx(throughput, rel=1e-12)
        assert rows[key]["peak_memory_gib"] * GIB == pytest.approx(memory, rel=1e-12)
    best = max(fitting, key=lambda k: (fitting[k][1], -fitting[k][2]))
    top = plan.candidates[0]
    assert (top["schedule"], top["p"], top["d"], top["b"], top["m"], top["recompute"]) == best
    assert (plan.schedule, plan.degrees.pipeline, plan.degrees.data, plan.microbatch_size) == best[:4]


@pytest.mark.parametrize("seed", range(12))
def test_brute_force_on_random_profiles(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.choice([2, 3, 4, 6])
    model = _random_profile(rng, rng.randint(2, 7))
    batch = rng.choice([6, 12, 24])
    memory = rng.uniform(20, 80)
    cluster = _cluster(n, memory_bytes=memory, bandwidth=rng.uniform(1, 10), latency_s=rng.uniform(0, 0.1))
    problem = PipelineProblem(model=model, cluster=cluster, global_batch_size=batch)
    _check_against_brute(problem, {1: model}, batch)


@pytest.mark.parametrize("seed", range(6))
def test_brute_force_on_random_transformers_sweeping_b(seed: int) -> None:
    rng = random.Random(100 + seed)
    heads = rng.choice([2, 4])
    cfg = TransformerConfig(name="tiny", hidden_size=64 * heads, num_layers=rng.randint(2, 6), num_heads=heads,
                            seq_length=rng.choice([128, 256]), vocab_size=rng.choice([1000, 5000]))
    n = rng.choice([2, 4, 8])
    cluster = Cluster(name="toy", device=Device(name="gpu", memory_headroom_bytes=0, memory_bytes=rng.uniform(0.01, 0.08) * GIB, peak_flops=1e12),
                      num_nodes=1, devices_per_node=n, intra_node_bytes_per_s=rng.uniform(1e9, 1e10),
                      inter_node_bytes_per_s=1e9, intra_node_latency_s=1e-5)
    batch = rng.choice([16, 32, 64])
    problem = api.make_problem(cfg, cluster, global_batch_size=batch)
    profiles = {b: transformer_profile(cfg, device=cluster.device, microbatch_size=b,
                                       intra_node_bytes_per_s=cluster.intra_node_bytes_per_s) for b in (1, 2, 4, 8)}
    _check_against_brute(problem, profiles, batch, mixed=True)


# --------------------------------------------------------------------------------------
# Simulator agreement and memory in simulation
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("model", "cluster", "batch", "schedule"), [
    ("gpt-1.7b", "v100:1x8", 512, "1f1b"),
    ("gpt-1.7b", "v100:1x8", 64, "flush"),
    ("gpt-3.6b", "a100-80gb:2x8", 512, "1f1b"),
    ("gpt-7.5b", "a100-40gb:1x8", 64, "flush"),
])
def test_closed_form_agrees_with_the_simulator(model: str, cluster: str, batch: int, schedule: str) -> None:
    plan = solve(api.make_problem(model, cluster, global_batch_size=batch, schedule=schedule))
    best = plan.candidates[0]
    result = simulate(plan, include_events=False)
    assert plan.predicted is not None
    assert plan.predicted.iteration_time_s == result.iteration_time_s
    assert result.iteration_time_s == pytest.approx(best["iteration_s"], rel=SIM_TOLERANCE)
    assert result.iteration_time_s <= best["iteration_s"] * (1 + 1e-9)  # the closed form is the pessimist
    capacity = plan.cluster.device.memory_bytes
    assert result.fits_memory and all(s.peak_memory_bytes <= capacity for s in result.stages)
    assert max(s.peak_memory_bytes for s in result.stages) <= best["peak_memory_gib"] * GIB * (1 + 1e-12)
    assert plan.num_microbatches * plan.microbatch_size * plan.degrees.data == batch
    if schedule == "flush":
        assert {r["schedule"] for r in plan.candidates} == {"flush"}


def test_memory_without_recompute_equals_the_simulated_peak() -> None:
    problem = api.make_problem("gpt-1.7b", "v100:1x8", global_batch_size=64)
    plan = solve(problem, options={"recompute": "none", "schedules": "2bw"})
    terms = cm.stage_terms(plan.model, plan.cluster, [c.layers[0] for s in plan.stages for c in s.chunks]
                           + [plan.model.num_layers], recompute="none", data_parallel=plan.degrees.data,
                           tensor_parallel=1)
    closed = cm.stage_memory_bytes(terms, "2bw", plan.num_microbatches)
    simulated = [s.peak_memory_bytes for s in simulate(plan, include_events=False).stages]
    assert simulated == pytest.approx(closed, rel=1e-12)


# --------------------------------------------------------------------------------------
# Published trade-off directions (Sec. 3.4.4, L3035-3077; Fig 3.7)
# --------------------------------------------------------------------------------------


def test_recompute_wins_when_memory_is_tight() -> None:
    roomy = solve(api.make_problem("gpt-1.7b", "v100:1x8", global_batch_size=512, attention=KERNELS_2020))
    assert roomy.candidates[0]["recompute"] == "none"
    cluster = api.load_cluster("v100:1x8")
    # 14 GiB: at 16 GiB a memory-balanced 8-deep split (fewer blocks on the first stages, which
    # hold the most in-flight microbatches) still fits b = 1 without recompute
    tight = cluster.model_copy(update={"device": cluster.device.model_copy(update={"memory_bytes": 14 * GIB})})
    plan = solve(api.make_problem("gpt-1.7b", tight, global_batch_size=512, attention=KERNELS_2020))
    assert plan.candidates[0]["recompute"] == "full"
    assert any(r["recompute"] == "none" and not r["fits"] for r in plan.candidates)


def test_deeper_pipelines_fit_larger_microbatches() -> None:
    # Fig 3.8's point (L3059-3065) on the chapter's 16-GB V100s (L2949-2951), with full recompute
    # (without it the activations of a 2048-token sample cap b at 1 everywhere)
    cluster = api.load_cluster("v100:1x8")
    small = cluster.model_copy(update={"device": cluster.device.model_copy(update={"memory_bytes": 16 * GIB})})
    plan = solve(api.make_problem("gpt-1.7b", small, global_batch_size=512, attention=KERNELS_2020),
                 options={"recompute": "full"})

    def largest_b(p: int) -> int:
        return max((r["b"] for r in plan.candidates if r["p"] == p and r["fits"]), default=0)

    # with the default headroom (0.8 GiB runtime + 5 % = 1.6 GiB of 16 GiB) and the chapter's runtime
    # (24 B per parameter with 2BW, 20 with Flush) p = 2 holds nothing (19.8 GB of model state per
    # device), p = 4 b = 4, p = 8 b = 8
    assert (largest_b(1), largest_b(2), largest_b(4), largest_b(8)) == (0, 0, 4, 8)


def test_larger_batch_amortizes_the_cross_node_allreduce() -> None:
    # 32 V100s on 4 nodes, p = 2, d = 16: stage replicas span nodes (w > 8, p < 8, L3043-3049), so
    # more gradient accumulation raises throughput; 2BW hides the all-reduce once m t exceeds it
    problem = api.make_problem("gpt-1.7b", "v100:4x8", global_batch_size=256, attention=KERNELS_2020)

    def rate(schedule: str, m: int) -> float:
        return evaluate(problem, problem.model, schedule=schedule, num_stages=2, data_parallel=16,
                        num_microbatches=m, recompute="none").samples_per_s

    assert rate("flush", 2) < rate("flush", 4) < rate("flush", 16) < rate("flush", 64)
    # 2BW overlaps the all-reduce with the next batch: already hidden at m = 2 here
    assert rate("2bw", 2) == rate("2bw", 4) == rate("2bw", 16) == rate("2bw", 64)
    # on one placement 2BW is faster (no flush); its second weight version can force a less balanced
    # split than Flush's, which then wins (here 13 + 13 layers for Flush, 12 + 14 for 2BW)
    two = evaluate(problem, problem.model, schedule="2bw", num_stages=2, data_parallel=16, num_microbatches=64,
                   recompute="none")
    terms = cm.stage_terms(problem.model, problem.cluster, list(two.bounds), recompute="none", data_parallel=16,
                           tensor_parallel=1)
    assert cm.iteration_time_s(terms, "2bw", 64) < cm.iteration_time_s(terms, "flush", 64)
    assert two.bounds == (0, 12, 26) and rate("2bw", 64) < rate("flush", 64)


def test_flush_needs_less_memory_than_2bw() -> None:
    problem = api.make_problem("gpt-1.7b", "v100:1x8", global_batch_size=64)
    kw = {"num_stages": 4, "data_parallel": 2, "num_microbatches": 32, "recompute": "none"}
    flush = evaluate(problem, problem.model, schedule="flush", **kw)
    double = evaluate(problem, problem.model, schedule="2bw", **kw)
    weights = sum(layer.param_bytes for layer in problem.model.layers[:7])  # stage 0: embedding + 6 blocks
    assert double.peak_memory_bytes - flush.peak_memory_bytes == pytest.approx(weights)


# --------------------------------------------------------------------------------------
# Plan contents, profile re-derivation
# --------------------------------------------------------------------------------------


def test_plan_fields_and_candidate_table() -> None:
    plan = solve(api.make_problem("gpt-1.7b", "v100:1x8", global_batch_size=512))
    assert plan.solver == "pipedream-2bw" and plan.status == "optimal"
    assert plan.degrees.pipeline * plan.degrees.data == 8 and plan.degrees.virtual == 1
    keys = list(plan.candidates[0])
    assert all(list(r) == keys for r in plan.candidates)
    fits = [r["fits"] for r in plan.candidates]
    assert fits == sorted(fits, reverse=True)
    rates = [r["samples_per_s"] for r in plan.candidates if r["fits"]]
    assert rates == sorted(rates, reverse=True)
    assert all(r["m"] >= r["p"] for r in plan.candidates if r["schedule"] == "2bw")
    assert any("gradient accumulation steps: " + str(plan.num_microbatches) in n for n in plan.notes)
    assert {r["b"] for r in plan.candidates} >= {1, 2, 4}
    derived = transformer_profile(plan.transformer, device=plan.cluster.device, microbatch_size=plan.microbatch_size,
                                  intra_node_bytes_per_s=plan.cluster.intra_node_bytes_per_s)
    # the plan's static bytes are the runtime's: + fp32 main gradients (4 B per parameter) and, with
    # 2BW, the fp32 second version's extra 2 B over the 16-bit one the simulator counts
    extra = 4 + (2 if plan.schedule == "2bw" else 0)
    assert plan.model == cm.runtime_profile(derived, plan.schedule, bytes_per_element=2)
    decoder = plan.model.layers[1]
    assert decoder.static_bytes == pytest.approx(derived.layers[1].static_bytes + extra * decoder.param_bytes / 2)


def test_efficiency_is_recovered_when_rederiving_profiles() -> None:
    problem = api.make_problem("gpt-1.7b", "v100:1x8", global_batch_size=512, efficiency=0.4)
    plan = solve(problem, options={"microbatch_sizes": "2"})
    assert plan.microbatch_size == 2 and any("efficiency 0.4" in n for n in plan.notes)
    expected = transformer_profile(problem.transformer, device=problem.cluster.device, microbatch_size=2,
                                   efficiency=0.4, intra_node_bytes_per_s=problem.cluster.intra_node_bytes_per_s)
    assert plan.model.layers[1].forward_s == pytest.approx(expected.layers[1].forward_s, rel=1e-12)


def test_measured_profile_keeps_its_microbatch_size() -> None:
    model = ModelProfile(name="m", microbatch_size=4, layers=tuple(_layer(i, act=1.0) for i in range(4)))
    plan = solve(PipelineProblem(model=model, cluster=_cluster(4), global_batch_size=64))
    assert {r["b"] for r in plan.candidates} == {4} and plan.microbatch_size == 4
    with pytest.raises(InvalidProblemError, match="fixes the microbatch size at 4"):
        solve(PipelineProblem(model=model, cluster=_cluster(4), global_batch_size=64),
              options={"microbatch_sizes": "1,2"})


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------


def test_nothing_fits_memory_says_what_would() -> None:
    with pytest.raises(InfeasibleError) as info:
        solve(api.make_problem("gpt-39.1b", "v100:1x8", global_batch_size=512))
    text = str(info.value)
    # the chapter's runtime keeps 20 B per parameter with Flush (24 with 2BW): a 0.8B-parameter block
    # takes 16.1 GB, two do not fit 29.4 GiB, so one block per stage (48 stages)
    assert "GiB" in text and "a pipeline of 48 stages" in text and "at most 8 of its 48 decoder layers" in text
    with pytest.raises(InfeasibleError) as info:  # the profile's 16 B per parameter (+2 for 2BW's version)
        solve(api.make_problem("gpt-39.1b", "v100:1x8", global_batch_size=512), options={"runtime_memory": "profile"})
    text = str(info.value)
    assert "a pipeline of 25 stages" in text and "at most 14 of its 48 decoder layers" in text


def test_no_batch_split_lists_batches_that_work() -> None:
    problem = api.make_problem("gpt-1.7b", "v100:1x8", global_batch_size=4, schedule="2bw")
    with pytest.raises(InfeasibleError, match=r"m = B / \(b d\) >= p.*work: \[8, 16, 32, 64, 128\]"):
        solve(problem)
    odd = api.make_problem("gpt-1.7b", "v100:1x6", global_batch_size=7)
    with pytest.raises(InfeasibleError, match=r"not a multiple of b x d.*work: \[4, 6, 8"):
        solve(odd, options={"microbatch_sizes": "2,4"})


def test_fewer_layers_than_stages() -> None:
    model = ModelProfile(name="two", layers=(_layer(0), _layer(1)))
    problem = PipelineProblem(model=model, cluster=_cluster(4), data_parallel=1, global_batch_size=8)
    with pytest.raises(InfeasibleError, match="has 2 layers but the pipeline would need 4 stages"):
        solve(problem)


@pytest.mark.parametrize(("options", "match"), [
    ({"schedules": "gpipe"}, "option schedules='gpipe'"),
    ({"recompute": "selective"}, "option recompute='selective'"),
    ({"microbatch_sizes": "0,2"}, "option microbatch_sizes='0,2'"),
    ({"microbatch_sizes": "two"}, "option microbatch_sizes='two'"),
    ({"max_microbatch_size": "0"}, "option max_microbatch_size=0"),
    ({"colour": "red"}, "has no option 'colour'"),
])
def test_bad_options(options: dict[str, str], match: str) -> None:
    problem = api.make_problem("gpt-1.7b", "v100:1x8", global_batch_size=64)
    with pytest.raises(InvalidProblemError, match=match):
        solve(problem, options=options)


def test_problem_fields_the_planner_rejects() -> None:
    with pytest.raises(InvalidProblemError, match="schedule='gpipe' is not supported"):
        solve(api.make_problem("gpt-1.7b", "v100:1x8", schedule="gpipe"))
    with pytest.raises(InvalidProblemError, match="conflicts with option schedules"):
        solve(api.make_problem("gpt-1.7b", "v100:1x8", schedule="flush"), options={"schedules": "2bw"})
    model = ModelProfile(name="m", layers=tuple(_layer(i) for i in range(4)))  # no 'full' option
    with pytest.raises(InvalidProblemError, match="no layer of 'm' offers"):
        solve(PipelineProblem(model=model, cluster=_cluster(2)), options={"recompute": "full"})


def test_cli_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", "--solver", "pipedream-2bw", "--cluster", "v100:1x8"]
    assert cli.main([*base, "--model", "gpt-1.7b", "--global-batch", "512"]) == 0
    out = capsys.readouterr().out
    assert "configurations (--json has them all)" in out and "recompute" in out
    assert cli.main([*base, "--model", "gpt-39.1b"]) == 3
    assert "would fit" in capsys.readouterr().err
    assert cli.main([*base, "--model", "gpt-1.7b", "--option", "schedules=zb"]) == 2


def test_allreduce_term_matches_the_ring_formula() -> None:
    # stage replicas within a node use the intra-node link; d = 4 ranks x 1 GB gradients
    layers = tuple(_layer(i, params=1e9) for i in range(2))
    cluster = _cluster(8, bandwidth=1e10, per_node=8, latency_s=1e-3)
    terms = cm.stage_terms(ModelProfile(name="t", layers=layers), cluster, [0, 1, 2], recompute="none",
                           data_parallel=4, tensor_parallel=1)
    assert terms.allreduce_s == pytest.approx((allreduce_time_s(1e9, 4, 1e10, 1e-3),) * 2)
    assert terms.allreduce_s[0] == pytest.approx(2 * 3 / 4 * 0.1 + 6e-3)
    assert math.isclose(terms.comm_in_s[1], 2 * 1e-3)  # no output bytes: latency both ways
    # the same replicas over 2-device nodes (inter = bandwidth / 4 per device): the simulator's
    # hierarchical all-reduce (collectives.ranks_allreduce_s): reduce-scatter and all-gather inside
    # the node (2 x 1/2 x 1 GB at 10 GB/s + 2 latencies), then 1/2 GB all-reduced across the 2 nodes
    # on each rail (2 x 1/2 x 0.5 GB at 2.5 GB/s + 2 latencies). The flat ring over
    # min(intra, 2 x inter) it replaces charged allreduce_time_s(1e9, 4, 5e9, 1e-3) = 0.306 s.
    spread = _cluster(8, bandwidth=1e10, per_node=2, latency_s=1e-3)
    terms = cm.stage_terms(ModelProfile(name="t", layers=layers), spread, [0, 1, 2], recompute="none",
                           data_parallel=4, tensor_parallel=1)
    assert terms.allreduce_s == pytest.approx((0.1 + 2e-3 + 0.2 + 2e-3,) * 2)


def test_problem_fixes_depth_or_microbatches() -> None:
    fixed_p = solve(api.make_problem("gpt-1.7b", "v100:1x8", global_batch_size=512, num_stages=4))
    assert {(r["p"], r["d"]) for r in fixed_p.candidates} == {(4, 2)}
    fixed_m = solve(api.make_problem("gpt-1.7b", "v100:1x8", num_microbatches=8))
    assert {r["m"] for r in fixed_m.candidates} == {8} and all(r["p"] <= 8 for r in fixed_m.candidates)
    assert fixed_m.global_batch_size == 8 * fixed_m.microbatch_size * fixed_m.degrees.data
    assert not any("defaulted" in n for n in fixed_m.notes)
    default = solve(api.make_problem("gpt-1.7b", "v100:1x8"))
    assert default.global_batch_size == 512 and any("defaulted to 512" in n for n in default.notes)


# --------------------------------------------------------------------------------------
# Placement and the chapter's depth choices (Sec. 3.4.2, L2947-2951)
# --------------------------------------------------------------------------------------


def _all_splits(n: int, p: int) -> list[list[int]]:
    return [[0, *cuts, n] for cuts in itertools.combinations(range(1, n), p - 1)]


@pytest.mark.parametrize("seed", range(24))
def test_balanced_bounds_is_the_best_fitting_split(seed: int) -> None:
    rng = random.Random(300 + seed)
    model = _random_profile(rng, rng.randint(2, 8))
    n, p, m = model.num_layers, rng.randint(1, min(4, model.num_layers)), rng.choice([1, 2, 8])
    schedule, recompute = rng.choice(["2bw", "flush"]), rng.choice(["none", "full"])
    capacity = rng.uniform(15, 60)
    best = math.inf
    for cuts in _all_splits(n, p):
        terms = cm.stage_terms(model, _cluster(1), cuts, recompute=recompute, data_parallel=1, tensor_parallel=1)
        if max(cm.stage_memory_bytes(terms, schedule, m)) <= capacity:
            best = min(best, max(terms.compute_s))
    got = cm.balanced_bounds(model, p, recompute=recompute, schedule=schedule, num_microbatches=m,
                             capacity_bytes=capacity)
    if math.isinf(best):
        assert got is None
    else:
        assert got is not None
        terms = cm.stage_terms(model, _cluster(1), got, recompute=recompute, data_parallel=1, tensor_parallel=1)
        assert max(cm.stage_memory_bytes(terms, schedule, m)) <= capacity * (1 + 1e-12)
        assert max(terms.compute_s) == pytest.approx(best, rel=1e-12)


def _best_per_depth(plan) -> dict[int, float]:  # type: ignore[no-untyped-def]
    out: dict[int, float] = {}
    for row in plan.candidates:
        if row["fits"]:
            out.setdefault(row["p"], row["samples_per_s"])
    return out


@pytest.mark.parametrize("cluster", ["v100-16gb:1x8", "v100-16gb:8x8"])
def test_chapter_picks_8_deep_for_gpt_2_2b(cluster: str) -> None:
    # GPT 2.2B (h 1920, 48 layers, s 512, fp16) on 16-GB V100s, batch 512 (the chapter's GPT batch),
    # on the chapter's runtime (24 B per parameter with 2BW): the chapter's planner (Algorithm 1,
    # which plans 2BW) and our default sweep (2BW and Flush) both pick 8 deep. At 4 deep a stage's
    # 0.56B parameters take 13.3 GB, so b = 1 without recompute does not fit and recompute (4/3 the
    # time) holds b = 4; 8 deep holds b = 2 without recompute (docs/solver-pipedream-2bw.md)
    for schedule in ("2bw", "1f1b"):
        plan = solve(api.make_problem("gpt2bw-2.2b", cluster, global_batch_size=512, attention=KERNELS_2020,
                                      schedule=schedule))
        top = plan.candidates[0]
        assert (top["schedule"], top["p"], top["b"], top["recompute"]) == ("2bw", 8, 2, "none")
        rates = _best_per_depth(plan)
        assert rates[4] < rates[8] / 1.04


def test_chapter_picks_16_deep_for_gpt_3_8b() -> None:
    # GPT 3.8B (h 2560, 48 layers) on 64 16-GB V100s: the chapter's planner picked 16 deep. On the
    # chapter's runtime 8 deep holds 2BW only with recompute (0.49B parameters per stage at 24 B are
    # 11.7 GB), 16 deep without: 10 % faster among 2BW configurations (Algorithm 1 plans 2BW). With
    # Flush in the sweep, 8-deep Flush at b = 1 (20 B per parameter) comes within 1 %.
    plan = solve(api.make_problem("gpt2bw-3.8b", "v100-16gb:8x8", global_batch_size=512, attention=KERNELS_2020,
                                  schedule="2bw"))
    rates = _best_per_depth(plan)
    top = plan.candidates[0]
    assert (top["p"], top["b"], top["recompute"]) == (16, 1, "none")
    assert rates[16] / rates[8] == pytest.approx(1.106, abs=0.01)
    both = solve(api.make_problem("gpt2bw-3.8b", "v100-16gb:8x8", global_batch_size=512, attention=KERNELS_2020))
    assert both.candidates[0]["p"] == 16
    flush8 = max(r["samples_per_s"] for r in both.candidates if r["fits"] and (r["p"], r["schedule"]) == (8, "flush"))
    assert flush8 / both.candidates[0]["samples_per_s"] == pytest.approx(0.990, abs=0.005)
    # on the profile's 16 B per parameter (+2 for the 16-bit version) 8 deep fits 2BW at b = 1 and wins
    old = solve(api.make_problem("gpt2bw-3.8b", "v100-16gb:8x8", global_batch_size=512, attention=KERNELS_2020),
                options={"runtime_memory": "profile"})
    assert old.candidates[0]["p"] == 8


@pytest.mark.parametrize("schedule", ["zb-v", "dualpipe-v"])
def test_v_schedules_are_refused_naming_the_schedule_and_the_solvers_that_plan_them(schedule) -> None:
    problem = api.make_problem("gpt-1.7b", "a100-80gb:8", schedule=schedule, num_stages=4)
    with pytest.raises(InvalidProblemError, match=rf"schedule='{schedule}': solver 'pipedream-2bw' .* solver 'ptdp' or 'even'"):
        api.plan(problem, solver="pipedream-2bw")
    for solver in ("stage-ilp", "merak", "adapipe"):
        with pytest.raises(InvalidProblemError, match=rf"schedule='{schedule}': the stage ILP .*'{solver}'"):
            api.plan(problem, solver=solver)
