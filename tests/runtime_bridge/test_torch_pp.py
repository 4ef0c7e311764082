"""The adapter: which path each schedule takes, and torch's offline lowering of plan actions."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from planner.errors import InvalidProblemError  # noqa: E402
from runtime_bridge.torch_pp import executor_for, lower_offline, torch_actions  # noqa: E402
from tests.runtime_bridge.plans import tiny_plan, torchtitan_custom_plan  # noqa: E402


@pytest.mark.parametrize("schedule,path", [("gpipe", "builtin"), ("1f1b", "builtin"), ("zb-h1", "actions"),
                                           ("zb-h2", "actions"), ("zb-v", "builtin"), ("dualpipe-v", "builtin")])
def test_executor_paths(schedule: str, path: str) -> None:
    assert executor_for(tiny_plan(schedule)) == path


def test_builtin_refused_for_zero_bubble() -> None:
    with pytest.raises(InvalidProblemError, match="use executor 'actions'"):
        executor_for(tiny_plan("zb-h1"), "builtin")


@pytest.mark.parametrize("plan", [tiny_plan("1f1b", p=4, m=8), tiny_plan("zb-h2", m=6),
                                  tiny_plan("interleaved-1f1b", v=2, m=4), torchtitan_custom_plan()],
                         ids=["1f1b", "zb-h2", "interleaved", "custom"])
def test_torch_lowers_plan_actions(plan) -> None:
    lowered = lower_offline(plan)
    assert sorted(lowered) == list(range(plan.degrees.pipeline))
    compute = {r: [a for a in acts if a[-2:-1].isalpha() and "SEND" not in a and "RECV" not in a
                   and "SHARD" not in a and "REDUCE" not in a] for r, acts in lowered.items()}
    assert compute == {r: [str(a) for a in acts] for r, acts in torch_actions(plan).items()}
    assert any("SEND_F" in a for a in lowered[0])


def test_backward_before_forward_is_rejected() -> None:
    bad = tiny_plan("custom", m=1, actions=[["0B0", "0F0"], ["1F0", "1B0"]])
    with pytest.raises(InvalidProblemError, match="rejects the plan's action list"):
        lower_offline(bad)


def test_cyclic_custom_plan_is_rejected() -> None:
    # rank 0 runs stage 2's forward first, which needs stage 1's, which needs stage 0's: a cycle
    rows = [["2F0", "2F1", "0F0", "0F1", "2B0", "2B1", "0B0", "0B1"],
            ["1F0", "1F1", "3F0", "3F1", "3B0", "3B1", "1B0", "1B1"]]
    bad = tiny_plan("custom", v=2, m=2, actions=rows)
    with pytest.raises(InvalidProblemError, match="rejects the plan's action list"):
        lower_offline(bad)


@pytest.mark.parametrize("schedule", ["zb-v", "dualpipe-v"])
def test_v_schedule_classes_run_the_plans_order(schedule: str) -> None:
    """torch's ScheduleZBVZeroBubble / ScheduleDualPipeV built on mock stages (no process group):
    V stage->rank mapping, and the plan's action list is the class's own order (DualPipeV's
    OVERLAP_F_B blocks opened into their F and B)."""
    from unittest import mock

    from torch.distributed.pipelining import PipelineStage

    from runtime_bridge.torch_pp import build_schedule

    plan = tiny_plan(schedule, m=6)
    p = plan.degrees.pipeline
    orders = {}
    for rank in range(p):
        stages = []
        for k in (rank, 2 * p - 1 - rank):
            stage = mock.create_autospec(PipelineStage, instance=True)
            stage.group_rank, stage.group_size, stage.num_stages, stage.stage_index = rank, p, 2 * p, k
            stage.submod = None
            stages.append(stage)
        sched = build_schedule(plan, stages, lambda out, target: out.sum())
        assert sched.stage_index_to_group_rank == {0: 0, 1: 1, 2: 1, 3: 0}
        orders = sched.pipeline_order
    opened = {r: [str(sub) for a in acts if a is not None for sub in (a.sub_actions or (a,))]
              for r, acts in orders.items()}
    assert opened == {r: [str(a) for a in acts] for r, acts in torch_actions(plan).items()}
