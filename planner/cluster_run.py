"""Gavel's round-based mechanism driving real jobs on a Ray cluster (``paraplan cluster-run``).

The same policy solve (``solvers.gavel.solve_matrix``), priority selection
(``mechanism.select``) and lease placement (``mechanism.Placer``) as the cluster simulator's
``paper`` mechanism,
but every scheduled job runs as a Ray task: a real training lease
(``planner.cluster_job.train_lease``) on the accelerator type it was given, asked for as a
Ray custom resource named after the type (``{"v100": scale_factor}``). A round launches the
leases of the selected jobs, each for min(remaining, floor(throughput x round)) steps, and
ends when the last of them returns: the round rule of Gavel's simulator, measured in wall
time. A job not selected next round is preempted: its state is in its checkpoint, and its
next lease resumes from there, in whichever worker process Ray picks.

Accelerator speed is emulated by pacing each lease to the job's throughput on that type
(CPUs stand in for GPUs). The result puts every measured JCT beside the simulator's JCT for
the same trace, policy and round length.

Ray is imported only when a run starts (``ray`` is an optional dependency, pinned in the
``ray`` and ``test`` extras). Started here, the local head node has one logical CPU per
accelerator and one custom resource per type; ``address`` joins a running cluster instead,
which must offer those custom resources.
"""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from planner.errors import InvalidProblemError
from planner.schema_gavel import ClusterProblem, ClusterRunResult, JobsFile, RunJobResult
from solvers.gavel import get_policy, solve_matrix
from solvers.gavel.mechanism import Placer, select
from solvers.gavel.simulator import round_steps, simulate

RAY_REQUIREMENT = "ray==2.60.0"


@dataclass
class _Live:
    remaining: float
    completion_s: float | None = None
    num_leases: int = 0
    pids: set[int] = field(default_factory=set)
    loss: float = float("nan")


@dataclass
class _Allocation:
    f: Any
    x: np.ndarray
    jobs: list[int]
    received_s: np.ndarray


