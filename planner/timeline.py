"""The timeline picture of a simulated plan: one row per pipeline rank, one box per compute event.

The picture follows the pipeline diagrams of the PTD-P chapter (dissertation [narayanan-thesis], Figs.
4.3-4.4, [narayanan-thesis] ch. 4) and of Zero Bubble (Qi et al. 2023, Fig. 3): rank 0 on top, time to the
right, forward (F), backward (B), input-gradient (I), weight-gradient (W), recompute (R) and
data-parallel all-reduce (AR) in distinct colours, idle time left blank, microbatch numbers in
boxes wide enough to hold them. Later model chunks of an interleaved plan are drawn in a paler
shade of their kind's colour. Each kind and shade is one ``broken_barh`` call, so that tens of
thousands of events render in seconds. matplotlib is imported inside ``draw_timeline`` (Agg
canvas, no pyplot), so importing this module is cheap and works headless.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

from planner.errors import InvalidProblemError
from planner.schema import SimResult, TimelineEvent

logger = logging.getLogger(__name__)

__all__ = ["draw_timeline"]

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


def draw_timeline(
    sim: SimResult,
    path: str | Path,
    *,
    title: str | None = None,
    resources: Mapping[str, Sequence[tuple[str, float, float]]] | None = None,
) -> Path:
    """Draw a simulated timeline to a PNG or SVG file.

    Args:
        sim: a simulation result with ``events`` (simulate with events included).
        path: the output file; its suffix (``.png`` or ``.svg``) picks the format.
        title: a title above the picture; by default the iteration time and bubble fraction.
        resources: extra rows below the ranks, label -> (kind, start, end) intervals: host
            links and CPUs of offloaded plans, BPipe's pair links
            (``cost_models.simulate.resource_timelines``).

    Returns:
        The path written.

    Raises:
        InvalidProblemError: a suffix other than .png / .svg, or a result without events.
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
    labels = [f"rank {r}" for r in range(num_ranks)] + [label for label, _ in extra]
    per_rank = Counter(e.rank for e in sim.events)
    width_in = min(max(10.0, 0.16 * max(per_rank.values())), _MAX_WIDTH_IN)
    end_s = max(sim.iteration_time_s, max(e.end_s for e in events)) or 1.0  # 1.0: all events empty
    fig = Figure(figsize=(width_in, 1.6 + 0.42 * len(labels)), dpi=_DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    # White separators only where boxes are wide enough to keep their colour visible.
    durations = sorted(e.end_s - e.start_s for e in sim.events)
    separators = durations[len(durations) // 2] * width_in * _DPI * 0.9 / end_s >= 4.0
    num_chunks = _draw_boxes(ax, events, num_ranks, separators=separators)
    ax.set_xlim(0.0, end_s)
    ax.set_ylim(len(labels) - 0.5, -0.5)  # rank 0 on top, resource rows below the ranks
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("time (s)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    fig.tight_layout(rect=(0, 0, 1, 0.86))
    _draw_labels(ax, fig, sim.events, end_s)
    _draw_legend(fig, {e.kind for e in events}, num_chunks)
    fig.suptitle(title or f"iteration {sim.iteration_time_s:.4g} s, bubble {sim.bubble_fraction:.1%}",
                 x=0.01, y=0.99, ha="left", va="top", fontsize=11)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format=fmt)
    logger.info("wrote timeline %s (%d events, %d ranks, %d resource rows)", out, len(events), num_ranks, len(extra))
    return out


def _shade(colour: str, chunk: int, num_chunks: int) -> str:
    """The kind's colour mixed with white, more so for later model chunks."""
    if num_chunks <= 1 or chunk <= 0:
        return colour
    mix = 0.55 * chunk / (num_chunks - 1)
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
    num_chunks = max(chunk for _, chunk, _ in groups) + 1
    order = list(_KINDS)
    for (kind, chunk, rank), spans in sorted(groups.items(), key=lambda g: (order.index(g[0][0]), g[0][1], g[0][2])):
        colour = _shade(_KINDS[kind][0], chunk, num_chunks)
        ax.broken_barh(spans, (rank - _ROW_HEIGHT / 2, _ROW_HEIGHT), facecolors=colour,  # type: ignore[attr-defined]
                       edgecolor="white", linewidth=0.3 if separators else 0.0)
    return num_chunks


def _draw_labels(ax: object, fig: object, events: tuple[TimelineEvent, ...], end_s: float) -> None:
    """Microbatch numbers in boxes at least as wide as the text (estimated from the font size)."""
    axes_width_px = ax.get_window_extent().width  # type: ignore[attr-defined]
    px_per_s = axes_width_px / end_s if end_s > 0 else 0.0
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
        centre_s = (event.start_s + event.end_s) / 2
        ax.text(centre_s, event.rank, text, ha="center", va="center",  # type: ignore[attr-defined]
                fontsize=fontsize, color="white", clip_on=True)
        labels += 1


def _draw_legend(fig: object, kinds: set[str], num_chunks: int) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=c, label=label) for kind, (c, label) in _KINDS.items() if kind in kinds]
    if num_chunks > 1:
        pale = _shade(_KINDS["F"][0], num_chunks - 1, num_chunks)
        handles.append(Patch(facecolor=pale, label=f"paler: later chunk (of {num_chunks})"))
    handles.append(Patch(facecolor="white", edgecolor="#999999", label="idle"))
    fig.legend(handles=handles, loc="upper right", bbox_to_anchor=(1.0, 0.93), ncol=len(handles),  # type: ignore[attr-defined]
               fontsize=9, frameon=False)
