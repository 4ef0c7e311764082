"""Shared timing helper of the benchmark scripts (run as ``python bench/<name>.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def best_of(fn: Callable[[], T], repeats: int = 3) -> tuple[float, T]:
    """Smallest wall time of ``repeats`` calls and the last call's result."""
    best, result = float("inf"), None
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    assert result is not None
    return best, result


def warm_imports(*modules: str) -> None:
    """Import the solver libraries that a timed call would import lazily on its first run
    (highspy, pulp, cvxpy: 0.1-1 s each, several seconds on a loaded machine), so that no bench
    counts an import as solve time. Missing optional ones are skipped."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
