"""Tests of cost_models.schedules: hand-written orders, warm-up counts, closed-form bubbles
(checked with a tiny dependency-driven event simulation written here) and agreement with
torch.distributed.pipelining (orders and offline lowering with mock stages)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from cost_models.schedules import BUILTIN_SCHEDULES, build_actions, validate_actions, warmup_forwards
from planner.errors import InvalidProblemError
from planner.schema import V_SCHEDULES, Action

# The V schedules (two chunks per rank, V placement) have their own tests: test_vschedules.py.
LOOP_SCHEDULES = tuple(s for s in BUILTIN_SCHEDULES if s not in V_SCHEDULES)


def _grid() -> list[tuple[str, int, int, int]]:
    """(schedule, p, v, m) cases that every structural test runs over."""
    cases = []
    for schedule in LOOP_SCHEDULES:
        for p in (1, 2, 3, 4, 5):
            chunks = (2, 3) if schedule == "interleaved-1f1b" else (1,)
            for v in chunks:
                for m in range(1, 11):
                    if schedule == "interleaved-1f1b" and m % p:
                        continue
                    cases.append((schedule, p, v, m))
    return cases


def _strs(actions: tuple[tuple[Action, ...], ...]) -> list[list[str]]:
    return [[str(a) for a in rank] for rank in actions]


def _simulate(actions, *, num_virtual_stages: int, f, b, w):
    """Dependency-driven execution: each action starts when its rank is free and its inputs are
    ready (F after the previous stage's F, B/I after the next stage's B/I, W after its I).
    Returns (per-rank (first start, last end, busy), per-rank peak of F-done-backward-not-started)."""
    duration = {"F": f, "B": b + w, "I": b, "W": w}
    end: dict[tuple[int, str, int], object] = {}
    position = [0] * len(actions)
    free = [Fraction(0)] * len(actions)
    spans: list[list] = [[None, Fraction(0), Fraction(0)] for _ in actions]
    inflight = [0] * len(actions)
    peak = [0] * len(actions)
    remaining = sum(len(rank) for rank in actions)
    while remaining:
        progressed = False
        for r, rank_actions in enumerate(actions):
            while position[r] < len(rank_actions):
                s, kind, mb = rank_actions[position[r]]
                if kind == "F":
                    deps = [(s - 1, "F", mb)] if s > 0 else []
                elif kind in "BI":
                    deps = [(s, "F", mb)]
                    if s < num_virtual_stages - 1:
                        deps.append((s + 1, "B", mb) if (s + 1, "B", mb) in end else (s + 1, "I", mb))
                else:
                    deps = [(s, "I", mb)]
                if any(d not in end for d in deps):
                    break
                start = max([free[r]] + [end[d] for d in deps])
                free[r] = end[(s, kind, mb)] = start + duration[kind]
                spans[r][0] = start if spans[r][0] is None else spans[r][0]
                spans[r][1] = free[r]
                spans[r][2] += duration[kind]
                inflight[r] += {"F": 1, "B": -1, "I": -1, "W": 0}[kind]
                peak[r] = max(peak[r], inflight[r])
                position[r] += 1
                remaining -= 1
                progressed = True
        assert progressed, "deadlock in the test simulation"
    return spans, peak


# ------------------------------------------------------------------------------------------
# Structure and hand-written orders
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("schedule", "p", "v", "m"), _grid())
def test_every_builtin_schedule_is_structurally_valid(schedule: str, p: int, v: int, m: int) -> None:
    actions = build_actions(schedule, num_stages=p, num_chunks=v, num_microbatches=m)
    assert len(actions) == p
    validate_actions(actions, num_virtual_stages=p * v, num_microbatches=m)
    split = schedule.startswith("zb")
    for r, rank in enumerate(actions):
        assert {a.stage % p for a in rank} == {r}
        kinds = [a.kind for a in rank]
        assert kinds.count("F") == m * v
        assert kinds.count("B") == (0 if split else m * v)
        assert kinds.count("I") == kinds.count("W") == (m * v if split else 0)
    _simulate(actions, num_virtual_stages=p * v, f=1, b=1, w=1)  # no deadlock


def test_1f1b_p4_m8_rank0_and_rank3_by_hand() -> None:
    actions = _strs(build_actions("1f1b", num_stages=4, num_microbatches=8))
    assert actions[0] == "0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 0B4 0B5 0B6 0B7".split()
    assert actions[3] == "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5 3F6 3B6 3F7 3B7".split()
    assert _strs(build_actions("flush", num_stages=4, num_microbatches=8)) == actions
    assert _strs(build_actions("2bw", num_stages=4, num_microbatches=8)) == actions


def test_1f1b_with_fewer_microbatches_than_stages() -> None:
    actions = _strs(build_actions("1f1b", num_stages=4, num_microbatches=2))
    assert actions[0] == "0F0 0F1 0B0 0B1".split()
    assert actions[2] == "2F0 2F1 2B0 2B1".split()  # warm-up min(4 - 2 - 1, 2) = 1
    assert actions[3] == "3F0 3B0 3F1 3B1".split()


def test_gpipe_by_hand() -> None:
    actions = _strs(build_actions("gpipe", num_stages=2, num_microbatches=3))
    assert actions == ["0F0 0F1 0F2 0B0 0B1 0B2".split(), "1F0 1F1 1F2 1B0 1B1 1B2".split()]


def test_interleaved_p2_v2_m4_by_hand() -> None:
    # Rank 0 warms up (2-0-1)*2 + (2-1)*2 = 4 forwards; rank 1 warms up 2.
    actions = _strs(build_actions("interleaved-1f1b", num_stages=2, num_chunks=2, num_microbatches=4))
    assert actions[0] == "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3".split()
    assert actions[1] == "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3".split()


def test_zb_h1_and_h2_p2_m4_by_hand() -> None:
    h1 = _strs(build_actions("zb-h1", num_stages=2, num_microbatches=4))
    assert h1[0] == "0F0 0F1 0I0 0W0 0F2 0I1 0W1 0F3 0I2 0W2 0I3 0W3".split()
    assert h1[1] == "1F0 1I0 1F1 1I1 1W0 1F2 1I2 1W1 1F3 1I3 1W2 1W3".split()
    h2 = _strs(build_actions("zb-h2", num_stages=2, num_microbatches=4))
    assert h2[0] == "0F0 0F1 0F2 0I0 0W0 0F3 0I1 0W1 0I2 0W2 0I3 0W3".split()
    assert h2[1] == "1F0 1I0 1F1 1I1 1F2 1I2 1W0 1F3 1I3 1W1 1W2 1W3".split()


@pytest.mark.parametrize(
    ("p", "v", "m", "expected"),
    [
        (4, 2, 8, [10, 8, 6, 4]),  # (p-r-1)*2 + (v-1)*p
        (4, 2, 4, [8, 8, 6, 4]),  # capped at m*v = 8
        (8, 4, 16, [38, 36, 34, 32, 30, 28, 26, 24]),
        (2, 3, 2, [6, 4]),
        (3, 2, 6, [7, 5, 3]),
    ],
)
def test_megatron_interleaved_warmup_counts(p: int, v: int, m: int, expected: list[int]) -> None:
    got = [
        warmup_forwards("interleaved-1f1b", num_stages=p, num_chunks=v, num_microbatches=m, rank=r)
        for r in range(p)
    ]
    assert got == expected
    actions = build_actions("interleaved-1f1b", num_stages=p, num_chunks=v, num_microbatches=m)
    for r, rank in enumerate(actions):
        first_backward = next(i for i, a in enumerate(rank) if a.kind == "B")
        # Megatron runs one steady-state forward before the first backward unless all are warm-up.
        assert first_backward == min(expected[r] + 1, m * v)


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1", "zb-h2", "gpipe"])
def test_warmup_counts_match_the_orders(schedule: str) -> None:
    for p, m in ((4, 8), (4, 2), (3, 9)):
        actions = build_actions(schedule, num_stages=p, num_microbatches=m)
        for r, rank in enumerate(actions):
            first_backward = next(i for i, a in enumerate(rank) if a.kind in "BI")
            warmup = warmup_forwards(schedule, num_stages=p, num_microbatches=m, rank=r)
            assert first_backward == min(warmup + 1, m)


# ------------------------------------------------------------------------------------------
# Closed-form bubbles and in-flight peaks, by dependency-driven simulation
# ------------------------------------------------------------------------------------------

_TIMES = [(1, 1, 1), (1, 2, 1), (2, 1, 1), (1, 1, Fraction(1, 2)), (3, 2, 1), (1, 3, 1), (2, 2, Fraction(1, 2))]


@pytest.mark.parametrize(("f", "b", "w"), _TIMES)
@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 5), (8, 16)])
def test_1f1b_and_gpipe_bubble_is_p_minus_1_stage_times(p: int, m: int, f, b, w) -> None:
    # Dissertation L3512-3588: t_pb = (p - 1)(t_f + t_b) for GPipe and 1F1B alike.
    for schedule in ("gpipe", "1f1b"):
        actions = build_actions(schedule, num_stages=p, num_microbatches=m)
        spans, peak = _simulate(actions, num_virtual_stages=p, f=f, b=b, w=w)
        makespan = max(s[1] for s in spans)
        assert makespan == m * (f + b + w) + (p - 1) * (f + b + w)
        expected_peak = [m] * p if schedule == "gpipe" else [min(p - r, m) for r in range(p)]
        assert peak == expected_peak


@pytest.mark.parametrize(("p", "v", "m"), [(4, 2, 8), (4, 2, 16), (8, 2, 32), (8, 4, 32), (2, 3, 6)])
def test_interleaved_bubble_and_rank0_peak(p: int, v: int, m: int) -> None:
    # Dissertation L3590-3652: per-chunk times t/v give a bubble (p - 1)(t_f + t_b)/v.
    f, b = Fraction(1, v), Fraction(2, v)
    actions = build_actions("interleaved-1f1b", num_stages=p, num_chunks=v, num_microbatches=m)
    spans, peak = _simulate(actions, num_virtual_stages=p * v, f=f, b=b, w=0)
    assert max(s[1] for s in spans) == m * 3 + Fraction(3 * (p - 1), v)
    # ptdp-gavel-cloud.md Sec. 1.2: rank 0 holds p v + p - 1 chunk activations at its peak.
    assert peak[0] == min(p * v + p - 1, m * v)


@pytest.mark.parametrize(("f", "b", "w"), _TIMES)
@pytest.mark.parametrize(("p", "m"), [(2, 2), (3, 3), (4, 4), (4, 9), (6, 12), (8, 16)])
def test_zb_h1_bubble_closed_form(p: int, m: int, f, b, w) -> None:
    # Qi et al. 2023, Table 2: ZB-H1 bubble (p - 1)(T_F + T_B - T_W) at 1F1B's in-flight limit.
    actions = build_actions("zb-h1", num_stages=p, num_microbatches=m)
    spans, peak = _simulate(actions, num_virtual_stages=p, f=f, b=b, w=w)
    assert max(s[1] for s in spans) == m * (f + b + w) + (p - 1) * (f + b - w)
    assert peak == [min(p - r, m) for r in range(p)]


@pytest.mark.parametrize(("f", "b", "w"), _TIMES)
@pytest.mark.parametrize(("p", "m"), [(2, 3), (3, 5), (4, 7), (4, 12), (8, 16)])
def test_zb_h2_bubble_closed_form(p: int, m: int, f, b, w) -> None:
    # Qi et al. 2023, Table 2: ZB-H2 bubble (p - 1)(T_F + T_B - 2 T_W), peak 2p - 1 on stage 0.
    # The bubble is the idle inside each rank's own span (first start to last end): ZB-H2 drops
    # the synchronization at the optimizer step, so consecutive iterations tile as parallelograms.
    actions = build_actions("zb-h2", num_stages=p, num_microbatches=m)
    spans, peak = _simulate(actions, num_virtual_stages=p, f=f, b=b, w=w)
    idle = [last - first - busy for first, last, busy in spans]
    assert max(idle) == (p - 1) * (f + b - 2 * w)
    assert peak[0] == 2 * p - 1
    assert peak == [min(2 * (p - r) - 1, m) for r in range(p)]
    if (f, b, w) == (1, 1, 1):
        assert idle == [0] * p  # no bubble with T_F = T_B = T_W
    # One synchronized iteration also waits (p - 1) T_F for the first forward to reach the last rank.
    assert max(s[1] for s in spans) == m * (f + b + w) + (p - 1) * max(f, f + b - 2 * w)


# ------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------


def test_interleaved_rejects_microbatches_not_a_multiple_of_stages() -> None:
    with pytest.raises(InvalidProblemError, match=r"num_microbatches=10.*use 8 or 12"):
        build_actions("interleaved-1f1b", num_stages=4, num_chunks=2, num_microbatches=10)
    with pytest.raises(InvalidProblemError, match=r"num_microbatches=3.*use 4$"):
        build_actions("interleaved-1f1b", num_stages=4, num_chunks=2, num_microbatches=3)


@pytest.mark.parametrize(
    ("schedule", "kwargs", "pattern"),
    [
        ("1f1b", {"num_chunks": 2}, r"num_chunks=2 needs schedule 'interleaved-1f1b'"),
        ("zb-h2", {"num_chunks": 3}, r"num_chunks=3 needs schedule 'interleaved-1f1b'"),
        ("interleaved-1f1b", {"num_chunks": 1}, r"needs num_chunks >= 2"),
        ("looped", {}, r"unknown schedule 'looped'"),
        ("custom", {}, r"unknown schedule 'custom'"),
        ("1f1b", {"num_stages": 0}, r"num_stages=0 must be a positive integer"),
    ],
)
def test_bad_arguments_raise(schedule: str, kwargs: dict, pattern: str) -> None:
    args = {"num_stages": 2, "num_chunks": 1, "num_microbatches": 4} | kwargs
    with pytest.raises(InvalidProblemError, match=pattern):
        build_actions(schedule, **args)


def test_warmup_rejects_bad_rank() -> None:
    with pytest.raises(InvalidProblemError, match=r"rank=4 is outside"):
        warmup_forwards("1f1b", num_stages=4, num_microbatches=8, rank=4)


def _parse(rows: list[str]) -> list[list[Action]]:
    return [[Action.parse(a) for a in row.split()] for row in rows]


@pytest.mark.parametrize(
    ("rows", "pattern"),
    [
        (["0F0 0B0 0F1 0B1", "1F0 1B0 1F1"], r"stage 1 microbatch 1 has actions \['F'\]"),
        (["0B0 0F0 0F1 0B1", "1F0 1B0 1F1 1B1"], r"rank 0 action 0 \(0B0\): B follows nothing"),
        (["0F0 0F0 0B0 0F1 0B1", "1F0 1B0 1F1 1B1"], r"F follows F"),
        (["0F0 0I0 0B0 0F1 0B1", "1F0 1B0 1F1 1B1"], r"B follows F/I"),
        (["0F0 0W0 0I0 0F1 0B1", "1F0 1B0 1F1 1B1"], r"W follows F"),
        (["0F0 0B0 0F1 0B1 1F0", "1B0 1F1 1B1"], r"stage 1 already runs on rank 0"),
        (["0F0 0B0 0F2 0B2", "1F0 1B0 1F1 1B1"], r"microbatch 2 is outside \[0, 2\)"),
        (["0F0 0B0 0F1 0B1", "2F0 2B0 2F1 2B1"], r"stage 2 is outside \[0, 2\)"),
        (["0F0 0B0", "1F0 1B0"], r"stage 0 has no actions for microbatches \[1\]"),
        (["0F0 0B0 0F1 0B1", ""], r"virtual stages \[1\] have no actions"),
    ],
)
def test_validate_actions_errors(rows: list[str], pattern: str) -> None:
    with pytest.raises(InvalidProblemError, match=pattern):
        validate_actions(_parse(rows), num_virtual_stages=2, num_microbatches=2)


def test_validate_actions_rejects_unknown_kind() -> None:
    actions = [[Action(0, "F", 0), Action(0, "X", 0)]]
    with pytest.raises(InvalidProblemError, match=r"kind 'X' must be one of F, B, I, W"):
        validate_actions(actions, num_virtual_stages=1, num_microbatches=1)


def test_validate_accepts_torchtitan_style_interleaved_zero_bubble() -> None:
    # V-free looped placement with I/W on two ranks (torchtitan's custom_schedule.csv shape).
    rows = [
        "0F0 0F1 2F0 2F1 2I0 2W0 2I1 2W1 0I0 0W0 0I1 0W1",
        "1F0 1F1 3F0 3F1 3I0 3W0 3I1 3W1 1I0 1W0 1I1 1W1",
    ]
    validate_actions(_parse(rows), num_virtual_stages=4, num_microbatches=2)


# ------------------------------------------------------------------------------------------
# Agreement with torch.distributed.pipelining
# ------------------------------------------------------------------------------------------


def _torch_order(name: str, p: int, m: int, v: int | None = None) -> list[list[str]]:
    pytest.importorskip("torch")
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    ops = get_schedule_ops(name, p, m, v)
    # torch appends REDUCE_GRAD (a grad-sync marker, not compute) and pads with None.
    return [[str(a) for a in rank if a is not None and str(a)[-1:].isdigit()] for rank in ops]


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 3), (3, 7)])
def test_gpipe_matches_torch(p: int, m: int) -> None:
    assert _torch_order("GPipe", p, m) == _strs(build_actions("gpipe", num_stages=p, num_microbatches=m))


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 6), (3, 3)])
def test_1f1b_matches_torch_except_its_last_rank_display_bug(p: int, m: int) -> None:
    # Schedule1F1B._get_pipeline_order numbers the last rank's microbatches from 1 (a display
    # bug; the runtime is right, ecosystem.md Sec. 2.5), so compare every other rank.
    ours = _strs(build_actions("1f1b", num_stages=p, num_microbatches=m))
    assert _torch_order("1F1B", p, m)[:-1] == ours[:-1]


@pytest.mark.parametrize(
    ("p", "v", "m"), [(2, 2, 4), (4, 2, 8), (4, 2, 4), (2, 3, 6), (4, 2, 12), (3, 2, 9), (4, 3, 8)]
)
def test_interleaved_matches_torch(p: int, v: int, m: int) -> None:
    ours = _strs(build_actions("interleaved-1f1b", num_stages=p, num_chunks=v, num_microbatches=m))
    assert _torch_order("Interleaved1F1B", p, m, v) == ours


def _lower(actions, p: int, v: int, m: int):
    pytest.importorskip("torch")
    from unittest import mock

    from torch.distributed.pipelining.schedules import _Action, _PipelineScheduleRuntime
    from torch.distributed.pipelining.stage import PipelineStage

    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod, stage.num_stages = 0, p, None, p * v
    runtime = _PipelineScheduleRuntime([stage] * v, m)
    plan = {r: [_Action.from_str(str(a)) for a in acts] for r, acts in enumerate(actions)}
    runtime._prepare_schedule_with_comms(plan)
    return runtime


@pytest.mark.parametrize("schedule", LOOP_SCHEDULES)
def test_torch_offline_lowering_accepts_every_builtin_schedule(schedule: str) -> None:
    for p in (2, 3, 4):
        for v in (2, 3) if schedule == "interleaved-1f1b" else (1,):
            for m in (1, 2, 4, 8, 12):
                if schedule == "interleaved-1f1b" and m % p:
                    continue
                runtime = _lower(build_actions(schedule, num_stages=p, num_chunks=v, num_microbatches=m), p, v, m)
                assert runtime.stage_index_to_group_rank == {s: s % p for s in range(p * v)}
                assert len(runtime.pipeline_order_with_comms) == p


def test_torch_offline_lowering_rejects_a_cyclic_plan() -> None:
    # Structurally valid (validate_actions accepts it) but rank 0 waits for 0B0 before 0F1
    # while rank 1 waits for 1F1 before 1B0: the cycle is left to the simulator and to torch.
    rows = ["0F0 0B0 0F1 0B1", "1F1 1F0 1B0 1B1"]
    actions = _parse(rows)
    validate_actions(actions, num_virtual_stages=2, num_microbatches=2)
    with pytest.raises(AssertionError, match="Malformed compute schedule"):
        _lower(actions, 2, 1, 2)
