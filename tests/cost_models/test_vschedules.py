"""ZB-V and DualPipeV (cost_models.vschedules): V placement, agreement with torch's own orders,
hand-checked orders, closed-form makespans on the simulator, in-flight activations and the
overlapped F&B block."""

from __future__ import annotations

import pytest

from cost_models.schedules import build_actions, overlapped_blocks, validate_actions, warmup_forwards
from cost_models.sim.overlap import fused_block_s
from cost_models.simulate import PipelineCosts, simulate_costs
from planner.errors import InvalidProblemError

TORCH_NAMES = {"zb-v": "ZBVZeroBubble", "dualpipe-v": "DualPipeV"}


def _cases(schedule: str) -> list[tuple[int, int]]:
    """p 1..5 with m around the V's fill (2p - 1 microbatches) and well past it; DualPipeV m >= 2p."""
    low = {"zb-v": 1, "dualpipe-v": 2}[schedule]
    cases = set()
    for p in (1, 2, 3, 4, 5):
        for m in (1, 2, 2 * p - 1, 2 * p, 2 * p + 1, 3 * p + 2):
            if m >= max(1, low * p):
                cases.add((p, m))
    return sorted(cases)


def _strs(actions) -> list[list[str]]:
    return [[str(a) for a in rank] for rank in actions]


def _torch_rows(name: str, p: int, m: int) -> tuple[list[list[str]], list[list[int]]]:
    """torch's compute-only order with OVERLAP_F_B blocks opened into their F and B, and the
    positions where each block starts."""
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    rows, blocks = [], []
    for row in get_schedule_ops(name, p, m):
        flat, starts = [], []
        for action in row:
            if action is None:
                continue
            if action.sub_actions:
                starts.append(len(flat))
                flat += [str(a) for a in action.sub_actions]
            else:
                flat.append(str(action))
        rows.append(flat)
        blocks.append(starts)
    return rows, blocks


@pytest.mark.parametrize("schedule", ["zb-v", "dualpipe-v"])
def test_orders_and_overlapped_blocks_equal_torch(schedule: str) -> None:
    pytest.importorskip("torch")
    for p, m in _cases(schedule):
        rows, blocks = _torch_rows(TORCH_NAMES[schedule], p, m)
        assert _strs(build_actions(schedule, num_stages=p, num_chunks=2, num_microbatches=m)) == rows, (p, m)
        ours = overlapped_blocks(schedule, num_stages=p, num_microbatches=m)
        assert [list(b) for b in ours] == blocks, (p, m)


@pytest.mark.parametrize("schedule", ["zb-v", "dualpipe-v"])
def test_v_placement_validity_and_torch_lowering(schedule: str) -> None:
    pytest.importorskip("torch")
    from unittest import mock

    from torch.distributed.pipelining.schedules import _Action, _PipelineScheduleRuntime
    from torch.distributed.pipelining.stage import PipelineStage

    for p, m in [(2, 4), (3, 6), (4, 8), (4, 11)]:
        actions = build_actions(schedule, num_stages=p, num_chunks=2, num_microbatches=m)
        validate_actions(actions, num_virtual_stages=2 * p, num_microbatches=m)
        for r, rank in enumerate(actions):
            assert {a.stage for a in rank} == {r, 2 * p - 1 - r}
        stage = mock.create_autospec(PipelineStage, instance=True)
        stage.group_rank, stage.group_size, stage.submod, stage.num_stages = 0, p, None, 2 * p
        runtime = _PipelineScheduleRuntime([stage] * 2, m)
        runtime._prepare_schedule_with_comms({r: [_Action.from_str(str(a)) for a in acts]
                                              for r, acts in enumerate(actions)})
        assert runtime.stage_index_to_group_rank == {k: k if k < p else 2 * p - 1 - k for k in range(2 * p)}


def test_zb_v_p2_m4_by_hand() -> None:
    # Rank 0 (stages 0 and 3): 2(p - r) - 1 = 3 chunk-0 forwards, then p - r = 2 chunk-1
    # F I W triples, then the steady state and the cool-down (Qi et al. Sec. 6, Fig. 8).
    actions = _strs(build_actions("zb-v", num_stages=2, num_chunks=2, num_microbatches=4))
    assert actions[0] == ("0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0F3 0I0 0W0 3F2 3I2 3W2 0I1 0W1 "
                          "3F3 3I3 3W3 0I2 0W2 0I3 0W3").split()
    assert actions[1][:6] == "1F0 2F0 1F1 2F1 2I0 2W0".split()
    assert warmup_forwards("zb-v", num_stages=2, num_chunks=2, num_microbatches=4, rank=0) == 3


