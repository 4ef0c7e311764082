"""The timeline picture of a simulated plan: one row per pipeline rank, one box per compute event.

The picture follows the pipeline diagrams of the PTD-P chapter (dissertation [narayanan-thesis], Figs.
4.3-4.4, [narayanan-thesis] ch. 4) and of Zero Bubble (Qi et al. 2023, Fig. 3): rank 0 on top, time to the
right, forward (F), backward (B), input-gradient (I), weight-gradient (W), recompute (R) and
data-parallel all-reduce (AR) in distinct colours, idle time hatched grey, microbatch numbers in
boxes wide enough to hold them. Rows are labelled with the global ranks each stage runs on;
large plans are drawn as two windows (fill and drain) so that single operations stay
readable; a panel below shows each stage's memory in use over time. Later model chunks of an interleaved plan are drawn in a paler
shade of their kind's colour. Each kind and shade is one ``broken_barh`` call, so that tens of
thousands of events render in seconds. matplotlib is imported inside ``draw_timeline`` (Agg
canvas, no pyplot), so importing this module is cheap and works headless.
"""

from __future__ import annotations

import logging
import warnings
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from planner.errors import InvalidProblemError
from planner.schema import SimResult, TimelineEvent

logger = logging.getLogger(__name__)

__all__ = ["AUTO_MAX_EVENTS_PER_RANK", "AUTO_MICROBATCHES", "Window", "draw_timeline"]

# Kind -> (colour, legend label). Drawn in this order, so R and AR sit on top of what they overlap.
_KINDS: dict[str, tuple[str, str]] = {
    "F": ("#4c78a8", "F forward"),
    "B": ("#54a24b", "B backward"),
    "I": ("#72b7b2", "I input grad"),
    "W": ("#b279a2", "W weight grad"),
    "R": ("#f58518", "R recompute"),
    "AR": ("#9d755d", "AR all-reduce"),
    # resource rows (host links, CPUs, BPipe pair links), drawn below the ranks
    "P": ("#e45756", "P parameter prefetch"),
    "G": ("#ff9da6", "G gradient offload"),
    "O": ("#bab0ac", "O CPU optimizer step"),
    "EV": ("#eeca3b", "EV BPipe evict"),
    "LD": ("#9ecae9", "LD BPipe load"),
}
_SUFFIXES = {".png": "png", ".svg": "svg"}
_DPI = 100
_MAX_WIDTH_IN = 80.0  # keeps the PNG under ~8000 px wide; very long runs just lose their labels
_MAX_LABELS = 20_000
_ROW_HEIGHT = 0.8
_IDLE_COLOUR = "#f2f2f2"
_IDLE_HATCH_COLOUR = "#c8c8c8"


Window = Literal["auto", "all"] | tuple[float, float]
"""Which part of the iteration to draw: ``all``; a time range (start_s, end_s); or ``auto``:
all of it when every rank has at most ``AUTO_MAX_EVENTS_PER_RANK`` events, else two panels,
the first and the last ``AUTO_MICROBATCHES`` microbatches (fill and drain)."""
AUTO_MAX_EVENTS_PER_RANK = 400
AUTO_MICROBATCHES = 4


