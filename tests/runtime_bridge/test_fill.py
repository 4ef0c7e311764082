"""PipeFill's bubble instruction (runtime_bridge/fill.py): where it fires, what it does, and that
the main job's numbers do not move when it runs (2 gloo ranks on CPU)."""

from __future__ import annotations

import json
import time

import pytest

torch = pytest.importorskip("torch")

from cost_models.simulate import simulate  # noqa: E402
from planner.cli import main  # noqa: E402
from planner.errors import InvalidProblemError  # noqa: E402
from runtime_bridge.check import TOLERANCE  # noqa: E402
from runtime_bridge.fill import LOSS_WINDOW, FillTask, FillRunner, bubble_points, load_fill_job  # noqa: E402
from runtime_bridge.launch import RunJob, LaunchOptions, launch, summarize  # noqa: E402
from runtime_bridge.validate import resolve_config  # noqa: E402
from tests.runtime_bridge.plans import tiny_plan  # noqa: E402


def test_bubble_points_of_1f1b_by_hand() -> None:
    # p = 2, m = 4 1F1B: rank 0 runs F0 F1 | B0 F2 | B1 F3 | B2 | B3 and waits before every backward
    # (for stage 1's gradient); rank 1 waits before F0 (head), before F2, and after B3 (tail).
    plan = tiny_plan("1f1b")
    sim = simulate(plan)
    ev = {(e.rank, e.kind, e.microbatch): e for e in sim.events}
    rank0, iteration_s = bubble_points(plan, 0)
    assert iteration_s == sim.iteration_time_s
    assert [p.trigger for p in rank0] == [("B", 0, 0), ("B", 0, 1), ("B", 0, 2), ("B", 0, 3)]
    assert rank0[0].duration_s == pytest.approx(ev[0, "B", 0].start_s - ev[0, "F", 1].end_s)
    rank1, _ = bubble_points(plan, 1)
    assert [p.trigger for p in rank1] == [("F", 1, 0), ("F", 1, 2), None]
    assert rank1[0].duration_s == pytest.approx(ev[1, "F", 0].start_s)
    assert rank1[2].duration_s == pytest.approx(sim.iteration_time_s - ev[1, "B", 3].end_s)
    for rank in (0, 1):  # the bubbles are all of the rank's idle time
        points, _ = bubble_points(plan, rank)
        assert sum(p.duration_s for p in points) == pytest.approx(sim.stages[rank].idle_s)


def test_bubble_points_zero_bubble_maps_recompute_and_input_grad_to_b() -> None:
    plan = tiny_plan("zb-h1", recompute={0: {"full": [1, 2]}})
    points, _ = bubble_points(plan, 0)
    # rank 0's first wait is before the recompute of microbatch 0, fed by the B receive
    assert points[0].trigger == ("B", 0, 0)
    assert {p.trigger[0] for p in points if p.trigger} <= {"F", "B", "W"}


@pytest.mark.parametrize(("data", "match"), [
    ({"hidden": 3}, "unknown field"),
    ({"points": "everywhere"}, "points='everywhere'"),
    ({"points": "recv"}, "needs budget_s"),
    ({"budget_s": 0.0}, "budget_s=0.0"),
    ({"batch_size": 0}, "batch_size=0"),
    ({"fill_fraction": 1.5}, "fill_fraction=1.5"),
])
def test_fill_job_rejects_bad_fields(data: dict, match: str) -> None:
    with pytest.raises(InvalidProblemError, match=match):
        FillTask.from_dict(data)


def test_load_fill_job(tmp_path) -> None:
    assert load_fill_job("tiny-mlp") == FillTask()
    path = tmp_path / "fill.json"
    path.write_text(json.dumps({"hidden_size": 16, "points": "recv", "budget_s": 0.01}))
    assert load_fill_job(str(path)) == FillTask(hidden_size=16, points="recv", budget_s=0.01)
    with pytest.raises(InvalidProblemError, match="neither a preset"):
        load_fill_job(str(tmp_path / "missing.json"))
    path.write_text("[1, 2]")
    with pytest.raises(InvalidProblemError, match="JSON object"):
        load_fill_job(str(path))


