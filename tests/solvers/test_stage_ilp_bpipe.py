"""stage-ilp with BPipe (--bpipe): the balanced own/foreign counts in C2, a model that fits only
with BPipe, the plan's BPipe spec and pair-adjacent ranks, the simulator's memory check, and the
shortfall messages that name BPipe when it would apply."""

from __future__ import annotations

import random

import pytest

from cost_models import bpipe
from cost_models.simulate import simulate
from planner.errors import InfeasibleError, InvalidProblemError
from solvers import _stage_ilp_milp as milp
from solvers._stage_ilp_model import build_model, fits, objective, rank_memory_bytes
from solvers.common import format_bytes, memory_shortfall_message, resolve_layout
from solvers.stage_ilp import min_memory_bytes, solve
from tests.solvers.test_stage_ilp import _problem, all_counts

# p = 8, m = 16, 1F1B, embedding + 8 decoders + head, no recompute: every stage holds one or two
# layers, so re-partitioning cannot move memory off stage 0 (8 in-flight sets). By brute force
# (test below) the smallest peak is 122 B without BPipe and 102 B with it (mu_opt = 5).
NO_RECOMPUTE = {"strategies": "none"}


def _tight(memory: float = 110, *, bpipe_on: bool = False, p: int = 8, decoders: int = 8):
    problem = _problem(random.Random(0), p=p, v=1, num_decoders=decoders, memory=memory, m=2 * p)
    return problem.model_copy(update={"bpipe": bpipe_on})


def _model(problem):
    return build_model(problem, resolve_layout(problem, problem.num_stages), strategies=["none"])


def test_bpipe_memory_rows_use_own_and_foreign_counts() -> None:
    model = _model(_tight(bpipe_on=True))
    assert model.bpipe_split == tuple(bpipe.inflight_split(8, 16))
    counts = next(iter(all_counts(model)))
    acts = [sum(n[0] * lt.activation_bytes[0] for n, lt in zip(per_type, model.types)) for per_type in counts]
    static = [sum(n[0] * lt.static_bytes for n, lt in zip(per_type, model.types)) for per_type in counts]
    want = bpipe.balanced_memory_bytes(acts, 16, static_bytes=static)
    assert rank_memory_bytes(model, counts) == pytest.approx(want)
    assert _model(_tight(bpipe_on=True, p=3, decoders=4)).bpipe_split is None  # below 4 stages: plain counts


def test_min_memory_with_and_without_bpipe_equals_brute_force() -> None:
    for on, expected in ((False, 122.0), (True, 102.0)):
        problem = _tight(bpipe_on=on)
        model = _model(problem)
        brute = min(max(rank_memory_bytes(model, c)) for c in all_counts(model))
        assert brute == pytest.approx(expected)
        assert min_memory_bytes(problem, 8, ["none"]) == pytest.approx(brute)


def test_ilp_optimum_with_bpipe_equals_brute_force_and_cpsat() -> None:
    problem = _problem(random.Random(3), p=4, v=1, num_decoders=5, memory=150, m=8).model_copy(update={"bpipe": True})
    model = build_model(problem, resolve_layout(problem, 4), strategies=None)
    feasible = [c for c in all_counts(model) if fits(model, c)]
    best = min(objective(model, c, "tri") for c in feasible)
    assert len(feasible) < len(all_counts(model)), "the memory rows must bind"
    form = milp.formulate(model, "tri")
    for engine in ("highs", "cpsat"):
        got = milp.solve_milp(model, form, engine=engine, time_limit_s=30, mip_gap=0.0, start=None)
        assert got.status == "optimal" and got.counts is not None and fits(model, got.counts)
        assert objective(model, got.counts, "tri") == pytest.approx(best, rel=1e-4)


