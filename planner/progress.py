"""A progress line on stderr for anything that runs longer than a second."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class Ticker:
    """Counts finished units of work so that the progress line can show ``3/5, ETA 8 s``."""

    def __init__(self, total: int | None) -> None:
        self.total, self.done = total, 0
        self.start = time.perf_counter()
        self.phase = ""
        self.phase_start = self.start

    def advance(self, done: int | None = None, total: int | None = None) -> None:
        """One more unit finished (or ``done`` of ``total`` units)."""
        self.done = self.done + 1 if done is None else done
        self.total = total if total is not None else self.total

    def update(self, phase: str, done: int | None = None, total: int | None = None) -> None:
        """A solver's phase (``solvers.budget.report_phase``): shown after the label, with the
        ETA of its units when it gives them (the clock restarts when their total changes); a
        phase without counts keeps the current ones (a sub-phase of the same unit)."""
        self.phase = phase
        if done is None and total is None:
            return
        if total != self.total:
            self.phase_start = time.perf_counter()
        self.done, self.total = done or 0, total

    def suffix(self) -> str:
        text = f" [{self.phase}]" if self.phase else ""
        if not self.total:
            return text
        text += f" ({self.done}/{self.total}"
        if 0 < self.done < self.total:
            began = self.phase_start if self.phase else self.start
            remaining_s = (time.perf_counter() - began) / self.done * (self.total - self.done)
            text += f", ETA {remaining_s:.0f} s"
        return text + ")"


@contextmanager
def progress(label: str, *, delay_s: float = 1.0, stream=None, total: int | None = None) -> Iterator[Ticker]:  # type: ignore[no-untyped-def]
    """Print ``label... 3.2 s`` on stderr while the block runs, once it has taken ``delay_s``.

    With ``total`` units of work, the block calls ``ticker.advance()`` after each one and the
    line adds ``(done/total, ETA s)``. On a terminal the line updates in place; otherwise one
    line is printed when the delay passes, one per 10 s while it runs, and one when the work
    ends, so logs stay short.
    """
    out = stream or sys.stderr
    done = threading.Event()
    ticker = Ticker(total)
    start = ticker.start
    shown = threading.Event()
    tty = hasattr(out, "isatty") and out.isatty()

    def run() -> None:
        if done.wait(delay_s):
            return
        shown.set()
        while True:
            elapsed = time.perf_counter() - start
            if tty:
                out.write(f"\r{label}... {elapsed:5.1f} s{ticker.suffix()}   ")
            else:
                out.write(f"{label}... {elapsed:.0f} s{ticker.suffix()}\n")
            out.flush()
            if done.wait(0.2 if tty else 10.0):
                return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield ticker
    finally:
        done.set()
        thread.join()
        if shown.is_set():
            out.write(("\r" if tty else "") + f"{label}: done in {time.perf_counter() - start:.1f} s\n")
            out.flush()