@pytest.mark.parametrize(("f", "w"), [(1.0, 1.0), (2.0, 1.0), (1.0, 0.5)])
def test_zb_v_makespan_closed_form(f: float, w: float) -> None:
    # Chunk times F = I = f, W = w <= f: the synchronised makespan is 2 m (F + I + W) + (p - 1) F,
    # half of ZB-H2's (p - 1) T_F per stage, and every rank idles (p - 1) F. With F = I = W (the
    # paper's zero-bubble setting) rank r runs without a gap from its first forward to its last
    # W: it only starts r forwards late and ends p - 1 - r forwards early.
    for p, m in [(2, 3), (2, 6), (3, 5), (4, 7), (4, 12), (5, 9)]:
        costs = PipelineCosts.uniform(num_stages=p, num_chunks=2, forward_s=f, backward_s=f + w,
                                      backward_weight_s=w, v_shape=True)
        result = simulate_costs(costs, build_actions("zb-v", num_stages=p, num_chunks=2, num_microbatches=m),
                                num_microbatches=m)
        assert result.iteration_time_s == pytest.approx(2 * m * (2 * f + w) + (p - 1) * f), (p, m)
        for r, stage in enumerate(result.stages):  # gaps only before its start and after its end
            assert stage.idle_s == pytest.approx((p - 1) * f)
            assert w != f or all(b.end_s <= r * f + 1e-9 or b.start_s >= result.iteration_time_s - (p - 1 - r) * f - 1e-9
                       for b in stage.bubbles)


def test_zb_v_holds_1f1b_peak_and_dualpipe_v_one_chunk_more() -> None:
    # ZB-V: 2p chunk activations (each 1/(2p) of the model) on every rank = 1F1B's p stage
    # activations on rank 0 (Qi et al. Sec. 6); DualPipeV 2p + 1 chunks (DeepSeek-V3 Sec. 3.2.1:
    # PP + 1 with PP = 2p stages).
    for p, m in [(2, 4), (3, 8), (4, 8), (4, 16)]:
        for schedule, chunks in (("zb-v", 2 * p), ("dualpipe-v", 2 * p + 1)):
            costs = PipelineCosts.uniform(num_stages=p, num_chunks=2, forward_s=1.0, backward_s=2.0,
                                          backward_weight_s=1.0, activation_bytes=1.0, v_shape=True)
            actions = build_actions(schedule, num_stages=p, num_chunks=2, num_microbatches=m)
            result = simulate_costs(costs, actions, num_microbatches=m,
                                    overlapped=overlapped_blocks(schedule, num_stages=p, num_microbatches=m))
            assert [s.peak_inflight_microbatches for s in result.stages] == [chunks] * p, (schedule, p, m)


@pytest.mark.parametrize(("f", "b", "w"), [(1.0, 2.0, 1.0), (2.0, 3.0, 1.0), (1.0, 1.5, 0.5)])
def test_dualpipe_v_bubble_without_communication(f: float, b: float, w: float) -> None:
    # DeepSeek-V3 Sec. 3.2.1 Table 2 / DualPipeV: bubble (PP/2 - 1)(F&B + B - 3W) with PP = 2p
    # stages; with no communication to hide F&B = F + B. Exact when I = B - W equals F.
    for p, m in [(2, 4), (2, 7), (3, 6), (4, 8), (4, 13), (5, 10)]:
        costs = PipelineCosts.uniform(num_stages=p, num_chunks=2, forward_s=f, backward_s=b,
                                      backward_weight_s=w, v_shape=True)
        result = simulate_costs(costs, build_actions("dualpipe-v", num_stages=p, num_chunks=2, num_microbatches=m),
                                num_microbatches=m,
                                overlapped=overlapped_blocks("dualpipe-v", num_stages=p, num_microbatches=m))
        assert result.iteration_time_s == pytest.approx(2 * m * (f + b) + (p - 1) * ((f + b) + b - 3 * w)), (p, m)


def test_fused_block_time_by_hand() -> None:
    assert fused_block_s(1.0, 2.0, 0.0, 0.0) == 3.0  # nothing to hide: F + B
    assert fused_block_s(1.0, 2.0, 0.4, 0.6) == pytest.approx(2.0)  # compute 0.6 + 1.4 hides comm 1.0
    assert fused_block_s(1.0, 1.0, 0.8, 0.8) == pytest.approx(1.6)  # communication-bound


