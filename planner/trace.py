"""A simulated iteration as a Chrome/Perfetto trace (JSON trace event format).

``chrome_trace(plan, sim)`` returns the document that ``paraplan simulate PLAN --trace out.json``
writes; open it in the Perfetto UI (ui.perfetto.dev), chrome://tracing or Perfetto's trace
processor. Layout:

- one process per pipeline stage, named with the global ranks it runs on ("stage 1 (ranks
  16-31)"; per GPU for offloaded plans), with a ``compute`` track (F, B, I, W, R) and a ``data-parallel all-reduce`` track;
- one process ``links`` with a track per directed link that carried a transfer ("link 0->1":
  activations SF, gradients SB, BPipe evictions EV and loads LD, offloaded activations A and
  checkpoints C);
- one process ``host`` with a track per host link and CPU of offloaded plans (prefetch P,
  gradient offload G, optimizer step O).

Times are microseconds (the format's unit); every slice carries its virtual stage and
microbatch in ``args``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from planner.schema import Plan, SimResult

__all__ = ["chrome_trace", "stage_labels", "stage_rank_ranges", "write_trace"]

_NS_PER_S = 1e9
_LINKS_PID = 100_000
_HOST_PID = 100_001


def stage_rank_ranges(plan: Plan) -> list[str]:
    """Global ranks of each pipeline stage as text ("0-15"), from ``Stage.ranks`` or Megatron's order.

    Without explicit ranks, stage x holds ranks x d t .. (x + 1) d t - 1 (tensor fastest, then
    data, then pipeline).
    """
    per_stage = plan.degrees.data * plan.degrees.tensor
    out = []
    for x, stage in enumerate(plan.stages):
        ranks = stage.ranks or tuple(range(x * per_stage, (x + 1) * per_stage))
        lo, hi = min(ranks), max(ranks)
        contiguous = len(set(ranks)) == hi - lo + 1
        out.append(str(lo) if lo == hi else f"{lo}-{hi}" if contiguous else ",".join(map(str, ranks)))
    return out


def stage_labels(plan: Plan) -> list[str]:
    """Row names for pictures and traces: "stage 1 (ranks 16-31)"."""
    out = []
    for x, text in enumerate(stage_rank_ranges(plan)):
        plural = "s" if "-" in text or "," in text else ""
        out.append(f"stage {x} (rank{plural} {text})")
    return out


def chrome_trace(
    plan: Plan,
    sim: SimResult,
    *,
    links: dict[str, list[tuple[str, int, int, float, float]]] | None = None,
    resources: dict[str, list[tuple[str, float, float]]] | None = None,
) -> dict[str, Any]:
    """The trace document (see the module docstring); ``sim`` needs its events."""
    events: list[dict[str, Any]] = []
    num_rows = max(len(sim.stages), 1 + max((e.rank for e in sim.events), default=-1))
    ranges = stage_labels(plan)
    if plan.offload is not None or len(ranges) != num_rows:
        ranges = [f"GPU {g}" for g in range(num_rows)]  # offloaded plans are simulated per GPU
    for x, label in enumerate(ranges):
        events += _names(x + 1, label, x, {1: "compute", 2: "data-parallel all-reduce"})
    for e in sim.events:
        tid = 2 if e.kind == "AR" else 1
        name = "AR" if e.kind == "AR" else f"{e.kind}{e.microbatch}"
        events.append(_slice(name, "compute" if tid == 1 else "collective", e.rank + 1, tid, e.start_s, e.end_s,
                             {"virtual_stage": e.stage, "microbatch": e.microbatch}))
    if links:
        events += _names(_LINKS_PID, "links", len(ranges), {t: label for t, label in enumerate(links, 1)})
        for tid, spans in enumerate(links.values(), 1):
            for kind, stage, microbatch, start, end in spans:
                events.append(_slice(f"{kind}{microbatch}", "transfer", _LINKS_PID, tid, start, end,
                                     {"virtual_stage": stage, "microbatch": microbatch}))
    if resources:
        events += _names(_HOST_PID, "host", len(ranges) + 1, {t: label for t, label in enumerate(resources, 1)})
        for tid, row in enumerate(resources.values(), 1):
            for kind, start, end in row:
                events.append(_slice(kind, "host", _HOST_PID, tid, start, end, {}))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"solver": plan.solver, "schedule": plan.schedule,
                      "iteration_time_s": sim.iteration_time_s, "bubble_fraction": sim.bubble_fraction},
    }


def write_trace(document: dict[str, Any], path: str | Path) -> Path:
    """Write a trace document as compact JSON; returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, separators=(",", ":")))
    return out


def _names(pid: int, process: str, sort_index: int, threads: dict[int, str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": process}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": sort_index}},
    ]
    for tid, name in threads.items():
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    return out


def _slice(name: str, cat: str, pid: int, tid: int, start_s: float, end_s: float, args: dict[str, Any]) -> dict[str, Any]:
    # Whole nanoseconds, written in microseconds: Perfetto reads ts and dur as round(x * 1000) ns,
    # so a slice ends exactly where the next one on its track starts (rounding ts and dur apart
    # could overlap them by 1 ns, which Perfetto's importer treats as a misnested slice).
    start_ns = round(start_s * _NS_PER_S)
    end_ns = max(start_ns, round(end_s * _NS_PER_S))
    return {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": start_ns / 1000,
            "dur": (end_ns - start_ns) / 1000, "args": args}
