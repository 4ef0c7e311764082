"""PipeFill's explicit bubble instruction in the runtime bridge (seed 000 L113-117, L129).

PipeFill adds a *bubble instruction* to the pipeline engine's instruction list where large bubbles
are expected (L113, placed statically at the fill-drain and fwd-bwd points, L180); each time the
engine reaches it, the Executor runs one pre-planned fill-job partition that fits the bubble and
then waits (L117, L129). Reading: shared/design/pipefill.md Sec. 1.4 and Sec. 7.

Here the instruction is a callback in this rank's process. torch's schedules (the built-in
classes and the custom-schedule runtime alike) post receives with ``_batch_p2p`` and block on them
in ``_wait_batch_p2p``; ``torch_pp.install_wait_hook`` routes that wait through the runner, and the
stages' ``get_fwd_recv_ops`` / ``get_bwd_recv_ops`` are wrapped to tag each receive with its action
(phase, virtual stage, microbatch). So the fill work runs exactly when the rank is about to wait
on a receive, with its sends already posted, and no change to the schedule itself. Where it fires:

- ``points="timeline"``: at the bubbles of the plan's simulated timeline (``cost_models.simulate``):
  a gap before action (phase, virtual stage, microbatch) fires at the wait for that action's
  receive (or at its compute call, when it receives nothing); the idle tail after the rank's last
  action fires at the end of the step. Budget per bubble: ``fill_fraction`` (0.68, L231) of the
  bubble, measured as the rank's timed wait in the first ``calibration_steps`` steps (which run
  no fill work; the paper probes durations instead, L115), or the simulated gap times the
  smallest measured / simulated iteration time so far (``budget_from="simulated"``, and the tail),
  or a fixed ``budget_s`` from step 0.
- ``points="recv"``: before every wait on a receive, each with the fixed ``budget_s``.

Inside a bubble the fill job runs whole SGD steps while the running estimate of one step still
fits the remaining budget (at most ``max_steps_per_bubble``): cooperative switching, as in the
paper (no preemption). The fill job is a small MLP regression of a fixed random teacher on the
main job's device, with its own parameters and random generator, so the main job's numbers are
untouched. torch is imported only when a runner is attached: ``FillTask`` and ``bubble_points``
work without it (the CLI parses ``--fill`` before anything starts).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from planner.errors import InvalidProblemError
from planner.schema import Plan
from planner.schema_io import load_json

log = logging.getLogger(__name__)

__all__ = [
    "LOSS_WINDOW", "PRESETS", "BubblePoint", "FillTask", "FillRunner", "bubble_points", "compare_with_baseline",
    "load_fill_job", "summarize_fill",
]

_ESTIMATE_DECAY = 0.8
"""Shrink of the step-time estimate after a bubble it kept empty (a probe, like the paper's L115)."""

Trigger = tuple[str, int, int]
"""(phase F/B/W, virtual stage, microbatch) of the action a bubble precedes."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FillTask:
    """The fill job and where and for how long it may run."""

    name: str = "tiny-mlp"
    input_size: int = 32
    hidden_size: int = 64
    batch_size: int = 16
    num_batches: int = 8
    """Size of the fixed training set, in batches (cycled)."""
    lr: float = 0.05
    seed: int = 0
    points: Literal["timeline", "recv"] = "timeline"
    budget_s: float | None = None
    """Fixed budget per bubble, from step 0; None: ``fill_fraction`` x the bubble (``budget_from``)."""
    budget_from: Literal["measured", "simulated"] = "measured"
    """``measured``: the rank's timed wait before the action in the calibration steps (the idle tail:
    simulated, rescaled); ``simulated``: the plan's bubble x measured / simulated iteration time."""
    calibration_steps: int = 2
    """Steps without fill work that measure the bubbles (step 0 also infers shapes)."""
    fill_fraction: float = 0.68
    max_steps_per_bubble: int = 8

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FillTask:
        """Build and validate from JSON fields.

        Raises:
            InvalidProblemError: an unknown field or a value out of range, named with the fix.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidProblemError(f"fill job: unknown field(s) {unknown}; known: {sorted(known)}")
        job = cls(**data)
        job.validate()
        return job

    def validate(self) -> None:
        """Raises InvalidProblemError on a value out of range."""
        for name in ("input_size", "hidden_size", "batch_size", "num_batches", "max_steps_per_bubble",
                     "calibration_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidProblemError(f"fill job: {name}={value!r} must be a positive integer")
        if not self.lr > 0:
            raise InvalidProblemError(f"fill job: lr={self.lr} must be positive")
        if self.budget_from not in ("measured", "simulated"):
            raise InvalidProblemError(f"fill job: budget_from={self.budget_from!r}; choose 'measured' or 'simulated'")
        if self.points not in ("timeline", "recv"):
            raise InvalidProblemError(f"fill job: points={self.points!r} unknown; choose 'timeline' or 'recv'")
        if self.budget_s is not None and not self.budget_s > 0:
            raise InvalidProblemError(f"fill job: budget_s={self.budget_s} must be positive (seconds per bubble)")
        if self.points == "recv" and self.budget_s is None:
            raise InvalidProblemError("fill job: points='recv' needs budget_s (seconds per bubble)")
        if not 0 < self.fill_fraction <= 1:
            raise InvalidProblemError(f"fill job: fill_fraction={self.fill_fraction} must be in (0, 1]; paper: 0.68")


PRESETS: dict[str, FillTask] = {
    "tiny-mlp": FillTask(),
    "tiny-mlp-recv": FillTask(name="tiny-mlp-recv", points="recv", budget_s=0.002),
}


def load_fill_job(text: str) -> FillTask:
    """``--fill``: a preset name or a JSON file of ``FillTask`` fields.

    Raises:
        InvalidProblemError: neither a preset nor a readable JSON object.
    """
    if text in PRESETS:
        return PRESETS[text]
    path = Path(text)
    if not path.is_file():
        raise InvalidProblemError(f"--fill {text!r} is neither a preset ({sorted(PRESETS)}) nor a JSON file")
    data = load_json(path, what="--fill job")
    if not isinstance(data, dict):
        raise InvalidProblemError(f"--fill {text!r}: expected a JSON object of fill-job fields")
    return FillTask.from_dict(data)


@dataclass(frozen=True, slots=True)
class BubblePoint:
    """One bubble of a rank's simulated iteration."""

    trigger: Trigger | None
    """The action the bubble precedes; None: the idle tail at the end of the step."""
    duration_s: float
    """Simulated idle time (the plan's seconds)."""


