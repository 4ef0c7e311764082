"""Launch plans with torchrun and report measured against predicted.

``run_plan`` checks the plan against the model (``validate.check_plan``: refused before any
process starts), writes the job file, starts ``python -m torch.distributed.run`` (single node:
``--standalone``; several nodes: c10d rendezvous flags passed through), gloo on CPU and NCCL on
CUDA, with a process-group timeout in every rank and a wall-clock limit on the whole launch, so
that a broken plan or a dead rank ends the run within seconds with the failing rank's message
(shared/design/ecosystem.md Sec. 3.5). Rank 0's gathered records become the report: step time,
tokens/s, MFU and per-rank peak memory beside the plan's ``predicted`` numbers, with ratios, and
with ``check=True`` the ``max_loss_diff`` / ``max_grad_diff`` against single-process training.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cost_models import transformer
from planner.errors import InvalidProblemError, PlannerError
from planner.report import mfu as report_mfu
from planner.schema import Plan, TransformerConfig
from runtime_bridge.fill import FillJob, compare_with_baseline, summarize_fill
from runtime_bridge.validate import check_plan, num_ranks, resolve_config

log = logging.getLogger(__name__)

__all__ = ["Job", "LaunchOptions", "RunFailedError", "launch", "run_plan", "summarize"]


class RunFailedError(PlannerError):
    """A launched run failed or timed out (CLI exit code 1); the message names the rank."""

    exit_code = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchOptions:
    """How to start the ranks."""

    device: str = "cpu"
    nproc_per_node: int | None = None
    """Default: all of the plan's ranks on this node."""
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    """host:port of the c10d rendezvous (several nodes)."""
    rdzv_id: str = "paraplan"
    timeout_s: float = 30.0
    """Process-group timeout: a collective or receive waiting longer fails the rank."""
    launch_timeout_s: float | None = None
    """Wall-clock limit of the whole launch; default 120 s + timeout_s."""
    num_threads: int = 1
    """torch threads per rank (several ranks share one host's cores)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """One plan to run inside a launch."""

    plan: Plan
    config: TransformerConfig
    steps: int = 3
    check: bool = False
    seed: int = 0
    lr: float = 0.05
    executor: str = "auto"
    """``auto``, ``builtin`` or ``actions`` (see ``torch_pp.build_schedule``)."""
    fail_rank: int | None = None
    """Fault injection for tests: this rank exits abruptly at step ``fail_step``."""
    fail_step: int = 0
    fill: FillJob | None = None
    """PipeFill's bubble instruction: run this fill job in each rank's bubbles (``runtime_bridge.fill``)."""


def _torchrun_command(world_size: int, options: LaunchOptions, spec_path: Path, out_dir: Path) -> list[str]:
    nproc = options.nproc_per_node or world_size // options.nnodes
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--max-restarts", "0", "--monitor-interval", "0.1"]
    if options.nnodes == 1:
        cmd.append("--standalone")
    else:
        cmd += ["--nnodes", str(options.nnodes), "--node-rank", str(options.node_rank),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", str(options.rdzv_endpoint),
                "--rdzv-id", options.rdzv_id]
    return cmd + ["-m", "runtime_bridge.worker", str(spec_path), str(out_dir)]


def _worker_env(options: LaunchOptions) -> dict[str, str]:
    root = str(Path(__file__).resolve().parent.parent)  # the checkout holding runtime_bridge
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env["OMP_NUM_THREADS"] = str(options.num_threads)
    return env


def launch(jobs: Sequence[Job], options: LaunchOptions = LaunchOptions()) -> list[list[dict[str, Any]]] | None:
    """Run several jobs in one torchrun launch (one process group).

    Args:
        jobs: plans that all need the same number of ranks.
        options: launch settings.

    Returns:
        Per job, every rank's record (rank order); None on a node other than node 0.

    Raises:
        RunFailedError: a rank failed, torchrun failed, or the launch passed its time limit.
    """
    world = {num_ranks(job.plan) for job in jobs}
    assert len(world) == 1, f"jobs of one launch need one world size, got {sorted(world)}"
    world_size = world.pop()
    with tempfile.TemporaryDirectory(prefix="paraplan-run-") as tmp:
        out_dir = Path(tmp)
        spec = {"device": options.device, "timeout_s": options.timeout_s, "num_threads": options.num_threads,
                "jobs": [_job_dict(job) for job in jobs]}
        (out_dir / "jobs.json").write_text(json.dumps(spec))
        cmd = _torchrun_command(world_size, options, out_dir / "jobs.json", out_dir)
        limit_s = options.launch_timeout_s or 120.0 + options.timeout_s
        log.info("launching: %s", " ".join(cmd))
        start = time.perf_counter()
        with open(out_dir / "torchrun.log", "w") as logfile:
            try:
                proc = subprocess.run(cmd, env=_worker_env(options), stdout=logfile, stderr=subprocess.STDOUT,
                                      timeout=limit_s, check=False)
            except subprocess.TimeoutExpired:
                raise RunFailedError(_failure_text(out_dir, f"the launch passed its {limit_s:.0f} s limit")) from None
        log.info("torchrun finished in %.1f s with exit status %d", time.perf_counter() - start, proc.returncode)
        if proc.returncode != 0:
            raise RunFailedError(_failure_text(out_dir, f"torchrun exited with status {proc.returncode}"))
        if options.node_rank != 0:
            return None
        import torch

        per_rank = torch.load(out_dir / "results.pt", weights_only=False)
    return [[per_rank[r][j] for r in range(world_size)] for j in range(len(jobs))]


def _job_dict(job: Job) -> dict[str, Any]:
    data = asdict(job)
    data["plan"] = job.plan.model_dump(mode="json")
    data["config"] = job.config.model_dump(mode="json")
    return data


def _failure_text(out_dir: Path, headline: str) -> str:
    """The headline plus each failing rank's first error line (or torchrun's log tail)."""
    lines = [f"run failed: {headline}"]
    for path in sorted(out_dir.glob("error-rank*.txt")):
        first = path.read_text().splitlines()[0] if path.read_text() else "(empty)"
        lines.append(f"  {path.stem.removeprefix('error-')}: {first[:400]}")
    log_path = out_dir / "torchrun.log"
    log_lines = log_path.read_text().splitlines() if log_path.exists() else []
    # torchrun's failure summary names each dead rank with its exit code (a killed rank writes nothing)
    lines += [f"  torchrun: {t.strip()}" for t in log_lines if "exitcode" in t or t.strip().startswith("rank:")]
    if len(lines) == 1:
        lines += ["  torchrun log (last lines):"] + [f"    {t}" for t in log_lines[-15:]]
    return "\n".join(lines)


def run_plan(
    plan: Plan,
    *,
    model: TransformerConfig | None = None,
    steps: int = 3,
    check: bool = False,
    seed: int = 0,
    executor: str = "auto",
    options: LaunchOptions = LaunchOptions(),
    fill: FillJob | None = None,
) -> dict[str, Any] | None:
    """Execute a plan on the bundled GPT model and report measured against predicted.

    Args:
        plan: the plan (its transformer, or ``model``, or the preset named like its profile).
        model: the transformer to build, when the plan does not carry one.
        steps: training steps (the first one, with shape inference, is not timed when steps > 1).
        check: also train in one process and report ``max_loss_diff`` and ``max_grad_diff``.
        seed: weights and data.
        executor: ``auto``, ``builtin`` or ``actions``.
        options: launch settings.
        fill: a fill job for the ranks' bubbles; the same launch then also runs the plan without
            it first, and the report's ``fill`` adds ``max_main_loss_diff`` and ``main_job_slowdown``.

    Returns:
        The report (see ``summarize``); None on nodes other than node 0.

    Raises:
        InvalidProblemError: the plan does not match the model or the launch (nothing started).
        RunFailedError: the run failed or timed out.
    """
    cfg = resolve_config(plan, model)
    world = options.nproc_per_node * options.nnodes if options.nproc_per_node else None
    check_plan(plan, cfg, world_size=world)
    if steps < 1:
        raise InvalidProblemError(f"--steps={steps} must be at least 1")
    job = Job(plan=plan, config=cfg, steps=steps, check=check, seed=seed, executor=executor, fill=fill)
    if fill is None:
        results = launch([job], options)
        return None if results is None else summarize(job, results[0])
    fill.validate()
    baseline = Job(plan=plan, config=cfg, steps=steps, seed=seed, executor=executor)
    results = launch([baseline, job], options)
    if results is None:
        return None
    report = summarize(job, results[1])
    report["fill"].update(compare_with_baseline(summarize(baseline, results[0]), report, results[0], results[1]))
    return report


def _mfu(plan: Plan, cfg: TransformerConfig, step_s: float) -> float | None:
    """Model FLOPs utilisation as the planner reports it (``planner.report.mfu``: the layers'
    FLOPs), else from the transformer's FLOPs per iteration (PTD-P Eq. 4.2 without recompute)."""
    util = report_mfu(plan, step_s)
    if util is not None or plan.cluster.device is None or step_s <= 0:
        return util
    flops = transformer.flops_per_iteration(cfg, global_batch_size=plan.global_batch_size, recompute=False)
    return flops / (step_s * num_ranks(plan) * plan.cluster.device.peak_flops)


