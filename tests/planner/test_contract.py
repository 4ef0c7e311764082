"""Every case of the contract issue as a regression test: bad input exits 2 naming the field, the
value and the fix (never 1, never a hang, never a silent accept); flags are honoured or refused;
identical input gives byte-identical plan JSON for every solver."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from planner import api
from planner.errors import InvalidProblemError
from planner.validate import action_defects, check_actions, plan_defects
from tests.planner.contract_helpers import (
    CLUSTER, GRAPH_TXT, JOBS, PROFILE, TRACE, TRANSFORMER, assert_contract, plan_dict, run_cli, write,
)


def _refused(argv: list[str], *needles: str) -> str:
    outcome = run_cli(argv)
    assert_contract(outcome, argv)
    assert outcome.code == 2, outcome.err
    for needle in needles:
        assert needle in outcome.err, (needle, outcome.err)
    return outcome.err


# ---- encodings: every reader -----------------------------------------------------------------


def _readers(tmp: Path) -> dict[str, tuple[str, list[str]]]:
    """reader -> (valid text, argv with {path} for the file)."""
    plan = write(tmp / "ok-plan.json", plan_dict())
    return {
        "profile": (json.dumps(PROFILE), ["plan", "--model", "{path}", "--cluster", "cpu:2"]),
        "transformer": (json.dumps(TRANSFORMER), ["plan", "--model", "{path}", "--cluster", "cpu:2"]),
        "cluster": (json.dumps(CLUSTER), ["plan", "--model", "gpt-tiny", "--cluster", "{path}"]),
        "plan": (json.dumps(plan_dict()), ["simulate", "{path}"]),
        "jobs": (json.dumps(JOBS), ["schedule", "--jobs", "{path}", "--cluster", "v100:1,k80:1", "--policy", "fifo"]),
        "fill-jobs": (json.dumps({"jobs": [{"id": "f", "model": "bert-base", "mode": "inference"}]}),
                      ["fill", str(plan), "--fill-jobs", "{path}"]),
        "graph.txt": (GRAPH_TXT, ["plan", "--model", "{path}", "--cluster", "v100:1x2", "--solver", "pipedream"]),
        "trace": (TRACE, ["schedule", "--jobs", "{path}", "--cluster", "v100:1,k80:1", "--policy", "fifo"]),
        "fill --fill job": (json.dumps({"hidden_size": 16}), ["run", str(plan), "--fill", "{path}", "--steps", "0"]),
    }


_SUFFIX = {"graph.txt": "graph.txt", "trace": "in.trace"}


@pytest.mark.parametrize("reader", ["profile", "transformer", "cluster", "plan", "jobs", "fill-jobs", "graph.txt", "trace"])
@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-32"])
def test_every_reader_detects_byte_order_marks(tmp_path: Path, reader: str, encoding: str) -> None:
    text, argv = _readers(tmp_path)[reader]
    path = tmp_path / "m" / "net" / _SUFFIX.get(reader, "in.json")
    path.parent.mkdir(parents=True)
    path.write_bytes(text.encode(encoding))
    plain = tmp_path / "p" / "net" / _SUFFIX.get(reader, "in.json")
    plain.parent.mkdir(parents=True)
    plain.write_text(text)
    bom = run_cli([a.replace("{path}", str(path)) for a in argv])
    utf8 = run_cli([a.replace("{path}", str(plain)) for a in argv])
    assert bom.code == utf8.code == 0, bom.err
    assert _untimed(bom.out) == _untimed(utf8.out)


def _untimed(text: str) -> str:
    return re.sub(r"solved in [0-9.]+ s", "solved in - s", text)


@pytest.mark.parametrize("reader", ["profile", "transformer", "cluster", "plan", "jobs", "fill-jobs", "graph.txt", "trace"])
@pytest.mark.parametrize("data", [b"\xff\xfe\x00garbage", "caf\u00e9 {}".encode("latin-1"), "{}".encode("utf-16-le") + b"\xe9"])
def test_every_reader_refuses_undecodable_text_naming_the_file(tmp_path: Path, reader: str, data: bytes) -> None:
    _, argv = _readers(tmp_path)[reader]
    path = tmp_path / _SUFFIX.get(reader, "bad.json")
    path.write_bytes(data)
    outcome = run_cli([a.replace("{path}", str(path)) for a in argv])
    assert_contract(outcome, argv)
    assert outcome.code == 2 and str(path) in outcome.err, outcome.err


# ---- numbers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("token", ["Infinity", "-Infinity", "NaN", "1e999"])
def test_non_finite_numbers_are_refused_in_every_json(tmp_path: Path, token: str) -> None:
    profile = json.dumps(PROFILE).replace('"static_bytes": 10000000.0', f'"static_bytes": {token}', 1)
    (tmp_path / "p.json").write_text(profile)
    _refused(["plan", "--model", str(tmp_path / "p.json"), "--cluster", "cpu:2"], token, "finite")
    jobs = json.dumps(JOBS).replace('"num_steps": 1000', f'"num_steps": {token}')
    (tmp_path / "j.json").write_text(jobs)
    _refused(["schedule", "--jobs", str(tmp_path / "j.json"), "--cluster", "v100:1,k80:1", "--policy", "fifo"], token)
    cluster = json.dumps(CLUSTER).replace('"inter_node_bytes_per_s": 10000000000.0', f'"inter_node_bytes_per_s": {token}')
    (tmp_path / "c.json").write_text(cluster)
    _refused(["plan", "--model", "gpt-tiny", "--cluster", str(tmp_path / "c.json")], token)


def test_infinity_from_the_python_api_is_refused() -> None:
    from planner.schema import ModelProfile

    bad = json.loads(json.dumps(PROFILE))
    bad["layers"][0]["static_bytes"] = float("inf")
    with pytest.raises(InvalidProblemError, match="static_bytes.*finite"):
        ModelProfile.from_dict(bad)


def test_booleans_are_not_numbers(tmp_path: Path) -> None:
    cluster = json.loads(json.dumps(CLUSTER))
    cluster["device"]["memory_bytes"] = True
    _refused(["plan", "--model", "gpt-tiny", "--cluster", str(write(tmp_path / "c.json", cluster))],
             "device.memory_bytes", "boolean")
    profile = json.loads(json.dumps(PROFILE))
    profile["microbatch_size"] = True
    _refused(["plan", "--model", str(write(tmp_path / "p.json", profile)), "--cluster", "cpu:2"], "microbatch_size")


def test_graph_txt_negative_times_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "net" / "graph.txt"
    path.parent.mkdir()
    path.write_text(GRAPH_TXT.replace("forward_compute_time=1.500", "forward_compute_time=-1.5"))
    _refused(["plan", "--model", str(path), "--cluster", "v100:1x2", "--solver", "pipedream"], "line 2", "-1.5")


def test_trace_infinite_fields_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.trace"
    path.write_text(TRACE.replace("\t1\t1\t-1\t0\n", "\t1\tinf\t-1\t0\n", 1))
    _refused(["schedule", "--jobs", str(path), "--cluster", "v100:1,k80:1", "--policy", "fifo"], "line 1", "finite")


# ---- bounds: absurd counts are refused at once, naming the limit and why ------------------------


@pytest.mark.parametrize("argv, needle", [
    (["plan", "--model", "gpt-1.7b", "--cluster", "a100-80gb:99999999999"], "131,072"),
    (["plan", "--model", "gpt-1.7b", "--cluster", "a100-80gb:2", "--microbatches", "1000000000000"], "16,384"),
    (["plan", "--model", "gpt-1.7b", "--cluster", "a100-80gb:2", "--global-batch", "1000000000000000000"], "16,777,216"),
    (["schedule", "--jobs", "small_test", "--cluster", "v100:99999999999", "--policy", "fifo"], "131,072"),
    (["cluster-sim", "--cluster", "v100:2", "--policy", "fifo", "--jobs", "100000000000", "--rate", "1"], "100,000"),
])
def test_absurd_counts_are_refused_with_the_limit(argv: list[str], needle: str) -> None:
    _refused(argv, needle)


@pytest.mark.parametrize("solver", ["even", "pipedream", "pipedream-2bw", "stage-ilp"])
def test_a_trillion_microbatches_is_refused_for_every_solver(solver: str) -> None:
    _refused(["plan", "--model", "gpt-tiny", "--cluster", "cpu:2", "--solver", solver,
              "--microbatches", "1000000000000"], "--microbatches")


@pytest.mark.parametrize("command", [["simulate"], ["export", "--format", "megatron"], ["fill", "--fill-jobs", "bert-large-inference"]])
def test_a_plan_with_a_trillion_microbatches_is_refused(tmp_path: Path, command: list[str]) -> None:
    plan = dict(plan_dict(), num_microbatches=10**12, global_batch_size=10**12)
    path = write(tmp_path / "plan.json", plan)
    _refused([command[0], str(path), *command[1:]], "num_microbatches", "16,384")


@pytest.mark.parametrize("argv, needle", [
    (["cluster-sim", "--cluster", "v100:2", "--policy", "fifo", "--jobs", "5", "--rate", "1", "--round", "1e-300"], "--round"),
    (["cluster-sim", "--cluster", "v100:2", "--policy", "fifo", "--jobs", "5", "--rate", "1", "--seed", "-1"], "--seed"),
    (["cluster-sim", "--cluster", "v100:2", "--policy", "fifo", "--jobs", "5", "--rate", "1e-300"], "arrival_time_s"),
    (["plan", "--model", "gpt-tiny", "--cluster", "cpu:2", "--time-limit", "nan"], "finite"),
    (["plan", "--model", "gpt-tiny", "--cluster", "cpu:2", "--efficiency", "1.5"], "fraction"),
    (["fill", "--scale", "--horizon-h", "1e9"], "--horizon-h"),
])
def test_flags_that_would_hang_or_crash_are_refused(argv: list[str], needle: str) -> None:
    _refused(argv, needle)


def test_a_million_fill_jobs_are_refused_at_once(tmp_path: Path) -> None:
    plan = str(write(tmp_path / "plan.json", plan_dict()))
    _refused(["fill", plan, "--fill-jobs", "bert-large-inference:1000000"], "100,000")


def test_large_legitimate_scale_passes_the_input_layer() -> None:
    problem = api.make_problem("gpt-1.7b", "a100-80gb:512", num_stages=64, global_batch_size=4096)
    assert problem.cluster.num_devices == 4096


# ---- output paths are checked before any work ---------------------------------------------------


@pytest.mark.parametrize("flag", ["-o"])
def test_output_paths_are_checked_first(tmp_path: Path, flag: str) -> None:
    plan = str(write(tmp_path / "plan.json", plan_dict()))
    for argv in (["plan", "--model", "gpt-tiny", "--cluster", "cpu:2"], ["export", plan, "--format", "megatron"],
                 ["fill", plan, "--fill-jobs", "bert-large-inference"], ["profile", "--model", "gpt-tiny"]):
        _refused([*argv, flag, str(tmp_path)], "is a directory")
        _refused([*argv, flag, str(tmp_path / "missing" / "out.json")], "does not exist", "mkdir -p")
    _refused(["simulate", plan, "--timeline", str(tmp_path / "nope" / "t.png")], "--timeline")
    _refused(["cluster-sim", "--cluster", "v100:2", "--policy", "fifo", "--jobs", "2", "--rate", "1",
              "--cdf", str(tmp_path)], "--cdf")


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
        _refused(argv, "invalid plan", needle)
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
    _refused(["plan", "--model", "gpt-tiny", "--cluster", "cpu:2", "--microbatch-size", "0"], "--microbatch-size")


def test_bpipe_below_four_stages_is_refused() -> None:
    _refused(["plan", "--model", "gpt-1.7b", "--cluster", "a100-80gb:1", "--bpipe", "--pipeline", "2"],
             "bpipe", "num_stages >= 4")


def test_schedule_refuses_a_missing_throughput_table() -> None:
    _refused(["schedule", "--jobs", "small_test", "--cluster", "v100:2,k80:2", "--policy", "fifo",
              "--throughputs", "missing.json"], "missing.json", "does not exist")


def test_schedule_refuses_a_throughput_table_it_would_ignore(tmp_path: Path) -> None:
    table = tmp_path / "t.json"
    table.write_text("{}")
    _refused(["schedule", "--jobs", str(write(tmp_path / "j.json", JOBS)), "--cluster", "v100:1,k80:1",
              "--policy", "fifo", "--throughputs", str(table)], "--throughputs")


def test_optional_int_options_are_converted() -> None:
    outcome = run_cli(["plan", "--model", "gpt-1.7b", "--cluster", "a100-80gb:1", "--solver", "ptdp",
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
    _refused(["profile", "--model", "gpt-tiny"], "pip install 'paraplan[torch]'")


# ---- determinism: byte-identical plans -----------------------------------------------------------

_SOLVER_CASES = {
    "even": ("gpt-tiny", "cpu:4", {}),
    "merak": ("gpt-tiny", "cpu:4", {"num_stages": 2}),
    "adapipe": ("gpt-tiny", "cpu:4", {"num_stages": 2}),
    "stage-ilp": ("gpt-tiny", "cpu:4", {"num_stages": 2}),
    "pipedream": ("pipedream:alexnet", "v100:1x4", {}),
    "pipedream-2bw": ("gpt-tiny", "cpu:4", {"global_batch_size": 16}),
    "ptdp": ("gpt-tiny", "cpu:4", {"global_batch_size": 16}),
    "spipe": ("gpt-1.7b", "a100-80gb:1", {}),
    "mobius": ("gpt-1.7b", "a100-80gb:1", {}),
    "zero-offload": ("gpt-1.7b", "a100-80gb:1", {}),
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
    assert "cluster cpu:2: 1 node x 2 cpu = 2 devices" in outcome.err
    outcome = run_cli(["schedule", "--jobs", "small_test", "--cluster", "v100:2,k80:2", "--policy", "fifo"])
    assert "cluster v100:2,k80:2: 2 v100, 2 k80 accelerators" in outcome.err


def test_pipedream_memory_option_on_gpt3_175b_explains_infeasibility() -> None:
    argv = ["plan", "--model", "gpt3-175b", "--cluster", "a100-80gb:1", "--solver", "pipedream",
            "--option", "memory=true", "--no-offload"]
    outcome = run_cli(argv)
    assert_contract(outcome, argv)
    assert outcome.code == 3 and "GiB" in outcome.err, outcome.err


def test_duplicate_job_ids_are_refused(tmp_path: Path) -> None:
    jobs = json.loads(json.dumps(JOBS))
    jobs["jobs"][1]["id"] = "a"
    path = str(write(tmp_path / "jobs.json", jobs))
    _refused(["cluster-sim", "--trace", path, "--cluster", "v100:1,k80:1", "--policy", "fifo"], "'a' appears twice")
    fill = {"jobs": [{"id": "f", "model": "bert-base", "mode": "inference"}] * 2}
    plan = str(write(tmp_path / "plan.json", plan_dict()))
    _refused(["fill", plan, "--fill-jobs", str(write(tmp_path / "f.json", fill))], "'f' appears twice")


def test_a_plan_whose_transformer_differs_from_its_profile_is_refused(tmp_path: Path) -> None:
    plan = json.loads(api.plan(api.make_problem("gpt-tiny", "cpu:2")).model_dump_json())
    plan["transformer"]["num_layers"] = 8
    path = str(write(tmp_path / "plan.json", plan))
    for argv in (["simulate", path], ["export", path, "--format", "megatron"], ["run", path]):
        _refused(argv, "8 blocks", "plan again")


def test_nodes_x_devices_means_the_same_in_every_command() -> None:
    plan = run_cli(["plan", "--model", "gpt-tiny", "--cluster", "v100:2x4"])
    assert "= 8 devices" in plan.err
    schedule = run_cli(["schedule", "--jobs", "small_test", "--cluster", "v100:2x4,k80:1x2", "--policy", "fifo"])
    assert schedule.code == 0 and "8 v100, 2 k80" in schedule.err, schedule.err


def test_simulator_work_is_bounded() -> None:
    _refused(["plan", "--model", "gpt3-175b", "--cluster", "a100-80gb:16", "--pipeline", "96",
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
    _refused([a.replace("{plan}", plan) for a in argv], needle)
