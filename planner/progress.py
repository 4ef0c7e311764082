"""A progress line on stderr for anything that runs longer than a second."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def progress(label: str, *, delay_s: float = 1.0, stream=None) -> Iterator[None]:  # type: ignore[no-untyped-def]
    """Print ``label... 3.2 s`` on stderr while the block runs, once it has taken ``delay_s``.

    On a terminal the line updates in place; otherwise one line is printed when the delay
    passes and one when the work ends, so logs stay short.
    """
    out = stream or sys.stderr
    done = threading.Event()
    start = time.perf_counter()
    shown = threading.Event()
    tty = hasattr(out, "isatty") and out.isatty()

    def run() -> None:
        if done.wait(delay_s):
            return
        shown.set()
        while True:
            elapsed = time.perf_counter() - start
            if tty:
                out.write(f"\r{label}... {elapsed:5.1f} s")
            else:
                out.write(f"{label}...\n")
            out.flush()
            if not tty or done.wait(0.2):
                return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        if shown.is_set():
            out.write(("\r" if tty else "") + f"{label}: done in {time.perf_counter() - start:.1f} s\n")
            out.flush()
