"""The dissertation's ch. 6 numbers reproduced from its own tables (tolerances = accuracy reached).

The two Table 6.1 cells the chapter's own speedups and GCP's list prices do not give to the
printed decimal (Transformer V100: 3.3 / 5.51 = 0.60 stated 0.8; ResNet-50 V100: 9.6 / 5.51 =
1.74 stated 1.8) are asserted as the documented differences, not hidden; the ResNet-50 one is
within the table's rounding, the Transformer one within no price (``test_..._transformer_v100``).
"""

from __future__ import annotations

import pytest

import solvers.cloud as cloud
from planner.schema_cloud import CloudJob, CloudProblem
from solvers.cloud import chapter as ch
from solvers.cloud.catalogue import load_catalogue
from tests.solvers.cloud.helpers import generated_market

CAT = load_catalogue("ch6-2020")
MISMATCHES = {("Transformer", 1): 0.60, ("ResNet-50", 1): 1.74}


def test_table_6_1_dollar_normalized_speedups() -> None:
    for model, predicted in ch.table_6_1_predicted(CAT).items():
        for k in range(2):
            stated = ch.TABLE_6_1[model][1][k]
            if (model, k) in MISMATCHES:
                assert predicted[k] == pytest.approx(MISMATCHES[(model, k)], abs=0.005)
            else:
                assert predicted[k] == pytest.approx(stated, abs=0.05), (model, k)  # the table's one decimal


def test_table_6_1_transformer_v100_is_inconsistent_with_every_price() -> None:
    # The other four V100 rows, read with the table's rounding, pin the K80 / V100 price ratio to
    # [0.1813, 0.1852] (GCP 2020: 0.45 / 2.48 = 0.1815 inside); Transformer's 3.3x and 0.8x need
    # at least 0.2239, i.e. a V100 at most $2.01/h, or a V100 speedup of 4.1-4.7x at GCP's price.
    others = [ch.implied_price_ratio(m, 1) for m in ch.TABLE_6_1 if m != "Transformer"]
    lo, hi = max(r[0] for r in others), min(r[1] for r in others)
    assert (lo, hi) == (pytest.approx(0.1813, abs=1e-4), pytest.approx(0.1852, abs=1e-4))
    k80, v100 = (ch._single(CAT, "gcp", a).on_demand_usd_per_h for a in ("k80", "v100"))
    assert lo <= k80 / v100 <= hi
    t_lo, t_hi = ch.implied_price_ratio("Transformer", 1)
    assert t_lo == pytest.approx(0.2239, abs=1e-4) and t_lo > hi
    # the ResNet-50 cell: 9.65 x 0.1815 = 1.75 rounds to the stated 1.8
    r_lo, r_hi = ch.implied_price_ratio("ResNet-50", 1)
    assert r_lo <= k80 / v100 <= r_hi


def test_table_6_2_egress_fractions() -> None:
    predicted = ch.table_6_2_predicted(CAT)
    for model, (_, _, dataset_pct, model_pct) in ch.TABLE_6_2.items():
        assert predicted[model][0] == pytest.approx(dataset_pct, abs=0.06)
        assert predicted[model][1] == pytest.approx(model_pct, abs=0.0006)
    # "hundreds of transfers per model before reaching even 10 % of compute cost"
    assert all(100 <= 10 / pct < 10000 for _, pct in predicted.values())


def test_table_6_3_from_a_generated_trace() -> None:
    trace, _ = generated_market(0)
    predicted = ch.table_6_3_predicted(CAT, trace)
    for cloud_name, row in ch.TABLE_6_3.items():
        for acc, stated in row.items():
            if stated is None:
                assert predicted[cloud_name][acc] is None
            else:
                assert predicted[cloud_name][acc] == pytest.approx(stated, rel=2e-3)


def test_switching_example() -> None:
    split = ch.switching_example(CAT)
    assert (split["k80"], split["v100"]) == pytest.approx(ch.STATED_SWITCH_SPLIT, abs=1e-6)


