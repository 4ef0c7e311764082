"""Issue 14's absurd counts plan in bounded time or are refused (exit 2), never hang: a plan of
10^12 microbatches, a 10^18 global batch, and simulate/export/fill on such a plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner import cli

TRILLION = "1000000000000"


def _plan(tmp_path: Path, *extra: str) -> Path:
    out = tmp_path / "plan.json"
    code = cli.main(["plan", "--model", "gpt-tiny", "--cluster", "cpu:2", *extra, "-o", str(out)])
    assert code == 0
    return out


def test_a_trillion_microbatches_plan_simulate_export_and_fill(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan_file = _plan(tmp_path, "--pipeline", "2", "--microbatches", TRILLION)
    assert json.loads(plan_file.read_text())["num_microbatches"] == 10**12
    capsys.readouterr()
    assert cli.main(["simulate", str(plan_file), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["iteration_time_s"] > 0 and result["stages"][0]["peak_inflight_microbatches"] == 2
    assert cli.main(["simulate", str(plan_file), "--events"]) == 2
    assert "num_microbatches=1000000000000" in capsys.readouterr().err
    assert cli.main(["export", str(plan_file), "--format", "torch-csv"]) == 2
    assert "--format megatron" in capsys.readouterr().err
    assert cli.main(["export", str(plan_file), "--format", "megatron"]) == 0
    # bounded time; on this tiny CPU plan no bubble is long enough, which is infeasibility (exit 3)
    assert cli.main(["fill", str(plan_file), "--fill-jobs", "bert-large-inference", "--json"]) in (0, 3)


@pytest.mark.parametrize("solver", ["stage-ilp", "merak", "adapipe"])
def test_stage_model_solvers_refuse_a_trillion_microbatches(solver: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["plan", "--model", "gpt-tiny", "--cluster", "cpu:2", "--solver", solver, "--pipeline", "2",
                     "--microbatches", TRILLION])
    assert code == 2
    assert "num_microbatches=1000000000000" in capsys.readouterr().err


@pytest.mark.parametrize("solver", ["even", "ptdp", "pipedream-2bw"])
def test_a_huge_global_batch_plans(solver: str, tmp_path: Path) -> None:
    plan_file = _plan(tmp_path, "--solver", solver, "--global-batch", "1000000000000000000")
    plan = json.loads(plan_file.read_text())
    assert plan["global_batch_size"] == 10**18 and plan["predicted"]["iteration_time_s"] > 0