class _FakeStage:
    """The five methods the bubble instruction wraps, recording the calls torch would make."""

    def __init__(self, stage_index: int) -> None:
        self.stage_index, self.calls = stage_index, []

    def get_fwd_recv_ops(self, mb: int) -> list:
        self.calls.append(("recv_f", mb))
        return [object()]

    def forward_one_chunk(self, mb: int, args=None, kwargs=None, save_forward_output=True) -> str:
        self.calls.append(("F", mb))
        return f"out{mb}"

    def get_bwd_recv_ops(self, mb: int) -> list:
        self.calls.append(("recv_b", mb))
        return [object()]

    def backward_one_chunk(self, mb: int, loss=None, full_backward=True, last_backward=False) -> None:
        self.calls.append(("B", mb))

    def backward_weight_one_chunk(self, mb: int, last_backward=False) -> None:
        self.calls.append(("W", mb))


@pytest.fixture
def p2p(monkeypatch):
    """torch's P2P post and wait replaced by fakes (no process group); each wait idles ``idle_s``."""
    from torch.distributed.pipelining import schedules

    state = {"idle_s": 0.0, "waits": 0}

    def wait(works: list) -> None:
        state["waits"] += 1
        time.sleep(state["idle_s"])

    monkeypatch.setattr(schedules, "_batch_p2p", lambda ops, desc=None: [object() for _ in ops])
    monkeypatch.setattr(schedules, "_wait_batch_p2p", wait)
    return schedules, state


def _drive_1f1b_rank1(runner: FillRunner, stage: _FakeStage, schedules) -> None:
    """What Schedule1F1B does on the last of 2 stages with m = 4 (post, wait, compute)."""
    runner.start_step()
    for mb in range(4):
        schedules._wait_batch_p2p(schedules._batch_p2p(stage.get_fwd_recv_ops(mb)))
        stage.forward_one_chunk(mb, (), {})
        stage.backward_one_chunk(mb, loss=None, last_backward=mb == 3)
    runner.end_step()


def _runner(job: FillTask, rank: int = 1) -> tuple[FillRunner, _FakeStage]:
    runner = FillRunner(job, tiny_plan("1f1b"), rank, torch.device("cpu"))
    stage = _FakeStage(rank)
    runner.attach([stage])
    return runner, stage


def test_runner_fills_the_timeline_bubbles_once_per_step_and_leaves_the_stage_alone(p2p) -> None:
    schedules, state = p2p
    job = FillTask(budget_s=10.0, max_steps_per_bubble=3)  # budget never binds: 3 steps per bubble
    runner, stage = _runner(job)
    rng = torch.get_rng_state()
    _drive_1f1b_rank1(runner, stage, schedules)
    # the waits before F0 and F2 and the tail are filled; F1 and F3 follow a backward at once
    assert runner.stats.bubbles_visited == 3 and runner.stats.steps == 9 and state["waits"] == 4
    assert stage.forward_one_chunk(7) == "out7" and len(stage.get_bwd_recv_ops(5)) == 1
    assert stage.calls[:3] == [("recv_f", 0), ("F", 0), ("B", 0)]
    _drive_1f1b_rank1(runner, stage, schedules)
    record = runner.record()
    assert record["steps"] == 18 and record["samples"] == 18 * job.batch_size and record["bubbles_planned"] == 3
    assert torch.equal(torch.get_rng_state(), rng)  # the fill job draws from its own generator only
    losses = record["losses"]
    assert sum(losses[-3:]) < 0.5 * sum(losses[:3])  # the fill job learns its teacher
    runner.detach()
    assert schedules._wait_batch_p2p.__name__ == "wait"  # the fixture's fake is back