def test_dualpipe_v_single_rank_hides_communication() -> None:
    # p = 1, m = 2: rank 0 runs 0F0 1F0 0F1 1B0 (1F1;0B0) 1B1 0I1 0W1. With F = 1, B = 2 (I = W = 1)
    # and 0.5 of hideable communication in every F and B, the block costs max(0.5 + 1.5, 1) = 2
    # instead of 3: makespan 1 + 1 + 1 + 2 + 2 + 2 + 1 + 1 = 11.
    costs = PipelineCosts.uniform(num_stages=1, num_chunks=2, forward_s=1.0, backward_s=2.0, backward_weight_s=1.0,
                                  v_shape=True, comm_s=0.5)
    actions = build_actions("dualpipe-v", num_stages=1, num_chunks=2, num_microbatches=2)
    assert _strs(actions) == [["0F0", "1F0", "0F1", "1B0", "1F1", "0B0", "1B1", "0I1", "0W1"]]
    blocks = overlapped_blocks("dualpipe-v", num_stages=1, num_microbatches=2)
    assert blocks == ((4,),)
    result = simulate_costs(costs, actions, num_microbatches=2, overlapped=blocks)
    assert result.iteration_time_s == pytest.approx(11.0)
    plain = simulate_costs(costs, actions, num_microbatches=2)
    assert plain.iteration_time_s == pytest.approx(12.0)


def test_v_schedules_refuse_bad_shapes() -> None:
    with pytest.raises(InvalidProblemError, match="exactly 2 chunks"):
        build_actions("zb-v", num_stages=2, num_chunks=1, num_microbatches=4)
    with pytest.raises(InvalidProblemError, match=r"num_microbatches >= 2 x num_stages = 8"):
        build_actions("dualpipe-v", num_stages=4, num_chunks=2, num_microbatches=7)


# ------------------------------------------------------------------------------------------
# Plans: V placement through pipeline_costs and simulate
# ------------------------------------------------------------------------------------------


def test_v_plan_places_chunks_in_a_v_and_the_turn_is_local() -> None:
    from cost_models.simulate import pipeline_costs
    from tests.cost_models import sim_helpers as h

    p = 3
    layers = h.uniform_layers(2 * p, 1.0, 2.0, backward_weight_s=1.0, output_bytes=1e9)
    slow = h.cluster(intra_bytes_per_s=1e10)  # 0.1 s per boundary between ranks
    plan = h.plan(layers, num_stages=p, num_chunks=2, num_microbatches=6, schedule="zb-v", the_cluster=slow)
    assert plan.stage_ranks() == (0, 1, 2, 2, 1, 0)
    assert [c.layers for c in plan.virtual_stages()] == [(k, k + 1) for k in range(2 * p)]
    costs = pipeline_costs(plan)
    assert costs.ranks() == (0, 1, 2, 2, 1, 0)
    assert list(costs.send_forward_s) == pytest.approx([0.1, 0.1, 0.0, 0.1, 0.1])  # stage 2 -> 3 stays on rank 2


@pytest.mark.parametrize("schedule", ["zb-v", "dualpipe-v"])
def test_v_plan_simulation_equals_the_cost_level_closed_form(schedule: str) -> None:
    from cost_models.simulate import simulate
    from tests.cost_models import sim_helpers as h

    p, m = 4, 8
    layers = h.uniform_layers(2 * p, 1.0, 2.0, backward_weight_s=1.0)
    result = simulate(h.plan(layers, num_stages=p, num_chunks=2, num_microbatches=m, schedule=schedule))
    bubble = (p - 1) * 1.0 if schedule == "zb-v" else (p - 1) * (3.0 + 2.0 - 3 * 1.0)
    assert result.iteration_time_s == pytest.approx(2 * m * 3.0 + bubble)


