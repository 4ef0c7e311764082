"""Progress on stderr for long commands: solvers report their phases through
``solvers.budget.report_phase`` and the CLI's progress line shows them with an ETA."""

from __future__ import annotations

import io
import random
import time

from planner.progress import Ticker, progress
from solvers import stage_ilp
from solvers.budget import listening, report_phase
from tests.solvers.test_stage_ilp import _problem


def test_stage_ilp_reports_depths_and_every_phase() -> None:
    seen: list[tuple[str, int | None, int | None]] = []
    free = _problem(random.Random(2), p=2, v=1, num_decoders=6, memory=1e6).model_copy(
        update={"num_stages": None, "num_microbatches": 8})
    with listening(lambda *args: seen.append(args)):
        stage_ilp.solve(free, options={"rerank": 2})
    depths = [entry for entry in seen if entry[2] is not None]
    assert depths and all(total == depths[0][2] for _, _, total in depths)
    assert [done for _, done, _ in depths] == list(range(len(depths)))
    phases = " | ".join(phase for phase, _, _ in seen)
    for part in ("baselines", "MILP", "re-ranking"):
        assert part in phases
    report_phase("after the block")  # nobody listens any more: no error, nothing recorded
    assert seen[-1][0] != "after the block"


def test_ticker_shows_the_phase_and_an_eta_from_the_phase_clock() -> None:
    ticker = Ticker(None)
    ticker.update("4 stages", 0, 4)
    ticker.phase_start = time.perf_counter() - 10.0  # 1 of 4 units took 10 s
    ticker.update("4 stages: MILP")  # a sub-phase keeps the counts
    ticker.done = 1
    assert ticker.suffix().startswith(" [4 stages: MILP] (1/4, ETA 3") and ticker.suffix().endswith(" s)")
    assert Ticker(None).suffix() == ""


def test_the_progress_line_carries_the_phase() -> None:
    out = io.StringIO()
    with progress("planning", delay_s=0.0, stream=out) as ticker, listening(ticker.update):
        report_phase("2 stages", 1, 2)
        time.sleep(0.05)
    text = out.getvalue()
    assert "planning: done in" in text
