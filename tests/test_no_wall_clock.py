"""No test asserts a wall-clock time (issue 14: six did, and the suite went red on a loaded
2-core machine). Speed targets live in bench/ scripts that print tables; tests check outcomes,
statuses and notes. This guard fails when a test starts reading the clock."""

from __future__ import annotations

import re
from pathlib import Path

CLOCK = re.compile(r"\b(?:time\.(?:perf_counter|monotonic|time|process_time)|perf_counter|monotonic)\(")
ALLOWED = {"tests/planner/test_progress.py"}  # back-dates a progress clock to test the ETA text, asserts no time


def test_no_test_reads_the_wall_clock() -> None:
    root = Path(__file__).resolve().parents[1]
    readers = [f"{path.relative_to(root)}:{number}" for path in sorted((root / "tests").rglob("*.py"))
               if str(path.relative_to(root)) not in ALLOWED and path.name != Path(__file__).name
               for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
               if CLOCK.search(line.split("#", 1)[0])]
    assert readers == [], "tests must not time themselves; put speed targets in bench/: " + ", ".join(readers)
