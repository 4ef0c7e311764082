"""Cloud boundary types: JSON round trip, unknown keys and bad values refused."""

from __future__ import annotations

import pytest

import solvers.cloud as cloud
from planner.errors import InvalidProblemError
from planner.schema_cloud import Catalogue, CloudJob, CloudPlan, CloudProblem, PriceSeries
from solvers.cloud.catalogue import bundled_catalogues, load_catalogue


@pytest.mark.parametrize("name", bundled_catalogues())
def test_bundled_catalogues_round_trip(name: str) -> None:
    cat = load_catalogue(name)
    assert Catalogue.from_json(cat.to_json()) == cat
    assert cat.sources and cat.prices_as_of


def test_plan_round_trip() -> None:
    job = CloudJob(id="a", throughputs={"k80": 1.0, "v100": 3.0}, num_steps=3600.0, slo_h=2)
    plan = cloud.solve(CloudProblem(jobs=(job,)))
    assert CloudPlan.from_json(plan.to_json()) == plan


def test_unknown_key_and_missing_throughputs_are_refused() -> None:
    with pytest.raises(InvalidProblemError, match="unknown key 'gpus'"):
        CloudJob.from_dict({"id": "a", "throughputs": {"k80": 1.0}, "num_steps": 1, "gpus": 2})
    with pytest.raises(InvalidProblemError, match="needs 'throughputs'"):
        CloudJob.from_dict({"id": "a", "num_steps": 1})


def test_catalogue_refuses_duplicates_and_unknown_clouds() -> None:
    data = load_catalogue("ch6-2020").model_dump()
    data["instances"] = [*data["instances"], data["instances"][0]]
    with pytest.raises(InvalidProblemError, match="listed twice"):
        Catalogue.from_dict(data)
    data = load_catalogue("ch6-2020").model_dump()
    data["instances"][0]["cloud"] = "ibm"
    with pytest.raises(InvalidProblemError, match="cloud 'ibm' is not in 'clouds'"):
        Catalogue.from_dict(data)


def test_series_out_of_time_order_is_refused() -> None:
    with pytest.raises(InvalidProblemError, match="sort the points by time"):
        PriceSeries.from_dict({"instance": "aws/r/x", "points": [{"time_h": 2, "usd_per_h": 1}, {"time_h": 1, "usd_per_h": 1}]})


def test_unknown_bundled_catalogue_lists_them() -> None:
    with pytest.raises(InvalidProblemError, match=r"unknown catalogue 'aws-2019'; bundled ones: \['ch6-2020', 'public-2024'\]"):
        load_catalogue("aws-2019")