def test_runner_simulated_budgets_calibrate_then_scale(p2p) -> None:
    schedules, _ = p2p
    runner, stage = _runner(FillTask(budget_from="simulated", calibration_steps=1, max_steps_per_bubble=1000))
    _drive_1f1b_rank1(runner, stage, schedules)
    assert runner.stats.steps == 0 and runner.stats.bubbles_visited == 0  # step 0 only measures
    points, _ = bubble_points(tiny_plan("1f1b"), 1)
    scale = runner._scale  # measured / simulated iteration time of step 0
    assert scale is not None and scale > 0
    _drive_1f1b_rank1(runner, stage, schedules)
    # each bubble's budget: 0.68 x its simulated length x the scale measured in the previous step
    assert runner.stats.budget_s == pytest.approx(0.68 * sum(p.duration_s for p in points) * scale)
    assert runner.stats.bubbles_visited == 3
    runner.detach()


def test_runner_measured_budgets_from_the_timed_waits(p2p) -> None:
    schedules, state = p2p
    # 0.1 s waits: budgets of 68 ms hold a fill step (a few ms) even on a loaded machine (with
    # 20 ms waits, a slowed first step's estimate kept every bubble empty)
    state["idle_s"] = 0.1
    runner, stage = _runner(FillTask(calibration_steps=2, max_steps_per_bubble=1000))
    for _ in range(2):
        _drive_1f1b_rank1(runner, stage, schedules)
    assert runner.stats.bubbles_visited == 0
    assert set(runner._measured_s) == {("F", 1, mb) for mb in range(4)}
    assert all(t >= 0.1 for t in runner._measured_s.values())  # at least the wait (no upper bound: load)
    tail_s = 0.68 * bubble_points(tiny_plan("1f1b"), 1)[0][-1].duration_s * runner._scale
    _drive_1f1b_rank1(runner, stage, schedules)
    # two timeline bubbles (before F0, F2) at 0.68 x their timed wait, plus the simulated tail
    expected = 0.68 * (runner._measured_s[("F", 1, 0)] + runner._measured_s[("F", 1, 2)]) + tail_s
    assert runner.stats.budget_s == pytest.approx(expected)  # the tail uses the scale of steps 0-1
    assert runner.stats.bubbles_visited == 3 and runner.stats.steps > 0 and state["waits"] == 12
    runner.detach()


def test_runner_recv_mode_fires_before_every_wait_on_a_receive(p2p) -> None:
    schedules, _ = p2p
    runner, stage = _runner(FillTask(points="recv", budget_s=10.0, max_steps_per_bubble=1), rank=0)
    runner.start_step()
    for mb in range(4):
        stage.forward_one_chunk(mb, (), {})  # stage 0 receives no input: no bubble
        schedules._wait_batch_p2p(schedules._batch_p2p([object()]))  # a send: not a bubble
        schedules._wait_batch_p2p(schedules._batch_p2p(stage.get_bwd_recv_ops(mb)))
        stage.backward_one_chunk(mb)
    runner.end_step()
    assert runner.stats.bubbles_visited == 4 and runner.stats.steps == 4
    runner.detach()


_FIXED = FillTask(budget_s=0.005, max_steps_per_bubble=2)
_STEPS = 4  # two calibration steps, then two with fill work at the measured bubbles
_TWO_RANK_FILLS = {
    "gpipe (torch's class), fixed budget": (tiny_plan("gpipe"), _FIXED),
    "zb-h1 + recompute (the plan's action list)": (tiny_plan("zb-h1", recompute={0: {"full": [1, 2]}}), _FIXED),
    "interleaved-1f1b, before every receive": (
        tiny_plan("interleaved-1f1b", v=2), FillTask(points="recv", budget_s=0.002, max_steps_per_bubble=1)),
    "1f1b, measured bubbles (the default)": (tiny_plan("1f1b"), FillTask()),
    "1f1b, simulated bubbles rescaled": (tiny_plan("1f1b"), FillTask(budget_from="simulated")),
}
_SOME_RANK_IDLE = {"1f1b, measured bubbles (the default)", "1f1b, simulated bubbles rescaled"}
"""Budgets from measured waits (or rescaled by the measured step) may be too short for one fill step
on a loaded machine: these cases check the main job and the accounting only; the fixed budgets,
which always allow a step, check the fill job's progress and learning."""


