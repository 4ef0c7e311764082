"""Simulate plans with very many microbatches in time independent of the microbatch count.

A flushed pipeline schedule (GPipe, 1F1B, interleaved 1F1B, the zero-bubble schedules) and
PipeDream-2BW's steady state repeat one pattern per microbatch once the pipeline is full, so
their iteration time, per-rank busy time, peak memory and in-flight count are affine in the
microbatch count m past a transient: the simulation is a longest-path (max-plus linear)
recurrence, which becomes periodic (Baccelli et al., *Synchronization and Linearity*, 1992,
ch. 3). ``simulate_many`` simulates three plans with m_a, m_a + q and m_a + 2 q microbatches
(m_a congruent to m modulo q, q = lcm(p, 12): a multiple of the interleaved schedule's group
of p microbatches and of the usual cyclicities 1-4 and 6 of the steady state), checks that the
three results lie on one line to 1e-9 relative, and extrapolates that line to m exactly. If
they do not (the transient is longer), it retries from a larger m_a; if no window is linear it
refuses the plan instead of guessing.

What an extrapolated result keeps from the largest simulated run: the bubbles of the fill and
the drain (those after the steady state are shifted to the end of the iteration; steady-state
gaps count in ``idle_s`` but are not listed one by one). Timeline events are built by a full
simulation up to ``MAX_EVENT_ACTIONS`` actions and refused above.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from planner.errors import InvalidProblemError
from planner.schema import Bubble, Plan, SimResult, StageResult

__all__ = ["MAX_EVENT_ACTIONS", "MAX_SIMULATED_ACTIONS", "needs_extrapolation", "num_actions", "simulate_many"]

MAX_SIMULATED_ACTIONS = 100_000
"""Plans with more compute actions (2 x virtual stages x microbatches) than this are extrapolated."""

MAX_EVENT_ACTIONS = 4_194_304
"""Largest plan whose timeline events are built (a full simulation); larger ones are refused."""

_REL_TOL = 1e-9
_ATTEMPTS = 3
_CYCLICITY = 12

SimulateFn = Callable[[Plan], SimResult]


def num_actions(plan: Plan) -> int:
    """Compute actions of one iteration: forward and backward per virtual stage and microbatch."""
    return 2 * plan.degrees.pipeline * plan.degrees.virtual * plan.num_microbatches


def needs_extrapolation(plan: Plan) -> bool:
    """Whether ``simulate`` should extrapolate: a built-in schedule with more actions than the cap."""
    return plan.schedule != "custom" and num_actions(plan) > MAX_SIMULATED_ACTIONS


def simulate_many(plan: Plan, simulate: SimulateFn, *, include_events: bool = False) -> SimResult:
    """The simulation of ``plan`` from three smaller ones (module docstring).

    Raises:
        InvalidProblemError: events were asked for, or no simulated window is affine in m.
    """
    m = plan.num_microbatches
    if include_events:
        raise InvalidProblemError(
            f"num_microbatches={m}: a timeline of {num_actions(plan):,} actions is too large to build "
            f"(at most {MAX_EVENT_ACTIONS:,}); simulate without --timeline/--events, or plan with fewer "
            "microbatches to look at the timeline"
        )
    p, v = plan.degrees.pipeline, plan.degrees.virtual
    # The interleaved schedule groups microbatches by p; the steady state of heterogeneous
    # stages can repeat every c microbatches (the cyclicity of the critical circuit): 12 covers c <= 4 and 6.
    step = math.lcm(p, _CYCLICITY)
    base = max(2 * p, 8)
    done: dict[int, SimResult] = {}  # a retry's window overlaps the last one: each count simulated once
    for _ in range(_ATTEMPTS):
        m_a = base + (m - base) % step
        if 3 * (m_a + step) >= m:
            return simulate(plan)  # the three runs would simulate as many microbatches as the plan
        for count in (m_a + j * step for j in range(3)):
            if count not in done:
                done[count] = simulate(_with_microbatches(plan, count))
        runs = [done[m_a + j * step] for j in range(3)]
        result = _extrapolate(plan, runs, m_a, step)
        if result is not None:
            return result
        base *= 2
    raise InvalidProblemError(
        f"num_microbatches={m} on {p} stages x {v} chunks: the schedule did not reach a periodic steady state "
        f"within {base // 2} microbatches, so it cannot be extrapolated exactly and {num_actions(plan):,} actions "
        f"are too many to simulate (at most {MAX_SIMULATED_ACTIONS:,}); use fewer microbatches"
    )


def _with_microbatches(plan: Plan, m: int) -> Plan:
    b, d = plan.microbatch_size, plan.degrees.data
    return plan.model_copy(update={"num_microbatches": m, "global_batch_size": m * b * d})


def _line(values: tuple[float, float, float], steps: float) -> float | None:
    """values[0] + steps x slope if the three equally spaced values are collinear, else None."""
    a, b, c = values
    slope = b - a
    scale = max(abs(a), abs(b), abs(c), 1e-300)
    if abs((c - b) - slope) > _REL_TOL * scale:
        return None
    return a + steps * slope


def _extrapolate(plan: Plan, runs: list[SimResult], m_a: int, step: int) -> SimResult | None:
    steps = (plan.num_microbatches - m_a) / step
    iteration = _line(tuple(r.iteration_time_s for r in runs), steps)  # type: ignore[arg-type]
    if iteration is None:
        return None
    last = runs[-1]
    shift = iteration - last.iteration_time_s
    stages = []
    for index in range(len(last.stages)):
        per = [r.stages[index] for r in runs]
        busy = _line(tuple(s.busy_s for s in per), steps)  # type: ignore[arg-type]
        peak = _line(tuple(s.peak_memory_bytes for s in per), steps)  # type: ignore[arg-type]
        inflight = _line(tuple(float(s.peak_inflight_microbatches) for s in per), steps)  # type: ignore[arg-type]
        if busy is None or peak is None or inflight is None:
            return None
        stages.append(StageResult.model_construct(
            index=per[-1].index, busy_s=busy, idle_s=max(0.0, iteration - busy), peak_memory_bytes=peak,
            peak_inflight_microbatches=int(round(inflight)),
            bubbles=_shifted_bubbles(per[-1].bubbles, last.iteration_time_s, shift),
        ))
    idle = math.fsum(s.idle_s for s in stages)
    samples = float(plan.global_batch_size)
    return SimResult.model_construct(
        iteration_time_s=iteration,
        bubble_fraction=idle / (iteration * len(stages)) if iteration > 0 else 0.0,
        throughput_samples_per_s=samples / iteration if iteration > 0 else 0.0,
        allreduce_s=last.allreduce_s,
        memory_capacity_bytes=last.memory_capacity_bytes,
        fits_memory=all(s.peak_memory_bytes <= last.memory_capacity_bytes for s in stages),
        stages=tuple(stages),
        events=(),
    )


def _shifted_bubbles(bubbles: tuple[Bubble, ...], iteration_s: float, shift_s: float) -> tuple[Bubble, ...]:
    """Bubbles of the fill as they are, those of the second half moved to the end of the iteration."""
    out = []
    for bubble in bubbles:
        if bubble.start_s >= iteration_s / 2:
            bubble = bubble.model_copy(update={"start_s": bubble.start_s + shift_s, "end_s": bubble.end_s + shift_s})
        out.append(bubble)
    return tuple(out)
