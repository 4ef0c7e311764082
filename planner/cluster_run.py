"""Gavel's round-based mechanism driving real jobs on a Ray cluster (``paraplan cluster-run``).

The cluster simulator's round loop (``solvers.gavel.simulator.RoundLoop``: the same arrivals,
policy solves, priority selection under either mechanism, lease placement and bookkeeping),
but every scheduled job runs as a Ray task: a real training lease
(``planner.cluster_job.train_lease``) on the accelerator type it was given, asked for as a
Ray custom resource named after the type (``{"v100": scale_factor}``). A round launches the
leases of the selected jobs, each for min(remaining, floor(throughput x round)) steps, and
ends when the last of them returns: the round rule of Gavel's simulator, measured in wall
time. A job not selected next round is preempted: its state is in its checkpoint, and its
next lease resumes from there, in whichever worker process Ray picks.

Which clock the decisions read (``decision_clock``): ``accelerator`` (the default) books each
lease's accelerator time, steps / throughput, the time the emulated device was busy, and moves
the scheduler's clock by those round lengths, as the simulator does; the real run then takes the
simulator's decisions, lease for lease, and its measured JCTs differ from the simulated ones by
what the system adds (dispatch, checkpoint load and save, pacing). ``wall`` books the measured
lease times and reads the wall clock, as a deployed scheduler would; millisecond jitter then
breaks exact priority ties either way and can move whole rounds between jobs.

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
from pathlib import Path
from typing import Any

import numpy as np

from planner.errors import InvalidProblemError
from planner.schema_gavel import ClusterRunResult, JobsFile, RunJobResult
from solvers.gavel import get_policy
from solvers.gavel.simulator import MECHANISMS, RoundLoop, round_steps, simulate

RAY_REQUIREMENT = "ray==2.60.0"
DECISION_CLOCKS = ("accelerator", "wall")


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
    mechanism: str = "gavel",
    seed: int = 0,
    decision_clock: str = "accelerator",
) -> ClusterRunResult:
    """Run the jobs to completion on Ray under ``policy``; compare with the simulator.

    Steps are whole: each job's num_steps is rounded up, for the real run and the simulation.

    Raises:
        InvalidProblemError: bad round, mechanism or decision clock, pairs, missing throughputs,
            ray not installed.
    """
    if round_s <= 0:
        raise InvalidProblemError(f"round length {round_s} s must be positive")
    if mechanism not in MECHANISMS:
        raise InvalidProblemError(f"mechanism {mechanism!r} is not one of {MECHANISMS}")
    if decision_clock not in DECISION_CLOCKS:
        raise InvalidProblemError(f"decision clock {decision_clock!r} is not one of {DECISION_CLOCKS}")
    get_policy(policy)
    check_jobs(jobs, worker_types)
    jobs = jobs.model_copy(update={"jobs": tuple(j.model_copy(update={"num_steps": float(math.ceil(j.num_steps))})
                                                 for j in jobs.jobs)})
    ray = import_ray()
    started_here = not ray.is_initialized()
    if started_here:
        _start(ray, worker_types, address)
    try:
        _check_resources(ray.cluster_resources(), worker_types)
        with tempfile.TemporaryDirectory(prefix="paraplan-ckpt-") as tmp:
            loop = RayRoundLoop(ray, jobs, worker_types, policy, round_s, Path(checkpoint_dir or tmp), options or {},
                                decision_clock)
            loop.configure(mechanism, seed)
            loop.warm_up()
            loop.start_clock()
            loop.run(None)
    finally:
        if started_here:
            ray.shutdown()
    sim = simulate(jobs, worker_types=worker_types, policy=policy, round_s=round_s, options=options,
                   mechanism=mechanism, seed=seed)
    return loop.outcome(sim, mechanism)


def _check_resources(have: dict[str, float], worker_types: dict[str, int]) -> None:
    """A cluster without a type's custom resource would leave its leases pending forever."""
    short = {t: n for t, n in worker_types.items() if have.get(t, 0.0) < n}
    if short:
        raise InvalidProblemError(
            f"the Ray cluster offers {({t: have.get(t, 0.0) for t in short})} of the accelerator resources "
            f"{short} that --cluster asks for; start its nodes with --resources naming each type, or ask for fewer")


def _start(ray: Any, worker_types: dict[str, int], address: str | None) -> None:
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    if address is None:
        kwargs.update(num_cpus=sum(worker_types.values()), resources=dict(worker_types))
    else:
        check_address(address)
    try:
        ray.init(address=address, **kwargs)
    except (ConnectionError, ValueError) as error:  # e.g. ``auto`` with no cluster running
        raise InvalidProblemError(f"--address {address!r}: Ray could not join a cluster ({error}); start one with "
                                  "`ray start --head --resources ...`, or drop --address to start a local head") from None


RAY_DEFAULT_PORT = 6379
"""The port ``ray start --head`` listens on unless told otherwise."""
CONNECT_TIMEOUT_S = 5.0


