"""V-shaped pipeline schedules: ZB-V and DualPipeV, as per-rank compute action lists.

Both place two model chunks on every rank in a V (``planner.schema.virtual_stage_home``): rank
r holds virtual stage r (chunk 0, on the way down) and virtual stage 2p - 1 - r (chunk 1, on
the way back up), so rank 0 holds the first and the last stage and the turn of the V
(stages p - 1 and p) is local to rank p - 1.

- ZB-V (Qi et al., *Zero Bubble Pipeline Parallelism*, arXiv:2401.10241, Sec. 6, the memory-
  efficient zero-bubble schedule; the ICLR 2024 version has ZB-H1/H2 only): the backward is
  split into I (input gradient) and W (weight gradient) as in ZB-H1/H2. Rank r warms up with 2
  (p - r) - 1 forwards of chunk 0, then r alternating chunk-1 / chunk-0 forwards, then p - r
  chunk-1 F, I, W triples; the steady state repeats F, I, W on chunk 0 then on chunk 1; the
  cool-down runs r I pairs (chunk 0 and chunk 1), then p - r chunk-0 I, W pairs, and the delayed
  W passes last. The order is built for max(m, 2p - 1) microbatches and the actions of
  microbatches >= m are dropped (the paper's order needs 2p - 1 microbatches to fill the V;
  fewer leave gaps). With equal chunk times T_F = T_I = T_W every rank is busy from its first
  forward to its last W.
- DualPipeV (DeepSeek-AI, *DeepSeek-V3 Technical Report*, 2024, Sec. 3.2.1 and Fig. 5;
  DualPipe cut in half so that one copy of the weights suffices, as DeepSeek's DualPipe
  repository and torch's ``ScheduleDualPipeV`` run it). Its eight phases on rank r:
  2 (p - r - 1) chunk-0 forwards; r + 1 (chunk-0, chunk-1) forward pairs; p - r - 1 chunk-1
  (I, a pending W, F) steps; m - 2p + r + 1 steps of two overlapped F&B blocks (F chunk 0
  with B chunk 1, then F chunk 1 with B chunk 0; the last rank's very first block runs its two
  halves apart); p - r - 1 steps of (B chunk 1, F chunk 1 & B chunk 0); r + 1 backward pairs
  (chunk 1 then chunk 0) that switch from B to the split I halfway; p - r - 1 (pending W,
  chunk-0 backward) steps; and the r + 1 pending W passes. Needs m >= 2p.

An overlapped F&B block is written as its two actions next to each other (F first) and marked
in ``overlapped``: the simulator runs the pair as one block whose time is set by what the two
can hide of each other (docs/schedules-and-exports.md, "V schedules").
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from functools import lru_cache

from planner.schema import Action

__all__ = ["VSchedule", "count_inflight", "dualpipe_v", "peak_inflight", "zb_v"]


@dataclass(slots=True)
class VSchedule:
    """One rank's V-schedule order while it is built."""

    rank: int
    num_stages: int
    actions: list[Action] = field(default_factory=list)
    overlapped: list[int] = field(default_factory=list)
    """Positions j whose actions j (an F) and j + 1 (a B) form one overlapped F&B block."""
    _next: dict[tuple[int, str], int] = field(default_factory=dict)
    _pending_w: deque[tuple[int, int]] = field(default_factory=deque)

    def stage(self, chunk: int) -> int:
        return self.rank if chunk == 0 else 2 * self.num_stages - 1 - self.rank

    def emit(self, chunk: int, kind: str) -> None:
        """Append the chunk's next microbatch of this kind (B and I share one counter, as do B and W)."""
        k = self.rank if chunk == 0 else 2 * self.num_stages - 1 - self.rank  # ``stage``, inlined
        counter = "I" if kind in "BI" else kind
        mb = self._next.get((k, counter), 0)
        self._next[(k, counter)] = mb + 1
        if kind == "B":
            self._next[(k, "W")] = self._next.get((k, "W"), 0) + 1
        elif kind == "I":
            self._pending_w.append((k, mb))
        self.actions.append(Action(k, kind, mb))

    def emit_pending_w(self) -> None:
        """The oldest W whose I has run (none pending: nothing)."""
        if self._pending_w:
            k, mb = self._pending_w.popleft()
            self.actions.append(Action(k, "W", mb))

    def emit_overlap(self, forward_chunk: int) -> None:
        """F of ``forward_chunk`` overlapped with B of the other chunk."""
        self.overlapped.append(len(self.actions))
        self.emit(forward_chunk, "F")
        self.emit(1 - forward_chunk, "B")


def zb_v(rank: int, p: int, m: int) -> VSchedule:
    """Rank ``rank``'s ZB-V order for p ranks (2p virtual stages) and m microbatches."""
    s = VSchedule(rank, p)
    n = max(m, 2 * p - 1)
    for _ in range(2 * (p - rank) - 1):
        s.emit(0, "F")
    for _ in range(rank):
        s.emit(1, "F")
        s.emit(0, "F")
    for _ in range(p - rank):
        for kind in "FIW":
            s.emit(1, kind)
    while _count(s, 1, "F") < _count(s, 0, "F") or _count(s, 0, "F") < n:
        if _count(s, 0, "F") < n:
            s.emit(0, "F")
        for chunk in (0, 1):
            if chunk:
                s.emit(1, "F")
            s.emit(chunk, "I")
            s.emit(chunk, "W")
    _zb_v_cooldown(s, p)
    s.actions = [a for a in s.actions if a.microbatch < m]
    return s


