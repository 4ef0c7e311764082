"""Gavel's round-based scheduling mechanism, dissertation ch. 5 L5220-5244 and L5723-5879.

An allocation X gives time fractions; rounds (6 minutes in the chapter, L5242-5244) turn it
into whole assignments:

- Priorities (L5787-5800): f_kj = t_kj / sum_k' t_k'j is the share of type-j time combination
  k has received since the allocation was computed; priority_kj = X_kj / f_kj. A combination
  that has received nothing gets X_kj x 1e9 (first in line, as in Gavel's code); X_kj = 0
  gives priority 0 (never run there). Fig. 5.5's "X / rounds received" is the same ratio
  counted in rounds (reading sec. 2.9 item 6).
- Greedy selection (Algorithm 2, L5822-5837): take (combination, type) cells in decreasing
  priority; skip a cell when its type has fewer free accelerators than the scale factor, or
  when a member job already runs this round (at most one combination per job, L5739-5743).
  paraplan uses one global priority queue over all types (the chapter's loop ignores types;
  Gavel's code can do either), and stops when the queue empties (the algorithm as printed
  has no exit then).
- Placement (L5873-5879): jobs keep last round's accelerators when they run on the same type
  again (lease renewal, Table 5.4); the rest are placed in decreasing scale factor, each on
  the server with the fewest free accelerators that still holds it (less fragmentation),
  else spread over the fullest-free servers. A job that ran last round and now stops or moves
  is a preemption.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

NEVER_RUN_BOOST = 1e9


def priorities(allocation: np.ndarray, received_s: np.ndarray) -> np.ndarray:
    """priority_kj = X_kj / f_kj, with f the per-type share of time received (L5787-5800)."""
    total = received_s.sum(axis=0, keepdims=True)
    share = np.divide(received_s, total, out=np.zeros_like(received_s), where=total > 0)
    ratio = np.divide(allocation, share, out=allocation * NEVER_RUN_BOOST, where=share > 0)
    return np.where(allocation > 0, ratio, 0.0)


def select(
    allocation: np.ndarray,
    received_s: np.ndarray,
    *,
    combos: tuple[tuple[int, ...], ...],
    combo_scale: np.ndarray,
    capacity: np.ndarray,
) -> list[tuple[int, int]]:
    """The (combination, type) cells that run this round (Algorithm 2 with a global queue).

    Ties are broken by the allocation, then by combination and type index (deterministic).
    """
    prio = priorities(allocation, received_s)
    cells = np.argwhere(prio > 0)
    if len(cells) == 0:
        return []
    keys = np.lexsort((cells[:, 1], cells[:, 0], -allocation[cells[:, 0], cells[:, 1]], -prio[cells[:, 0], cells[:, 1]]))
    free = capacity.astype(int).copy()
    busy: set[int] = set()
    chosen: list[tuple[int, int]] = []
    for k, j in cells[keys]:
        scale = int(combo_scale[k])
        if scale > free[j] or any(m in busy for m in combos[k]):
            continue
        chosen.append((int(k), int(j)))
        free[j] -= scale
        busy.update(combos[k])
        if not free.any():
            break
    return chosen


@dataclass
class Placer:
    """Concrete accelerator ids per type, with leases carried from round to round."""

    capacity: dict[str, int]
    gpus_per_server: int = 4
    leases: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    """Placement key (job ids joined by '+') -> (type, accelerator ids) of the last round."""

    def place(self, wanted: list[tuple[str, str, int]]) -> tuple[dict[str, tuple[str, tuple[int, ...]]], int]:
        """Place (key, type, scale) requests; returns the placement and the preemption count."""
        free = {t: set(range(n)) for t, n in self.capacity.items()}
        placed: dict[str, tuple[str, tuple[int, ...]]] = {}
        for key, worker, scale in wanted:  # lease renewal first
            old = self.leases.get(key)
            if old is not None and old[0] == worker and len(old[1]) == scale and set(old[1]) <= free[worker]:
                placed[key] = old
                free[worker] -= set(old[1])
        rest = sorted((w for w in wanted if w[0] not in placed), key=lambda w: (-w[2], w[0]))
        for key, worker, scale in rest:
            ids = self._take(free[worker], scale)
            placed[key] = (worker, ids)
            free[worker] -= set(ids)
        preempted = sum(1 for key, old in self.leases.items() if placed.get(key) != old)
        self.leases = placed
        return placed, preempted

    def _take(self, free: set[int], scale: int) -> tuple[int, ...]:
        servers: dict[int, list[int]] = {}
        for gpu in sorted(free):
            servers.setdefault(gpu // self.gpus_per_server, []).append(gpu)
        fitting = [s for s, ids in servers.items() if len(ids) >= scale]
        if fitting:
            best = min(fitting, key=lambda s: (len(servers[s]), s))
            return tuple(servers[best][:scale])
        ids: list[int] = []
        for server in sorted(servers, key=lambda s: (-len(servers[s]), s)):
            ids.extend(servers[server][: scale - len(ids)])
            if len(ids) == scale:
                break
        assert len(ids) == scale, "select() never asks for more accelerators than are free"
        return tuple(ids)


# Gavel's own simulator (Scheduler._update_priorities, _schedule_jobs_on_workers_helper in
# stanford-futuredata/gavel) differs from the chapter's description in four ways, which
# ``mechanism="gavel"`` of the simulator reproduces:
# - every job starts each reset interval with R/2 seconds of credit on every type (so a job
#   that has not run yet has share (R/2) / total, not zero), and the share of type j is the
#   job's time there over the sum of all jobs' (credits included);
# - one queue per type, taken type by type (v100, p100, k80 for the _perf/_packed policies,
#   a seeded shuffle each round for the agnostic ones), each sorted by (priority, deficit, X)
#   in decreasing order, stable on job order;
# - it is work-conserving: a job with X = 0 on a type (a near-zero priority, ZERO_X below)
#   still takes an accelerator that nobody with a positive allocation wanted, as long as its
#   throughput there is positive (FIFO excepted: it skips X = 0);
# - the deficit (time owed: X x elapsed - time received, summed over reset intervals) breaks
#   priority ties.
GAVEL_TYPE_ORDER = ("v100", "p100", "k80")


# An allocation of exactly zero is never exactly zero in Gavel's runs: its interior-point solver
# (ECOS) leaves ~1e-10 there, so X x 1e9 gives a never-run cell a small positive priority and a
# cell that ran a near-zero one. ``gavel_priorities`` keeps that order with X = ZERO_X: among the
# cells a work-conserving round fills with X = 0, those that have not run on the type since the
# allocation go first. Below any real allocation (repair zeroes X < 1e-8).
ZERO_X = 1e-12
TIE_REL, TIE_ABS = 1e-6, 1e-9
"""Priorities, deficits (s) and allocations within TIE_REL x the larger magnitude + TIE_ABS are
ties: solver round-off must not decide them (Gavel's own ties fall to job order, as here)."""


def gavel_priorities(
    allocation: np.ndarray, time_s: np.ndarray, runnable: np.ndarray, *, exact: bool = False
) -> np.ndarray:
    """X / (t_kj / sum_k' t_k'j), X x 1e9 where that share is 0 (X = ZERO_X where X = 0), 0 where not runnable.

    ``exact``: the allocation is ECOS's own point (``lp_solver="ecos"``), whose near-zero
    entries already order the cells as in Gavel's runs; X is used as it is.
    """
    total = time_s.sum(axis=0, keepdims=True)
    share = np.divide(time_s, total, out=np.zeros_like(time_s), where=total > 0)
    x = allocation if exact else np.where(allocation > 0, allocation, ZERO_X)
    ratio = np.divide(x, share, out=x * NEVER_RUN_BOOST, where=share > 0)
    return np.where(runnable, ratio, 0.0)


def _queue_order(a: tuple[float, ...], b: tuple[float, ...], rel: float = TIE_REL, tie_abs: float = TIE_ABS) -> int:
    """Decreasing (priority, deficit, X) with ties within ``rel``; 0 keeps job order."""
    for u, v in zip(a, b):
        if abs(u - v) > rel * max(abs(u), abs(v)) + tie_abs:
            return -1 if u > v else 1
    return 0


def select_per_type(
    allocation: np.ndarray,
    priority: np.ndarray,
    deficit_s: np.ndarray,
    *,
    combos: tuple[tuple[int, ...], ...],
    combo_scale: np.ndarray,
    capacity: np.ndarray,
    type_order: list[int],
    runnable: np.ndarray,
    skip_zero_priority: bool,
    exact: bool = False,
) -> list[tuple[int, int]]:
    """Gavel's selection: per-type queues in ``type_order``, work-conserving (see above).

    ``skip_zero_priority`` (FIFO) skips the cells with X = 0 instead of filling with them.
    ``exact``: only equal keys are ties, as in Gavel's sort (for ECOS's own allocations).
    """
    tol = (0.0, 0.0) if exact else (TIE_REL, TIE_ABS)
    free = capacity.astype(int).copy()
    busy: set[int] = set()
    chosen: list[tuple[int, int]] = []
    for j in type_order:
        keys = {k: (priority[k, j], deficit_s[k, j], allocation[k, j]) for k in range(len(combos)) if runnable[k, j]}
        queue = sorted(keys, key=functools.cmp_to_key(lambda p, q: _queue_order(keys[p], keys[q], *tol)))
        for k in queue:
            scale = int(combo_scale[k])
            if free[j] == 0:
                break
            if scale > free[j] or any(m in busy for m in combos[k]) or (skip_zero_priority and allocation[k, j] <= 0):
                continue
            chosen.append((k, j))
            free[j] -= scale
            busy.update(combos[k])
    return chosen
