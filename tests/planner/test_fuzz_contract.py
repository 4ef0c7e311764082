"""Property-based fuzzing of every reader and command against the exit-code contract.

Each case mutates a valid input (one JSON value replaced, deleted or added; the file re-encoded;
text lines garbled; flags drawn from nasty values) and runs the command in this process through
``planner.cli.main``. Every outcome must be exit 0, 2 or 3 without a traceback; inputs that are
invalid by construction (a non-finite number, a boolean where a number was, text in an encoding
we cannot detect) must give exit 2 naming the file. The profile is fixed and derandomized so the
suite is reproducible; it takes about 6 s on an idle 2-core machine (100 or 30 examples a test).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.planner.contract_helpers import (
    CLUSTER, FILL_JOBS, GRAPH_TXT, JOBS, PROFILE, TRACE, TRANSFORMER, assert_contract, plan_dict, run_cli,
)

# PARAPLAN_FUZZ_EXAMPLES=500 explores more (and at random) on a machine with time to spare.
_EXAMPLES = int(os.environ.get("PARAPLAN_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=_EXAMPLES or 100, derandomize=not _EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FEW = settings(FUZZ, max_examples=_EXAMPLES or 30)

NASTY = st.sampled_from([
    None, True, False, 0, -1, 1, 2, 3, 0.5, -0.0, 1e-300, 1e308, 10**6, 2**63, 10**30, "", "x", "1", [], {},
    [1, 2], {"a": 1}, float("nan"), float("inf"), float("-inf"),
])
NON_FINITE = (float("nan"), float("inf"), float("-inf"))


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside a decoded JSON document."""
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            out += _paths(value, (*prefix, i))
    return out


def _get(doc: Any, path: tuple) -> Any:
    for key in path:
        doc = doc[key]
    return doc


