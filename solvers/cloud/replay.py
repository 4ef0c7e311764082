"""Replay of the end-to-end strategies of ch. 6 sec. 6.3.2 (Figs. 6.5 and 6.6) over a price trace.

One single-job run on spot instances. The strategies are cumulative, as in the chapter:

- ``baseline``: the cheapest 1xV100 instance on AWS (us-east-1) when the job starts, kept;
- ``gpu-type``: the single-GPU AWS type with the best cost-normalized throughput at the start;
- ``multi-gpu``: multi-GPU AWS types too, paying one GPU's share (jobs packed, Fig. 6.4);
- ``multi-cloud``: AWS and Azure types, the best at the start, kept;
- ``dynamic``: as multi-cloud, but at every price change the job moves to the type with the
  lowest dollars per step when the saving over the rest of the job pays for the move
  (checkpoint egress across clouds, restart time) and is at least ``min_saving`` of the rest's
  cost at current prices (hysteresis), at most ``max_switches`` times. With
  ``decide_every_h`` it decides only every that many hours from the start instead; the
  chapter's own evaluation decides once a day, moves whenever another type is cheaper per step
  (``min_saving`` 0) and caps nothing (``max_switches`` None): ``CHAPTER_RULE``.

Prices are piecewise constant (``solvers.cloud.traces``); a job pays its share of the price for
every hour it holds an instance. Preemptions are optional (seeded, Poisson at the catalogue's
rates): each costs the restart time and, when the checkpoint does not fit in the notice, half
a checkpoint interval of work, and the job resumes on its strategy's choice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from planner.errors import InvalidProblemError
from planner.schema_cloud import Catalogue, CloudJob, PriceTrace, ReplayResult, ReplayStep
from solvers.cloud.catalogue import spot_preemption_rate
from solvers.cloud.traces import check_trace


@dataclass(frozen=True, slots=True, kw_only=True)
class Scope:
    clouds: tuple[str, ...]
    accelerators: tuple[str, ...] | None = None
    single_gpu: bool = False
    dynamic: bool = False


CHAPTER_RULE = {"decide_every_h": 24.0, "min_saving": 0.0, "max_switches": None}
"""The dynamic strategy as the chapter's evaluation ran it (sec. 6.3.2; its published notebook
re-decides the instance at every day boundary, with no threshold and no cap on moves)."""

STRATEGIES: dict[str, Scope] = {
    "baseline": Scope(clouds=("aws",), accelerators=("v100",), single_gpu=True),
    "gpu-type": Scope(clouds=("aws",), single_gpu=True),
    "multi-gpu": Scope(clouds=("aws",)),
    "multi-cloud": Scope(clouds=("aws", "azure")),
    "dynamic": Scope(clouds=("aws", "azure"), dynamic=True),
}


@dataclass(frozen=True)
class Market:
    """The trace as a matrix: prices[i, k] of candidate k from times_h[i] to times_h[i + 1]."""

    times_h: np.ndarray
    prices: np.ndarray
    labels: tuple[str, ...]
    instances: tuple[str, ...]
    clouds: tuple[str, ...]
    accelerators: tuple[str, ...]
    num_accelerators: np.ndarray
    preemption_rate_per_h: np.ndarray


def market(trace: PriceTrace, catalogue: Catalogue) -> Market:
    """Align every series of the trace on the union of its change times."""
    check_trace(trace, catalogue)
    times = np.unique(np.concatenate([[p.time_h for p in s.points] for s in trace.series]))
    prices = np.empty((len(times), len(trace.series)))
    for k, s in enumerate(trace.series):
        t = np.array([p.time_h for p in s.points])
        v = np.array([p.usd_per_h for p in s.points])
        prices[:, k] = v[np.maximum(np.searchsorted(t, times, side="right") - 1, 0)]
    insts = [catalogue.instance(s.instance) for s in trace.series]
    return Market(times_h=times, prices=prices, labels=tuple(f"{s.instance}@{s.zone}" for s in trace.series),
                  instances=tuple(s.instance for s in trace.series), clouds=tuple(i.cloud for i in insts),
                  accelerators=tuple(i.accelerator for i in insts),
                  num_accelerators=np.array([i.num_accelerators for i in insts]),
                  preemption_rate_per_h=np.array([spot_preemption_rate(i, catalogue) for i in insts]))


def replay(job: CloudJob, mk: Market, catalogue: Catalogue, *, strategy: str, start_h: float = 0.0,
           max_switches: int | None = 3, min_saving: float = 0.1, decide_every_h: float | None = None,
           preemptions: bool = False, seed: int = 0) -> ReplayResult:
    """Run one job from ``start_h`` under a strategy; returns its dollars, moves and timeline.

    Raises:
        InvalidProblemError: an unknown strategy, a start after the trace's last price change, or no
            instance in the strategy's scope can run the job.
    """
    if strategy not in STRATEGIES:
        raise InvalidProblemError(f"unknown strategy {strategy!r}; choose from {list(STRATEGIES)}")
    if decide_every_h is not None and not decide_every_h > 0:
        raise InvalidProblemError(f"decide_every_h={decide_every_h} must be positive (hours between decisions)")
    last_h = float(mk.times_h[-1])
    if not 0.0 <= start_h <= last_h:
        raise InvalidProblemError(f"start_h={start_h:g} h is outside the price trace, whose last price change is at "
                                  f"{last_h:g} h; start between 0 and {last_h:g} (--start-h)")
    scope = STRATEGIES[strategy]
    speed, share = _candidates(job, mk, scope)
    if not (speed > 0).any():
        raise InvalidProblemError(f"job {job.id!r}: no instance of strategy {strategy!r} (clouds {list(scope.clouds)}) "
                                  f"can run it; its throughputs cover {sorted(job.throughputs or {})}")
    run = _Run(job, mk, catalogue, speed, share, scope.dynamic, max_switches, preemptions, seed)
    run.min_saving, run.decide_every_h = min_saving, decide_every_h
    return run.go(strategy, start_h)


def _candidates(job: CloudJob, mk: Market, scope: Scope) -> tuple[np.ndarray, np.ndarray]:
    """Steps per hour and the job's share of an instance for each candidate (0 = out of scope)."""
    thr = job.throughputs or {}
    per_instance = mk.num_accelerators // job.num_accelerators
    ok = np.array([c in scope.clouds and (scope.accelerators is None or a in scope.accelerators)
                   for c, a in zip(mk.clouds, mk.accelerators)])
    if scope.single_gpu:
        ok &= mk.num_accelerators == job.num_accelerators
    ok &= per_instance >= 1
    speed = np.array([thr.get(a, 0.0) * 3600.0 for a in mk.accelerators]) * ok
    share = np.where(per_instance >= 1, 1.0 / np.maximum(per_instance, 1), 0.0)
    return speed, share


