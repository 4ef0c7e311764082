"""Argument types of the ``paraplan`` command line: every number is checked where it is parsed.

argparse turns a refused value into its usage message and exit code 2, naming the flag, the
value and what it must be (docs/getting-started.md, "Exit codes"). Counts carry the bounds of
``planner.schema_io`` so that an absurd count is refused at once rather than exhausting time
or memory.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from planner import schema_io

__all__ = ["count", "fraction", "non_negative_float", "non_negative_int", "positive_float", "write_or_print"]


def count(limit: int | None = None, why: str = "") -> Callable[[str], int]:
    """An integer >= 1 (and at most ``limit``, refused with ``why``)."""

    def parse(text: str) -> int:
        value = _int(text)
        if value < 1:
            raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
        if limit is not None and value > limit:
            raise argparse.ArgumentTypeError(f"{value} exceeds the limit of {limit:,} ({why}); use a smaller value")
        return value

    parse.__name__ = "positive integer"
    return parse


def non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def positive_float(limit: float | None = None, why: str = "") -> Callable[[str], float]:
    """A finite number > 0 (and at most ``limit``)."""

    def parse(text: str) -> float:
        value = _float(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
        if limit is not None and value > limit:
            raise argparse.ArgumentTypeError(f"{value:g} exceeds the limit of {limit:g} ({why})")
        return value

    parse.__name__ = "positive number"
    return parse


def between(low: float, high: float, why: str) -> Callable[[str], float]:
    """A finite number in [low, high], refused with ``why``."""

    def parse(text: str) -> float:
        value = _float(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low:g} and {high:g} ({why}), got {text!r}")
        return value

    parse.__name__ = "number"
    return parse


def non_negative_float(text: str) -> float:
    value = _float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def fraction(text: str) -> float:
    """A number in (0, 1]."""
    value = _float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be a fraction in (0, 1], got {text!r}")
    return value


def _int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def _float(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


DEVICES = count(schema_io.MAX_DEVICES, "set above the largest published training clusters")
MICROBATCHES = count(schema_io.MAX_MICROBATCHES, "microbatches per pipeline per iteration; the simulator steps each one")
BATCH = count(schema_io.MAX_GLOBAL_BATCH, "samples per iteration, set far above GPT-3's 1,536")
LAYERS = count(schema_io.MAX_LAYERS, "ten times the largest model planned")


def _seed(text: str) -> int:
    """A random seed: 0 to 2^32 - 1 (numpy's range)."""
    value = _int(text)
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"must be between 0 and {2**32 - 1} (numpy's seed range), got {text!r}")
    return value


_seed.__name__ = "seed"
SEED = _seed
SEQ_LENGTH = count(schema_io.MAX_TOKENS, "16M tokens, far above the 1M-token contexts of today's models")
JOBS = count(schema_io.MAX_JOBS, "ten times Gavel's largest simulated trace")


def write_or_print(text: str, output: str | None, *, hint: str = "") -> None:
    """A command's one document: to ``-o`` (with a newline, and ``wrote PATH`` plus ``hint`` on
    stderr) or to stdout."""
    import sys
    from pathlib import Path

    if output:
        Path(output).write_text(text + "\n")
        print(f"wrote {output}{hint}", file=sys.stderr)
    else:
        print(text)
