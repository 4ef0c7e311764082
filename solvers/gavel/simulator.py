"""Round-based cluster simulator for the Gavel policies (dissertation ch. 5 sec. 5.6, L5935-6072).

Time advances in rounds (6 minutes, L5761-5763). At the start of a round the jobs that have
arrived join; if the set of jobs changed (an arrival or a completion: a reset event,
L5042-5048) the policy is solved again on the remaining steps and the time-received counters
restart. The mechanism (``mechanism.select``) picks the (combination, type) cells that run.

Round rule (as Gavel's own simulator, ``Scheduler.simulate``): every job scheduled in a round
runs min(remaining steps, floor(throughput x round length)) whole steps, so it is busy for
steps / throughput seconds; the round ends when the last job running in it stops, i.e. at
the start plus the longest of those times. A round in which every running job finishes early
is short; a round of full-length jobs lasts floor(thr x R) / thr of the slowest-rounding job,
at most R. A job's completion time is when its last step ends. When no job is active the
clock jumps to the next arrival. Work is conserved: a job finishes with exactly num_steps.

Metrics (L6064-6072): average and tail job completion time (JCT), makespan (first arrival
to last completion), utilization per type (busy accelerator-seconds over capacity x
makespan), finish-time fairness per job rho = JCT / (num_steps / thr(X^iso)), with X^iso
the 1/n share at the average number of active jobs n over the job's life (Themis's
contention), and cost at ``prices_per_hour`` for busy accelerator time.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from planner.errors import InvalidProblemError
from planner.schema_gavel import ClusterSimResult, JobResult, JobsFile
from solvers.gavel import common, get_policy, solve_matrix, solved_by_ecos
from solvers.gavel import mechanism as mechanism_mod
from solvers.gavel.mechanism import Placer, select

log = logging.getLogger(__name__)

ROUND_S = 360.0
MECHANISMS = ("paper", "gavel")
MIN_RESET_S = 1920.0
"""Gavel's simulator recomputes the allocation at most this often (its default)."""
MAX_ROUNDS = 2_000_000


@dataclass
class _JobState:
    index: int
    remaining: float
    completion_s: float | None = None
    num_rounds: int = 0
    contention_sum: float = 0.0
    contention_rounds: int = 0
    cost_usd: float = 0.0


@dataclass
class _Round:
    """The allocation in force: its formulation rows map to global job indices."""

    f: common.Formulation
    x: np.ndarray
    jobs: list[int]
    start_s: float = 0.0
    credit_s: float = 0.0
    """Time every combination is credited with at the start (Gavel's code: half a round)."""
    received_s: np.ndarray = field(init=False)
    deficit_s: np.ndarray = field(init=False)
    done: set[int] = field(default_factory=set)
    """Local indices of the jobs that finished since the allocation (``gavel`` mechanism)."""

    def __post_init__(self) -> None:
        self.received_s = np.full_like(self.x, self.credit_s)
        self.deficit_s = np.zeros_like(self.x)

    def runnable(self) -> np.ndarray:
        """(combination, type) cells whose members all run there and none has finished."""
        thr = self.f.combo_throughput
        rows = [np.all(thr[k, :, :len(c)] > 0, axis=1) & (not any(m in self.done for m in c))
                for k, c in enumerate(self.f.combos)]
        return np.array(rows, dtype=bool).reshape(self.x.shape)


def simulate(
    jobs: JobsFile,
    *,
    worker_types: dict[str, int],
    policy: str,
    round_s: float = ROUND_S,
    options: dict[str, Any] | None = None,
    seed: int | None = None,
    measure: tuple[int, int] | None = None,
    prices_per_hour: dict[str, float] | None = None,
    on_round: Callable[[int, int], None] | None = None,
    mechanism: str = "gavel",
) -> ClusterSimResult:
    """Run a trace through a policy and the round-based mechanism.

    Args:
        jobs: the jobs with arrival times (``workload.generate_jobs`` or a trace).
        worker_types: accelerator counts by type.
        policy: a name of ``solvers.gavel.POLICIES``.
        round_s: round length in seconds.
        options: policy options (``num_partitions``...).
        seed: recorded in the result (the trace carries the randomness).
        measure: [first, last) job indices the averages are over (steady state); all if None.
        prices_per_hour: dollars per accelerator-hour (GCP defaults for v100/p100/k80).
        on_round: called with (jobs done, jobs total) after every round (progress bars).
        mechanism: ``gavel`` (default: Gavel's simulator code, half-round credits, per-type
            queues, work-conserving, deficits, allocations at most every ``MIN_RESET_S``) or
            ``paper`` (the chapter's Algorithm 2 with a global queue and a new allocation at
            every arrival and completion); see docs/gavel-simulator.md. ``gavel`` also solves
            the max-min policies with Gavel's normalizer (option ``las_normalizer="isolated"``),
            ``fifo_perf`` as Gavel's greedy (``fifo="greedy"``) and its makespan bisection
            (``makespan="bisection"``) unless ``options`` names them.

    Raises:
        InvalidProblemError: bad round length or window; InfeasibleError from the policy.
    """
    if round_s <= 0:
        raise InvalidProblemError(f"round length {round_s} s must be positive")
    if mechanism not in MECHANISMS:
        raise InvalidProblemError(f"mechanism {mechanism!r} is not one of {MECHANISMS}")
    get_policy(policy)
    missing = [j.id for j in jobs.jobs if j.throughputs is None]
    if missing:
        raise InvalidProblemError(f"jobs {missing[:5]} have no throughputs; derive them first (throughputs.resolve_problem)")
    sim = RoundLoop(jobs, worker_types, policy, round_s, options or {}, prices_per_hour or {})
    sim.configure(mechanism, seed)
    sim.run(on_round)
    return sim.result(seed=seed, measure=measure)


