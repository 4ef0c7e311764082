"""Simulator for BPipe plans: compute plus activation evictions and loads (seed 004 Sec. 3-4).

A plan with ``bpipe`` set runs its 1F1B or interleaved 1F1B action lists as the plain
simulator does (``_sim_engine``: dependency-driven, F then B per virtual stage, transfers
between consecutive stages delay the consumer only), and in addition each evictor of
``plan.bpipe.pairs`` runs the transfers of ``cost_models.bpipe.schedule_transfers`` with
``target_inflight`` as its cap:

- an eviction issued with op j starts when op j starts (and the set's forward has ended, and
  the previous eviction of that evictor has finished: one evict stream, seed L199); a load
  starts with op j, or when op j ends for a cooldown load, after its set's eviction and the
  previous load (one load stream). Each takes latency + set bytes / bandwidth of the link
  between the pair's first ranks (``Cluster.link``); evict and load run in opposite directions
  and do not share bandwidth;
- the backward of a loaded set waits for its load to end, so a slow link delays the pipeline;
- memory: a set is allocated on its stage when its forward starts and freed when its backward
  ends (as in the engine); an eviction allocates it on the acceptor at its start and frees it
  on the evictor at its end; a load allocates it on the evictor at its start and frees it on
  the acceptor at its end. At equal times frees come first.

Peak memory and ``peak_inflight_microbatches`` count the own and foreign sets a rank holds;
the free memory of a bubble is the least over the bubble. Timeline events show compute only;
``run_bpipe`` returns the transfers with their times.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from cost_models import _sim_report as report
from cost_models._sim_costs import PipelineCosts, _replica_rank, pipeline_costs
from cost_models._sim_engine import KIND_CODE, Trace
from cost_models._sim_rr import is_round_robin
from cost_models.bpipe import SUPPORTED_SCHEDULES, Transfer, schedule_transfers
from cost_models.schedules import build_actions
from planner.errors import InvalidProblemError
from planner.schema import Action, Plan, SimResult

__all__ = ["BPipeRun", "TransferEvent", "check_bpipe_plan", "run_bpipe", "simulate_bpipe"]

Key = tuple[int, int]


@dataclass(frozen=True, slots=True)
class TransferEvent:
    """One simulated eviction (evictor -> acceptor) or load (acceptor -> evictor)."""

    kind: Literal["evict", "load"]
    evictor: int
    acceptor: int
    stage: int
    """Virtual stage of the activation set."""
    microbatch: int
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class BPipeRun:
    result: SimResult
    transfers: tuple[TransferEvent, ...]


def check_bpipe_plan(plan: Plan) -> None:
    """Reject BPipe specs the simulator cannot run (schedule, pairs, replication).

    Raises:
        InvalidProblemError: no spec, an unsupported schedule, PipeDream replication, or pairs
            outside the pipeline, pairing a stage with itself or naming a stage twice.
    """
    spec = plan.bpipe
    if spec is None:
        raise InvalidProblemError("the plan has no 'bpipe' spec")
    if plan.schedule not in SUPPORTED_SCHEDULES or is_round_robin(plan):
        raise InvalidProblemError(
            f"bpipe needs schedule '1f1b' or 'interleaved-1f1b' with every stage replicated degrees.data "
            f"times; got schedule {plan.schedule!r}, replicas {[s.replicas for s in plan.stages]}. "
            "Remove 'bpipe' or change the schedule"
        )
    p = plan.degrees.pipeline
    seen: set[int] = set()
    for evictor, acceptor in spec.pairs:
        if evictor >= p or acceptor >= p or evictor == acceptor or {evictor, acceptor} & seen:
            raise InvalidProblemError(
                f"bpipe.pairs entry ({evictor}, {acceptor}) is invalid: each pair needs two distinct stages "
                f"below degrees.pipeline={p}, each stage in at most one pair; BPipe pairs s with p-1-s"
            )
        seen |= {evictor, acceptor}


def simulate_bpipe(plan: Plan, *, include_events: bool = True) -> SimResult:
    """``simulate`` for a plan with ``bpipe`` set (see the module docstring)."""
    return run_bpipe(plan, include_events=include_events).result


def run_bpipe(plan: Plan, *, include_events: bool = True) -> BPipeRun:
    """Simulate a BPipe plan and return the result with every transfer's times.

    Raises:
        InvalidProblemError: see ``check_bpipe_plan``; a target_inflight too small to schedule.
    """
    check_bpipe_plan(plan)
    assert plan.bpipe is not None
    costs = pipeline_costs(plan)
    p, m = plan.degrees.pipeline, plan.num_microbatches
    actions = build_actions(plan.schedule, num_stages=p, num_chunks=plan.degrees.virtual, num_microbatches=m)
    plans: dict[int, tuple[int, tuple[Transfer, ...], float, float]] = {}
    for evictor, acceptor in plan.bpipe.pairs:
        bandwidth, latency = plan.cluster.link(_replica_rank(plan, evictor, 0), _replica_rank(plan, acceptor, 0))
        transfers = schedule_transfers(actions[evictor], plan.bpipe.target_inflight)
        plans[evictor] = (acceptor, transfers, bandwidth, latency)
    sim = _Sim(costs, actions, plans)
    sim.run()
    trace = sim.trace()
    result = report.flush_result(
        trace,
        recompute_s=costs.recompute_s,
        static_bytes=costs.static_bytes,
        allreduce_s=costs.allreduce_s,
        capacity_bytes=costs.memory_capacity_bytes,
        samples_per_iteration=float(plan.global_batch_size),
        include_events=include_events,
    )
    return BPipeRun(result=result, transfers=tuple(sim.transfer_events))


class _Sim:
    """Dependency-driven timing of compute and transfers, then a memory sweep per rank."""

    def __init__(
        self,
        costs: PipelineCosts,
        actions: Sequence[Sequence[Action]],
        plans: dict[int, tuple[int, tuple[Transfer, ...], float, float]],
    ) -> None:
        self.costs, self.actions, self.plans = costs, actions, plans
        num_ranks = len(actions)
        self.pos = [0] * num_ranks
        self.free = [0.0] * num_ranks
        self.starts: list[list[float]] = [[] for _ in range(num_ranks)]
        self.ends: list[list[float]] = [[] for _ in range(num_ranks)]
        self.f_end: dict[Key, float] = {}
        self.b_end: dict[Key, float] = {}
        self.evict_end: dict[Key, float] = {}
        self.load_end: dict[Key, float] = {}
        self.stream_free: dict[tuple[int, str], float] = {}
        self.loaded = {r: {(t.stage, t.microbatch) for t in plan[1] if t.kind == "load"} for r, plan in plans.items()}
        self.issued: dict[tuple[int, int], list[Transfer]] = {}
        for r, (_, transfers, _, _) in plans.items():
            for t in transfers:
                self.issued.setdefault((r, t.op_index), []).append(t)
        # (time, 0 free / 1 alloc, rank, bytes, sets)
        self.memory: list[tuple[float, int, int, float, int]] = []
        self.transfer_events: list[TransferEvent] = []

    def run(self) -> None:
        order = list(range(len(self.actions)))
        while any(self.pos[r] < len(self.actions[r]) for r in order):
            moved = [self._advance(r) for r in order]
            assert any(moved), "built-in 1F1B/interleaved lists cannot deadlock"
            order.reverse()  # forward chains resolve left to right, backward chains right to left

    def _advance(self, r: int) -> bool:
        """Time rank r's ops until one waits on another rank; True if any op was timed."""
        c, ops = self.costs, self.actions[r]
        last = c.num_virtual_stages - 1
        start_pos = self.pos[r]
        while self.pos[r] < len(ops):
            op = ops[self.pos[r]]
            key = (op.stage, op.microbatch)
            k, i = key
            if op.kind == "F":
                ready = 0.0
                if k:
                    prev = self.f_end.get((k - 1, i))
                    if prev is None:
                        break
                    ready = prev + c.send_forward_s[k - 1]
                start = max(self.free[r], ready)
                end = start + c.forward_s[k]
                self.f_end[key] = end
                self.memory.append((start, 1, r, c.activation_bytes[k], 1))
            else:
                ready = self.f_end[key]
                if k < last:
                    grad = self.b_end.get((k + 1, i))
                    if grad is None:
                        break
                    ready = max(ready, grad + c.send_backward_s[k])
                if key in self.loaded.get(r, ()):
                    ready = max(ready, self.load_end[key])  # issued with an earlier op of this rank
                start = max(self.free[r], ready)
                end = start + c.recompute_s[k] + c.backward_s[k]
                self.b_end[key] = end
                self.memory.append((end, 0, r, -c.activation_bytes[k], -1))
            self.starts[r].append(start)
            self.ends[r].append(end)
            for t in self.issued.get((r, self.pos[r]), ()):
                self._transfer(r, t, end if t.after else start)
            self.free[r] = end
            self.pos[r] += 1
        return self.pos[r] > start_pos

    def _transfer(self, evictor: int, t: Transfer, issue_s: float) -> None:
        acceptor, _, bandwidth, latency = self.plans[evictor]
        key = (t.stage, t.microbatch)
        set_bytes = self.costs.activation_bytes[t.stage]
        after = self.f_end[key] if t.kind == "evict" else self.evict_end[key]
        start = max(issue_s, after, self.stream_free.get((evictor, t.kind), 0.0))
        end = start + latency + set_bytes / bandwidth
        self.stream_free[(evictor, t.kind)] = end
        src, dst = (evictor, acceptor) if t.kind == "evict" else (acceptor, evictor)
        (self.evict_end if t.kind == "evict" else self.load_end)[key] = end
        self.memory.append((start, 1, dst, set_bytes, 1))
        self.memory.append((end, 0, src, -set_bytes, -1))
        self.transfer_events.append(TransferEvent(t.kind, evictor, acceptor, t.stage, t.microbatch, start, end))

    def trace(self) -> Trace:
        """The engine's Trace: per-op times, held bytes after each op, peaks from the sweep."""
        num_ranks = len(self.actions)
        per_rank: list[list[tuple[float, int, float, int]]] = [[] for _ in range(num_ranks)]
        for time, order, r, delta_bytes, delta_sets in sorted(self.memory, key=lambda e: (e[0], e[1])):
            per_rank[r].append((time, order, delta_bytes, delta_sets))
        peak_bytes, peak_sets, held_after = [], [], []
        for r in range(num_ranks):
            times, held, top_bytes, top_sets = _sweep(per_rank[r])
            peak_bytes.append(top_bytes)
            peak_sets.append(top_sets)
            held_after.append(_held_after_ops(times, held, self.starts[r], self.ends[r]))
        ops = [[(KIND_CODE[a.kind], a.stage, a.microbatch) for a in rank] for rank in self.actions]
        return Trace(
            ops=ops, starts=self.starts, ends=self.ends, held_bytes=held_after,
            peak_activation_bytes=peak_bytes, peak_inflight=peak_sets,
        )


def _sweep(events: list[tuple[float, int, float, int]]) -> tuple[list[float], list[float], float, int]:
    """Cumulative held bytes after each event (time order), and the peak bytes and set count."""
    times, held = [], []
    now_bytes, now_sets, top_bytes, top_sets = 0.0, 0, 0.0, 0
    for time, _, delta_bytes, delta_sets in events:
        now_bytes += delta_bytes
        now_sets += delta_sets
        top_bytes, top_sets = max(top_bytes, now_bytes), max(top_sets, now_sets)
        times.append(time)
        held.append(now_bytes)
    return times, held, top_bytes, top_sets


def _held_after_ops(times: list[float], held: list[float], starts: list[float], ends: list[float]) -> list[float]:
    """Per op, the most bytes held from its end until the next op starts (the bubble's view)."""
    out = []
    for j, end in enumerate(ends):
        nxt = starts[j + 1] if j + 1 < len(starts) else end
        lo = bisect.bisect_right(times, end)  # state after every event at or before the op's end
        hi = max(lo, bisect.bisect_left(times, nxt))
        out.append(max([held[lo - 1] if lo else 0.0] + held[lo:hi]))
    return out