def draw_timeline(
    sim: SimResult,
    path: str | Path,
    *,
    title: str | None = None,
    resources: Mapping[str, Sequence[tuple[str, float, float]]] | None = None,
    row_labels: Sequence[str] | None = None,
    window: Window = "auto",
    memory: Mapping[int, Sequence[tuple[float, float]]] | None = None,
) -> Path:
    """Draw a simulated timeline to a PNG or SVG file.

    Args:
        sim: a simulation result with ``events`` (simulate with events included).
        path: the output file; its suffix (``.png`` or ``.svg``) picks the format.
        title: a title above the picture; by default the iteration time and bubble fraction.
        resources: extra rows below the ranks, label -> (kind, start, end) intervals: host
            links and CPUs of offloaded plans, BPipe's pair links
            (``cost_models.simulate.resource_timelines``).
        row_labels: one label per pipeline rank (e.g. "stage 1 (ranks 16-31)"); default "rank r".
        window: what to draw (see ``Window``).
        memory: per rank, the memory in use as (time, bytes) steps; drawn in a panel below.

    Returns:
        The path written.

    Raises:
        InvalidProblemError: a suffix other than .png / .svg, a result without events, or an
            empty window.
    """
    out = Path(path)
    fmt = _SUFFIXES.get(out.suffix.lower())
    if fmt is None:
        raise InvalidProblemError(
            f"timeline file {str(out)!r} has suffix {out.suffix!r}; use .png or .svg"
        )
    if not sim.events:
        raise InvalidProblemError(
            "the simulation result has no timeline events; simulate with events included "
            "(api.simulate(plan, include_events=True), or paraplan simulate --timeline)"
        )
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    num_ranks = max(max(e.rank for e in sim.events) + 1, len(sim.stages))
    extra = list((resources or {}).items())
    row_events = tuple(
        TimelineEvent(num_ranks + row, kind, -1, -1, start, end)
        for row, (_, spans) in enumerate(extra) for kind, start, end in spans
    )
    events = sim.events + row_events
    if row_labels is not None and len(row_labels) != num_ranks:
        raise InvalidProblemError(f"{len(row_labels)} row labels for {num_ranks} timeline rows; give one per rank")
    labels = list(row_labels or [f"rank {r}" for r in range(num_ranks)]) + [label for label, _ in extra]
    end_s = max(sim.iteration_time_s, max(e.end_s for e in events)) or 1.0  # 1.0: all events empty
    windows = _windows(sim, window, end_s)
    shown = max(max(Counter(e.rank for e in sim.events if _inside(e, lo, hi)).values(), default=1) for lo, hi in windows)
    width_in = min(max(10.0, 0.16 * shown * len(windows)), _MAX_WIDTH_IN)
    height = 1.6 + 0.42 * len(labels) + (0.35 * num_ranks + 1.2 if memory else 0.0)
    fig = Figure(figsize=(width_in, height), dpi=_DPI)
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(2 if memory else 1, len(windows), height_ratios=(0.42 * len(labels) + 0.6,
                            0.35 * num_ranks + 0.8) if memory else None, wspace=0.03)
    num_chunks = 1
    for column, (lo, hi) in enumerate(windows):
        ax = fig.add_subplot(grid[0, column])
        visible = tuple(e for e in events if _inside(e, lo, hi))
        _draw_idle(ax, num_ranks, lo, hi)
        durations = sorted(e.end_s - e.start_s for e in visible if e.rank < num_ranks) or [0.0]
        px_per_s = width_in * _DPI * 0.9 / len(windows) / (hi - lo)
        num_chunks = max(num_chunks, _draw_boxes(ax, visible, num_ranks,
                                                 separators=durations[len(durations) // 2] * px_per_s >= 4.0))
        _style_axis(ax, labels, lo, hi, first=column == 0, xlabel=not memory)
        if memory:
            _draw_memory(fig.add_subplot(grid[1, column], sharex=ax), memory, lo, hi, first=column == 0)
    with warnings.catch_warnings():  # a shared-x memory panel makes matplotlib warn; the layout is fine
        warnings.simplefilter("ignore", UserWarning)
        fig.tight_layout(rect=(0, 0, 1, 0.86))
    for ax in fig.axes[:: 2 if memory else 1]:
        lo, hi = ax.get_xlim()
        _draw_labels(ax, fig, tuple(e for e in sim.events if _inside(e, lo, hi)), lo, hi)
    _draw_legend(fig, {e.kind for e in events}, num_chunks)
    note = "" if len(windows) == 1 and windows[0] == (0.0, end_s) else "; " + ", ".join(
        f"{lo:.4g}-{hi:.4g} s" for lo, hi in windows) + " shown"
    fig.suptitle((title or f"iteration {sim.iteration_time_s:.4g} s, bubble {sim.bubble_fraction:.1%}") + note,
                 x=0.01, y=0.99, ha="left", va="top", fontsize=11)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format=fmt)
    logger.info("wrote timeline %s (%d events, %d ranks, %d resource rows)", out, len(events), num_ranks, len(extra))
    return out


def _inside(event: TimelineEvent, lo: float, hi: float) -> bool:
    return event.end_s > lo and event.start_s < hi


def _windows(sim: SimResult, window: Window, end_s: float) -> list[tuple[float, float]]:
    """The time ranges to draw (see ``Window``)."""
    if window == "all":
        return [(0.0, end_s)]
    if window != "auto":
        lo, hi = float(window[0]), min(float(window[1]), end_s)
        if not 0.0 <= lo < hi:
            raise InvalidProblemError(
                f"timeline window {window} is empty or negative; give start < end within [0, {end_s:.4g}] s"
            )
        return [(lo, hi)]
    per_rank = Counter(e.rank for e in sim.events)
    num_microbatches = 1 + max(e.microbatch for e in sim.events)
    if max(per_rank.values()) <= AUTO_MAX_EVENTS_PER_RANK or num_microbatches <= 2 * AUTO_MICROBATCHES:
        return [(0.0, end_s)]
    k = AUTO_MICROBATCHES
    # Fill: until the first k microbatches have left every rank's forward; drain: from the
    # first backward-side action of the last k microbatches on.
    head = max((e.end_s for e in sim.events if 0 <= e.microbatch < k and e.kind == "F"), default=end_s)
    tail = min((e.start_s for e in sim.events if e.microbatch >= num_microbatches - k and e.kind in ("B", "I", "R")),
               default=0.0)
    if tail <= head:
        return [(0.0, end_s)]
    return [(0.0, head), (tail, end_s)]


def _draw_idle(ax: object, num_ranks: int, lo: float, hi: float) -> None:
    """A hatched grey band behind every rank's row: whatever the boxes leave uncovered is idle."""
    for rank in range(num_ranks):
        ax.broken_barh([(lo, hi - lo)], (rank - _ROW_HEIGHT / 2, _ROW_HEIGHT),  # type: ignore[attr-defined]
                       facecolors=_IDLE_COLOUR, edgecolor=_IDLE_HATCH_COLOUR, hatch="////", linewidth=0.0, zorder=0)


def _style_axis(ax: object, labels: list[str], lo: float, hi: float, *, first: bool, xlabel: bool) -> None:
    ax.set_xlim(lo, hi)  # type: ignore[attr-defined]
    ax.set_ylim(len(labels) - 0.5, -0.5)  # type: ignore[attr-defined]  # rank 0 on top, resource rows below
    ax.set_yticks(range(len(labels)), labels if first else [""] * len(labels))  # type: ignore[attr-defined]
    if xlabel:
        ax.set_xlabel("time (s)")  # type: ignore[attr-defined]
    ax.grid(axis="x", alpha=0.3)  # type: ignore[attr-defined]
    ax.set_axisbelow(True)  # type: ignore[attr-defined]


def _draw_memory(ax: object, memory: Mapping[int, Sequence[tuple[float, float]]], lo: float, hi: float,
                 *, first: bool) -> None:
    """Memory in use per rank over time (GiB), one step line per rank."""
    for rank, steps in sorted(memory.items()):
        if steps:
            times = [t for t, _ in steps] + [hi]
            values = [b / 2**30 for _, b in steps]
            ax.stairs(values, times, label=f"{rank}", baseline=None)  # type: ignore[attr-defined]
    ax.set_xlim(lo, hi)  # type: ignore[attr-defined]
    ax.set_xlabel("time (s)")  # type: ignore[attr-defined]
    if first:
        ax.set_ylabel("memory (GiB)")  # type: ignore[attr-defined]
        if len(memory) <= 16:
            ax.legend(title="stage", fontsize=7, title_fontsize=7, ncol=min(len(memory), 8), loc="lower center")  # type: ignore[attr-defined]
    ax.grid(alpha=0.3)  # type: ignore[attr-defined]


def _shade(colour: str, chunk: int, num_chunks: int) -> str:
    """The kind's colour mixed with white, more so for later model chunks."""
    if num_chunks <= 1 or chunk <= 0:
        return colour
    mix = 0.45 * chunk / (num_chunks - 1)  # the palest chunk stays clearly darker than idle
    rgb = [int(colour[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * mix):02x}" for c in rgb)


def _draw_boxes(ax: object, events: tuple[TimelineEvent, ...], num_ranks: int, *, separators: bool) -> int:
    """One ``broken_barh`` per (kind, model chunk, rank); virtual stage k is chunk k // p.
    Returns the number of model chunks."""
    groups: dict[tuple[str, int, int], list[tuple[float, float]]] = defaultdict(list)
    for event in events:
        if event.kind not in _KINDS:
            raise InvalidProblemError(f"timeline event kind {event.kind!r} is not one of {list(_KINDS)}")
        chunk = event.stage // num_ranks if event.stage >= 0 else 0
        groups[(event.kind, chunk, event.rank)].append((event.start_s, event.end_s - event.start_s))
    num_chunks = max((chunk for _, chunk, _ in groups), default=0) + 1
    order = list(_KINDS)
    for (kind, chunk, rank), spans in sorted(groups.items(), key=lambda g: (order.index(g[0][0]), g[0][1], g[0][2])):
        colour = _shade(_KINDS[kind][0], chunk, num_chunks)
        ax.broken_barh(spans, (rank - _ROW_HEIGHT / 2, _ROW_HEIGHT), facecolors=colour,  # type: ignore[attr-defined]
                       edgecolor="white", linewidth=0.3 if separators else 0.0, zorder=2)
    return num_chunks


def _draw_labels(ax: object, fig: object, events: tuple[TimelineEvent, ...], lo: float, hi: float) -> None:
    """Microbatch numbers in boxes at least as wide as the text (estimated from the font size)."""
    axes_width_px = ax.get_window_extent().width  # type: ignore[attr-defined]
    px_per_s = axes_width_px / (hi - lo) if hi > lo else 0.0
    fontsize = 7.0
    char_px = 0.62 * fontsize * fig.dpi / 72  # type: ignore[attr-defined]
    labels = 0
    for event in events:
        if event.microbatch < 0 or event.kind == "AR":
            continue
        text = str(event.microbatch)
        if (event.end_s - event.start_s) * px_per_s < char_px * len(text) + 3:
            continue
        if labels >= _MAX_LABELS:
            logger.info("timeline: more than %d labelled boxes; the rest are left unlabelled", _MAX_LABELS)
            break
        centre_s = (max(event.start_s, lo) + min(event.end_s, hi)) / 2
        ax.text(centre_s, event.rank, text, ha="center", va="center",  # type: ignore[attr-defined]
                fontsize=fontsize, color="white", clip_on=True)
        labels += 1


def _draw_legend(fig: object, kinds: set[str], num_chunks: int) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=c, label=label) for kind, (c, label) in _KINDS.items() if kind in kinds]
    if num_chunks > 1:
        pale = _shade(_KINDS["F"][0], num_chunks - 1, num_chunks)
        handles.append(Patch(facecolor=pale, label=f"paler: later chunk (of {num_chunks})"))
    handles.append(Patch(facecolor=_IDLE_COLOUR, edgecolor=_IDLE_HATCH_COLOUR, hatch="////", label="idle"))
    fig.legend(handles=handles, loc="upper right", bbox_to_anchor=(1.0, 0.93), ncol=len(handles),  # type: ignore[attr-defined]
               fontsize=9, frameon=False)