@st.composite
def mutated(draw: st.DrawFn, seed: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """(a mutated copy of ``seed``, what the mutation was: 'nonfinite', 'bool-for-number' or 'other')."""
    doc = json.loads(json.dumps(seed))
    path = draw(st.sampled_from(_paths(doc)))
    parent, key = _get(doc, path[:-1]), path[-1]
    action = draw(st.sampled_from(["replace", "replace", "replace", "delete", "add"]))
    if action == "delete":
        parent.pop(key) if isinstance(parent, dict) else parent.pop(key)
        return doc, "other"
    if action == "add" and isinstance(parent, dict):
        parent["unexpected_key"] = 1
        free_form = path[-2:-1] in (("options",), ("throughputs",), ("recompute",), ("worker_types",))
        return doc, "other" if free_form else "unknown-key"
    old, new = parent[key], draw(NASTY)
    parent[key] = new
    if isinstance(new, float) and new in NON_FINITE or new != new:
        return doc, "nonfinite"
    if isinstance(new, (bool, str)) and isinstance(old, (int, float)) and not isinstance(old, bool):
        return doc, "bool-for-number"  # (or a string: "1" is not a number either)
    return doc, "other"


ENCODINGS = st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-32", "utf-16-le", "latin-1"])


def _write(folder: Path, name: str, text: str, encoding: str) -> tuple[Path, bool]:
    """Write ``text`` in ``encoding`` (a non-ASCII name makes latin-1 and BOM-less UTF-16 undecodable);
    returns the path and whether paraplan can decode it."""
    path = folder / name
    if encoding in ("latin-1", "utf-16-le"):
        text = text.replace('"toy"', '"toy\u00e9"').replace('"tiny"', '"tiny\u00e9"').replace('"two"', '"two\u00e9"')
        text = text.replace('"a"', '"a\u00e9"') if "\u00e9" not in text else text
        path.write_bytes(text.encode(encoding))
        return path, "\u00e9" not in text
    path.write_bytes(text.encode(encoding))
    return path, True


def _check_json_reader(seed: dict[str, Any], argv_of, doc_kind: tuple[dict, str], encoding: str) -> None:
    doc, kind = doc_kind
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path, decodable = _write(folder, "input.json", json.dumps(doc), encoding)
        argv = argv_of(folder, path)
        outcome = run_cli(argv)
        assert_contract(outcome, argv)
        if not decodable:
            assert outcome.code == 2 and "input.json" in outcome.err, outcome.err
        elif kind in ("nonfinite", "bool-for-number", "unknown-key"):
            assert outcome.code == 2, (kind, argv, outcome.err)


def _plan_with(folder: Path, model: str, cluster: str) -> list[str]:
    return ["plan", "--model", model, "--cluster", cluster, "--pipeline", "2"]


@pytest.mark.timeout(300)
@FUZZ
@given(mutated(PROFILE), ENCODINGS)
def test_profile_reader(doc_kind: tuple[dict, str], encoding: str) -> None:
    _check_json_reader(PROFILE, lambda d, p: ["plan", "--model", str(p), "--cluster", "cpu:2"], doc_kind, encoding)


@pytest.mark.timeout(300)
@FUZZ
@given(mutated(TRANSFORMER), ENCODINGS)
def test_transformer_reader(doc_kind: tuple[dict, str], encoding: str) -> None:
    _check_json_reader(TRANSFORMER, lambda d, p: ["plan", "--model", str(p), "--cluster", "cpu:2"], doc_kind, encoding)


@pytest.mark.timeout(300)
@FUZZ
@given(mutated(CLUSTER), ENCODINGS)
def test_cluster_reader(doc_kind: tuple[dict, str], encoding: str) -> None:
    _check_json_reader(CLUSTER, lambda d, p: ["plan", "--model", "gpt-tiny", "--cluster", str(p)], doc_kind, encoding)


@pytest.mark.timeout(300)
@FUZZ
@given(mutated(plan_dict()), ENCODINGS, st.sampled_from(["simulate", "export", "fill"]))
def test_plan_reader(doc_kind: tuple[dict, str], encoding: str, command: str) -> None:
    def argv(folder: Path, path: Path) -> list[str]:
        extra = {"simulate": [], "export": ["--format", "torch-csv"], "fill": ["--fill-jobs", "bert-large-inference"]}
        return [command, str(path), *extra[command]]

    _check_json_reader(plan_dict(), argv, doc_kind, encoding)


@pytest.mark.timeout(300)
@FEW
@given(mutated(JOBS), ENCODINGS)
def test_jobs_reader(doc_kind: tuple[dict, str], encoding: str) -> None:
    _check_json_reader(JOBS, lambda d, p: ["schedule", "--jobs", str(p), "--cluster", "v100:1,k80:1",
                                           "--policy", "max_min_fairness_perf"], doc_kind, encoding)


@pytest.mark.timeout(300)
@FEW
@given(mutated(FILL_JOBS), ENCODINGS)
def test_fill_jobs_reader(doc_kind: tuple[dict, str], encoding: str) -> None:
    def argv(folder: Path, path: Path) -> list[str]:
        plan = folder / "plan.json"
        plan.write_text(json.dumps(plan_dict()))
        return ["fill", str(plan), "--fill-jobs", str(path)]

    _check_json_reader(FILL_JOBS, argv, doc_kind, encoding)


NUMBER_TEXT = st.sampled_from(["0", "-1", "1.5", "nan", "inf", "-inf", "1e999", "99999999999999999999", "x", ""])


@st.composite
def garbled_lines(draw: st.DrawFn, text: str, sep: str) -> str:
    """``text`` with some fields of some lines replaced by nasty numbers or removed."""
    lines = text.splitlines()
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        fields = lines[i].split(sep)
        j = draw(st.integers(0, len(fields) - 1))
        if draw(st.booleans()):
            fields[j] = draw(NUMBER_TEXT) if sep == "\t" else f"{fields[j].split('=')[0]}={draw(NUMBER_TEXT)}"
        else:
            fields.pop(j)
        lines[i] = sep.join(fields)
    return "\n".join(lines) + "\n"


@pytest.mark.timeout(300)
@FUZZ
@given(garbled_lines(GRAPH_TXT, ", "), st.sampled_from(["utf-8", "utf-16", "latin-1"]))
def test_graph_txt_reader(text: str, encoding: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "net" / "graph.txt"
        path.parent.mkdir()
        path.write_bytes(text.encode(encoding))
        argv = ["plan", "--model", str(path), "--cluster", "v100:1x2", "--solver", "pipedream"]
        outcome = run_cli(argv)
        assert_contract(outcome, argv)
        if re.search(r"(compute_time|_size)=(nan|inf|-inf|-1|1e999)\b", text):
            assert outcome.code == 2, outcome.err


@pytest.mark.timeout(300)
@FEW
@given(garbled_lines(TRACE, "\t"))
def test_gavel_trace_reader(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "jobs.trace"
        path.write_text(text)
        argv = ["schedule", "--jobs", str(path), "--cluster", "v100:1,k80:1", "--policy", "max_min_fairness_perf"]
        assert_contract(run_cli(argv), argv)


COUNTS = st.sampled_from(["0", "-3", "1", "2", "3", "4", "7", "64", "1000000000000", "x", "1.5", "nan"])


@pytest.mark.timeout(300)
@FUZZ
@given(st.dictionaries(st.sampled_from(["--pipeline", "--chunks", "--microbatches", "--global-batch",
                                        "--microbatch-size", "--tensor-parallel", "--data-parallel",
                                        "--efficiency", "--time-limit"]), COUNTS, max_size=4),
       st.sampled_from(["even", "pipedream", "merak", "adapipe", "ptdp", "no-such-solver"]),
       st.sampled_from([None, "1f1b", "gpipe", "interleaved-1f1b", "zb-h1", "custom", "bogus"]),
       st.booleans(), st.sampled_from(["gpt-tiny", "pipedream:alexnet"]))
def test_plan_flags(flags: dict[str, str], solver: str, schedule: str | None, bpipe: bool, model: str) -> None:
    argv = ["plan", "--model", model, "--cluster", "cpu:4", "--solver", solver, "--json"]
    for flag, value in flags.items():
        argv += [flag, value]
    argv += ["--schedule", schedule] if schedule else []
    argv += ["--bpipe"] if bpipe else []
    outcome = run_cli(argv)
    assert_contract(outcome, argv)
    if outcome.code == 0:
        json.loads(outcome.out)  # --json: one JSON document on stdout, nothing else


@pytest.mark.timeout(300)
@FUZZ
@given(st.from_regex(r"[a-z0-9]{0,9}(:[0-9x,:-]{0,14})?", fullmatch=True),
       st.sampled_from(["plan", "schedule", "cluster-sim"]))
def test_cluster_shorthand(spec: str, command: str) -> None:
    argv = {
        "plan": ["plan", "--model", "gpt-tiny", "--cluster", spec],
        "schedule": ["schedule", "--jobs", "small_test", "--cluster", spec, "--policy", "fifo"],
        "cluster-sim": ["cluster-sim", "--cluster", spec, "--policy", "fifo", "--jobs", "2", "--rate", "1"],
    }[command]
    assert_contract(run_cli(argv), argv)


NUMBERS = st.sampled_from(["0", "-1", "1e-300", "0.5", "1", "3", "360", "1e300", "nan", "inf", "x"])


@pytest.mark.timeout(300)
@FEW
@given(st.dictionaries(st.sampled_from(["--rate", "--round", "--seed", "--partitions", "--measure"]), NUMBERS, max_size=3),
       st.sampled_from(["1", "3", "0", "-2"]), st.sampled_from(["fifo", "max_min_fairness_perf", "bogus"]))
def test_cluster_sim_flags(flags: dict[str, str], num_jobs: str, policy: str) -> None:
    argv = ["cluster-sim", "--cluster", "v100:2,k80:2", "--policy", policy, "--jobs", num_jobs, "--json"]
    if "--rate" not in flags:
        argv += ["--rate", "2"]
    for flag, value in flags.items():
        argv += [f"{flag}={value}"]
    outcome = run_cli(argv)
    assert_contract(outcome, argv)
    if outcome.code == 0:
        json.loads(outcome.out)


@pytest.mark.timeout(300)
@FEW
@given(st.dictionaries(st.sampled_from(["--fill-fraction", "--free-memory-gb", "--fill-efficiency", "--seed"]),
                       NUMBERS, max_size=3),
       st.sampled_from(["bert-large-inference", "bert-base-training:2", "paper-mix", "nope", "bert-base-training:0"]),
       st.sampled_from(["sjf", "fifo", "bogus"]))
def test_fill_flags(flags: dict[str, str], jobs: str, policy: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "plan.json"
        plan.write_text(json.dumps(plan_dict()))
        argv = ["fill", str(plan), "--fill-jobs", jobs, "--policy", policy, "--json"]
        for flag, value in flags.items():
            argv += [f"{flag}={value}"]
        outcome = run_cli(argv)
        assert_contract(outcome, argv)
        if outcome.code == 0:
            json.loads(outcome.out)


CLOUD_JOBS: dict[str, Any] = {"format": "paraplan.cloud-jobs/v1", "jobs": [
    {"id": "transformer", "throughputs": {"k80": 1.0, "p100": 3.3, "v100": 3.3}, "num_steps": 237600,
     "slo_h": 30, "checkpoint_gb": 0.4, "checkpoint_s": 60, "restart_s": 300},
    {"id": "small", "throughputs": {"k80": 2.0, "v100": 5.0}, "num_steps": 1000}]}


@pytest.mark.timeout(300)
@FEW
@given(mutated(CLOUD_JOBS), ENCODINGS, st.sampled_from(["min-cost", "max-throughput", "min-makespan"]))
def test_cloud_jobs_reader(doc_kind: tuple[dict, str], encoding: str, objective: str) -> None:
    budget = {"min-makespan": ["--budget", "1000"], "max-throughput": ["--budget-per-hour", "50"]}.get(objective, [])
    _check_json_reader(CLOUD_JOBS, lambda d, p: ["cloud", "plan", "--jobs", str(p), "--objective", objective, *budget],
                       doc_kind, encoding)