def _trigger(kind: str, stage: int, microbatch: int) -> Trigger:
    # recompute (R) and input-gradient (I) run inside the backward the B receive feeds
    return ({"F": "F", "W": "W"}.get(kind, "B"), stage, microbatch)


def bubble_points(plan: Plan, pipeline_rank: int) -> tuple[tuple[BubblePoint, ...], float]:
    """The bubbles of one pipeline rank in the plan's simulated iteration.

    Returns:
        (bubbles in time order, simulated iteration time in seconds).
    """
    from cost_models.simulate import simulate

    sim = simulate(plan)
    events = sorted((e for e in sim.events if e.rank == pipeline_rank and e.kind != "AR"), key=lambda e: e.start_s)
    tol = 1e-9 * sim.iteration_time_s
    points: list[BubblePoint] = []
    busy_until = 0.0
    for e in events:
        if e.start_s - busy_until > tol:
            points.append(BubblePoint(_trigger(e.kind, e.stage, e.microbatch), e.start_s - busy_until))
        busy_until = max(busy_until, e.end_s)
    if sim.iteration_time_s - busy_until > tol:
        points.append(BubblePoint(None, sim.iteration_time_s - busy_until))
    return tuple(points), sim.iteration_time_s


@dataclass(slots=True)
class _Stats:
    steps: int = 0
    bubbles_visited: int = 0
    bubbles_filled: int = 0
    fill_time_s: float = 0.0
    budget_s: float = 0.0
    max_overrun_s: float = 0.0
    losses: list[float] = field(default_factory=list)


