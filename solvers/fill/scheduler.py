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

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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
    """Assign jobs to devices as devices free up.

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
    order = sorted(range(len(arrival_s)), key=lambda j: (arrival_s[j], j))
    busy_until = [0.0] * num_devices
    queue: list[int] = []
    done: list[Scheduled] = []
    nxt, now = 0, 0.0
    completions: list[tuple[float, int]] = []  # (end time, device), the next event besides arrivals
    while now < horizon_s:
        while nxt < len(order) and arrival_s[order[nxt]] <= now:
            queue.append(order[nxt])
            nxt += 1
        _assign(queue, busy_until, now, proc_s, arrival_s, policy, done, completions)
        events = [arrival_s[order[nxt]]] if nxt < len(order) else []
        if completions:
            events.append(completions[0][0])
        if not events:
            break
        now = min(events)
        while completions and completions[0][0] <= now:
            heapq.heappop(completions)
    return done


def _assign(queue: list[int], busy_until: list[float], now: float, proc_s: Sequence[Sequence[float]],
            arrival_s: Sequence[float], policy: str, done: list[Scheduled],
            completions: list[tuple[float, int]]) -> None:
    for device in range(len(busy_until)):
        if busy_until[device] > now or not queue:
            continue
        max_rem = max(max(0.0, b - now) for b in busy_until)
        best, best_key = None, None
        for pos, j in enumerate(queue):
            if not math.isfinite(proc_s[j][device]):
                continue
            key = (_score(policy, proc_s[j], device, max_rem, arrival_s[j]), -arrival_s[j], -j)
            if best_key is None or key > best_key:
                best, best_key = pos, key
        if best is None:
            continue
        j = queue.pop(best)
        end = now + proc_s[j][device]
        busy_until[device] = end
        done.append(Scheduled(j, device, now, end))
        heapq.heappush(completions, (end, device))


def score_function(policy: str) -> Callable[[Sequence[float], int, float, float], float]:
    """The score f(j, s, i) of a policy as a function of (proc times, device, max remaining, arrival)."""
    if policy not in POLICIES:
        raise InvalidProblemError(f"unknown fill policy {policy!r}; choose from {list(POLICIES)}")
    return lambda proc, device, max_rem, arrival: _score(policy, proc, device, max_rem, arrival)
