"""Contract regression tests, part 1: every reader's encodings and numbers, bounds on counts and
output paths. Bad input exits 2 naming the field, the value and the fix (never 1, never a hang,
never a silent accept). Part 2 (test_contract_plans.py): the plan validator, flags, determinism."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from planner import api
from planner.errors import InvalidProblemError
from tests.planner.contract_helpers import (
    CLUSTER, GRAPH_TXT, JOBS, PROFILE, TRACE, TRANSFORMER, assert_contract, plan_dict, refused, run_cli, write,
)


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
    refused(["plan", "--model", str(tmp_path / "p.json"), "--cluster", "cpu:2"], token, "finite")
    jobs = json.dumps(JOBS).replace('"num_steps": 1000', f'"num_steps": {token}')
    (tmp_path / "j.json").write_text(jobs)
    refused(["schedule", "--jobs", str(tmp_path / "j.json"), "--cluster", "v100:1,k80:1", "--policy", "fifo"], token)
    cluster = json.dumps(CLUSTER).replace('"inter_node_bytes_per_s": 10000000000.0', f'"inter_node_bytes_per_s": {token}')
    (tmp_path / "c.json").write_text(cluster)
    refused(["plan", "--model", "gpt-tiny", "--cluster", str(tmp_path / "c.json")], token)


def test_infinity_from_the_python_api_is_refused() -> None:
    from planner.schema import ModelProfile

    bad = json.loads(json.dumps(PROFILE))
    bad["layers"][0]["static_bytes"] = float("inf")
    with pytest.raises(InvalidProblemError, match="static_bytes.*finite"):
        ModelProfile.from_dict(bad)


def test_booleans_are_not_numbers(tmp_path: Path) -> None:
    cluster = json.loads(json.dumps(CLUSTER))
    cluster["device"]["memory_bytes"] = True
    refused(["plan", "--model", "gpt-tiny", "--cluster", str(write(tmp_path / "c.json", cluster))],
             "device.memory_bytes", "boolean")
    profile = json.loads(json.dumps(PROFILE))
    profile["microbatch_size"] = True
    refused(["plan", "--model", str(write(tmp_path / "p.json", profile)), "--cluster", "cpu:2"], "microbatch_size")
    cluster["device"]["memory_bytes"] = "80e9"
    refused(["plan", "--model", "gpt-tiny", "--cluster", str(write(tmp_path / "c.json", cluster))],
            "device.memory_bytes", "string is not a number")


def test_numbers_are_not_booleans(tmp_path: Path) -> None:
    # the converse of the above, found by the adversarial campaign: "degrees_included": 0 was read as false
    plan = json.loads(json.dumps(plan_dict()))
    plan["model"]["degrees_included"] = 0
    refused(["simulate", str(write(tmp_path / "plan.json", plan))], "model.degrees_included", "not a boolean")


def test_graph_txt_negative_times_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "net" / "graph.txt"
    path.parent.mkdir()
    path.write_text(GRAPH_TXT.replace("forward_compute_time=1.500", "forward_compute_time=-1.5"))
    refused(["plan", "--model", str(path), "--cluster", "v100:1x2", "--solver", "pipedream"], "line 2", "-1.5")


def test_trace_infinite_fields_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.trace"
    path.write_text(TRACE.replace("\t1\t1\t-1\t0\n", "\t1\tinf\t-1\t0\n", 1))
    refused(["schedule", "--jobs", str(path), "--cluster", "v100:1,k80:1", "--policy", "fifo"], "line 1", "finite")


# ---- bounds: absurd counts are refused at once, naming the limit and why ------------------------


@pytest.mark.parametrize("argv, needle", [
    (["plan", "--model", "gpt-1.7b", "--cluster", "a100-80gb:99999999999"], "131,072"),
    (["plan", "--model", "gpt-1.7b", "--cluster", "a100-80gb:16", "--microbatches", "1000000000000"], "16,384"),
    (["plan", "--model", "gpt-1.7b", "--cluster", "a100-80gb:16", "--global-batch", "1000000000000000000"], "16,777,216"),
    (["schedule", "--jobs", "small_test", "--cluster", "v100:99999999999", "--policy", "fifo"], "131,072"),
    (["cluster-sim", "--cluster", "v100:2", "--policy", "fifo", "--jobs", "100000000000", "--rate", "1"], "100,000"),
])
def test_absurd_counts_are_refused_with_the_limit(argv: list[str], needle: str) -> None:
    refused(argv, needle)


@pytest.mark.parametrize("solver", ["even", "pipedream", "pipedream-2bw", "stage-ilp"])
def test_a_trillion_microbatches_is_refused_for_every_solver(solver: str) -> None:
    refused(["plan", "--model", "gpt-tiny", "--cluster", "cpu:2", "--solver", solver,
              "--microbatches", "1000000000000"], "--microbatches")


@pytest.mark.parametrize("command", [["simulate"], ["export", "--format", "megatron"], ["fill", "--fill-jobs", "bert-large-inference"]])
def test_a_plan_with_a_trillion_microbatches_is_refused(tmp_path: Path, command: list[str]) -> None:
    plan = dict(plan_dict(), num_microbatches=10**12, global_batch_size=10**12)
    path = write(tmp_path / "plan.json", plan)
    refused([command[0], str(path), *command[1:]], "num_microbatches", "16,384")


@pytest.mark.parametrize("argv, needle", [
    (["cluster-sim", "--cluster", "v100:2", "--policy", "fifo", "--jobs", "5", "--rate", "1", "--round", "1e-300"], "--round"),
    (["cluster-sim", "--cluster", "v100:2", "--policy", "fifo", "--jobs", "5", "--rate", "1", "--seed", "-1"], "--seed"),
    (["cluster-sim", "--cluster", "v100:2", "--policy", "fifo", "--jobs", "5", "--rate", "1e-300"], "arrival_time_s"),
    (["plan", "--model", "gpt-tiny", "--cluster", "cpu:2", "--time-limit", "nan"], "finite"),
    (["plan", "--model", "gpt-tiny", "--cluster", "cpu:2", "--efficiency", "1.5"], "fraction"),
    (["fill", "--scale", "--horizon-h", "1e9"], "--horizon-h"),
])
def test_flags_that_would_hang_or_crash_are_refused(argv: list[str], needle: str) -> None:
    refused(argv, needle)


def test_a_million_fill_jobs_are_refused_at_once(tmp_path: Path) -> None:
    plan = str(write(tmp_path / "plan.json", plan_dict()))
    refused(["fill", plan, "--fill-jobs", "bert-large-inference:1000000"], "100,000")


def test_fixed_bubble_memory_beyond_the_gpu_is_refused(tmp_path: Path) -> None:
    plan = str(write(tmp_path / "plan.json", plan_dict()))
    refused(["fill", plan, "--fill-jobs", "bert-large-inference", "--free-memory-gb", "1e6"], "--free-memory-gb", "at most")


def test_large_legitimate_scale_passes_the_input_layer() -> None:
    problem = api.make_problem("gpt-1.7b", "a100-80gb:4096", num_stages=64, global_batch_size=4096)
    assert problem.cluster.num_devices == 4096


# ---- output paths are checked before any work ---------------------------------------------------


@pytest.mark.parametrize("flag", ["-o"])
def test_output_paths_are_checked_first(tmp_path: Path, flag: str) -> None:
    plan = str(write(tmp_path / "plan.json", plan_dict()))
    for argv in (["plan", "--model", "gpt-tiny", "--cluster", "cpu:2"], ["export", plan, "--format", "megatron"],
                 ["fill", plan, "--fill-jobs", "bert-large-inference"], ["profile", "--model", "gpt-tiny"]):
        refused([*argv, flag, str(tmp_path)], "is a directory")
        refused([*argv, flag, ""], "is empty")
        refused([*argv, flag, str(tmp_path / "missing" / "out.json")], "does not exist", "mkdir -p")
    refused(["simulate", plan, "--timeline", str(tmp_path / "nope" / "t.png")], "--timeline")
    refused(["simulate", plan, "--trace", str(tmp_path)], "--trace", "is a directory")
    refused(["export", plan, "--format", "torch-csv", "--schedule-csv", "s.csv"], "--schedule-csv", "torchtitan")
    refused(["export", plan, "--format", "torchtitan", "--schedule-csv", ""], "--schedule-csv", "is empty")
    refused(["plan", "--model", "gpt-tiny", "--cluster", "cpu:2", "--solver", " "], "--solver", "is empty")
    refused(["plan", "--model", "gpt-tiny", "--cluster", "cpu:2", "--schedule", ""], "--schedule", "is empty")
    refused(["simulate", plan, "--window", "nan:inf", "--timeline", str(tmp_path / "t.png")], "--window", "finite")
    refused(["cluster-sim", "--cluster", "v100:2", "--policy", "fifo", "--jobs", "2", "--rate", "1",
              "--cdf", str(tmp_path)], "--cdf")


@pytest.mark.parametrize("argv, needle", [
    (["cloud", "trace", "--generate", "--days", "1e9"], "--days"),
    (["cloud", "trace", "--generate", "--days", "nan"], "finite"),
    (["cloud", "trace", "--generate", "--seed", "-1"], "--seed"),
    (["cloud", "trace", "--generate", "-o", "{tmp}"], "is a directory"),
    (["cloud", "catalogue", "--catalogue", "{tmp}/latin1.json"], "latin1.json"),
    (["cloud", "plan", "--jobs", "{tmp}/jobs.json", "--markets", ""], "--markets"),
    (["cloud", "plan", "--jobs", "{tmp}/jobs.json", "--clouds", " , "], "--clouds"),
    (["cloud", "plan", "--jobs", "{tmp}/jobs.json", "--instances", ""], "--instances"),
    (["cloud", "replay", "--jobs", "{tmp}/jobs.json", "--job", "small", "--start-h", "1e14"], "--start-h"),
])
def test_cloud_commands_keep_the_contract(tmp_path: Path, argv: list[str], needle: str) -> None:
    (tmp_path / "latin1.json").write_bytes('{"name": "caf\u00e9"}'.encode("latin-1"))
    (tmp_path / "jobs.json").write_text(json.dumps({"format": "paraplan.cloud-jobs/v1", "jobs": [
        {"id": "small", "throughputs": {"k80": 2.0, "v100": 5.0}, "num_steps": 1000}]}))
    refused([a.replace("{tmp}", str(tmp_path)) for a in argv], needle)


@pytest.mark.parametrize("field, value, needle", [
    ("throughputs", {"k80": 1e308}, "1e+09"), ("num_steps", 1e-300, "greater than or equal to 1"),
])
def test_cloud_jobs_with_absurd_numbers_are_refused(tmp_path: Path, field: str, value: object, needle: str) -> None:
    jobs = {"format": "paraplan.cloud-jobs/v1", "jobs": [{"id": "a", "throughputs": {"k80": 1.0}, "num_steps": 100}]}
    jobs["jobs"][0][field] = value
    refused(["cloud", "plan", "--jobs", str(write(tmp_path / "jobs.json", jobs))], needle)


@pytest.mark.parametrize("edit, needle", [
    (lambda plan: plan["options"].clear(), "not in 'options'"),  # was exit 1 (KeyError)
    (lambda plan: plan["jobs"]["a"]["fractions"].update({k: 0.0 for k in plan["jobs"]["a"]["fractions"]}),
     "no instance"),  # was exit 1 (IndexError)
    (lambda plan: plan["jobs"]["a"]["fractions"].update({k: 2.0 for k in plan["jobs"]["a"]["fractions"]}),
     "at most 1"),
])
def test_cloud_export_of_an_inconsistent_plan_is_refused(tmp_path: Path, edit, needle: str) -> None:
    jobs = {"format": "paraplan.cloud-jobs/v1", "jobs": [{"id": "a", "throughputs": {"k80": 1.0}, "num_steps": 100}]}
    plan_path = tmp_path / "plan.json"
    assert run_cli(["cloud", "plan", "--jobs", str(write(tmp_path / "jobs.json", jobs)), "-o", str(plan_path)]).code == 0
    plan = json.loads(plan_path.read_text())
    edit(plan)
    refused(["cloud", "export", str(write(plan_path, plan)), "--format", "skypilot"], needle)