def summarize(job: Job, records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Measured numbers beside the plan's predictions, with measured / predicted ratios."""
    plan, cfg = job.plan, job.config
    per_step = [max(rec["step_times_s"][s] for rec in records) for s in range(job.steps)]
    timed = per_step[1:] if len(per_step) > 1 else per_step  # step 0 infers shapes
    step_s = statistics.median(timed)
    tokens = plan.global_batch_size * cfg.seq_length
    last = [rec for rec in records if rec["losses"] and rec["losses"][0]]
    report: dict[str, Any] = {
        "plan": {"solver": plan.solver, "schedule": plan.schedule, "degrees": plan.degrees.model_dump(),
                 "num_microbatches": plan.num_microbatches, "microbatch_size": plan.microbatch_size,
                 "global_batch_size": plan.global_batch_size, "model": cfg.name},
        "steps": job.steps, "step_times_s": per_step, "step_time_s": step_s,
        "tokens_per_s": tokens / step_s, "mfu": _mfu(plan, cfg, step_s),
        "peak_memory_bytes": [rec["peak_memory_bytes"] for rec in records],
        "rank_stage": [rec["stage"] for rec in records],
        "memory_kind": records[0]["memory_kind"],
        "loss": [statistics.fmean(x for rec in last for x in rec["losses"][s]) for s in range(job.steps)],
    }
    predicted = plan.predicted
    if predicted is not None:
        report["predicted"] = {
            "iteration_time_s": predicted.iteration_time_s,
            "tokens_per_s": predicted.throughput_samples_per_s * cfg.seq_length,
            "peak_memory_bytes": list(predicted.peak_memory_bytes),
            "mfu": _mfu(plan, cfg, predicted.iteration_time_s),
        }
        report["ratio"] = {
            "step_time": step_s / predicted.iteration_time_s if predicted.iteration_time_s else None,
            # A CPU process's peak RSS includes the interpreter and torch: no ratio for it.
            "peak_memory": [rec["peak_memory_bytes"] / predicted.peak_memory_bytes[rec["stage"]]
                            if predicted.peak_memory_bytes[rec["stage"]] and rec["memory_kind"] != "cpu_peak_rss"
                            else None for rec in records],
        }
    if job.check:
        from runtime_bridge.check import TOLERANCE, compare, reference_run

        ref_losses, ref_grads = reference_run(plan, cfg, steps=job.steps, seed=job.seed, lr=job.lr)
        diffs = compare(plan, records, ref_losses, ref_grads)
        report.update(diffs)
        report["check_passed"] = (not diffs["check_failures"]
                                  and max(diffs["max_loss_diff"], diffs["max_grad_diff"]) <= TOLERANCE)
    if job.fill is not None:
        report["fill"] = summarize_fill(job.fill, [rec["fill"] for rec in records])
    return report
