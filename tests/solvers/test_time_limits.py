"""--time-limit is the command's total budget in every solver that searches (issue 14 item 5):
a spent budget returns the best plan found with status ``time_limit`` and a note naming what
was left untried, or an infeasibility message that says the search was cut short. Checked by
status and notes, never by wall time (a limit of 1e-9 s is spent before the second candidate)."""

from __future__ import annotations

import pytest

import solvers
from planner import api
from planner.errors import InfeasibleError

SPENT = 1e-9


def _spent(problem):
    return problem.model_copy(update={"time_limit_s": SPENT})


def test_even_stops_after_the_first_depth_and_says_which_were_not_tried() -> None:
    problem = api.make_problem("gpt3-13b", "a100-80gb:8", num_microbatches=8)
    full = solvers.solve(problem, solver="even")
    assert full.degrees.pipeline > 1  # depth 1 does not fit 13B on one 80 GB GPU
    with pytest.raises(InfeasibleError, match=r"time_limit_s=1e-09 was spent after 1 of \d+ pipeline depths"):
        solvers.solve(_spent(problem), solver="even")


@pytest.mark.parametrize("solver", ["spipe", "mobius", "zero-offload"])
def test_offload_sweeps_return_the_best_of_the_configurations_tried(solver: str) -> None:
    problem = api.make_problem("spipe-19b", "v100:1x4", microbatch_size=2, global_batch_size=16)
    full = solvers.solve(problem, solver=solver)
    try:
        plan = solvers.solve(_spent(problem), solver=solver)
    except InfeasibleError as e:  # the first configuration did not fit
        assert "was spent after 1 of" in str(e) and "configurations" in str(e)
        return
    assert plan.status == "time_limit" and full.status == "optimal"
    assert any("spent after 1 of" in note and "configurations" in note for note in plan.notes)
    assert len(plan.candidates) == 1 < len(full.candidates)
    assert plan.predicted.iteration_time_s >= full.predicted.iteration_time_s * (1 - 1e-12)  # type: ignore[union-attr]


def test_merak_returns_its_first_fitting_ratio_with_status_time_limit() -> None:
    problem = api.make_problem("gpt-1.7b", "a100-80gb:8", num_stages=4, global_batch_size=64)
    full = solvers.solve(problem, solver="merak")
    plan = solvers.solve(_spent(problem), solver="merak")
    assert full.status != "time_limit" and plan.status == "time_limit"
    assert any("recompute strategies" in note for note in plan.notes)


def test_pipedream_2bw_stops_after_the_first_depth_width_pair() -> None:
    problem = api.make_problem("gpt-1.7b", "a100-80gb:8", global_batch_size=64)
    full = solvers.solve(problem, solver="pipedream-2bw")
    plan = solvers.solve(_spent(problem), solver="pipedream-2bw")
    assert full.status == "optimal" and plan.status == "time_limit"
    assert any(note.startswith("time_limit_s=1e-09 spent after 1 of") and "(depth, width) pairs" in note
               for note in plan.notes)
    assert len(plan.candidates) < len(full.candidates)
    assert plan.predicted.throughput_samples_per_s <= full.predicted.throughput_samples_per_s * (1 + 1e-12)  # type: ignore[union-attr]


def test_zero_offload_refuses_a_simulation_beyond_its_bound_at_once() -> None:
    # 4,096 data-parallel GPUs x 26 layers: each GPU's per-layer fetches and passes are simulated
    problem = api.make_problem("gpt-1.7b", "a100-80gb:4096")
    with pytest.raises(InfeasibleError, match=r"4,096 GPUs x 26 layers .* above its bound of 400,000 .* at most 2,564 GPUs"):
        solvers.solve(problem, solver="zero-offload")


def test_pipedream_cut_short_in_its_dp_returns_the_data_parallel_plan() -> None:
    problem = api.make_problem("pipedream:vgg16", "v100:2x8")
    full = solvers.solve(problem, solver="pipedream", options={"memory": "false"})
    plan = solvers.solve(_spent(problem), solver="pipedream", options={"memory": "false"})
    assert full.status == "optimal" and len(full.stages) > 1
    assert plan.status == "time_limit" and [s.replicas for s in plan.stages] == [16]
    assert any("spent in the partitioning DP" in note and "gap unknown" in note for note in plan.notes)
    # the DP's objective (bottleneck per input) is at most the data-parallel candidate's
    assert full.predicted.bottleneck_s <= plan.predicted.bottleneck_s  # type: ignore[union-attr]
    assert api.simulate(plan).fits_memory


def test_pipedream_cut_short_without_a_fitting_candidate_says_so() -> None:
    problem = api.make_problem("gpt3-175b", "a100-80gb:64")
    with pytest.raises(InfeasibleError) as full:
        solvers.solve(problem, solver="pipedream")
    assert "the best partition needs 519.8 GiB" in str(full.value)
    with pytest.raises(InfeasibleError, match=r"time_limit_s=1e-09 was spent in PipeDream's partitioning DP .* "
                                              r"the data-parallel plan needs 2.6 TiB per device of 75.0 GiB usable"):
        solvers.solve(_spent(problem), solver="pipedream")


def test_zero_offload_simulates_the_cheapest_sizes_within_its_bound_and_says_which_it_left(monkeypatch) -> None:
    from solvers import zero_offload

    problem = api.make_problem("gpt-1.7b", "a100-80gb:8", global_batch_size=64)
    full = solvers.solve(problem, solver="zero-offload")
    assert {row["microbatch_size"] for row in full.candidates} == {1, 2, 4, 8} and full.status == "optimal"
    # 8 GPUs x (4 x 26 layers x m + 2 x 26): m = 1, 2 (b = 8, 4) fit 5,000 operations together; m = 4, 8 do not
    monkeypatch.setattr(zero_offload, "MAX_SIMULATED_OPS", 5_000)
    plan = solvers.solve(problem, solver="zero-offload")
    assert {row["microbatch_size"] for row in plan.candidates} == {4, 8} and plan.status == "feasible"
    assert any(note.startswith("microbatch sizes [1, 2] not simulated") for note in plan.notes)


@pytest.mark.parametrize("solver", ["spipe", "mobius"])
def test_offload_pipelines_on_more_gpus_than_layers_are_refused_with_the_reason(solver: str) -> None:
    # 1,536 layers on 4,096 GPUs in the scale table; here 24 decoder layers on 32 GPUs
    problem = api.make_problem("gpt-1.7b", "a100-80gb:32")
    with pytest.raises(InfeasibleError, match=r"32 stages need at least 32 decoder layers; the model has 24 \(every GPU "
                                              r"holds at least one forward stage: use at most as many GPUs as decoder layers\)"):
        solvers.solve(problem, solver=solver)