def test_dualpipe_v_plan_hides_the_profiled_communication() -> None:
    from cost_models.simulate import simulate
    from tests.cost_models import sim_helpers as h

    p, m = 2, 6
    plain = h.uniform_layers(2 * p, 1.0, 2.0, backward_weight_s=1.0)
    with_comm = h.uniform_layers(2 * p, 1.0, 2.0, backward_weight_s=1.0, forward_comm_s=0.4, backward_comm_s=0.4)
    t_plain = simulate(h.plan(plain, num_stages=p, num_chunks=2, num_microbatches=m, schedule="dualpipe-v"))
    t_comm = simulate(h.plan(with_comm, num_stages=p, num_chunks=2, num_microbatches=m, schedule="dualpipe-v"))
    blocks = sum(len(b) for b in overlapped_blocks("dualpipe-v", num_stages=p, num_microbatches=m))
    assert blocks > 0
    # Each block costs max(0.6 + 1.6, 0.8) = 2.2 instead of 3: the busy time drops by 0.8 per block.
    busy_plain = sum(s.busy_s for s in t_plain.stages)
    busy_comm = sum(s.busy_s for s in t_comm.stages)
    assert busy_plain - busy_comm == pytest.approx(0.8 * blocks)
    assert t_comm.iteration_time_s < t_plain.iteration_time_s


def test_v_problem_takes_two_chunks_and_refuses_others() -> None:
    from planner import api
    from planner.cli import main

    problem = api.make_problem("gpt-tiny", "cpu:2", num_stages=2, global_batch_size=4, schedule="zb-v")
    assert problem.num_chunks == 2
    plan = api.plan(problem)
    assert plan.schedule == "zb-v" and plan.stage_ranks() == (0, 1, 1, 0)
    with pytest.raises(ValueError, match=r"'dualpipe-v' runs exactly 2 chunks per rank .* use 2"):
        api.make_problem("gpt-tiny", "cpu:2", num_stages=2, global_batch_size=4, schedule="dualpipe-v", num_chunks=3)
    assert main(["plan", "--model", "gpt-tiny", "--cluster", "cpu:2", "--pipeline", "2", "--global-batch", "4",
                 "--schedule", "zb-v", "--chunks", "3", "--solver", "even"]) == 2


def test_zb_v_engine_agrees_with_an_independent_event_simulation() -> None:
    """The engine's ZB-V timing equals the dependency-driven loop of test_schedules.py (written
    separately, exact fractions) for random chunk times, including W > F and I < F."""
    import random
    from fractions import Fraction

    from tests.cost_models.test_schedules import _simulate

    rng = random.Random(7)
    for _ in range(12):
        p, m = rng.randint(1, 5), rng.randint(1, 12)
        f, i, w = (Fraction(rng.randint(1, 8), 4) for _ in range(3))
        actions = build_actions("zb-v", num_stages=p, num_chunks=2, num_microbatches=m)
        spans, _ = _simulate(actions, num_virtual_stages=2 * p, f=f, b=i, w=w)
        costs = PipelineCosts.uniform(num_stages=p, num_chunks=2, forward_s=float(f), backward_s=float(i + w),
                                      backward_weight_s=float(w), v_shape=True)
        result = simulate_costs(costs, actions, num_microbatches=m)
        assert result.iteration_time_s == pytest.approx(float(max(s[1] for s in spans))), (p, m, f, i, w)
        assert [st.busy_s for st in result.stages] == pytest.approx([float(s[2]) for s in spans])


@pytest.mark.parametrize("schedule", ["zb-v", "dualpipe-v"])
def test_peak_inflight_from_2p_microbatches_equals_the_whole_count(schedule: str) -> None:
    """``peak_inflight`` counts min(m, 2p) microbatches: the same three peaks as counting the whole
    order, on every rank, for m up to well past 2p."""
    from cost_models.vschedules import count_inflight, peak_inflight

    for p in range(1, 13):
        for rank in range(p):
            for m in range(2 * p if schedule == "dualpipe-v" else 1, 5 * p + 7):
                assert peak_inflight(schedule, p, m, rank) == count_inflight(schedule, p, m, rank), (p, rank, m)


@pytest.mark.parametrize("schedule", ["zb-v", "dualpipe-v"])
def test_inflight_total_closed_form_equals_the_count(schedule: str) -> None:
    """``inflight_total`` (ZB-V min(m + 1 + r, 2m, 2p), DualPipeV 2p + 1) is the counted peak of every
    rank, every m from the schedule's least up to past its steady state."""
    from cost_models.vschedules import count_inflight, inflight_total

    for p in range(1, 13):
        for rank in range(p):
            for m in range(2 * p if schedule == "dualpipe-v" else 1, 4 * p + 3):
                assert inflight_total(schedule, p, m, rank) == count_inflight(schedule, p, m, rank)[0], (p, rank, m)