def check_address(address: str) -> None:
    """Refuse a --address where nothing listens, at once: Ray itself waits about a minute for a head
    that is not there. ``auto`` / ``local`` (Ray's own lookups) pass unprobed.

    Raises:
        InvalidProblemError: a malformed address, or no head node answering at it.
    """
    if address in ("auto", "local"):
        return
    hostport = address.removeprefix("ray://").strip()
    host, sep, port_text = hostport.rpartition(":")
    if not sep:
        host, port_text = hostport, str(RAY_DEFAULT_PORT)
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not host or not 0 < port < 65536:
        raise InvalidProblemError(f"--address {address!r} is not HOST:PORT (e.g. 10.0.0.1:{RAY_DEFAULT_PORT}, "
                                  "ray://HOST:10001 or auto)")
    import socket

    try:
        socket.create_connection((host.strip("[]"), port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as error:
        raise InvalidProblemError(
            f"--address {address!r}: no Ray head node answers at {host}:{port} ({error.strerror or error}); "
            "start one there with `ray start --head --resources ...`, or drop --address to start a local "
            "head") from None


class RayRoundLoop(RoundLoop):
    """The simulator's round loop with the work done by Ray tasks and the clock on the wall."""

    def __init__(self, ray: Any, jobs: JobsFile, worker_types: dict[str, int], policy: str, round_s: float,
                 checkpoint_dir: Path, options: dict[str, Any], decision_clock: str = "accelerator") -> None:
        from planner.cluster_job import train_lease

        super().__init__(jobs, worker_types, policy, round_s, options, {})
        self.ray, self.dir = ray, checkpoint_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.lease = ray.remote(num_cpus=1)(train_lease)
        self.pids: list[set[int]] = [set() for _ in jobs.jobs]
        self.loss = [float("nan")] * len(jobs.jobs)
        self.t0 = 0.0
        self.decision_clock = decision_clock

    def warm_up(self) -> None:
        """One empty lease per accelerator, so worker start-up is not charged to the first round."""
        refs = [self.lease.options(resources={t: 1}).remote(str(self.dir / f"warm-{t}-{i}.npz"), seed=0, max_steps=0,
                                                            steps_per_s=1.0)
                for t, n in self.worker_types.items() for i in range(n)]
        self.ray.get(refs)

    def start_clock(self) -> None:
        self.t0 = time.time() - self.now

    def _wall_s(self) -> float:
        return time.time() - self.t0

    def advance_clock(self, length_s: float) -> None:
        self.now = self._wall_s() if self.decision_clock == "wall" else self.now + length_s

    def idle_until(self, time_s: float) -> None:
        time.sleep(max(0.0, time_s - self._wall_s()))
        self.now = self._wall_s() if self.decision_clock == "wall" else time_s

    def run_cells(self, current: Any, cells: list[tuple[int, int]]) -> tuple[list[float], set[int]]:
        """Launch one lease per cell, wait for the last (the round's end), book what they did.

        The busy time booked is the lease's accelerator time (steps / throughput) or, with the
        wall decision clock, its measured time; completion times are always the wall clock's.
        """
        f = current.f
        jobs = [current.jobs[f.combos[k][0]] for k, _ in cells]
        refs, nominal_s = [], []
        for (k, j), m in zip(cells, jobs):
            thr = float(f.combo_throughput[k, j, 0])
            steps = int(min(self.state[m].remaining, max(1.0, math.floor(round_steps(thr, self.round_s)))))
            nominal_s.append(steps / thr if thr > 0 else self.round_s)
            refs.append(self.lease.options(resources={self.types[j]: int(f.combo_scale[k])}).remote(
                str(self.dir / f"job-{m}.npz"), seed=m, max_steps=steps, steps_per_s=thr))
        busy_s, finished = [], set()
        for m, res, nominal in zip(jobs, self.ray.get(refs), nominal_s):
            st = self.state[m]
            st.num_rounds += 1
            st.remaining = max(0.0, st.remaining - res["steps"])
            self.pids[m].add(res["pid"])
            self.loss[m] = res["loss"]
            busy_s.append(res["end"] - res["start"] if self.decision_clock == "wall" else nominal)
            if st.remaining == 0.0:
                st.completion_s = res["end"] - self.t0
                finished.add(m)
        return busy_s, finished

    def outcome(self, sim: Any, mechanism: str) -> ClusterRunResult:
        rows = []
        for m, (job, st, ref) in enumerate(zip(self.jobs.jobs, self.state, sim.jobs)):
            assert st.completion_s is not None, f"job {job.id} did not finish"
            rows.append(RunJobResult(
                id=job.id, arrival_s=job.arrival_time_s, completion_s=st.completion_s,
                jct_s=st.completion_s - job.arrival_time_s, sim_jct_s=ref.jct_s, num_steps=job.num_steps,
                steps_done=job.num_steps - st.remaining, num_leases=st.num_rounds, sim_num_leases=ref.num_rounds,
                num_processes=len(self.pids[m]), final_loss=self.loss[m]))
        start = min(r.arrival_s for r in rows)
        return ClusterRunResult(
            engine="ray", mechanism=mechanism, decision_clock=self.decision_clock,
            policy=self.policy, round_s=self.round_s, num_jobs=len(rows),
            num_rounds=self.num_rounds, sim_num_rounds=sim.num_rounds, num_preemptions=self.num_preemptions,
            sim_num_preemptions=sim.num_preemptions,
            avg_jct_s=float(np.mean([r.jct_s for r in rows])), sim_avg_jct_s=sim.avg_jct_s,
            makespan_s=max(r.completion_s for r in rows) - start, sim_makespan_s=sim.makespan_s, jobs=tuple(rows))