class _Run:
    """The event loop of one replay (a class only to keep the loop's state together)."""

    def __init__(self, job: CloudJob, mk: Market, catalogue: Catalogue, speed: np.ndarray, share: np.ndarray,
                 dynamic: bool, max_switches: int | None, preemptions: bool, seed: int) -> None:
        self.job, self.mk, self.cat = job, mk, catalogue
        self.speed, self.share = speed, share
        with np.errstate(divide="ignore", invalid="ignore"):
            self.weight = np.where(speed > 0, share / np.where(speed > 0, speed, 1.0), np.inf)  # $/step per $/h
        self.dynamic, self.max_switches = dynamic, max_switches
        self.rng = np.random.default_rng(seed) if preemptions else None
        self.steps: list[ReplayStep] = []
        self.compute = self.egress = 0.0
        self.switches = self.preempted = 0
        self.visited: set[str] = set()
        self.min_saving = 0.0
        self.decide_every_h: float | None = None

    def best(self, i: int) -> int:
        return int(np.argmin(self.mk.prices[i] * self.weight))

    def go(self, strategy: str, start_h: float) -> ReplayResult:
        mk = self.mk
        self.i = max(int(np.searchsorted(mk.times_h, start_h, side="right")) - 1, 0)
        self.t, self.remaining, self.cur = start_h, float(self.job.num_steps), self.best(self.i)
        self.seg_start, self.seg_usd = self.t, 0.0
        self.egress += self._dataset_usd(mk.clouds[self.cur])
        self._enter(self.cur)
        self.next_preempt = self._draw(self.t, self.cur)
        every = self.decide_every_h
        self.next_decision = start_h + every if every else math.inf
        while self.remaining > 0.0:
            end = mk.times_h[self.i + 1] if self.i + 1 < len(mk.times_h) else math.inf
            if self.t >= end:  # a restart ran past a price change
                self.i += 1
            elif self._advance(min(end, self.next_decision)) and self.t == self.next_preempt:
                self._preempt()
            elif self.remaining > 0.0:
                if self.t >= end:
                    self._next_price()
                if every and self.t >= self.next_decision:
                    while self.next_decision <= self.t:
                        self.next_decision += every
                    self._maybe_move(self.i)
        self._close(self.seg_start, self.t, self.cur, self.seg_usd)
        return ReplayResult(strategy=strategy, job=self.job.id, total_usd=self.compute + self.egress,
                            compute_usd=self.compute, egress_usd=self.egress, duration_h=self.t - start_h,
                            num_switches=self.switches, num_preemptions=self.preempted, steps=tuple(self.steps))

    def _advance(self, end: float) -> bool:
        """Train until the price changes, the job ends or a preemption; True unless it ended."""
        cur = self.cur
        finish = self.t + self.remaining / self.speed[cur]
        stop = min(end, finish, self.next_preempt)
        self.remaining = 0.0 if stop == finish else self.remaining - self.speed[cur] * (stop - self.t)
        self.seg_usd += self.mk.prices[self.i, cur] * self.share[cur] * (stop - self.t)
        self.t = stop
        return self.remaining > 0.0

    def _preempt(self) -> None:
        """Restart (on the same type, or the best one if dynamic), losing work the notice could not save."""
        cur = self.cur
        self.preempted += 1
        lost_h = self.job.restart_s / 3600
        self.seg_usd += self.mk.prices[self.i, cur] * self.share[cur] * lost_h
        self.remaining = min(self.remaining + self.speed[cur] * self._lost_work_h(cur), float(self.job.num_steps))
        self.t += lost_h
        nxt = self.best(self.i) if self.dynamic else cur
        self.egress += self._move_usd(cur, nxt)
        self._enter(nxt)
        self._close(self.seg_start, self.t, cur, self.seg_usd)
        self.seg_start, self.seg_usd, self.cur = self.t, 0.0, nxt
        self.next_preempt = self._draw(self.t, nxt)

    def _next_price(self) -> None:
        """Step to the next price interval; a dynamic job moves when that pays (module docstring)."""
        mk, cur = self.mk, self.cur
        self.i += 1
        i = self.i
        if mk.prices[i, cur] != mk.prices[i - 1, cur]:  # one step per price: exact cost curves
            self._close(self.seg_start, self.t, cur, self.seg_usd)
            self.seg_start, self.seg_usd = self.t, 0.0
        if self.decide_every_h is None:
            self._maybe_move(i)

    def _maybe_move(self, i: int) -> None:
        """Move to the cheapest type per step when that pays (module docstring)."""
        mk, cur = self.mk, self.cur
        if not self.dynamic or (self.max_switches is not None and self.switches >= self.max_switches):
            return
        nxt = self.best(i)
        now = mk.prices[i, cur] * self.weight[cur] * self.remaining
        saving = now - mk.prices[i, nxt] * self.weight[nxt] * self.remaining
        restart_usd = mk.prices[i, nxt] * self.share[nxt] * self.job.restart_s / 3600
        if nxt == cur or saving <= self._move_usd(cur, nxt) + restart_usd or saving < self.min_saving * now:
            return
        self._close(self.seg_start, self.t, cur, self.seg_usd)
        self.egress += self._move_usd(cur, nxt)
        self._enter(nxt)
        self.switches += 1
        self.seg_start, self.seg_usd, self.cur = self.t, restart_usd, nxt
        self.t += self.job.restart_s / 3600
        self.next_preempt = self._draw(self.t, nxt)

    def _close(self, start: float, end: float, cur: int, usd: float) -> None:
        self.compute += usd
        if end > start or usd > 0:
            self.steps.append(ReplayStep(start_h=start, end_h=end, option=self.mk.labels[cur], usd=usd))

    def _draw(self, t: float, cur: int) -> float:
        rate = self.mk.preemption_rate_per_h[cur]
        if self.rng is None or rate <= 0:
            return math.inf
        return t + float(self.rng.exponential(1.0 / rate))

    def _lost_work_h(self, cur: int) -> float:
        notice = self.cat.clouds[self.mk.clouds[cur]].preemption_notice_s
        return 0.0 if self.job.checkpoint_s <= notice else self.job.checkpoint_interval_s / 2 / 3600

    def _move_usd(self, cur: int, nxt: int) -> float:
        """Checkpoint (and dataset, if it is not already there) out of the old cloud."""
        src, dst = self.mk.clouds[cur], self.mk.clouds[nxt]
        if src == dst:
            return 0.0
        return self.job.checkpoint_gb * self.cat.clouds[src].egress_usd_per_gb + self._dataset_usd(dst)

    def _dataset_usd(self, cloud: str) -> float:
        """The dataset goes to each cloud once, from its home cloud (Table 6.2's note)."""
        home = self.job.dataset_cloud
        if home is None or cloud == home or cloud in self.visited or home not in self.cat.clouds:
            return 0.0
        return self.job.dataset_gb * self.cat.clouds[home].egress_usd_per_gb

    def _enter(self, cur: int) -> None:
        self.visited.add(self.mk.clouds[cur])