def _zb_v_cooldown(s: VSchedule, p: int) -> None:
    for _ in range(s.rank):
        s.emit(0, "I")
        s.emit(1, "I")
    for _ in range(p - s.rank):
        s.emit(0, "I")
        _emit_w(s, 0)
    for chunk in (1, 0):
        while _count(s, chunk, "W") < _count(s, chunk, "I"):
            _emit_w(s, chunk)


def _emit_w(s: VSchedule, chunk: int) -> None:
    """The chunk's next W in microbatch order (ZB-V runs each chunk's W passes in order)."""
    k = s.stage(chunk)
    mb = s._next.get((k, "W"), 0)
    s._next[(k, "W")] = mb + 1
    s.actions.append(Action(k, "W", mb))


def _count(s: VSchedule, chunk: int, kind: str) -> int:
    return s._next.get((s.stage(chunk), kind), 0)


def dualpipe_v(rank: int, p: int, m: int) -> VSchedule:
    """Rank ``rank``'s DualPipeV order for p ranks (2p virtual stages) and m >= 2p microbatches."""
    s = VSchedule(rank, p)
    for _ in range(2 * (p - rank - 1)):
        s.emit(0, "F")
    for _ in range(rank + 1):
        s.emit(0, "F")
        s.emit(1, "F")
    for _ in range(p - rank - 1):
        s.emit(1, "I")
        s.emit_pending_w()
        s.emit(1, "F")
    for i in range(m - 2 * p + rank + 1):
        if i == 0 and rank == p - 1:  # the turn of the V: these two stay apart
            s.emit(0, "F")
            s.emit(1, "B")
        else:
            s.emit_overlap(0)
        s.emit_overlap(1)
    for _ in range(p - rank - 1):
        s.emit(1, "B")
        s.emit_overlap(1)
    split = _dualpipe_v_backward_pairs(s)
    for _ in range(p - rank - 1):
        s.emit_pending_w()
        s.emit(0, "I" if split else "B")
    for _ in range(rank + 1):
        s.emit_pending_w()
    return s


def _dualpipe_v_backward_pairs(s: VSchedule) -> bool:
    """r + 1 (chunk 1, chunk 0) backwards; halfway they switch from B to I (the W passes fill the
    drain). Odd ranks switch before the chunk-1 backward of the middle pair, even ranks after it."""
    steps = s.rank + 1
    split = False
    for i in range(steps):
        if i == steps // 2 and s.rank % 2 == 1:
            split = True
        s.emit(1, "I" if split else "B")
        if i == steps // 2 and s.rank % 2 == 0:
            split = True
        s.emit(0, "I" if split else "B")
    return split


@lru_cache(maxsize=1024)
def peak_inflight(schedule: str, p: int, m: int, rank: int = 0) -> tuple[int, int, int]:
    """(all, chunk 0, chunk 1) peak activation sets a rank holds, counted in program order as
    the simulator does (an F adds one; a B, or the W of a split backward, frees it).

    ZB-V holds 2p on every rank once m >= 2p - 1: the 1F1B peak of p stage activations, as
    chunks are half a stage (Qi et al. Sec. 6); DualPipeV 2p + 1 (DeepSeek-V3 Sec. 3.2.1: PP + 1
    with PP = 2p stages).

    The count is that of min(m, 2p) microbatches: from 2p on, one more microbatch adds one more
    steady-state step to every rank's order (ZB-V: F chunk 0, F chunk 1, then I and W of each;
    DualPipeV: two overlapped F&B blocks), each step ends holding what it started with and peaks
    as high as the one before, and what comes before and after the steady state is the same
    (``count_inflight`` counts the whole order; the tests compare the two).
    """
    return count_inflight(schedule, p, min(m, 2 * p), rank)


def inflight_total(schedule: str, p: int, m: int, rank: int) -> int:
    """The first of ``peak_inflight`` (all sets a rank holds at its peak) in closed form: ZB-V
    min(m + 1 + r, 2m, 2p) (rank r's warm-up holds 2(p - r) - 1 chunk-0 and r chunk-1 forwards before
    its first backward, m bounding both), DualPipeV 2p + 1 on every rank (m >= 2p). Equal to the
    counted value for every p up to 32 and m up to 4p + 2 (the tests compare them); O(1), where
    counting one rank's order is O(min(m, 2p))."""
    if schedule == "zb-v":
        return min(m + 1 + rank, 2 * m, 2 * p)
    return 2 * p + 1


def count_inflight(schedule: str, p: int, m: int, rank: int = 0) -> tuple[int, int, int]:
    """``peak_inflight`` counted on the whole order of m microbatches (O(m))."""
    build = zb_v if schedule == "zb-v" else dualpipe_v
    order = build(rank, p, m).actions
    split = {(a.stage, a.microbatch) for a in order if a.kind == "W"}
    held, peak = [0, 0], [0, 0, 0]
    for a in order:
        chunk = 0 if a.stage == rank else 1
        if a.kind == "F":
            held[chunk] += 1
        elif a.kind == ("W" if (a.stage, a.microbatch) in split else "B"):
            held[chunk] -= 1
        else:
            continue
        peak = [max(peak[0], held[0] + held[1]), max(peak[1], held[0]), max(peak[2], held[1])]
    return peak[0], peak[1], peak[2]
