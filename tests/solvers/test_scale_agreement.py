"""The shortcuts that make the solvers scale give the answers of the plain methods: the memory
lower bound against the simulator, and even/merak/adapipe with and without their shortcuts on
small random cases (same plans, or the same optimum)."""

from __future__ import annotations

import random

import pytest

from cost_models import simulate as sim
from planner.errors import PlannerError
from planner.schema import Cluster, Device, LayerProfile, ModelProfile, PipelineProblem, RecomputeOption
from solvers import _partition, adapipe, common, even, merak
from solvers.common import build_plan, memory_lower_bound_bytes, resolve_layout


def _problem(rng: random.Random, *, schedule: str = "1f1b", chunks: int = 1, stages: int | None = None) -> PipelineProblem:
    decoders = []
    for i in range(rng.randint(8, 12)):
        act = rng.uniform(4, 20)
        backward = rng.uniform(1, 4)
        decoders.append(LayerProfile(
            name=f"d{i}", kind="decoder", forward_s=rng.uniform(0.5, 2), backward_s=backward, backward_weight_s=backward / 2,
            static_bytes=rng.uniform(5, 30), output_bytes=1, param_bytes=1,
            recompute={"none": RecomputeOption(activation_bytes=act),
                       "full": RecomputeOption(activation_bytes=act / 8, extra_s=rng.uniform(0.5, 2))}))
    layers = (LayerProfile(name="emb", kind="embedding", forward_s=0.5, backward_s=1, backward_weight_s=0.5, static_bytes=40, activation_bytes=2,
                           output_bytes=1), *decoders)
    cluster = Cluster(name="toy", device=Device(name="gpu", memory_bytes=rng.uniform(60, 250), peak_flops=1e12),
                      num_nodes=1, devices_per_node=8, intra_node_bytes_per_s=1e9, inter_node_bytes_per_s=1e9)
    m = rng.choice([4, 8]) * (stages or 1)
    return PipelineProblem(model=ModelProfile(name="toy", layers=layers), cluster=cluster, schedule=schedule,
                           num_chunks=chunks, num_stages=stages, num_microbatches=m)


@pytest.mark.parametrize(("schedule", "chunks"), [("1f1b", 1), ("gpipe", 1), ("interleaved-1f1b", 2), ("zb-h1", 1)])
def test_memory_lower_bound_is_exact_for_1f1b_and_below_the_simulated_peak(schedule: str, chunks: int) -> None:
    rng = random.Random(7)
    for _ in range(15):
        p = rng.choice([2, 3, 4])
        problem = _problem(rng, schedule=schedule, chunks=chunks, stages=p)
        layout = resolve_layout(problem, p)
        strategies = [rng.choice(list(layer.strategies())) for layer in problem.model.layers]
        plan = build_plan(problem, layout, bounds=even.even_bounds(problem.model, p * chunks), strategies=strategies,
                          solver="test", options={})
        peak = max(s.peak_memory_bytes for s in sim.simulate(plan, include_events=False).stages)
        bound = memory_lower_bound_bytes(plan)
        assert bound <= peak * (1 + 1e-12)
        if schedule == "1f1b":
            assert bound == pytest.approx(peak, rel=1e-12)


def _outcome(solve, problem: PipelineProblem) -> object:  # type: ignore[no-untyped-def]
    try:
        plan = solve(problem)
    except PlannerError as e:
        return type(e).__name__, str(e)
    return plan.model_copy(update={"solve_time_s": 0.0}).model_dump()


@pytest.mark.parametrize("solver", [even.solve, merak.solve])
def test_skipping_candidates_by_the_bound_changes_no_answer(monkeypatch: pytest.MonkeyPatch, solver) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(3)
    for _ in range(12):
        problem = _problem(rng, stages=rng.choice([2, 4]) if solver is merak.solve else None)
        fast = _outcome(solver, problem)
        with monkeypatch.context() as patch:  # no shortcut: every candidate is simulated
            patch.setattr(even, "memory_lower_bound_bytes", lambda plan: 0.0)
            patch.setattr(merak, "memory_lower_bound_bytes", lambda plan: 0.0)
            slow = _outcome(solver, problem)
        assert fast == slow


def test_adapipe_parametric_partition_finds_the_dp_optimum(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(5)
    for _ in range(12):
        problem = _problem(rng, stages=rng.choice([2, 3, 4]))
        with monkeypatch.context() as patch:
            patch.setattr(_partition, "_DP_CELLS", 0)  # always the parametric search
            fast = _outcome(adapipe.solve, problem)
        with monkeypatch.context() as patch:
            patch.setattr(_partition, "_DP_CELLS", 10**9)  # always the DP
            slow = _outcome(adapipe.solve, problem)
        if isinstance(slow, tuple) or isinstance(fast, tuple):
            assert type(fast) is type(slow) and (fast == slow if isinstance(fast, tuple) else True)
            continue
        # the same optimum (largest stage time); equally good partitions may differ
        assert fast["notes"][0] == slow["notes"][0]


def test_ptdp_first_chunk_inflight_is_independent_of_long_runs() -> None:
    from solvers._ptdp_model import first_chunk_inflight

    def walk(p: int, v: int, m: int) -> int:  # the whole run, step by step
        total = m * v
        warmup = min(p - 1, m) if v == 1 else min(2 * (p - 1) + (v - 1) * p, total)
        held = peak = 0
        for k in range(total + warmup):
            if k < total and (k % (p * v)) // p == 0:
                held += 1
                peak = max(peak, held)
            j = k - warmup
            if 0 <= j < total and v - 1 - (j % (p * v)) // p == 0:
                held -= 1
        return peak

    for p in range(1, 7):
        for v in range(1, 4):
            for m in range(1, 40):
                assert first_chunk_inflight(p, v, m) == walk(p, v, m), (p, v, m)
    assert first_chunk_inflight(8, 2, 10**15) == first_chunk_inflight(8, 2, 8 * 1000)