def test_model_that_does_not_fit_without_bpipe_fits_with_it() -> None:
    with pytest.raises(InfeasibleError) as err:
        solve(_tight(), options=NO_RECOMPUTE)
    text = str(err.value)
    assert format_bytes(122) in text and f"--bpipe, stage s hands activations to stage p-1-s): needs {format_bytes(102)}" in text
    plan = solve(_tight(bpipe_on=True), options=NO_RECOMPUTE)
    assert plan.bpipe is not None and plan.bpipe.pairs == bpipe.pairs(8) and plan.bpipe.target_inflight == 5
    assert [s.ranks for s in plan.stages] == list(bpipe.pair_adjacent_ranks(8))
    result = simulate(plan)
    assert result.fits_memory and max(s.peak_memory_bytes for s in result.stages) <= 110
    assert any(note.startswith("bpipe: pairs") for note in plan.notes)


def test_interleaved_bpipe_plan_fits_in_simulation() -> None:
    problem = _problem(random.Random(1), p=4, v=2, num_decoders=10, memory=1e9, m=8).model_copy(update={"bpipe": True})
    loose = solve(problem, options={"rerank": 20})
    need = max(loose.predicted.peak_memory_bytes)  # type: ignore[union-attr]
    plan = solve(problem.model_copy(update={"cluster": _problem(random.Random(1), p=4, v=2, num_decoders=10,
                                                                memory=need * 0.9, m=8).cluster}))
    assert plan.bpipe is not None and plan.degrees.virtual == 2
    assert simulate(plan).fits_memory


def test_bpipe_rejects_unbalanced_schedules() -> None:
    problem = _problem(random.Random(5), p=4, v=1, num_decoders=4, memory=1e9, m=8, schedule="zb-h1")
    with pytest.raises(InvalidProblemError, match="bpipe"):
        solve(problem.model_copy(update={"bpipe": True}))


def test_shortfall_message_names_bpipe_only_where_it_applies() -> None:
    def names_bpipe(problem, num_stages=None) -> bool:
        return "--bpipe" in memory_shortfall_message(problem, 2e3, "the plan", num_stages=num_stages)

    tight = _tight()
    assert names_bpipe(tight)  # 1F1B, 8 stages, bpipe off
    assert not names_bpipe(tight.model_copy(update={"bpipe": True}))  # already on
    assert not names_bpipe(tight, num_stages=3)  # below 4 stages BPipe moves nothing
    assert not names_bpipe(tight.model_copy(update={"schedule": "zb-h1"}))  # not a schedule BPipe balances
    assert names_bpipe(tight.model_copy(update={"schedule": "interleaved-1f1b", "num_chunks": 2}))
    text = memory_shortfall_message(tight, 2e3, "the plan")
    assert format_bytes(2e3) in text and "more pipeline stages" in text and "full recompute" in text


def test_slow_pair_link_makes_the_evictor_recompute_and_matches_brute_force() -> None:
    # p = 4, m = 8: only stage 0 moves sets (4 > mu_opt = 3). On a 5 B/s link a decoder's 16 B set
    # takes 3.2 s, longer than its forward, so stage 0 holds the embedding alone or recomputes
    # (Eq. 7-9: every transfer within the chunk's forward).
    from tests.solvers.test_stage_ilp import _cluster

    problem = _problem(random.Random(0), p=4, v=1, num_decoders=4, memory=1e9, m=8)
    problem = problem.model_copy(update={"bpipe": True, "cluster": _cluster(1e9, bandwidth=5.0)})
    model = build_model(problem, resolve_layout(problem, 4), strategies=None)
    assert [k for k, _, _ in model.bpipe_links] == [0]
    feasible = [c for c in all_counts(model) if fits(model, c)]
    assert len(feasible) < len(all_counts(model))  # the link rows bind
    best = min(objective(model, c, "tri") for c in feasible)
    got = milp.solve_milp(model, milp.formulate(model, "tri"), engine="highs", time_limit_s=30, mip_gap=0.0, start=None)
    assert got.counts is not None and objective(model, got.counts, "tri") == pytest.approx(best, rel=1e-9)
    plan = solve(problem)
    assert bpipe.check_link_bandwidth(plan) == ()  # every transfer fits its forward: no warning
    assert simulate(plan).fits_memory