_COMPUTE = (("forward_one_chunk", "F"), ("backward_one_chunk", "B"), ("backward_weight_one_chunk", "W"))


class FillRunner:
    """A rank's fill job and its bubble instruction (see the module docstring)."""

    def __init__(self, job: FillTask, plan: Plan, pipeline_rank: int, device: Any) -> None:
        import torch

        self.job, self._torch, self._device = job, torch, device
        points, self._sim_iteration_s = bubble_points(plan, pipeline_rank) if job.points == "timeline" else ((), 0.0)
        self._points: dict[Trigger | None, BubblePoint] = {p.trigger: p for p in points}
        self._model, self._data = _build_mlp(job, device)
        self._optimizer = torch.optim.SGD(self._model.parameters(), lr=job.lr)
        self._est_step_s = self._warm_up()
        self._scale: float | None = None
        self._measured_s: dict[Trigger, float] = {}
        self._recv_ops: dict[int, tuple[Any, Trigger]] = {}  # id(op) -> (op kept alive, its action)
        self._fired: set[Trigger | None] = set()
        self._step_index = -1
        self._step_start = self._step_fill_s = 0.0
        self._uninstall: Callable[[], None] | None = None
        self.stats = _Stats()

    def _warm_up(self) -> float:
        """The fastest of three forward/backwards without an update: the first step-time estimate
        (the first call pays one-off initialisation)."""
        times = []
        for _ in range(3):
            start = time.perf_counter()
            self._loss(0).backward()
            self._model.zero_grad(set_to_none=True)
            self._sync()
            times.append(time.perf_counter() - start)
        return min(times)

    def _sync(self) -> None:
        if self._device.type == "cuda":
            self._torch.cuda.synchronize(self._device)

    def _loss(self, step: int) -> Any:
        x, y = self._data[step % len(self._data)]
        return self._torch.nn.functional.mse_loss(self._model(x), y)

    @property
    def _calibrating(self) -> bool:
        return self.job.budget_s is None and self._step_index < self.job.calibration_steps

    def attach(self, stages: Sequence[Any]) -> None:
        """Install the bubble instruction: tag this rank's receives, hook torch's blocking P2P
        wait, and wrap the compute calls (bubbles before actions that receive nothing)."""
        from runtime_bridge.torch_pp import install_wait_hook

        for stage in stages:
            for method, phase in (("get_fwd_recv_ops", "F"), ("get_bwd_recv_ops", "B")):
                setattr(stage, method, self._tag_recv(getattr(stage, method), phase, stage.stage_index))
            for method, phase in _COMPUTE:
                setattr(stage, method, self._wrap_compute(getattr(stage, method), phase, stage.stage_index))
        self._uninstall = install_wait_hook(self._on_wait)

    def detach(self) -> None:
        """Restore torch's P2P wait (the stages are discarded with their job)."""
        if self._uninstall is not None:
            self._uninstall()
            self._uninstall = None
        log.info("fill job %s: %d steps in %d of %d bubbles, %.3g s of %.3g s budget", self.job.name,
                 self.stats.steps, self.stats.bubbles_filled, self.stats.bubbles_visited, self.stats.fill_time_s,
                 self.stats.budget_s)

    def _tag_recv(self, original: Callable[..., Any], phase: str, stage: int) -> Callable[..., Any]:
        def tagged(microbatch: int, *args: Any, **kwargs: Any) -> Any:
            ops = original(microbatch, *args, **kwargs)
            for op in ops:
                self._recv_ops[id(op)] = (op, (phase, stage, microbatch))
            return ops

        return tagged

    def _wrap_compute(self, original: Callable[..., Any], phase: str, stage: int) -> Callable[..., Any]:
        def instrumented(microbatch: int, *args: Any, **kwargs: Any) -> Any:
            trigger = (phase, stage, microbatch)
            if self.job.points == "timeline" and trigger in self._points and trigger not in self._fired:
                self._fired.add(trigger)  # a bubble before an action that waits on no receive
                self._timeline_bubble(trigger)
            return original(microbatch, *args, **kwargs)

        return instrumented

    def _on_wait(self, ops: list[Any], wait: Callable[[], None]) -> None:
        """torch is about to block on ``ops``: fill the bubble, then wait (timed while calibrating)."""
        triggers = [self._recv_ops.pop(id(op))[1] for op in ops if id(op) in self._recv_ops]
        if triggers and self.job.points == "recv":
            self._bubble(self.job.budget_s or 0.0)
        for trigger in triggers:
            if self.job.points == "timeline" and trigger in self._points and trigger not in self._fired:
                self._fired.add(trigger)
                self._timeline_bubble(trigger)
        start = time.perf_counter()
        wait()
        waited_s = time.perf_counter() - start
        if self._calibrating:
            for trigger in triggers:  # the rank's real idle time before this action (cf. L115's probe)
                self._measured_s[trigger] = min(self._measured_s.get(trigger, math.inf), waited_s)

    def _timeline_bubble(self, trigger: Trigger | None) -> None:
        if self.job.budget_s is not None:
            self._bubble(self.job.budget_s)
            return
        if self._calibrating:
            return
        if self.job.budget_from == "measured" and trigger is not None:
            if trigger in self._measured_s:
                self._bubble(self.job.fill_fraction * self._measured_s[trigger])
        elif self._scale is not None:
            self._bubble(self.job.fill_fraction * self._points[trigger].duration_s * self._scale)

    def start_step(self) -> None:
        """Call before the schedule's ``step``: re-arms the timeline's bubble instructions."""
        self._step_index += 1
        self._fired.clear()
        self._recv_ops.clear()
        self._step_fill_s = 0.0
        self._step_start = time.perf_counter()

    def end_step(self) -> None:
        """Call after the schedule's ``step``: fills the idle tail and rescales the budgets."""
        if None in self._points:
            self._timeline_bubble(None)
        main_s = time.perf_counter() - self._step_start - self._step_fill_s
        if self._sim_iteration_s > 0 and main_s > 0:
            # The minimum over steps: waiting for a peer's fill work inflates a step, and a scale that
            # followed it would grow every budget in turn (a feedback loop between ranks).
            scale = main_s / self._sim_iteration_s
            self._scale = scale if self._scale is None else min(self._scale, scale)

    def _bubble(self, budget_s: float) -> None:
        """Run whole fill steps while the estimated next one still fits ``budget_s``."""
        stats, start = self.stats, time.perf_counter()
        stats.bubbles_visited += 1
        stats.budget_s += budget_s
        steps = 0
        with self._torch.enable_grad():
            while steps < self.job.max_steps_per_bubble and time.perf_counter() - start + self._est_step_s <= budget_s:
                step_start = time.perf_counter()
                self._train_step()
                step_s = time.perf_counter() - step_start
                self._est_step_s = 0.5 * self._est_step_s + 0.5 * step_s  # running estimate of one step
                steps += 1
        elapsed = time.perf_counter() - start
        if steps == 0:  # an estimate raised by one slow step must not shut filling off for good
            self._est_step_s *= _ESTIMATE_DECAY
        stats.bubbles_filled += steps > 0
        stats.fill_time_s += elapsed
        stats.max_overrun_s = max(stats.max_overrun_s, elapsed - budget_s)
        self._step_fill_s += elapsed

    def _train_step(self) -> None:
        loss = self._loss(self.stats.steps)
        loss.backward()
        self._optimizer.step()
        self._optimizer.zero_grad(set_to_none=True)
        self._sync()
        self.stats.losses.append(float(loss.detach()))
        self.stats.steps += 1

    def record(self) -> dict[str, Any]:
        """This rank's fill numbers for the launch report."""
        s = self.stats
        return {"steps": s.steps, "samples": s.steps * self.job.batch_size, "bubbles_planned": len(self._points),
                "bubbles_visited": s.bubbles_visited, "bubbles_filled": s.bubbles_filled,
                "fill_time_s": s.fill_time_s, "budget_s": s.budget_s, "max_overrun_s": s.max_overrun_s,
                "losses": list(s.losses)}


