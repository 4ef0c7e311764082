"""The fill simulator, the scale mode and ``paraplan fill`` (pipefill.md Sec. 4, issue 7)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner import api
from planner.cli import main
from planner.errors import InfeasibleError, InvalidProblemError
from planner.schema_fill import FillJob, FillPlan
from solvers.fill.bubbles import BubbleOptions
from solvers.fill.jobs import parse_fill_jobs
from solvers.fill.scale import ScaleOptions, paper_microbatches, scale_sweep
from solvers.fill.simulate import FillOptions, fill_plan


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    problem = api.make_problem("gpt-1.7b", "v100:8", schedule="gpipe", num_stages=4, data_parallel=1,
                               num_microbatches=8, global_batch_size=8)
    path = tmp_path_factory.mktemp("fill") / "plan.json"
    api.save(api.plan(problem, solver="even"), path)
    return path


def test_fill_plan_pieces_fit_and_utilization_is_recovered(plan_path: Path) -> None:
    plan = api.load_plan(plan_path)
    result = fill_plan(plan, parse_fill_jobs("bert-large-inference:2,resnet50-training:2,bert-base-training"))
    assert len(result.assignments) == 5 and result.recovered_utilization > 0
    bubbles = {sb.stage: sb.bubbles for sb in result.stages}
    for ep in result.executor_plans:
        for piece in ep.pieces:
            assert piece.duration_s < bubbles[ep.stage][piece.bubble].usable_s
            assert piece.peak_memory_bytes <= bubbles[ep.stage][piece.bubble].free_memory_bytes
    # fill FLOP/s per GPU cannot exceed what 68% of the bubbles at the fill efficiency give
    peak = plan.cluster.device.peak_flops
    assert result.fill_flops_per_device_s <= 0.68 * result.bubble_fraction * 0.5 * peak * 1.0001
    # every piece plus its 1 ms switch fits its bubble: the engine's filled iteration is unchanged
    assert result.main_job_slowdown == 0.0 and result.filled_iteration_time_s == result.iteration_time_s
    assert FillPlan.from_json(result.to_json()) == result


def test_overrunning_fill_slows_the_main_job_on_the_engine(plan_path: Path) -> None:
    plan = api.load_plan(plan_path)
    jobs = parse_fill_jobs("bert-large-inference:2,resnet50-training:2")
    # whole bubbles filled and a 50 ms switch: pieces overrun and delay the next main-job action
    result = fill_plan(plan, jobs, FillOptions(bubbles=BubbleOptions(fill_fraction=1.0), context_switch_s=0.05))
    assert result.filled_iteration_time_s > result.iteration_time_s
    makespan = max(a.end_s for a in result.assignments)
    occupancy = sum(a.end_s - a.start_s for a in result.assignments) / (result.num_devices * makespan)
    assert result.main_job_slowdown == pytest.approx(
        (result.filled_iteration_time_s / result.iteration_time_s - 1) * occupancy)


def test_bad_fill_input_gets_clear_errors(plan_path: Path) -> None:
    plan = api.load_plan(plan_path)
    with pytest.raises(InvalidProblemError, match="unknown fill-job preset 'bert-huge'"):
        parse_fill_jobs("bert-huge")
    with pytest.raises(InvalidProblemError, match="count after ':'"):
        parse_fill_jobs("bert-base-inference:0")
    with pytest.raises(InvalidProblemError, match="exactly one of 'model'"):
        FillJob.from_dict({"id": "x"})
    with pytest.raises(InfeasibleError, match="fits no bubble of any stage"):
        fill_plan(plan, parse_fill_jobs("xlm-roberta-xl-inference"),
                  FillOptions(bubbles=BubbleOptions(free_memory_bytes=1e9)))
    with pytest.raises(InvalidProblemError, match="no fill jobs"):
        fill_plan(plan, [])


def test_cli_fill_json_and_exit_codes(plan_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fill", str(plan_path), "--fill-jobs", "bert-large-inference", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"recovered_utilization", "main_job_slowdown", "executor_plans"} <= set(out)
    assert out["executor_plans"][0]["pieces"][0]["bubble"] >= 0
    jobs = tmp_path / "jobs.json"
    jobs.write_text(json.dumps([{"id": "a", "model": "bert-base", "mode": "training", "num_samples": 100}]))
    assert main(["fill", str(plan_path), "--fill-jobs", str(jobs), "--policy", "makespan", "-o",
                 str(tmp_path / "fill.json")]) == 0
    assert FillPlan.from_json((tmp_path / "fill.json").read_text()).policy == "makespan"
    assert main(["fill", str(plan_path), "--fill-jobs", "xlm-roberta-xl-inference", "--free-memory-gb", "1"]) == 3
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({**json.loads(plan_path.read_text()), "stages": []}))
    assert main(["fill", str(empty), "--fill-jobs", "bert-base-inference"]) == 2
    assert main(["fill", str(plan_path), "--fill-jobs", "bert-base-inference", "--policy", "lifo"]) == 2
    assert main(["fill", str(plan_path)]) == 2


def test_paper_microbatches() -> None:
    assert [paper_microbatches(n) for n in (1024, 2048, 4096, 8192, 16384)] == [64, 32, 16, 8, 4]
    with pytest.raises(InvalidProblemError, match="num_gpus=64"):
        paper_microbatches(64)


def test_scale_trend_grows_with_gpus(tmp_path: Path) -> None:
    result = scale_sweep(ScaleOptions(num_gpus=(1024, 8192), jobs="bert-inference", horizon_s=4 * 3600.0))
    low, high = result.points
    assert (low.num_microbatches, high.num_microbatches) == (64, 8)
    assert high.closed_form_bubble_fraction == pytest.approx(15 / 23)
    assert low.recovered_utilization < high.recovered_utilization  # the paper's trend (Sec. 6.1)
    assert high.recovered_utilization > 0.1  # "tens of percent" at 8K
    assert high.main_job_slowdown < 0.02  # under 2% (L7)
    assert main(["fill", "--scale", "--gpus", "1024,2048", "--horizon-h", "2", "--fill-jobs", "bert-base-inference",
                 "--plot", str(tmp_path / "u.png"), "--json"]) == 0
    assert (tmp_path / "u.png").stat().st_size > 0


def test_a_main_job_without_flushed_iterations_is_refused() -> None:
    problem = api.make_problem("gpt-1.7b", "v100:8", schedule="2bw", num_stages=4, data_parallel=1,
                               num_microbatches=8, global_batch_size=8)
    with pytest.raises(InvalidProblemError, match="2BW plan .* flushed pipeline schedule"):
        fill_plan(api.plan(problem, solver="even"), parse_fill_jobs("bert-base-inference"))
