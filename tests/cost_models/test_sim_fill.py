"""Fill pieces on the engine (cost_models.sim.fill): hand-timed GPipe, p = 2, m = 2, t_f = 1, t_b = 2.

Unfilled: rank 0 runs F [0,1] [1,2], idles [2,5], B [5,7] [7,9]; rank 1 runs F [1,2] [2,3],
B [3,5] [5,7] and idles [7,9] (tail) and [0,1] (head of the next iteration): iteration 9 s.
"""

from __future__ import annotations

import pytest

from cost_models.schedules import build_actions
from cost_models.sim.costs import PipelineCosts
from cost_models.sim.fill import simulate_filled
from planner.errors import InvalidProblemError

COSTS = PipelineCosts.uniform(num_stages=2, forward_s=1.0, backward_s=2.0)
ACTIONS = build_actions("gpipe", num_stages=2, num_chunks=1, num_microbatches=2)


def _filled(pieces, switch_s=0.0):  # noqa: ANN001, ANN202
    return simulate_filled(COSTS, ACTIONS, num_microbatches=2, pieces=pieces, switch_s=switch_s)


def test_piece_inside_its_bubble_costs_nothing() -> None:
    result = _filled([[[(2.0, 2.5)]], [[]]], switch_s=0.5)  # switch + piece end at 5.0, when B arrives
    assert (result.base_iteration_s, result.iteration_s) == (9.0, 9.0)
    assert result.pieces == ((0, 0, 2.0, 5.0),)


def test_overrunning_piece_delays_the_main_job_by_the_overrun() -> None:
    assert _filled([[[(2.0, 2.5)]], [[]]], switch_s=1.0).iteration_s == pytest.approx(9.5)
    # two GPUs of rank 0 (tensor parallel): the next action waits for the slower one
    assert _filled([[[(2.0, 1.0)], [(2.0, 3.5)]], [[]]]).iteration_s == pytest.approx(9.5)
    assert _filled([[[(2.0, 1.0)], [(2.0, 3.5)]], [[]]]).slowdown == pytest.approx(0.5 / 9)


def test_fill_drain_piece_wraps_into_the_next_head() -> None:
    # rank 1's tail [7, 9] plus the next iteration's head [0, 1]: 3 s before it must end
    assert _filled([[[]], [[(7.0, 2.5)]]]).iteration_s == 9.0
    assert _filled([[[]], [[(7.0, 3.5)]]]).iteration_s == pytest.approx(9.5)


def test_unknown_bubble_start_is_rejected() -> None:
    with pytest.raises(InvalidProblemError, match="no bubble starting at 3.5"):
        _filled([[[(3.5, 1.0)]], [[]]])


@pytest.mark.parametrize(("schedule", "chunks"), [("1f1b", 1), ("interleaved-1f1b", 2), ("zb-v", 2), ("dualpipe-v", 2)])
def test_without_pieces_the_fill_engine_times_the_plan_as_the_simulator_does(schedule: str, chunks: int) -> None:
    from cost_models.schedules import overlapped_blocks
    from cost_models.simulate import pipeline_costs, plan_actions, simulate
    from planner import api

    plan = api.plan(api.make_problem("gpt-1.7b", "a100-80gb:1x8", schedule=schedule, num_stages=4, num_chunks=chunks,
                                     data_parallel=1, num_microbatches=8, global_batch_size=8), solver="even")
    blocks = overlapped_blocks(schedule, num_stages=4, num_microbatches=8) if schedule == "dualpipe-v" else None
    result = simulate_filled(pipeline_costs(plan), plan_actions(plan), num_microbatches=8, pieces=[], switch_s=0.0,
                             overlapped=blocks)
    assert result.base_iteration_s == result.iteration_s == simulate(plan, include_events=False).iteration_time_s