@pytest.fixture(scope="module")
def fill_runs() -> dict[str, tuple[dict, list[dict], list[dict]]]:
    """Each plan twice in one launch: without fill, then with it (and --check)."""
    jobs: list[RunJob] = []
    for plan, fill in _TWO_RANK_FILLS.values():
        cfg = resolve_config(plan)
        jobs += [RunJob(plan=plan, config=cfg, steps=_STEPS),
                 RunJob(plan=plan, config=cfg, steps=_STEPS, check=True, fill=fill)]
    results = launch(jobs, LaunchOptions(timeout_s=30))
    assert results is not None
    return {name: (summarize(jobs[2 * i + 1], results[2 * i + 1]), results[2 * i], results[2 * i + 1])
            for i, name in enumerate(_TWO_RANK_FILLS)}


@pytest.mark.multirank
@pytest.mark.timeout(600)  # hang guard; wide for a loaded 2-core machine (launches have their own deadline)
@pytest.mark.parametrize("name", list(_TWO_RANK_FILLS))
def test_main_job_losses_unchanged_and_fill_progresses(fill_runs: dict, name: str) -> None:
    report, baseline, filled = fill_runs[name]
    assert report["check_passed"] and report["max_loss_diff"] <= TOLERANCE
    for base, rec in zip(baseline, filled):  # every (step, microbatch) loss of the main job, both ranks
        assert len(rec["losses"]) == _STEPS
        for a, b in zip(base["losses"], rec["losses"]):
            assert a == pytest.approx(b, abs=1e-6, rel=0)
    fill = report["fill"]
    # accounting that holds whatever the machine's load
    assert fill["samples"] == fill["steps"] * 16 and fill["steps"] == sum(fill["steps_per_rank"])
    assert 0 <= fill["bubbles_filled"] <= fill["bubbles_visited"] and fill["fill_time_s"] >= 0
    if name in _SOME_RANK_IDLE:
        return  # budgets from measured waits depend on the machine's load: progress is not guaranteed
    assert all(steps > 0 for steps in fill["steps_per_rank"]), fill
    assert fill["bubbles_filled"] > 0 and fill["fill_time_s"] > 0
    trained = [(first, last) for steps, first, last in zip(fill["steps_per_rank"], fill["first_loss"],
                                                            fill["last_loss"]) if steps >= 2 * LOSS_WINDOW]
    assert trained, fill
    assert all(last < first for first, last in trained)  # the fill job learns its teacher


@pytest.mark.multirank
@pytest.mark.timeout(600)  # hang guard; wide for a loaded 2-core machine (launches have their own deadline)
def test_cli_run_fill_json(tmp_path, capsys) -> None:
    from planner import api

    path = tmp_path / "plan.json"
    api.save(tiny_plan("1f1b", splits=[[(0, 3)], [(3, 6)]]), path)
    assert main(["run", str(path), "--steps", "4", "--fill", "tiny-mlp", "--check", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["check_passed"] is True
    fill = report["fill"]
    assert fill["max_main_loss_diff"] <= 1e-6
    assert fill["steps"] > 0 and fill["samples"] > 0 and fill["bubbles_filled"] > 0
    assert fill["baseline_step_time_s"] > 0 and "main_job_slowdown" in fill


def test_cli_run_fill_bad_job_exits_2(tmp_path, capsys) -> None:
    from planner import api

    path = tmp_path / "plan.json"
    api.save(tiny_plan("1f1b"), path)
    assert main(["run", str(path), "--fill", "no-such-job"]) == 2
    assert "neither a preset" in capsys.readouterr().err
