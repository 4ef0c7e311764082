"""Launch plans with torchrun and report measured against predicted.

``run_plan`` checks the plan against the model (``validate.check_plan``, and custom or
zero-bubble action lists lowered with torch's rules: refused before any process starts), writes
the job file, starts ``python -m torch.distributed.run`` (single node: ``--standalone``; several
nodes: the rendezvous flags passed through), gloo on CPU and NCCL on CUDA, with a process-group
timeout in every rank and a wall-clock limit on the whole launch, so that a broken plan or a dead
rank ends the run within seconds with the failing rank's message (exit 3). While it runs, the
last rank's per-step lines (loss, step time, tokens/s) are relayed to stderr. Rank 0's gathered
records become the report (``report.summarize``): step time, tokens/s, MFU and per-rank peak
memory beside the plan's ``predicted`` numbers, with ratios, and with ``check=True`` the
``max_loss_diff`` / ``max_grad_diff`` against single-process training.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from planner.errors import InfeasibleError, InvalidProblemError
from planner.schema import Plan, TransformerConfig
from runtime_bridge.fill import FillTask, compare_with_baseline
from runtime_bridge.report import summarize
from runtime_bridge.validate import check_plan, num_ranks, resolve_config

log = logging.getLogger(__name__)

__all__ = ["LaunchOptions", "RunJob", "check_actions", "RunFailedError", "launch", "run_plan", "summarize"]


class RunFailedError(InfeasibleError):
    """A launched run failed or timed out: the plan could not run on these processes (CLI exit
    code 3); the message names the failing ranks and their first error line."""


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
    rdzv_backend: str = "c10d"
    rdzv_conf: str | None = None
    """torchrun's ``--rdzv-conf`` (e.g. ``join_timeout=600``)."""
    timeout_s: float = 30.0
    """Process-group timeout: a collective or receive waiting longer fails the rank."""
    launch_timeout_s: float | None = None
    """Wall-clock limit of the whole launch; default 120 s of start-up plus ``timeout_s`` per step
    and per job (a step that waits longer than the timeout would fail anyway). It also bounds a
    rank stuck in a collective of a tensor- or data-parallel subgroup, whose timeout is torch's
    default for new groups rather than ``timeout_s``."""
    num_threads: int = 1
    """torch threads per rank (several ranks share one host's cores)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunJob:
    """One plan to run inside a launch."""

    plan: Plan
    config: TransformerConfig
    steps: int = 3
    name: str = ""
    """Shown in the per-step progress lines."""
    check: bool = False
    seed: int = 0
    lr: float = 0.05
    executor: str = "auto"
    """``auto``, ``builtin`` or ``actions`` (see ``torch_pp.build_schedule``)."""
    fail_rank: int | None = None
    """Fault injection for tests: this rank exits abruptly at step ``fail_step``."""
    fail_step: int = 0
    fill: FillTask | None = None
    """PipeFill's bubble instruction: run this fill job in each rank's bubbles (``runtime_bridge.fill``)."""


def _torchrun_command(world_size: int, options: LaunchOptions, spec_path: Path, out_dir: Path) -> list[str]:
    nproc = options.nproc_per_node or world_size // options.nnodes
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--max-restarts", "0", "--monitor-interval", "0.1"]
    if options.nnodes == 1:
        cmd.append("--standalone")
    else:
        cmd += ["--nnodes", str(options.nnodes), "--node-rank", str(options.node_rank),
                "--rdzv-backend", options.rdzv_backend, "--rdzv-endpoint", str(options.rdzv_endpoint),
                "--rdzv-id", options.rdzv_id]
        if options.rdzv_conf:
            cmd += ["--rdzv-conf", options.rdzv_conf]
    return cmd + ["-m", "runtime_bridge.worker", str(spec_path), str(out_dir)]


def _worker_env(options: LaunchOptions) -> dict[str, str]:
    root = str(Path(__file__).resolve().parent.parent)  # the checkout holding runtime_bridge
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env["OMP_NUM_THREADS"] = str(options.num_threads)
    return env


def launch(jobs: Sequence[RunJob], options: LaunchOptions = LaunchOptions()) -> list[list[dict[str, Any]]] | None:
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
        limit_s = options.launch_timeout_s or 120.0 + options.timeout_s * sum(job.steps + 1 for job in jobs)
        log.info("launching: %s", " ".join(cmd))
        nproc = options.nproc_per_node or world_size // options.nnodes
        print(f"starting {nproc} ranks on this node with torchrun ({'NCCL' if options.device == 'cuda' else 'gloo'})...",
              file=sys.stderr, flush=True)
        start = time.perf_counter()
        returncode = _run_relaying_progress(cmd, options, out_dir, limit_s)
        log.info("torchrun finished in %.1f s with exit status %d", time.perf_counter() - start, returncode)
        if returncode != 0:
            raise RunFailedError(_failure_text(out_dir, f"torchrun exited with status {returncode}"))
        if not (out_dir / "results.pt").exists():
            return None  # global rank 0 ran on another node (the rendezvous assigns ranks to nodes)
        import torch

        per_rank = torch.load(out_dir / "results.pt", weights_only=False)
    return [[per_rank[r][j] for r in range(world_size)] for j in range(len(jobs))]


def _run_relaying_progress(cmd: list[str], options: LaunchOptions, out_dir: Path, limit_s: float) -> int:
    """Run torchrun (its output to a log file) and copy the ranks' per-step lines to stderr as
    they come (``progress.log``, written by the last rank); kill it past ``limit_s``."""
    progress, relayed = out_dir / "progress.log", 0
    deadline = time.monotonic() + limit_s
    with open(out_dir / "torchrun.log", "w") as logfile:
        proc = subprocess.Popen(cmd, env=_worker_env(options), stdout=logfile, stderr=subprocess.STDOUT)
        while True:
            try:
                returncode = proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                returncode = None
            relayed = _relay(progress, relayed)
            if returncode is not None:
                return returncode
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise RunFailedError(_failure_text(out_dir, f"the launch passed its {limit_s:.0f} s limit"))


def _relay(path: Path, done: int) -> int:
    """Print the lines of ``path`` after the first ``done`` ones on stderr; returns the new count."""
    if not path.exists():
        return done
    lines = path.read_text().splitlines()
    complete = lines if path.read_text().endswith("\n") else lines[:-1]
    for line in complete[done:]:
        print(line, file=sys.stderr, flush=True)
    return max(done, len(complete))


def _job_dict(job: RunJob) -> dict[str, Any]:
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
    fill: FillTask | None = None,
) -> dict[str, Any] | None:
    """Execute a plan on the bundled decoder (GPT, Llama or Mixtral style) and report measured against predicted.

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
        The report (see ``report.summarize``); None on the nodes that do not hold global rank 0.

    Raises:
        InvalidProblemError: the plan does not match the model or the launch (nothing started).
        RunFailedError: the run failed or timed out.
    """
    cfg = resolve_config(plan, model)
    world = options.nproc_per_node * options.nnodes if options.nproc_per_node else None
    check_plan(plan, cfg, world_size=world)
    if steps < 1:
        raise InvalidProblemError(f"--steps={steps} must be at least 1")
    if options.nnodes > 1 and not options.rdzv_endpoint:
        raise InvalidProblemError(
            f"--nnodes={options.nnodes} needs --rdzv-endpoint HOST:PORT (the same on every node; HOST runs the "
            "rendezvous store)"
        )
    check_actions(plan, executor)
    job = RunJob(plan=plan, config=cfg, steps=steps, check=check, seed=seed, executor=executor, fill=fill,
                 name=cfg.name)
    if fill is None:
        results = launch([job], options)
        return None if results is None else summarize(job, results[0])
    fill.validate()
    baseline = RunJob(plan=plan, config=cfg, steps=steps, seed=seed, executor=executor, name=f"{cfg.name} without fill")
    results = launch([baseline, job], options)
    if results is None:
        return None
    report = summarize(job, results[1])
    report["fill"].update(compare_with_baseline(summarize(baseline, results[0]), report, results[0], results[1]))
    return report




def check_actions(plan: Plan, executor: str = "auto") -> None:
    """Before launch: a plan that runs as an action list (``custom``, the zero-bubble schedules,
    or ``executor="actions"``) is lowered with torch's own rules (``torch_pp.lower_offline``:
    validation, stage placement, send/receive insertion) so that a malformed or deadlocking list
    exits 2 here instead of hanging the ranks."""
    from runtime_bridge.torch_pp import executor_for, lower_offline

    if executor_for(plan, executor) == "actions":  # type: ignore[arg-type]
        lower_offline(plan)
