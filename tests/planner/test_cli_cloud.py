"""``paraplan cloud``: outputs and the exit codes of bad input (2) and infeasible problems (3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli import main
from solvers.cloud.catalogue import load_catalogue

JOBS = {"format": "paraplan.cloud-jobs/v1", "jobs": [
    {"id": "transformer", "throughputs": {"k80": 1.0, "p100": 3.3, "v100": 3.3}, "num_steps": 3.3 * 3600 * 20,
     "slo_h": 30, "checkpoint_gb": 0.4, "restart_s": 300},
    {"id": "resnet50", "throughputs": {"k80": 1.0, "p100": 3.7, "v100": 9.6}, "num_steps": 9.6 * 3600 * 24,
     "dataset_gb": 150, "dataset_cloud": "aws"},
]}


@pytest.fixture()
def jobs_file(tmp_path: Path) -> Path:
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps(JOBS))
    return path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_json_and_skypilot_export(capsys, jobs_file: Path, tmp_path: Path) -> None:
    plan_path = tmp_path / "plan.json"
    code, out, _ = run(capsys, "cloud", "plan", "--jobs", str(jobs_file), "-o", str(plan_path), "--json")
    assert code == 0
    plan = json.loads(out)  # one JSON document on stdout
    assert plan["format"] == "paraplan.cloud-plan/v1" and set(plan["jobs"]) == {"transformer", "resnet50"}
    assert plan["jobs"]["transformer"]["duration_h"] <= 30 + 1e-6
    code, out, _ = run(capsys, "cloud", "export", str(plan_path), "--format", "skypilot", "--job", "resnet50")
    assert code == 0 and "name: resnet50" in out and "resources:" in out
    code, _, _ = run(capsys, "cloud", "export", str(plan_path), "--format", "skypilot", "-o", str(tmp_path / "tasks"))
    assert code == 0 and sorted(p.name for p in (tmp_path / "tasks").iterdir()) == ["resnet50.yaml", "transformer.yaml"]


def test_catalogue_and_replay(capsys, jobs_file: Path, tmp_path: Path) -> None:
    code, out, _ = run(capsys, "cloud", "catalogue")
    assert code == 0 and "aws/us-east-1/p3.2xlarge" in out
    trace = tmp_path / "trace.csv"
    assert run(capsys, "cloud", "trace", "--generate", "--days", "20", "-o", str(trace))[0] == 0
    code, out, _ = run(capsys, "cloud", "trace", str(trace), "--json")
    assert code == 0 and json.loads(out)["aws/us-east-1/p3.16xlarge"]["changes_per_day"] == 0
    code, out, _ = run(capsys, "cloud", "replay", "--jobs", str(jobs_file), "--trace", str(trace), "--json")
    results = json.loads(out)
    assert code == 0 and [r["strategy"] for r in results] == ["baseline", "gpu-type", "multi-gpu", "multi-cloud", "dynamic"]
    assert results[-1]["num_switches"] <= 3
    # the chapter's rule: decisions at day boundaries only, so every move starts at a whole day
    long_job = tmp_path / "long.json"  # 8 V100-days of a Table 6.1 Transformer
    long_job.write_text(json.dumps({"jobs": [{"id": "t", "throughputs": {"k80": 1.0, "p100": 3.3, "v100": 3.3},
                                              "num_steps": 8 * 24 * 3600 * 3.3}]}))
    code, out, _ = run(capsys, "cloud", "replay", "--jobs", str(long_job), "--trace", str(trace), "--strategy",
                       "dynamic", "--rule", "chapter", "--json")
    (chapter,) = json.loads(out)
    steps = chapter["steps"]
    moves = [b["start_h"] for a, b in zip(steps, steps[1:]) if a["option"] != b["option"]]
    assert code == 0 and chapter["num_switches"] == len(moves) >= 1 and all(t % 24 == 0 for t in moves)


def test_unknown_instance_type_exit_2_lists_valid_ones(capsys, jobs_file: Path) -> None:
    code, _, err = run(capsys, "cloud", "plan", "--jobs", str(jobs_file), "--instances", "p9.xlarge")
    assert code == 2 and "unknown instance type 'p9.xlarge'; valid ones: [" in err and "aws/us-east-1/p3.2xlarge" in err


@pytest.mark.parametrize(("edit", "match"), [
    ({"unit": "usd_per_month"}, "unit='usd_per_month': prices must be in US dollars per hour"),
    ({"instances": [{"name": "x", "cloud": "aws", "region": "r", "accelerator": "v100", "num_accelerators": 1,
                     "on_demand_usd_per_h": -3.06}]}, "on_demand_usd_per_h = -3.06: Input should be greater than 0"),
])
def test_bad_catalogue_exit_2(capsys, jobs_file: Path, tmp_path: Path, edit: dict, match: str) -> None:
    data = load_catalogue("ch6-2020").model_dump()
    data.update(edit)
    path = tmp_path / "cat.json"
    path.write_text(json.dumps(data))
    code, _, err = run(capsys, "cloud", "plan", "--jobs", str(jobs_file), "--catalogue", str(path))
    assert code == 2 and match in err


@pytest.mark.parametrize(("header", "rows", "match"), [
    ("usd_per_hour", ["2020-02-02T00:00:00Z,1.0", "2020-02-01T00:00:00Z,0.9"], "line 3: timestamp 2020-02-01T00:00:00Z"),
    ("usd_per_hour", ["2020-02-01T00:00:00Z,-0.9"], "usd_per_hour=-0.9 is negative"),
    ("usd_per_second", ["2020-02-01T00:00:00Z,0.0003"], "multiply each price by 3600"),
])
def test_bad_trace_exit_2(capsys, jobs_file: Path, tmp_path: Path, header: str, rows: list[str], match: str) -> None:
    trace = tmp_path / "t.csv"
    body = "".join(f"{when},aws,us-east-1,us-east-1a,p3.2xlarge,{price}\n" for when, price in (r.split(",") for r in rows))
    trace.write_text(f"timestamp,cloud,region,zone,instance,{header}\n" + body)
    for argv in (("plan", "--jobs", str(jobs_file), "--trace", str(trace)), ("trace", str(trace))):
        code, _, err = run(capsys, "cloud", *argv)
        assert code == 2 and match in err


@pytest.mark.parametrize("objective", ["min-makespan", "min-cost"])
def test_budget_no_allocation_meets_exit_3_with_the_cheapest(capsys, jobs_file: Path, objective: str) -> None:
    code, _, err = run(capsys, "cloud", "plan", "--jobs", str(jobs_file), "--objective", objective, "--budget", "5")
    assert code == 3 and "raise the budget to at least $" in err
    cheapest = float(err.rsplit("$", 1)[1].strip().replace(",", ""))
    assert run(capsys, "cloud", "plan", "--jobs", str(jobs_file), "--objective", objective,
               "--budget", str(cheapest))[0] == 0
    assert run(capsys, "cloud", "plan", "--jobs", str(jobs_file), "--objective", objective, "--budget", "-5")[0] == 2


def test_deadline_no_allocation_meets_exit_3_with_the_earliest(capsys, tmp_path: Path) -> None:
    data = json.loads(json.dumps(JOBS))
    data["jobs"][0]["slo_h"] = 5
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps(data))
    code, _, err = run(capsys, "cloud", "plan", "--jobs", str(path))
    assert code == 3 and "job transformer: slo_h=5 but it needs at least 20.00 h" in err


def test_min_makespan_needs_a_budget_exit_2(capsys, jobs_file: Path) -> None:
    code, _, err = run(capsys, "cloud", "plan", "--jobs", str(jobs_file), "--objective", "min-makespan")
    assert code == 2 and "budget_usd" in err