def _build_mlp(job: FillTask, device: Any) -> tuple[Any, list[tuple[Any, Any]]]:
    """Student MLP and a fixed data set labelled by a random teacher MLP, from the job's seed only."""
    import torch
    from torch import nn

    generator = torch.Generator().manual_seed(job.seed)

    def mlp() -> nn.Module:
        net = nn.Sequential(nn.Linear(job.input_size, job.hidden_size), nn.Tanh(), nn.Linear(job.hidden_size, 1))
        with torch.no_grad():
            for param in net.parameters():
                scale = 1.0 / math.sqrt(param.shape[-1]) if param.dim() == 2 else 0.0
                param.copy_(torch.randn(param.shape, generator=generator) * scale)
        return net

    teacher, student = mlp(), mlp()
    x = torch.randn(job.num_batches * job.batch_size, job.input_size, generator=generator)
    with torch.no_grad():
        y = teacher(x)
    data = [(a.to(device), b.to(device)) for a, b in zip(x.split(job.batch_size), y.split(job.batch_size))]
    return student.to(device), data


LOSS_WINDOW = 3
"""``first_loss`` / ``last_loss``: means of this many first and last fill steps (batch noise)."""


def summarize_fill(job: FillTask, records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Fill work over all ranks: steps, samples, loss trend per rank (None: no step), time used
    against budget."""
    k = LOSS_WINDOW

    def head(xs: list[float]) -> float | None:
        return sum(xs[:k]) / len(xs[:k]) if xs else None

    def tail(xs: list[float]) -> float | None:
        return sum(xs[-k:]) / len(xs[-k:]) if xs else None

    return {
        "job": job.name, "points": job.points,
        "steps": sum(rec["steps"] for rec in records), "samples": sum(rec["samples"] for rec in records),
        "steps_per_rank": [rec["steps"] for rec in records],
        "bubbles_visited": sum(rec["bubbles_visited"] for rec in records),
        "bubbles_filled": sum(rec["bubbles_filled"] for rec in records),
        "fill_time_s": sum(rec["fill_time_s"] for rec in records),
        "budget_s": sum(rec["budget_s"] for rec in records),
        "max_overrun_s": max(rec["max_overrun_s"] for rec in records) if records else 0.0,
        "first_loss": [head(rec["losses"]) for rec in records], "last_loss": [tail(rec["losses"]) for rec in records],
    }


def compare_with_baseline(baseline_report: dict[str, Any], report: dict[str, Any],
                          baseline_records: Sequence[dict[str, Any]], records: Sequence[dict[str, Any]]
                          ) -> dict[str, Any]:
    """The main job with filling against the same run without it: every (rank, step, microbatch)
    loss must agree, and the median step time gives the slowdown the fill work caused."""
    diff = 0.0
    for base, filled in zip(baseline_records, records, strict=True):
        for a_step, b_step in zip(base["losses"], filled["losses"], strict=True):
            diff = max(diff, *(abs(a - b) for a, b in zip(a_step, b_step, strict=True)), 0.0)
    return {"max_main_loss_diff": diff, "baseline_step_time_s": baseline_report["step_time_s"],
            "main_job_slowdown": report["step_time_s"] / baseline_report["step_time_s"] - 1.0}
