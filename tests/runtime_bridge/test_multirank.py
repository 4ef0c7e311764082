"""Plans executed on CPU with gloo under torchrun, each checked against single-process training.

One launch runs many plans (one process group), so the whole file costs about four spawns:
2 ranks (every schedule, uneven splits, recompute, custom actions), 4 ranks (4 stages; a 2 x 2
data x pipeline mesh with DDP), a dead rank, and the CLI.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from planner.cli import main  # noqa: E402
from runtime_bridge.check import TOLERANCE  # noqa: E402
from runtime_bridge.launch import Job, LaunchOptions, RunFailedError, launch, summarize  # noqa: E402
from runtime_bridge.validate import resolve_config  # noqa: E402
from tests.runtime_bridge.plans import tiny_plan, torchtitan_custom_plan  # noqa: E402

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(240)]

_TWO_RANK_PLANS = {
    "gpipe uneven": tiny_plan("gpipe", splits=[[(0, 2)], [(2, 6)]]),
    "1f1b uneven + full/selective recompute": tiny_plan(
        "1f1b", splits=[[(0, 4)], [(4, 6)]], recompute={0: {"full": [1], "selective": [2, 3]}}),
    "interleaved-1f1b uneven chunks + selective": tiny_plan(
        "interleaved-1f1b", v=2, splits=[[(0, 1), (3, 5)], [(1, 3), (5, 6)]], recompute={1: {"selective": 1}}),
    "zb-h1 + full recompute": tiny_plan("zb-h1", recompute={0: {"full": [1, 2]}}),
    "zb-h2": tiny_plan("zb-h2", m=4),
    "custom actions (torchtitan CSV)": torchtitan_custom_plan(),
    "1f1b through the plan's action list": tiny_plan("1f1b", splits=[[(0, 3)], [(3, 6)]]),
}
_EXECUTOR = {"1f1b through the plan's action list": "actions"}


def _jobs(plans: dict, steps: int = 2) -> list[Job]:
    return [Job(plan=plan, config=resolve_config(plan), steps=steps, check=True, executor=_EXECUTOR.get(name, "auto"))
            for name, plan in plans.items()]


@pytest.fixture(scope="module")
def two_rank_reports() -> dict[str, dict]:
    jobs = _jobs(_TWO_RANK_PLANS)
    results = launch(jobs, LaunchOptions(timeout_s=30))
    assert results is not None
    return {name: summarize(job, recs) for name, job, recs in zip(_TWO_RANK_PLANS, jobs, results)}


@pytest.mark.parametrize("name", list(_TWO_RANK_PLANS))
def test_two_ranks_match_single_process(two_rank_reports: dict[str, dict], name: str) -> None:
    report = two_rank_reports[name]
    assert report["max_loss_diff"] <= TOLERANCE
    assert report["max_grad_diff"] <= TOLERANCE
    assert report["check_passed"]
    assert len(report["loss"]) == 2 and all(4.0 < x < 6.0 for x in report["loss"])  # ~ln(128) = 4.85


def test_two_ranks_measurements(two_rank_reports: dict[str, dict]) -> None:
    report = two_rank_reports["gpipe uneven"]
    assert report["step_time_s"] > 0 and len(report["step_times_s"]) == 2
    assert report["tokens_per_s"] == pytest.approx(4 * 16 / report["step_time_s"])
    assert len(report["peak_memory_bytes"]) == 2 and min(report["peak_memory_bytes"]) > 0
    assert report["rank_stage"] == [0, 1]


def test_four_ranks_pipeline_and_data_parallel_mesh() -> None:
    plans = {
        "1f1b p=4 uneven + recompute": tiny_plan(
            "1f1b", p=4, m=4, splits=[[(0, 1)], [(1, 3)], [(3, 4)], [(4, 6)]], recompute={1: {"full": 1}}),
        "2 x 2 data x pipeline (DDP)": tiny_plan("1f1b", p=2, d=2, m=4, splits=[[(0, 2)], [(2, 6)]]),
    }
    jobs = _jobs(plans)
    results = launch(jobs, LaunchOptions(timeout_s=30))
    assert results is not None
    for name, job, records in zip(plans, jobs, results):
        report = summarize(job, records)
        assert report["max_loss_diff"] <= TOLERANCE, name
        assert report["max_grad_diff"] <= TOLERANCE, name
    mesh = results[1]
    assert [(r["stage"], r["replica"]) for r in mesh] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # each replica's last stage computed its own half of the global batch's losses
    assert all(len(r["losses"][0]) == 4 for r in mesh if r["stage"] == 1)


@pytest.mark.timeout(240)  # a hang fails here; how fast the failure comes is bench/speed_targets.py's business
def test_dead_rank_fails_within_the_timeout() -> None:
    job = Job(plan=tiny_plan("1f1b"), config=resolve_config(tiny_plan("1f1b")), steps=3, fail_rank=1, fail_step=1)
    with pytest.raises(RunFailedError, match="run failed") as info:
        launch([job], LaunchOptions(timeout_s=5))
    # torchrun's summary names the killed rank's exit status; the survivor reports its broken link
    assert "exitcode: 17" in str(info.value)
    assert "rank0:" in str(info.value)


def test_cli_run_check_json(tmp_path, capsys) -> None:
    from planner import api

    path = tmp_path / "plan.json"
    api.save(tiny_plan("1f1b", splits=[[(0, 2)], [(2, 6)]]), path)
    assert main(["run", str(path), "--steps", "2", "--check", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["max_loss_diff"] <= TOLERANCE and report["max_grad_diff"] <= TOLERANCE
    assert report["check_passed"] is True