class RoundLoop:
    """Gavel's rounds over a trace: arrivals, allocations, selection, placement, bookkeeping.

    The work of a round is done by ``run_cells`` and the clock moves by ``advance_clock`` and
    ``idle_until``: here a simulation (jobs advance at their throughputs, the clock by the
    round's length); ``planner.cluster_run`` overrides the three to run real jobs on Ray in
    wall-clock time, with everything else shared.
    """

    def __init__(self, jobs: JobsFile, worker_types: dict[str, int], policy: str, round_s: float,
                 options: dict[str, Any], prices: dict[str, float]) -> None:
        self.jobs, self.worker_types, self.policy, self.round_s = jobs, worker_types, policy, round_s
        self.options, self.prices = options, {**common.DEFAULT_PRICES_PER_HOUR, **prices}
        self.types = tuple(worker_types)
        self.capacity = np.array([worker_types[t] for t in self.types], dtype=float)
        self.state = [_JobState(i, j.num_steps) for i, j in enumerate(jobs.jobs)]
        self.order = sorted(range(len(jobs.jobs)), key=lambda i: (jobs.jobs[i].arrival_time_s, i))
        self.busy_s = np.zeros(len(self.types))
        self.placer = Placer(capacity=dict(worker_types))
        self.num_rounds = self.num_allocations = self.num_preemptions = 0
        self.now = jobs.jobs[self.order[0]].arrival_time_s if jobs.jobs else 0.0
        self.configure("paper", None)

    def configure(self, mechanism: str, seed: int | None) -> None:
        self.gavel = mechanism == "gavel"
        if self.gavel and isinstance(self.options, dict):  # Gavel's code: LAS by thr(X^iso), greedy FIFO
            self.options = {"las_normalizer": "isolated", "fifo": "greedy", "makespan": "bisection", **self.options}
        self.last_reset_s = 0.0
        self.deficit_by_job: dict[int, np.ndarray] = {}
        self.shuffle = not get_policy(self.policy).heterogeneity_aware  # Gavel: agnostic policies (aliases resolved)
        self.ecos = solved_by_ecos(self.policy, self.options)
        self.rng = random.Random((seed or 0) + 5)
        known = [self.types.index(t) for t in mechanism_mod.GAVEL_TYPE_ORDER if t in self.types]
        self.type_order = known + [j for j in range(len(self.types)) if j not in known]

    def run(self, on_round: Callable[[int, int], None] | None) -> None:
        next_arrival, active, current = 0, [], None
        done, pending = 0, False
        while done < len(self.state):
            while next_arrival < len(self.order) and self.jobs.jobs[self.order[next_arrival]].arrival_time_s <= self.now:
                active.append(self.order[next_arrival])
                next_arrival += 1
                pending = True
            if not active:
                self.idle_until(self.jobs.jobs[self.order[next_arrival]].arrival_time_s)
                continue
            if current is None or (pending and self._may_reset(current)):
                current, pending = self._allocate(active, current), False
            finished, length_s = self._run_round(current, active)
            if length_s is None:  # ``gavel``: nothing could run; Gavel's code does not wait a round
                if next_arrival < len(self.order):
                    self.idle_until(self.jobs.jobs[self.order[next_arrival]].arrival_time_s)
                else:  # it forces a new allocation at once (its ``_last_reset_time = 0``)
                    self.last_reset_s, pending = 0.0, True
                continue
            if finished:
                done += len(finished)
                active = [m for m in active if m not in finished]
                current.done.update(current.jobs.index(m) for m in finished)
                pending = True
            self.advance_clock(length_s)
            self.num_rounds += 1
            if on_round is not None:
                on_round(done, len(self.state))
            if self.num_rounds > MAX_ROUNDS:
                raise InvalidProblemError(f"simulation passed {MAX_ROUNDS} rounds; lengthen --round or shorten jobs")

    def _may_reset(self, current: _Round) -> bool:
        """The chapter: at every reset event. Gavel's code: at most every MIN_RESET_S (its timer
        starts at the first reset after t = 0; a round in which nothing could run restarts it)."""
        if not self.gavel:
            return True
        return self.now - self.last_reset_s >= MIN_RESET_S or self.last_reset_s == 0.0

    def _allocate(self, active: list[int], previous: _Round | None) -> _Round:
        f, x, _, _ = solve_matrix(self._problem(active), policy=self.policy, options=self.options)
        self.num_allocations += 1
        if not self.gavel:
            return _Round(f=f, x=x, jobs=list(active), start_s=self.now)
        self._book_deficits(previous)
        new = _Round(f=f, x=x, jobs=list(active), start_s=self.now, credit_s=self.round_s / 2)
        for k, combo in enumerate(f.combos):
            if len(combo) == 1:
                new.deficit_s[k] = self.deficit_by_job.get(new.jobs[combo[0]], 0.0)
        self.last_reset_s = self.now
        return new

    def _book_deficits(self, previous: _Round | None) -> None:
        """Deficit += X x elapsed - time received, per job and type (Gavel's reset)."""
        if previous is None:
            return
        owed = previous.x * (self.now - previous.start_s) - (previous.received_s - previous.credit_s)
        for k, combo in enumerate(previous.f.combos):
            if len(combo) == 1 and combo[0] not in previous.done:
                m = previous.jobs[combo[0]]
                self.deficit_by_job[m] = self.deficit_by_job.get(m, 0.0) + owed[k]

    def _problem(self, active: list[int]) -> Any:
        from planner.schema_gavel import ClusterProblem

        ids = {self.jobs.jobs[m].id for m in active}
        jobs = [self.jobs.jobs[m].model_copy(update={
            "num_steps": max(self.state[m].remaining, 1e-9),
            "elapsed_s": max(0.0, self.now - self.jobs.jobs[m].arrival_time_s),
        }) for m in active]
        pairs = tuple(p for p in self.jobs.pairs if p.jobs[0] in ids and p.jobs[1] in ids)
        return ClusterProblem.model_construct(
            jobs=tuple(jobs), worker_types=self.worker_types, pairs=pairs,
            entities=dict(self.jobs.entities), prices_per_hour={t: self.prices[t] for t in self.types if t in self.prices},
        )

    def _run_round(self, current: _Round, active: list[int]) -> tuple[set[int], float | None]:
        """Run one round; returns the jobs that finished in it and the round's length (s).

        The length is None when the ``gavel`` mechanism selected nothing (the round does not
        happen); the chapter's mechanism idles for a round then.
        """
        f = current.f
        cells = self._select(current)
        if not cells and self.gavel:
            return set(), None
        wanted = [("+".join(f.job_ids[m] for m in f.combos[k]), self.types[j], int(f.combo_scale[k])) for k, j in cells]
        _, preempted = self.placer.place(wanted)
        self.num_preemptions += preempted
        for m in active:
            self.state[m].contention_sum += len(active)
            self.state[m].contention_rounds += 1
        busy_s, finished = self.run_cells(current, cells)
        for (k, j), busy_until in zip(cells, busy_s):
            current.received_s[k, j] += busy_until
            busy = busy_until * f.combo_scale[k]
            self.busy_s[j] += busy
            dollars = busy * self.prices.get(self.types[j], 0.0) / 3600.0
            for local in f.combos[k]:
                self.state[current.jobs[local]].cost_usd += dollars / len(f.combos[k])
        return finished, (max(busy_s) if cells else self.round_s)

    def run_cells(self, current: _Round, cells: list[tuple[int, int]]) -> tuple[list[float], set[int]]:
        """Run the round's cells; returns each cell's busy seconds and the jobs that finished."""
        f = current.f
        finished: set[int] = set()
        busy_s = [max(self._advance(current.jobs[local], f.combo_throughput[k, j, slot], finished)
                      for slot, local in enumerate(f.combos[k])) for k, j in cells]
        return busy_s, finished

    def advance_clock(self, length_s: float) -> None:
        self.now += length_s

    def idle_until(self, time_s: float) -> None:
        self.now = time_s

    def _select(self, current: _Round) -> list[tuple[int, int]]:
        f = current.f
        if not self.gavel:
            return select(current.x, current.received_s, combos=f.combos, combo_scale=f.combo_scale,
                          capacity=self.capacity)
        runnable = current.runnable()
        order = list(self.type_order)
        if self.shuffle:
            self.rng.shuffle(order)
        exact = self.ecos  # ECOS's own point: Gavel's exact ties
        prio = mechanism_mod.gavel_priorities(current.x, current.received_s, runnable, exact=exact)
        return mechanism_mod.select_per_type(
            current.x, prio, current.deficit_s, combos=f.combos, combo_scale=f.combo_scale, capacity=self.capacity,
            type_order=order, runnable=runnable, skip_zero_priority=self.policy.startswith("fifo"), exact=exact)

    def _advance(self, m: int, thr: float, finished: set[int]) -> float:
        """Run job m for a round at ``thr`` steps/s; returns the seconds it was busy.

        Whole steps per round, floor(thr x R), as Gavel's simulator; a job slower than one step
        per round runs its fractional step so that it still progresses.
        """
        st = self.state[m]
        st.num_rounds += 1
        if thr <= 0:
            return self.round_s
        per_round = round_steps(thr, self.round_s)
        if st.remaining <= per_round:
            busy = st.remaining / thr
            st.remaining = 0.0
            st.completion_s = self.now + busy
            finished.add(m)
            return busy
        st.remaining -= per_round
        return per_round / thr

    def result(self, *, seed: int | None, measure: tuple[int, int] | None) -> ClusterSimResult:
        records = [self._job_result(st) for st in self.state]
        lo, hi = measure or (0, len(records))
        if not 0 <= lo < hi <= len(records):
            raise InvalidProblemError(f"measure window [{lo}, {hi}) is outside the {len(records)} jobs")
        window = records[lo:hi]
        jct = np.array([r.jct_s for r in window])
        ftf = np.array([r.ftf for r in window])
        start = min(j.arrival_time_s for j in self.jobs.jobs)
        makespan = max(r.completion_s for r in records) - start
        return ClusterSimResult(
            policy=self.policy, seed=seed, round_s=self.round_s, num_jobs=len(records), num_rounds=self.num_rounds,
            num_allocations=self.num_allocations,
            avg_jct_s=float(jct.mean()), p50_jct_s=float(np.percentile(jct, 50)),
            p95_jct_s=float(np.percentile(jct, 95)), p99_jct_s=float(np.percentile(jct, 99)),
            makespan_s=makespan, avg_ftf=float(ftf.mean()), max_ftf=float(ftf.max()),
            utilization={t: float(self.busy_s[j] / (self.capacity[j] * makespan)) if makespan > 0 else 0.0
                         for j, t in enumerate(self.types)},
            total_cost_usd=float(sum(r.cost_usd for r in records)), num_preemptions=self.num_preemptions,
            measured_jobs=tuple(r.id for r in window), jobs=tuple(records),
        )

    def _job_result(self, st: _JobState) -> JobResult:
        job = self.jobs.jobs[st.index]
        assert st.completion_s is not None and st.remaining == 0.0, f"job {job.id} did not finish"
        jct = st.completion_s - job.arrival_time_s
        contention = st.contention_sum / max(st.contention_rounds, 1)
        return JobResult(
            id=job.id, arrival_s=job.arrival_time_s, completion_s=st.completion_s, num_steps=job.num_steps,
            steps_done=job.num_steps - st.remaining, scale_factor=job.scale_factor, jct_s=jct,
            ftf=jct / _isolated_time_s(job.num_steps, job.throughputs or {}, job.scale_factor, self.worker_types, contention),
            num_rounds=st.num_rounds, cost_usd=st.cost_usd,
        )


def round_steps(thr: float, round_s: float) -> float:
    """Steps a job runs in a full round: floor(thr x R) whole steps (Gavel), or thr x R below one."""
    steps = thr * round_s
    whole = math.floor(steps + 1e-9)
    return float(whole) if whole >= 1 else steps


def _isolated_time_s(steps: float, thr: dict[str, float], scale: int, workers: dict[str, int], n: float) -> float:
    """num_steps / thr(X^iso) with 1/n of every type (rows capped at one), Themis's baseline."""
    share = {t: min(workers[t] / n / scale, 1.0) for t in workers if thr.get(t, 0.0) > 0 and workers[t] >= scale}
    total = sum(share.values())
    scaled = {t: v / max(total, 1.0) for t, v in share.items()}
    rate = sum(thr[t] * v for t, v in scaled.items())
    return steps / rate


def cdf_points(values: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Sorted values and their empirical CDF (for the completion-time plot)."""
    xs = np.sort(np.asarray(values, dtype=float))
    return xs, np.arange(1, len(xs) + 1) / len(xs)
