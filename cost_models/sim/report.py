"""Turn an engine trace into the simulator's output contract (architecture.md, simulator output).

Two views of a trace:
- one flushed iteration (every schedule but 2BW): the window [0, iteration), where each rank's
  data-parallel all-reduce ("AR") starts when its last compute ends;
- the steady state of PipeDream-2BW: the window between the completions of two consecutive
  batches of a run without flushes, shifted to start at 0 (actions crossing the window edges
  are clipped; microbatches are numbered within their batch).

Bubbles are the idle intervals of each rank inside the window, touching ones merged and those
shorter than ``_TOLERANCE`` x iteration time dropped (float noise, not idle time). The memory
in use during a bubble is the rank's static bytes plus the activations it holds then.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from cost_models.sim.pipeline import KIND_NAME, Trace
from planner.schema import Bubble, SimResult, StageResult, TimelineEvent

_TOLERANCE = 1e-10


def flush_result(
    trace: Trace,
    *,
    recompute_s: Sequence[float],
    static_bytes: Sequence[float],
    allreduce_s: Sequence[float],
    capacity_bytes: float,
    samples_per_iteration: float,
    include_events: bool,
    include_bubbles: bool = True,
) -> SimResult:
    """One iteration ending with a flush: iteration = max over ranks of last end + all-reduce."""
    num_ranks = len(trace.ops)
    last_end = [ends[-1] if ends else 0.0 for ends in trace.ends]
    iteration = max((last_end[r] + allreduce_s[r] for r in range(num_ranks)), default=0.0)
    stages = []
    for r in range(num_ranks):
        ar = allreduce_s[r]
        busy = math.fsum(e - s for s, e in zip(trace.starts[r], trace.ends[r])) + ar
        held_end = trace.held_bytes[r][-1] if trace.held_bytes[r] else 0.0
        bubbles = _bubbles(
            trace.starts[r] + [last_end[r]],
            trace.ends[r] + [last_end[r] + ar],
            trace.held_bytes[r] + [held_end],
            initial_held=0.0,
            window_end=iteration,
            static=static_bytes[r],
            capacity=capacity_bytes,
        ) if include_bubbles else []
        stages.append(_stage(r, busy, iteration, trace, static_bytes[r], bubbles))
    events: list[TimelineEvent] = []
    if include_events:
        for r in range(num_ranks):
            events.extend(_rank_events(r, trace, recompute_s, 0.0, math.inf, None))
            if allreduce_s[r] > 0:
                events.append(TimelineEvent(r, "AR", -1, -1, last_end[r], last_end[r] + allreduce_s[r]))
    return _result(stages, iteration, samples_per_iteration, max(allreduce_s, default=0.0), capacity_bytes, events)


def steady_result(
    trace: Trace,
    *,
    num_microbatches: int,
    measured_batch: int,
    recompute_s: Sequence[float],
    static_bytes: Sequence[float],
    allreduce_s: Sequence[float],
    capacity_bytes: float,
    samples_per_iteration: float,
    include_events: bool,
    include_bubbles: bool = True,
) -> SimResult:
    """Steady state per batch of a flush-free run (PipeDream-2BW).

    The window runs from the completion of batch ``measured_batch - 1`` to that of
    ``measured_batch`` (completion = last end of any action of the batch's microbatches). The
    all-reduce of a batch overlaps the next batch's compute (2BW cost model, dissertation
    L2675-2694: max of compute and all-reduce per batch), so iteration = max(window, largest
    all-reduce) and AR is not on the timeline.
    """
    m = num_microbatches
    done = [0.0, 0.0]
    first = measured_batch - 1
    for rank_ops, ends in zip(trace.ops, trace.ends):
        for (_, _, i), end in zip(rank_ops, ends):
            batch = i // m - first
            if 0 <= batch < 2 and end > done[batch]:
                done[batch] = end
    lo, hi = done
    iteration = max(hi - lo, max(allreduce_s, default=0.0))
    stages = []
    for r in range(len(trace.ops)):
        starts, ends, held, initial = _clip(trace.starts[r], trace.ends[r], trace.held_bytes[r], lo, hi)
        busy = math.fsum(e - s for s, e in zip(starts, ends))
        bubbles = _bubbles(
            starts, ends, held, initial_held=initial, window_end=iteration, static=static_bytes[r],
            capacity=capacity_bytes,
        ) if include_bubbles else []
        stages.append(_stage(r, busy, iteration, trace, static_bytes[r], bubbles))
    events: list[TimelineEvent] = []
    if include_events:
        for r in range(len(trace.ops)):
            events.extend(_rank_events(r, trace, recompute_s, lo, hi, m))
    return _result(stages, iteration, samples_per_iteration, max(allreduce_s, default=0.0), capacity_bytes, events)


def _clip(
    starts: list[float], ends: list[float], held: list[float], lo: float, hi: float
) -> tuple[list[float], list[float], list[float], float]:
    """Intervals inside [lo, hi), shifted by -lo, and the activation bytes held at lo."""
    out_s, out_e, out_h = [], [], []
    initial = 0.0
    for s, e, h in zip(starts, ends, held):
        if e <= lo:
            initial = h
            continue
        if s >= hi:
            break
        out_s.append(max(s, lo) - lo)
        out_e.append(min(e, hi) - lo)
        out_h.append(h)
    return out_s, out_e, out_h, initial


def _bubbles(
    starts: Sequence[float],
    ends: Sequence[float],
    held: Sequence[float],
    *,
    initial_held: float,
    window_end: float,
    static: float,
    capacity: float,
) -> list[Bubble]:
    """Idle intervals of one rank in [0, window_end) given its busy intervals in time order."""
    tol = _TOLERANCE * window_end
    gaps: list[list[float]] = []  # [start, end, free bytes]
    prev_end, prev_held = 0.0, initial_held
    for s, e, h in zip(starts, ends, held):
        if s - prev_end > tol:
            _add_gap(gaps, prev_end, s, capacity - static - prev_held, tol)
        if e > prev_end:
            prev_end = e
        prev_held = h
    if window_end - prev_end > tol:
        _add_gap(gaps, prev_end, window_end, capacity - static - prev_held, tol)
    return [_bubble(g[0], g[1], g[2]) for g in gaps]


_BUBBLE_FIELDS = frozenset(("start_s", "end_s", "free_memory_bytes"))
_FIELDS_SET = set(_BUBBLE_FIELDS)
"""Shared by every bubble built here: pydantic copies it before changing it (``model_copy``), and
one object instead of a new set per bubble spares the garbage collector tens of thousands."""
_new, _set = object.__new__, object.__setattr__


def _bubble(start_s: float, end_s: float, free_bytes: float) -> Bubble:
    """A ``Bubble`` of plain floats computed here, without validation: what ``model_construct``
    builds, at a third of its cost (a 64 x 512 1F1B has tens of thousands of bubbles)."""
    b = _new(Bubble)
    _set(b, "__dict__", {"start_s": start_s, "end_s": end_s, "free_memory_bytes": free_bytes})
    _set(b, "__pydantic_fields_set__", _FIELDS_SET)
    _set(b, "__pydantic_extra__", None)
    _set(b, "__pydantic_private__", None)
    return b


def _add_gap(gaps: list[list[float]], start: float, end: float, free: float, tol: float) -> None:
    # A zero-length action between two gaps leaves them touching: report one bubble, with the
    # smaller free memory of the two so that a filler sized to it fits throughout.
    if gaps and start - gaps[-1][1] <= tol:
        gaps[-1][1] = end
        gaps[-1][2] = min(gaps[-1][2], free)
    else:
        gaps.append([start, end, free])


def _stage(r: int, busy: float, iteration: float, trace: Trace, static: float, bubbles: list[Bubble]) -> StageResult:
    return StageResult(
        index=r,
        busy_s=busy,
        idle_s=max(0.0, iteration - busy),
        peak_memory_bytes=static + trace.peak_activation_bytes[r],
        peak_inflight_microbatches=trace.peak_inflight[r],
        bubbles=tuple(bubbles),
    )


def _rank_events(
    r: int, trace: Trace, recompute_s: Sequence[float], lo: float, hi: float, relabel: int | None
) -> list[TimelineEvent]:
    """Compute events of rank r inside [lo, hi), shifted by -lo; B/I with recompute show R first."""
    out: list[TimelineEvent] = []
    clip = lo > 0.0 or hi < math.inf
    for (code, k, i), s, e in zip(trace.ops[r], trace.starts[r], trace.ends[r]):
        if clip and (e <= lo or s >= hi):
            continue
        mb = i % relabel if relabel else i
        rec = recompute_s[k] if code in (1, 2) else 0.0
        pieces = [("R", s, s + rec), (KIND_NAME[code], s + rec, e)] if rec > 0 else [(KIND_NAME[code], s, e)]
        for kind, a, b in pieces:
            if clip:
                a, b = max(a, lo) - lo, min(b, hi) - lo
                if b <= a:
                    continue
            out.append(TimelineEvent(r, kind, k, mb, a, b))
    return out


def _result(
    stages: list[StageResult],
    iteration: float,
    samples: float,
    allreduce: float,
    capacity: float,
    events: list[TimelineEvent],
) -> SimResult:
    idle = math.fsum(s.idle_s for s in stages)
    # model_construct: the fields are built here from validated parts; validating tens of
    # thousands of NamedTuple events again would dominate the simulation time.
    return SimResult.model_construct(
        iteration_time_s=iteration,
        bubble_fraction=idle / (iteration * len(stages)) if iteration > 0 else 0.0,
        throughput_samples_per_s=samples / iteration if iteration > 0 else 0.0,
        allreduce_s=allreduce,
        memory_capacity_bytes=capacity,
        fits_memory=all(s.peak_memory_bytes <= capacity for s in stages),
        stages=tuple(stages),
        events=tuple(events),
    )
