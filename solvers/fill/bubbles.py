"""The bubbles PipeFill fills, from the one schedule simulator (seed 000 L52, L113-117, L180).

The simulator reports every idle interval of each rank inside one iteration
(``SimResult.stages[].bubbles``). The bubble pattern repeats every iteration (L125: "a cycle of
bubbles"), so a rank's tail (idle after its last op) and head (idle before its first op of the
next iteration) are one bubble: the **fill-drain** bubble, s (t_f + t_b) for stage s (reading
Sec. 1.2, derived). Of the other gaps the longest is the **fwd-bwd** bubble, GPipe's
(S-s-1)(t_f+t_b) and 1F1B's (S-s-1) t_b + max(0, S-s-m) t_f (L180, minus signs rebuilt in the
reading); the rest ("other", e.g. 1F1B's cool-down gaps of t_f) PipeFill does not fill (L180)
unless ``kinds="all"``. Each bubble may be used for ``fill_fraction`` of its duration (0.68 in
the paper, L231) and ``memory_fraction`` of its free memory (L115), or a fixed free memory (the
paper's simulator uses 4.5 GB, L229).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from planner.errors import InvalidProblemError
from planner.schema import Bubble, SimResult
from planner.schema_fill import FillBubble, StageBubbles

PAPER_FILL_FRACTION = 0.68
"""Share of each bubble the Executors fill by default: main-job overhead < 2% up to 68% (L231)."""
PAPER_FREE_MEMORY_BYTES = 4.5e9
"""Free memory in bubbles measured on 16 GB V100s for the 5B and 40B jobs (L229)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BubbleOptions:
    """How bubbles are turned into the Executor's (duration, memory) cycle."""

    fill_fraction: float = PAPER_FILL_FRACTION
    memory_fraction: float = 1.0
    """Share of the simulator's free memory a fill job may use (a safety margin, L115)."""
    free_memory_bytes: float | None = None
    """Fixed free memory for every bubble (the paper's 4.5 GB); None uses the simulator's."""
    kinds: Literal["pipefill", "all"] = "pipefill"
    """``pipefill``: fill-drain and fwd-bwd only (L180); ``all``: every idle interval."""


def closed_form_bubble_fraction(num_stages: int, num_microbatches: int) -> float:
    """(p - 1) / (m + p - 1): idle share of GPipe and 1F1B (seed 000 L52, L66, L72)."""
    return (num_stages - 1) / (num_microbatches + num_stages - 1)


def check_options(options: BubbleOptions) -> None:
    """Raises InvalidProblemError on a fraction outside (0, 1] or a negative memory."""
    for name in ("fill_fraction", "memory_fraction"):
        value = getattr(options, name)
        if not 0 < value <= 1:
            raise InvalidProblemError(f"{name}={value} must be in (0, 1]; the paper fills 0.68 of each bubble")
    if options.free_memory_bytes is not None and options.free_memory_bytes <= 0:
        raise InvalidProblemError(f"free_memory_bytes={options.free_memory_bytes} must be positive (paper: 4.5e9)")
    if options.kinds not in ("pipefill", "all"):
        raise InvalidProblemError(f"bubble kinds {options.kinds!r} unknown; choose 'pipefill' or 'all'")


def stage_bubbles(sim: SimResult, options: BubbleOptions = BubbleOptions()) -> tuple[StageBubbles, ...]:
    """Every stage's bubble cycle, in the order the Executor meets them within an iteration.

    Args:
        sim: one simulated iteration of the main job.
        options: fill fraction, memory and which kinds to keep.

    Returns:
        One ``StageBubbles`` per pipeline rank; a rank without bubbles has an empty tuple.

    Raises:
        InvalidProblemError: bad options, or a plan whose stages have no bubble at all.
    """
    check_options(options)
    if not sim.stages:
        raise InvalidProblemError("the simulation has no stages; plan the main job first (paraplan plan)")
    fixed, capacity = options.free_memory_bytes, sim.memory_capacity_bytes
    if fixed is not None and 0 < capacity < float("inf") and fixed > capacity:
        raise InvalidProblemError(
            f"free_memory_bytes={fixed:.4g} (--free-memory-gb {fixed / 1e9:g}) exceeds the "
            f"{capacity / 1e9:.4g} GB the plan's GPUs have; give at most that (the paper fixes 4.5 GB)")
    out = tuple(
        StageBubbles(stage=s.index, bubbles=_cycle(s.bubbles, sim.iteration_time_s, options)) for s in sim.stages
    )
    if not any(s.bubbles for s in out):
        raise InvalidProblemError(
            "the main job has no bubbles to fill (every stage is busy the whole iteration); PipeFill needs a "
            "pipeline with p >= 2 stages or use kinds='all' for short gaps"
        )
    return out


def _cycle(raw: tuple[Bubble, ...], iteration_s: float, options: BubbleOptions) -> tuple[FillBubble, ...]:
    """Merge tail + head into the fill-drain bubble, label the longest gap fwd-bwd."""
    gaps = [(b.start_s, b.end_s - b.start_s, b.free_memory_bytes) for b in raw]
    fill_drain = None
    tol = 1e-9 * iteration_s
    head = gaps.pop(0) if gaps and gaps[0][0] <= tol else None
    tail = gaps.pop() if gaps and gaps[-1][0] + gaps[-1][1] >= iteration_s - tol else None
    if head or tail:
        parts = [g for g in (tail, head) if g]
        fill_drain = (parts[0][0], sum(g[1] for g in parts), min(g[2] for g in parts))
    longest = max(range(len(gaps)), key=lambda i: (gaps[i][1], -i)) if gaps else None
    labelled = [("fwd-bwd" if i == longest else "other", *g) for i, g in enumerate(gaps)]
    if fill_drain is not None:
        labelled.append(("fill-drain", *fill_drain))
    if options.kinds == "pipefill":
        labelled = [g for g in labelled if g[0] != "other"]
    return tuple(_bubble(kind, start, dur, free, options) for kind, start, dur, free in labelled)


def _bubble(kind: str, start: float, duration: float, free: float, options: BubbleOptions) -> FillBubble:
    memory = options.free_memory_bytes if options.free_memory_bytes is not None else free * options.memory_fraction
    return FillBubble(
        kind=kind,  # type: ignore[arg-type]
        start_s=start,
        duration_s=duration,
        usable_s=duration * options.fill_fraction,
        free_memory_bytes=max(0.0, memory),
    )
