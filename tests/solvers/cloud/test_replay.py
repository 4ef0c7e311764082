"""Replay of the ch. 6 strategies on hand-made traces with exact dollars."""

from __future__ import annotations

import pytest

from planner.errors import InvalidProblemError
from planner.schema_cloud import PricePoint, PriceSeries, PriceTrace
from solvers.cloud.replay import market, replay
from tests.solvers.cloud.helpers import catalogue, job

CAT = catalogue(("p3", "aws", "v100", 1, 3.0, 1.0, 0.5), ("p2", "aws", "k80", 1, 0.9, 0.3),
                ("nc", "azure", "k80", 1, 0.9, 0.2), ("p3x4", "aws", "v100", 4, 12.0, 2.0))


def series(instance: str, zone: str, *points: tuple[float, float]) -> PriceSeries:
    return PriceSeries(instance=instance, zone=zone, points=tuple(PricePoint(time_h=t, usd_per_h=p) for t, p in points))


# V100 at $1/h then $2/h from hour 10; an AWS K80 at $0.3; an Azure K80 at $0.5 that drops to $0.1 at hour 5;
# the 4xV100 at $2/h ($0.5 per GPU) from hour 20.
TRACE = PriceTrace(series=(
    series("aws/r1/p3", "z1", (0, 1.0), (10, 2.0)),
    series("aws/r1/p3", "z2", (0, 1.5)),
    series("aws/r1/p2", "z1", (0, 0.3)),
    series("azure/r1/nc", "z1", (0, 0.5), (5, 0.1)),
    series("aws/r1/p3x4", "z1", (0, 8.0), (20, 2.0)),
))
MK = market(TRACE, CAT)
JOB = job("j", {"k80": 1.0, "v100": 2.0}, 2.0 * 3600 * 12)  # 12 V100-hours, 24 K80-hours


def test_baseline_keeps_the_cheapest_v100_zone_at_the_start() -> None:
    r = replay(JOB, MK, CAT, strategy="baseline")
    assert r.total_usd == pytest.approx(10 * 1.0 + 2 * 2.0)  # z1: 10 h at $1, 2 h at $2
    assert r.duration_h == pytest.approx(12.0)
    assert r.num_switches == 0


def test_gpu_type_picks_the_best_cost_normalized_gpu() -> None:
    # at the start: V100 $1/2 steps = 0.5, K80 $0.3/1 = 0.3 -> the K80, 24 h at $0.3
    assert replay(JOB, MK, CAT, strategy="gpu-type").total_usd == pytest.approx(24 * 0.3)


def test_multi_cloud_chooses_at_the_start_and_dynamic_moves_once() -> None:
    # multi-cloud at hour 0: AWS K80 0.3 beats Azure K80 0.5 and 4xV100 8/4/2 = 1.0 per step unit
    assert replay(JOB, MK, CAT, strategy="multi-cloud").total_usd == pytest.approx(7.2)
    # dynamic: at hour 5 the Azure K80 drops to $0.1 -> moves; 5 h at 0.3 + 19 h at 0.1
    r = replay(JOB, MK, CAT, strategy="dynamic")
    assert r.num_switches == 1
    assert r.total_usd == pytest.approx(5 * 0.3 + 19 * 0.1)
    assert [s.option for s in r.steps] == ["aws/r1/p2@z1", "azure/r1/nc@z1"]


def test_no_switches_allowed_is_the_start_choice() -> None:
    assert replay(JOB, MK, CAT, strategy="dynamic", max_switches=0).total_usd == pytest.approx(7.2)


def test_a_move_pays_checkpoint_egress_and_restart() -> None:
    j = job("j", {"k80": 1.0, "v100": 2.0}, 2.0 * 3600 * 12, checkpoint_gb=10, restart_s=1800)
    r = replay(j, MK, CAT, strategy="dynamic")
    # 10 GB out of AWS at $0.09; the restart holds the Azure instance 0.5 h without progress
    assert r.egress_usd == pytest.approx(0.9)
    assert r.total_usd == pytest.approx(5 * 0.3 + 0.5 * 0.1 + 19 * 0.1 + 0.9)
    assert r.duration_h == pytest.approx(24.5)


def test_a_move_that_does_not_pay_for_itself_is_skipped() -> None:
    j = job("j", {"k80": 1.0, "v100": 2.0}, 2.0 * 3600 * 12, checkpoint_gb=100)  # $9 egress > 19 h x $0.2 saving
    r = replay(j, MK, CAT, strategy="dynamic")
    assert r.num_switches == 0
    assert r.total_usd == pytest.approx(7.2)


def test_decisions_every_8_hours_move_at_the_next_decision_time() -> None:
    # The Azure K80 drops at hour 5; deciding every 8 h from the start, the job moves at hour 8:
    # 8 h at $0.3 on the AWS K80, then 16 h at $0.1.
    r = replay(JOB, MK, CAT, strategy="dynamic", decide_every_h=8.0, min_saving=0.0, max_switches=None)
    assert r.num_switches == 1
    assert r.total_usd == pytest.approx(8 * 0.3 + 16 * 0.1)
    assert [(s.option, s.end_h) for s in r.steps] == [("aws/r1/p2@z1", 8.0), ("azure/r1/nc@z1", 24.0)]


def test_chapter_rule_decides_daily_without_threshold_or_cap() -> None:
    from solvers.cloud.replay import CHAPTER_RULE

    # Daily from hour 0: the first decision after the start is at hour 24, when the job is done.
    assert replay(JOB, MK, CAT, strategy="dynamic", **CHAPTER_RULE).total_usd == pytest.approx(24 * 0.3)
    # A 48 K80-hour job moves at hour 24 and pays 24 h at $0.1 after it.
    long_job = job("j", {"k80": 1.0, "v100": 2.0}, 2.0 * 3600 * 24)
    r = replay(long_job, MK, CAT, strategy="dynamic", **CHAPTER_RULE)
    assert (r.num_switches, r.total_usd) == (1, pytest.approx(24 * 0.3 + 24 * 0.1))
    with pytest.raises(InvalidProblemError, match="decide_every_h"):
        replay(JOB, MK, CAT, strategy="dynamic", decide_every_h=0.0)


def test_preemptions_are_seeded_and_cost_time() -> None:
    j = job("j", {"k80": 1.0, "v100": 2.0}, 2.0 * 3600 * 12, restart_s=3600)
    a = replay(j, MK, CAT, strategy="baseline", preemptions=True, seed=1)
    assert a == replay(j, MK, CAT, strategy="baseline", preemptions=True, seed=1)
    assert a.num_preemptions >= 1  # rate 0.5/h over 12+ h
    assert a.duration_h == pytest.approx(12.0 + a.num_preemptions * 1.0)


def test_unknown_strategy() -> None:
    with pytest.raises(InvalidProblemError, match="unknown strategy 'cheapest'; choose from"):
        replay(JOB, MK, CAT, strategy="cheapest")