def test_up_to_3_5x_cheaper_than_the_baseline() -> None:
    from solvers.cloud.replay import CHAPTER_RULE

    _, mk = generated_market(0)
    res = ch.end_to_end(CAT, mk, starts_h=tuple(float(h) for h in range(0, 30 * 24, 48)), rule=CHAPTER_RULE)
    best = max(r["dynamic"] for r in res.values())
    assert best == pytest.approx(ch.STATED_END_TO_END, rel=0.12)  # seeds 0-4 give 3.18-3.64 (docs/cloud.md)
    capped = ch.end_to_end(CAT, mk, starts_h=(0.0, 240.0), max_switches=3)  # the price-change rule
    assert all(r["max_switches_used"] <= 3 for r in capped.values())
    # ResNet-50 is cheapest on the steadily priced V100: dynamic switching adds little there
    assert res["ResNet-50"]["dynamic"] / res["ResNet-50"]["multi-cloud"] < 1.05
    for r in res.values():  # each strategy widens the choice of the one before (dynamic: with moves)
        assert r["multi-cloud"] >= r["multi-gpu"] - 1e-9


def test_chapter_rule_gain_grows_with_job_length() -> None:
    # Fig. 6.6 with the chapter's own rule (daily decisions, no threshold, no cap): about nothing
    # for half-day jobs, up to 1.16-1.37x for 16-day ones over seeds 0-4 (seed 1: 1.36x),
    # against the stated "up to 1.4x" (docs/cloud.md explains the gap and the moves).
    from solvers.cloud.replay import CHAPTER_RULE

    _, mk = generated_market(1)
    moves: dict[str, dict[float, int]] = {}
    gains = ch.dynamic_gain(CAT, mk, durations_days=(0.5, 16.0), starts_h=tuple(float(h) for h in range(0, 30 * 24, 48)),
                            rule=CHAPTER_RULE, switches_out=moves)
    assert max(g[0.5] for g in gains.values()) < 1.02
    assert max(g[16.0] for g in gains.values()) == pytest.approx(1.36, abs=0.01)
    assert max(m[16.0] for m in moves.values()) > 3  # more moves than the chapter's <= 3 on this trace


def test_moving_jobs_gains_more_on_long_jobs() -> None:
    _, mk = generated_market(1)
    gains = ch.dynamic_gain(CAT, mk, durations_days=(0.5, 4.0), starts_h=tuple(float(h) for h in range(0, 30 * 24, 48)))
    best_long = max(g[4.0] for g in gains.values())
    best_short = max(g[0.5] for g in gains.values())
    assert best_short < best_long
    assert 1.2 <= best_long <= ch.STATED_DYNAMIC * 1.05  # stated: up to 1.4x with <= 3 switches


def test_planner_derived_throughputs_feed_the_formulations() -> None:
    """A job given as model + batch gets its steps/s on each accelerator from the pipeline planner."""
    job = CloudJob(id="gpt", model="gpt-tiny", batch_size=8, num_steps=1e4)
    plan = cloud.solve(CloudProblem(jobs=(job,), markets=("on-demand",), clouds=("gcp",), instances=(
        "gcp/us-west1/n1-standard-4-k80x1", "gcp/us-west1/n1-standard-8-v100x1")), catalogue=CAT)
    from solvers.gavel.throughputs import derive_throughputs

    thr = derive_throughputs("gpt-tiny", 8, worker_types={"k80": 1, "v100": 1})
    assert thr["v100"] > thr["k80"] > 0
    # min-cost picks the option with the lowest price per step, computed from the derived throughputs
    per_step = {"k80": 0.45 / thr["k80"], "v100": 2.48 / thr["v100"]}
    cheaper = min(per_step, key=per_step.get)
    (key,) = plan.jobs["gpt"].fractions
    assert plan.options[key].accelerator == cheaper
    assert plan.total_usd == pytest.approx(1e4 / 3600 * per_step[cheaper], rel=1e-6)
