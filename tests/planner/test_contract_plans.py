"""Contract regression tests, part 2: the plan validator, flags honoured or refused, byte-identical
plans for every solver, and the first hour (bundled traces, cluster specs)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from planner import api
from planner.errors import InvalidProblemError
from planner.validate import action_defects, check_actions, plan_defects
from tests.planner.contract_helpers import (
    CLUSTER, JOBS, PROFILE, assert_contract, plan_dict, refused, run_cli, write,
)


# ---- plan validator ------------------------------------------------------------------------------


def _plan(**changes: Any) -> dict[str, Any]:
    plan = json.loads(json.dumps(plan_dict()))
    for key, value in changes.items():
        plan[key] = value
    return plan


def _stages(ranks: list[list[int]], replicas: int = 1) -> list[dict[str, Any]]:
    stages = json.loads(json.dumps(plan_dict()["stages"]))
    for stage, r in zip(stages, ranks):
        stage["ranks"], stage["replicas"] = r, replicas
    return stages


@pytest.mark.parametrize("changes, needle", [
    ({"cluster": dict(CLUSTER, devices_per_node=1)}, "needs 2 devices"),
    ({"degrees": {"data": 1, "tensor": 64, "pipeline": 2}}, "degrees.tensor=64"),
    ({"global_batch_size": 5}, "global_batch_size=5"),
    ({"stages": _stages([[0], [0]])}, "rank 0 is listed by stages 0 and 1"),
    ({"stages": _stages([[0], [7]])}, "names rank 7"),
    ({"stages": _stages([[0, 1], [0, 1]], replicas=2)}, "needs 4 devices"),
    ({"bpipe": {"pairs": [[0, 0]], "target_inflight": 2}}, "pairs a stage with itself"),
    ({"bpipe": {"pairs": [[0, 5]], "target_inflight": 2}}, "outside 0..1"),
])
def test_simulate_and_export_refuse_inconsistent_plans(tmp_path: Path, changes: dict, needle: str) -> None:
    path = write(tmp_path / "plan.json", _plan(**changes))
    for argv in (["simulate", str(path)], ["export", str(path), "--format", "megatron"],
                 ["fill", str(path), "--fill-jobs", "bert-large-inference"]):
        refused(argv, "invalid plan", needle)
    with pytest.raises(InvalidProblemError, match="invalid plan"):
        api.load_plan(path)


def test_every_solver_plan_passes_the_validator() -> None:
    from tests.planner.contract_helpers import CLUSTER as C

    from planner.schema import Cluster, ModelProfile

    for solver in ("even", "merak", "adapipe", "pipedream"):
        stages = 2 if solver in ("merak", "adapipe") else None
        problem = api.make_problem(ModelProfile.from_dict(PROFILE), Cluster.from_dict(C), num_stages=stages)
        assert plan_defects(api.plan(problem, solver=solver)) == []


_GOOD_ACTIONS = [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]]


def test_custom_action_lists_are_checked_structurally() -> None:
    kw = dict(num_stages=2, num_chunks=1, num_microbatches=2)
    assert action_defects(_GOOD_ACTIONS, **kw) == []
    assert any("never runs the forward" in d for d in action_defects([["0F0", "0B0", "0B1"], _GOOD_ACTIONS[1]], **kw))
    assert any("appears 2 times" in d for d in action_defects([["0F0", "0F0", "0F1", "0B0", "0B1"], _GOOD_ACTIONS[1]], **kw))
    assert any("belongs to rank 1" in d for d in action_defects([["1F0", *_GOOD_ACTIONS[0]], _GOOD_ACTIONS[1]], **kw))
    assert any("deadlock" in d for d in action_defects([["0F0", "0B0", "0F1", "0B1"], ["1F1", "1B1", "1F0", "1B0"]], **kw))
    assert any("one B or one I plus one W" in d
               for d in action_defects([["0F0", "0F1", "0I0", "0B1"], _GOOD_ACTIONS[1]], **kw))
    with pytest.raises(InvalidProblemError, match="invalid actions"):
        check_actions([["0F0"], []], **kw)


# ---- flags honoured or refused -------------------------------------------------------------------


def test_microbatch_size_zero_is_refused() -> None:
    refused(["plan", "--model", "gpt-tiny", "--cluster", "cpu:2", "--microbatch-size", "0"], "--microbatch-size")


def test_bpipe_below_four_stages_is_refused() -> None:
    refused(["plan", "--model", "gpt-1.7b", "--cluster", "a100-80gb:8", "--bpipe", "--pipeline", "2"],
             "bpipe", "num_stages >= 4")


def test_schedule_refuses_a_missing_throughput_table() -> None:
    refused(["schedule", "--jobs", "small_test", "--cluster", "v100:2,k80:2", "--policy", "fifo",
              "--throughputs", "missing.json"], "missing.json", "does not exist")


def test_schedule_refuses_a_throughput_table_it_would_ignore(tmp_path: Path) -> None:
    table = tmp_path / "t.json"
    table.write_text("{}")
    refused(["schedule", "--jobs", str(write(tmp_path / "j.json", JOBS)), "--cluster", "v100:1,k80:1",
              "--policy", "fifo", "--throughputs", str(table)], "--throughputs")


def test_optional_int_options_are_converted() -> None:
    outcome = run_cli(["plan", "--model", "gpt-1.7b", "--cluster", "a100-80gb:8", "--solver", "ptdp",
                       "--global-batch", "64", "--option", "tensor_parallel=1", "--option", "microbatch_size=1",
                       "--json"])
    assert outcome.code == 0, outcome.err
    plan = json.loads(outcome.out)
    assert plan["degrees"]["tensor"] == 1 and plan["microbatch_size"] == 1


def test_api_accepts_typed_options_and_refuses_another_solvers() -> None:
    from solvers import even, ptdp

    problem = api.make_problem("gpt-tiny", "cpu:2")
    assert api.plan(problem, solver="even", options=even.Options()) == api.plan(problem, solver="even")
    with pytest.raises(InvalidProblemError, match="solvers.ptdp.Options"):
        api.plan(problem, solver="ptdp", options=even.Options())
    assert ptdp.Options  # the class the message names exists


def test_chunks_infer_the_interleaved_schedule() -> None:
    outcome = run_cli(["plan", "--model", "gpt-tiny", "--cluster", "cpu:2", "--chunks", "2", "--pipeline", "2", "--json"])
    assert outcome.code == 0, outcome.err
    assert json.loads(outcome.out)["schedule"] == "interleaved-1f1b"
    assert "interleaved-1f1b" in outcome.err


def test_profile_without_torch_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "torch" or m.startswith(("torch.", "runtime_bridge.profile"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ModuleNotFoundError
    refused(["profile", "--model", "gpt-tiny"], "pip install 'paraplan[torch]'")


# ---- determinism: byte-identical plans -----------------------------------------------------------

_SOLVER_CASES = {
    "even": ("gpt-tiny", "cpu:4", {}),
    "merak": ("gpt-tiny", "cpu:4", {"num_stages": 2}),
    "adapipe": ("gpt-tiny", "cpu:4", {"num_stages": 2}),
    "stage-ilp": ("gpt-tiny", "cpu:4", {"num_stages": 2}),
    "pipedream": ("pipedream:alexnet", "v100:1x4", {}),
    "pipedream-2bw": ("gpt-tiny", "cpu:4", {"global_batch_size": 16}),
    "ptdp": ("gpt-tiny", "cpu:4", {"global_batch_size": 16}),
    "spipe": ("gpt-1.7b", "a100-80gb:8", {}),
    "mobius": ("gpt-1.7b", "a100-80gb:8", {}),
    "zero-offload": ("gpt-1.7b", "a100-80gb:8", {}),
}


@pytest.mark.parametrize("solver", sorted(_SOLVER_CASES))
def test_identical_input_gives_byte_identical_plan_json(tmp_path: Path, solver: str) -> None:
    import solvers

    assert set(_SOLVER_CASES) <= set(solvers.SOLVERS)
    model, cluster, kwargs = _SOLVER_CASES[solver]
    texts = [api.plan(api.make_problem(model, cluster, **kwargs), solver=solver).model_dump_json(indent=2)
             for _ in range(2)]
    assert texts[0] == texts[1]
    assert json.loads(texts[0])["solve_time_s"] is None
    timed = api.plan(api.make_problem(model, cluster, **kwargs), solver=solver, timings=True)
    assert timed.solve_time_s is not None and timed.solve_time_s >= 0


def test_every_registered_solver_is_in_the_determinism_test() -> None:
    import solvers

    assert set(solvers.SOLVERS) == set(_SOLVER_CASES)


def test_cli_writes_identical_bytes_twice(tmp_path: Path) -> None:
    for name in ("a.json", "b.json"):
        assert run_cli(["plan", "--model", "gpt-tiny", "--cluster", "cpu:2", "-o", str(tmp_path / name)]).code == 0
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()


# ---- first hour ------------------------------------------------------------------------------------


def test_bundled_traces_by_name_and_the_documented_command() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "gavel-simulator.md").read_text()
    line = next(x for x in docs.splitlines() if "--trace small_test" in x)
    argv = line.split()[1:]
    outcome = run_cli(argv)
    assert outcome.code == 0, outcome.err


def test_cluster_spec_is_printed_as_what_it_expanded_to() -> None:
    outcome = run_cli(["plan", "--model", "gpt-tiny", "--cluster", "cpu:2"])
    assert "cluster cpu:2 -> 1 node x 2 cpu = 2 devices" in outcome.err
    outcome = run_cli(["schedule", "--jobs", "small_test", "--cluster", "v100:2,k80:2", "--policy", "fifo"])
    assert "cluster v100:2,k80:2 -> 2 v100 + 2 k80 = 4 accelerators" in outcome.err


def test_pipedream_memory_option_on_gpt3_175b_explains_infeasibility() -> None:
    argv = ["plan", "--model", "gpt3-175b", "--cluster", "a100-80gb:8", "--solver", "pipedream",
            "--option", "memory=true", "--no-offload"]
    outcome = run_cli(argv)
    assert_contract(outcome, argv)
    assert outcome.code == 3 and "GiB" in outcome.err, outcome.err


def test_duplicate_job_ids_are_refused(tmp_path: Path) -> None:
    jobs = json.loads(json.dumps(JOBS))
    jobs["jobs"][1]["id"] = "a"
    path = str(write(tmp_path / "jobs.json", jobs))
    refused(["cluster-sim", "--trace", path, "--cluster", "v100:1,k80:1", "--policy", "fifo"], "'a' appears twice")
    fill = {"jobs": [{"id": "f", "model": "bert-base", "mode": "inference"}] * 2}
    plan = str(write(tmp_path / "plan.json", plan_dict()))
    refused(["fill", plan, "--fill-jobs", str(write(tmp_path / "f.json", fill))], "'f' appears twice")


def test_a_plan_whose_transformer_differs_from_its_profile_is_refused(tmp_path: Path) -> None:
    plan = json.loads(api.plan(api.make_problem("gpt-tiny", "cpu:2")).model_dump_json())
    plan["transformer"]["num_layers"] = 8
    path = str(write(tmp_path / "plan.json", plan))
    for argv in (["simulate", path], ["export", path, "--format", "megatron"], ["run", path]):
        refused(argv, "8 blocks", "plan again")


def test_nodes_x_devices_means_the_same_in_every_command() -> None:
    plan = run_cli(["plan", "--model", "gpt-tiny", "--cluster", "v100:2x4"])
    assert "= 8 devices" in plan.err
    schedule = run_cli(["schedule", "--jobs", "small_test", "--cluster", "v100:2x4,k80:1x2", "--policy", "fifo"])
    assert schedule.code == 0 and "8 v100 + 2 k80" in schedule.err, schedule.err


def test_simulator_work_is_bounded() -> None:
    refused(["plan", "--model", "gpt3-175b", "--cluster", "a100-80gb:128", "--pipeline", "96",
              "--microbatches", "16384"], "1,048,576")


@pytest.mark.parametrize("argv, needle", [
    (["cluster-sim", "--cluster", "v100:2,k80:2", "--policy", "fifo", "--trace", "small_test", "--rate", "3"], "--rate"),
    (["cluster-sim", "--cluster", "v100:2,k80:2", "--policy", "fifo", "--trace", "small_test", "--multi-gpu"], "--multi-gpu"),
    (["fill", "{plan}", "--fill-jobs", "bert-large-inference", "--gpus", "1024"], "--scale only"),
    (["fill", "{plan}", "--scale"], "drop the plan"),
    (["simulate", "{plan}", "--events"], "add --json"),
])
def test_flags_that_would_be_ignored_are_refused(tmp_path: Path, argv: list[str], needle: str) -> None:
    plan = str(write(tmp_path / "plan.json", plan_dict()))
    refused([a.replace("{plan}", plan) for a in argv], needle)


def test_bad_custom_actions_are_refused_before_any_process_starts(tmp_path: Path) -> None:
    plan = _plan(schedule="custom", actions=[["0F0", "0F1", "0F2", "0F3", "0B0", "0B1", "0B2"],
                                             ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2", "1F3", "1B3"]])
    path = str(write(tmp_path / "plan.json", plan))
    for argv in (["run", path], ["simulate", path], ["export", path, "--format", "torch-csv"]):
        refused(argv, "invalid plan", "virtual stage 0, microbatch 3")
