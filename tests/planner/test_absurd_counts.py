"""Issue 14's absurd counts never hang: the CLI refuses them at input (exit 2, the contract's
bounds), and within the bounds a plan of many microbatches plans, simulates (extrapolated),
exports and fills in bounded time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cost_models import extrapolate
from planner import api, cli


@pytest.mark.parametrize("flag", [["--microbatches", "1000000000000"], ["--global-batch", "1000000000000000000"]])
def test_absurd_counts_are_refused_at_input(flag: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", "--model", "gpt-tiny", "--cluster", "cpu:2", *flag]) == 2
    assert "exceeds the limit" in capsys.readouterr().err


def test_the_largest_allowed_count_plans_simulates_exports_and_fills(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    assert cli.main(["plan", "--model", "gpt-tiny", "--cluster", "cpu:4", "--pipeline", "4", "--microbatches", "16384",
                     "-o", str(out)]) == 0
    plan = api.load_plan(out)
    assert extrapolate.needs_extrapolation(plan)  # simulated at three small counts, extrapolated
    capsys.readouterr()
    assert cli.main(["simulate", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    exact = api.simulate(plan, include_events=True)  # events: the full simulation
    assert result["iteration_time_s"] == pytest.approx(exact.iteration_time_s, rel=1e-9)
    assert cli.main(["export", str(out), "--format", "megatron"]) == 0
    # bounded time; on this tiny CPU plan no bubble may be long enough, which is infeasibility (exit 3)
    assert cli.main(["fill", str(out), "--fill-jobs", "bert-large-inference", "--json"]) in (0, 3)
