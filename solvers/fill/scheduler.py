"""PipeFill's Fill Job Scheduler: event-driven list scheduling with a score function (seed 000
L156-174, reading Sec. 3).

When a device (GPU) is free, it gets the queued job with the highest score f(j, s, i) among the
jobs that can run on it; there is no preemption and one fill job per device at a time.
Processing times are exact: proc(j, i) = ceil(N_j / (k b)) x n x T_iter from the Executor plan
of job j on device i's bubble cycle (reading Sec. 2.3).

Scores:
- ``sjf``: 1 / min over all devices of proc(j, .) (L160-164; the minimum over all devices, as
  the paper writes it, not the time on device i);
- ``makespan``: 1 / max(proc(j, i), max_k rem_k) with rem_k the remaining busy time of device k
  (L168-172);
- ``fifo``: earlier arrival first.
Tie-break (the paper leaves it open, reading Sec. 8 item 3): higher score, then earlier
arrival, then the job's position in the input. Free devices are served in index order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cost_models.sim.dispatch import dispatch
from planner.errors import InfeasibleError, InvalidProblemError

POLICIES = ("sjf", "makespan", "fifo")


@dataclass(frozen=True, slots=True)
class Scheduled:
    job: int
    device: int
    start_s: float
    end_s: float


def _score(policy: str, proc: Sequence[float], device: int, max_rem: float, arrival: float) -> float:
    if policy == "sjf":
        return 1.0 / min(proc)
    if policy == "makespan":
        return 1.0 / max(proc[device], max_rem)
    return -arrival


def schedule(
    proc_s: Sequence[Sequence[float]],
    arrival_s: Sequence[float],
    *,
    policy: str,
    horizon_s: float = math.inf,
    job_names: Sequence[str] | None = None,
) -> list[Scheduled]:
    """Assign jobs to devices as devices free up (the engine's ``dispatch`` with PipeFill's score).

    Args:
        proc_s: proc_s[j][i], the processing time of job j on device i (inf: cannot run there).
        arrival_s: arrival time of each job.
        policy: ``sjf``, ``makespan`` or ``fifo``.
        horizon_s: no job starts at or after this time.
        job_names: for error messages.

    Returns:
        One entry per started job, in start order.

    Raises:
        InvalidProblemError: unknown policy.
        InfeasibleError: a job that runs on no device.
    """
    if policy not in POLICIES:
        raise InvalidProblemError(f"unknown fill policy {policy!r}; choose from {list(POLICIES)}")
    for j, row in enumerate(proc_s):
        if not any(math.isfinite(p) for p in row):
            name = job_names[j] if job_names else str(j)
            raise InfeasibleError(f"fill job {name!r} fits the bubbles of no device (see the Executor's message)")
    num_devices = len(proc_s[0]) if proc_s else 0

    def choose(queue: list[int], device: int, now: float, busy_until: list[float]) -> int | None:
        """The queued job with the highest (score, earlier arrival, earlier input) that runs here."""
        max_rem = max(max(0.0, b - now) for b in busy_until)
        best, best_key = None, None
        for pos, j in enumerate(queue):
            if not math.isfinite(proc_s[j][device]):
                continue
            key = (_score(policy, proc_s[j], device, max_rem, arrival_s[j]), -arrival_s[j], -j)
            if best_key is None or key > best_key:
                best, best_key = pos, key
        return best

    started = dispatch(num_devices, arrival_s, lambda j, device: proc_s[j][device], choose, horizon_s=horizon_s)
    return [Scheduled(s.job, s.server, s.start_s, s.end_s) for s in started]


def score_function(policy: str) -> Callable[[Sequence[float], int, float, float], float]:
    """The score f(j, s, i) of a policy as a function of (proc times, device, max remaining, arrival)."""
    if policy not in POLICIES:
        raise InvalidProblemError(f"unknown fill policy {policy!r}; choose from {list(POLICIES)}")
    return lambda proc, device, max_rem, arrival: _score(policy, proc, device, max_rem, arrival)
