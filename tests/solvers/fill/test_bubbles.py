"""Bubble cycles from the simulator match PipeFill's per-stage formulas (pipefill.md Sec. 1.2)."""

from __future__ import annotations

import pytest

from cost_models.schedules import build_actions
from cost_models.simulate import PipelineCosts, simulate_costs
from planner.errors import InvalidProblemError
from planner.schema import SimResult
from solvers.fill.bubbles import BubbleOptions, closed_form_bubble_fraction, stage_bubbles

EXACT = 1e-9


def _sim(schedule: str, p: int, m: int, tf: float, tb: float) -> SimResult:
    costs = PipelineCosts.uniform(num_stages=p, forward_s=tf, backward_s=tb)
    return simulate_costs(costs, build_actions(schedule, num_stages=p, num_microbatches=m), num_microbatches=m)


@pytest.mark.parametrize(("p", "m"), [(4, 8), (16, 8), (16, 4), (5, 2), (7, 13)])
@pytest.mark.parametrize(("tf", "tb"), [(1.0, 2.0), (0.3, 0.7)])
def test_gpipe_and_1f1b_bubbles_equal_the_papers_formulas(p: int, m: int, tf: float, tb: float) -> None:
    for schedule in ("gpipe", "1f1b"):
        stages = stage_bubbles(_sim(schedule, p, m, tf, tb), BubbleOptions(fill_fraction=1.0))
        for s, sb in enumerate(stages):
            kinds = {b.kind: b.duration_s for b in sb.bubbles}
            fill_drain = s * (tf + tb)  # derived in the reading: tail + head of the next iteration
            if schedule == "gpipe":
                fwd_bwd = (p - s - 1) * (tf + tb)  # L180
            else:
                fwd_bwd = (p - s - 1) * tb + max(0, p - s - m) * tf  # L180, minus signs rebuilt
            assert kinds.get("fill-drain", 0.0) == pytest.approx(fill_drain, abs=EXACT)
            assert kinds.get("fwd-bwd", 0.0) == pytest.approx(fwd_bwd, abs=EXACT)
            assert all(b.kind != "other" for b in sb.bubbles)  # PipeFill leaves 1F1B's t_f gaps alone


def test_all_kinds_keep_1f1b_cool_down_gaps_and_total_idle() -> None:
    p, m, tf, tb = 4, 8, 1.0, 2.0
    stages = stage_bubbles(_sim("1f1b", p, m, tf, tb), BubbleOptions(fill_fraction=1.0, kinds="all"))
    for s, sb in enumerate(stages):
        others = [b.duration_s for b in sb.bubbles if b.kind == "other"]
        assert others == pytest.approx([tf] * min(p - s - 1, m - 1))
        assert sum(b.duration_s for b in sb.bubbles) == pytest.approx((p - 1) * (tf + tb))


def test_paper_bubble_fractions() -> None:
    assert closed_form_bubble_fraction(16, 8) == pytest.approx(15 / 23)  # 65% at 8K GPUs (L229)
    assert closed_form_bubble_fraction(16, 64) == pytest.approx(0.1899, abs=1e-4)
    assert closed_form_bubble_fraction(16, 4) == pytest.approx(0.7895, abs=1e-4)  # "16K (78.9%)" L257
    # Fig. 2: 4 stages, 4 -> 2 microbatches raises the fraction by 40% (L66)
    assert closed_form_bubble_fraction(4, 2) / closed_form_bubble_fraction(4, 4) == pytest.approx(1.4)
    sim = _sim("gpipe", 16, 8, 1.0, 2.0)
    assert sim.bubble_fraction == pytest.approx(15 / 23)


def test_fill_fraction_and_fixed_memory() -> None:
    stages = stage_bubbles(_sim("gpipe", 4, 4, 1.0, 2.0), BubbleOptions(fill_fraction=0.68, free_memory_bytes=4.5e9))
    bubble = stages[0].bubbles[0]
    assert bubble.duration_s == pytest.approx(9.0)
    assert bubble.usable_s == pytest.approx(0.68 * 9.0)
    assert bubble.free_memory_bytes == 4.5e9


def test_zero_bubbles_and_bad_options_are_clear_errors() -> None:
    with pytest.raises(InvalidProblemError, match="no bubbles to fill"):
        stage_bubbles(_sim("gpipe", 1, 4, 1.0, 2.0))
    with pytest.raises(InvalidProblemError, match="fill_fraction=1.5"):
        stage_bubbles(_sim("gpipe", 4, 4, 1.0, 2.0), BubbleOptions(fill_fraction=1.5))
