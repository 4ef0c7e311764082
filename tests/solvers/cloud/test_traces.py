"""Spot-price traces: the CSV validator and the generator's statistics (ch. 6 sec. 6.3.2, Table 6.3)."""

from __future__ import annotations

import numpy as np
import pytest

from planner.errors import InvalidProblemError
from solvers.cloud.catalogue import load_catalogue
from solvers.cloud.chapter import TABLE_6_3
from solvers.cloud.traces import check_trace, generate_trace, parse_trace_csv, trace_stats, trace_to_csv

HEADER = "timestamp,cloud,region,zone,instance,usd_per_hour\n"
CAT = load_catalogue("ch6-2020")


@pytest.fixture(scope="module")
def stats() -> dict[str, dict[str, float]]:
    return trace_stats(generate_trace(CAT, seed=0), CAT)


def test_csv_round_trip() -> None:
    trace = generate_trace(CAT, seed=3)
    again = parse_trace_csv(trace_to_csv(trace))
    assert {(s.instance, s.zone): s.points for s in again.series} == {(s.instance, s.zone): s.points for s in trace.series}


def test_generator_is_deterministic_per_seed() -> None:
    assert generate_trace(CAT, seed=5) == generate_trace(CAT, seed=5)
    assert generate_trace(CAT, seed=5) != generate_trace(CAT, seed=6)


def test_best_case_reduction_is_table_6_3(stats) -> None:
    for inst in CAT.instances:
        if inst.num_accelerators == 1 and TABLE_6_3[inst.cloud].get(inst.accelerator):
            assert stats[inst.key]["best_reduction"] == pytest.approx(TABLE_6_3[inst.cloud][inst.accelerator], rel=2e-3)


def test_prices_stay_capped_at_on_demand(stats) -> None:
    for key, s in stats.items():
        assert s["max_usd_per_h"] <= CAT.instance(key).on_demand_usd_per_h + 1e-9


def test_fixed_and_constant_prices_do_not_move(stats) -> None:
    assert stats["aws/us-east-1/p3.16xlarge"]["changes_per_day"] == 0
    for inst in CAT.instances:
        if inst.cloud == "gcp":
            assert stats[inst.key]["changes_per_day"] == 0


def test_prices_change_about_every_other_day() -> None:
    """0.5 changes a day per moving series (the default), averaged over seeds; at most daily."""
    rates = []
    for seed in range(4):
        trace = generate_trace(CAT, seed=seed)
        for s in trace.series:
            if len(s.points) > 1:
                rates.append((len(s.points) - 1) / 90.0)
    assert 0.3 < float(np.mean(rates)) < 0.55


def test_cheapest_zone_changes_and_multi_gpu_is_steadier(stats) -> None:
    assert stats["aws/us-east-1/p2.xlarge"]["cheapest_zone_changes"] >= 1
    cv_single = np.mean([trace_stats(generate_trace(CAT, seed=s), CAT)["azure/eastus/Standard_NC6s_v2"]["cv"] for s in range(3)])
    cv_multi = np.mean([trace_stats(generate_trace(CAT, seed=s), CAT)["azure/eastus/Standard_NC24s_v2"]["cv"] for s in range(3)])
    assert cv_multi < cv_single


@pytest.mark.parametrize(("body", "match"), [
    ("2020-02-01T01:00:00Z,aws,us-east-1,a,p2.xlarge,0.5\n2020-02-01T00:00:00Z,aws,us-east-1,a,p2.xlarge,0.6\n",
     "line 3: timestamp 2020-02-01T00:00:00Z is not after the previous one.*sort the rows"),
    ("2020-02-01T00:00:00Z,aws,us-east-1,a,p2.xlarge,-0.5\n", "line 2: usd_per_hour=-0.5 is negative"),
    ("yesterday,aws,us-east-1,a,p2.xlarge,0.5\n", "timestamp 'yesterday' is not ISO 8601"),
    ("2020-02-01T00:00:00Z,aws,us-east-1,a,p2.xlarge\n", "line 2 has 5 columns"),
])
def test_bad_rows_are_refused(body: str, match: str) -> None:
    with pytest.raises(InvalidProblemError, match=match):
        parse_trace_csv(HEADER + body)


def test_wrong_unit_is_refused_with_the_conversion() -> None:
    text = "timestamp,cloud,region,zone,instance,usd_per_month\n2020-02-01T00:00:00Z,aws,us-east-1,a,p2.xlarge,657\n"
    with pytest.raises(InvalidProblemError, match=r"usd_per_month.*dollars per hour.*divide each price by 730 and rename the column usd_per_hour"):
        parse_trace_csv(text)


def test_unknown_instance_in_a_trace_lists_the_valid_ones() -> None:
    trace = parse_trace_csv(HEADER + "2020-02-01T00:00:00Z,aws,us-east-1,a,p9.xlarge,0.5\n")
    with pytest.raises(InvalidProblemError, match=r"'aws/us-east-1/p9.xlarge' is not an instance type.*valid ones: \["):
        check_trace(trace, CAT)