def import_ray() -> Any:
    """The ray module, or InvalidProblemError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise InvalidProblemError(
            f"--engine ray needs the ray package; install it with pip install '{RAY_REQUIREMENT}' "
            "(or the project's 'ray' extra)") from None
    return ray


def check_jobs(jobs: JobsFile, worker_types: dict[str, int]) -> None:
    """The engine runs single jobs with throughputs; pairs (space sharing) are not supported."""
    if jobs.pairs:
        raise InvalidProblemError("cluster-run does not run co-located pairs (space sharing); drop the jobs' pairs")
    for job in jobs.jobs:
        if job.throughputs is None:
            raise InvalidProblemError(f"job {job.id!r} has no throughputs; give steps/s per accelerator type")
        if not any(job.throughputs.get(t, 0.0) > 0 for t in worker_types):
            raise InvalidProblemError(f"job {job.id!r} has zero throughput on every type of {sorted(worker_types)}")


def run_on_ray(
    jobs: JobsFile,
    *,
    worker_types: dict[str, int],
    policy: str,
    round_s: float = 1.0,
    checkpoint_dir: str | Path | None = None,
    address: str | None = None,
    options: dict[str, Any] | None = None,
) -> ClusterRunResult:
    """Run the jobs to completion on Ray under ``policy``; compare with the simulator.

    Raises:
        InvalidProblemError: bad round, pairs, missing throughputs or ray not installed.
    """
    if round_s <= 0:
        raise InvalidProblemError(f"round length {round_s} s must be positive")
    get_policy(policy)
    check_jobs(jobs, worker_types)
    ray = import_ray()
    started_here = not ray.is_initialized()
    if started_here:
        _start(ray, worker_types, address)
    try:
        with tempfile.TemporaryDirectory(prefix="paraplan-ckpt-") as tmp:
            engine = _Engine(ray, jobs, worker_types, policy, round_s, Path(checkpoint_dir or tmp), options or {})
            engine.warm_up()
            engine.run()
    finally:
        if started_here:
            ray.shutdown()
    sim = simulate(jobs, worker_types=worker_types, policy=policy, round_s=round_s, options=options, mechanism="paper")
    return engine.result(sim)


def _start(ray: Any, worker_types: dict[str, int], address: str | None) -> None:
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    if address is None:
        kwargs.update(num_cpus=sum(worker_types.values()), resources=dict(worker_types))
    ray.init(address=address, **kwargs)


class _Engine:
    def __init__(self, ray: Any, jobs: JobsFile, worker_types: dict[str, int], policy: str, round_s: float,
                 checkpoint_dir: Path, options: dict[str, Any]) -> None:
        from planner.cluster_job import train_lease

        self.ray, self.jobs, self.worker_types, self.policy = ray, jobs, worker_types, policy
        self.round_s, self.options, self.dir = round_s, options, checkpoint_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.types = tuple(worker_types)
        self.capacity = np.array([worker_types[t] for t in self.types], dtype=float)
        self.lease = ray.remote(num_cpus=1)(train_lease)
        self.state = [_Live(remaining=float(math.ceil(j.num_steps))) for j in jobs.jobs]
        self.placer = Placer(capacity=dict(worker_types))
        self.num_rounds = self.num_preemptions = 0
        self.t0 = 0.0

    def warm_up(self) -> None:
        """One empty lease per accelerator, so worker start-up is not charged to the first round."""
        refs = [self.lease.options(resources={t: 1}).remote(str(self.dir / f"warm-{t}-{i}.npz"), seed=0, max_steps=0,
                                                            steps_per_s=1.0)
                for t, n in self.worker_types.items() for i in range(n)]
        self.ray.get(refs)

    def run(self) -> None:
        jobs = self.jobs.jobs
        order = sorted(range(len(jobs)), key=lambda i: (jobs[i].arrival_time_s, i))
        nxt, active, current, done = 0, [], None, 0
        self.t0 = time.time()
        while done < len(jobs):
            now = time.time() - self.t0
            arrived = [m for m in order[nxt:] if jobs[m].arrival_time_s <= now]
            nxt += len(arrived)
            active += arrived
            if not active:
                time.sleep(max(0.0, jobs[order[nxt]].arrival_time_s - now))
                continue
            if arrived or current is None:
                current = self._allocate(active, now)
            finished = self._round(current)
            if finished:
                done += len(finished)
                active = [m for m in active if m not in finished]
                current = None

    def _allocate(self, active: list[int], now: float) -> _Allocation:
        problem = ClusterProblem.model_construct(
            jobs=tuple(self.jobs.jobs[m].model_copy(update={
                "num_steps": max(self.state[m].remaining, 1e-9),
                "elapsed_s": max(0.0, now - self.jobs.jobs[m].arrival_time_s)}) for m in active),
            worker_types=self.worker_types, pairs=(), entities=dict(self.jobs.entities), prices_per_hour={})
        f, x, _, _ = solve_matrix(problem, policy=self.policy, options=self.options)
        return _Allocation(f=f, x=x, jobs=list(active), received_s=np.zeros_like(x))

    def _round(self, current: _Allocation) -> set[int]:
        """Launch the selected leases, wait for the last one (the round's end), book the results."""
        f = current.f
        cells = select(current.x, current.received_s, combos=f.combos, combo_scale=f.combo_scale, capacity=self.capacity)
        wanted = [(f.job_ids[f.combos[k][0]], self.types[j], int(f.combo_scale[k])) for k, j in cells]
        self.num_preemptions += self.placer.place(wanted)[1]
        refs = [self._launch(current, k, j) for k, j in cells]
        results = self.ray.get(refs) if refs else []
        if not refs:
            time.sleep(self.round_s)
        self.num_rounds += 1
        finished: set[int] = set()
        for (k, j), res in zip(cells, results):
            m = current.jobs[f.combos[k][0]]
            current.received_s[k, j] += res["end"] - res["start"]
            st = self.state[m]
            st.remaining -= res["steps"]
            st.num_leases += 1
            st.pids.add(res["pid"])
            st.loss = res["loss"]
            if st.remaining <= 0:
                st.completion_s = res["end"] - self.t0
                finished.add(m)
        return finished

    def _launch(self, current: _Allocation, k: int, j: int) -> Any:
        f = current.f
        m = current.jobs[f.combos[k][0]]
        thr = float(f.combo_throughput[k, j, 0])
        steps = int(min(self.state[m].remaining, max(1.0, math.floor(round_steps(thr, self.round_s)))))
        resources = {self.types[j]: int(f.combo_scale[k])}
        return self.lease.options(resources=resources).remote(
            str(self.dir / f"job-{m}.npz"), seed=m, max_steps=steps, steps_per_s=thr)

    def result(self, sim: Any) -> ClusterRunResult:
        rows = []
        for m, (job, st, ref) in enumerate(zip(self.jobs.jobs, self.state, sim.jobs)):
            assert st.completion_s is not None, f"job {job.id} did not finish"
            rows.append(RunJobResult(
                id=job.id, arrival_s=job.arrival_time_s, completion_s=st.completion_s,
                jct_s=st.completion_s - job.arrival_time_s, sim_jct_s=ref.jct_s, num_steps=job.num_steps,
                steps_done=job.num_steps - max(st.remaining, 0.0), num_leases=st.num_leases,
                num_processes=len(st.pids), final_loss=st.loss))
        start = min(r.arrival_s for r in rows)
        return ClusterRunResult(
            engine="ray", policy=self.policy, round_s=self.round_s, num_jobs=len(rows), num_rounds=self.num_rounds,
            num_preemptions=self.num_preemptions, avg_jct_s=float(np.mean([r.jct_s for r in rows])),
            sim_avg_jct_s=sim.avg_jct_s, makespan_s=max(r.completion_s for r in rows) - start,
            sim_makespan_s=sim.makespan_s, jobs=tuple(rows))
