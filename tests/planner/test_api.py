"""The Python API as an autotuner uses it: schema objects in, schema objects out, no files."""

from __future__ import annotations

import pytest

from planner import api
from planner.errors import InvalidProblemError
from planner.schema import ModelProfile, Plan, SimResult, TransformerConfig


def test_autotuner_loop_plans_and_simulates_in_process() -> None:
    config = api.load_model("gpt-1.7b")
    assert isinstance(config, TransformerConfig)
    cluster = api.load_cluster("a100-80gb:8")
    seen = {}
    for p in (1, 2, 4, 8):
        problem = api.make_problem(config, cluster, num_stages=p, num_microbatches=8, data_parallel=1)
        plan = api.plan(problem, solver="even")
        result = api.simulate(plan)
        assert isinstance(plan, Plan) and isinstance(result, SimResult)
        assert plan.predicted is not None
        assert plan.predicted.iteration_time_s == pytest.approx(result.iteration_time_s, rel=1e-12)
        seen[p] = result.iteration_time_s
    # more stages split the same work: each step is faster until the bubble dominates
    assert seen[2] < seen[1]


def test_profile_model_and_plan_json_round_trip() -> None:
    problem = api.make_problem("pipedream:vgg16", "a100-80gb:8", num_stages=4, num_microbatches=8)
    assert isinstance(problem.model, ModelProfile)
    plan = api.plan(problem)
    again = api.load_plan(plan.to_json())
    assert again == plan
    assert api.simulate(again).iteration_time_s == pytest.approx(plan.predicted.iteration_time_s)  # type: ignore[union-attr]


def test_profiles_fix_microbatch_and_tensor_parallel() -> None:
    with pytest.raises(InvalidProblemError, match="measured at tensor_parallel=1"):
        api.make_problem("pipedream:vgg16", "v100:8", tensor_parallel=2)


def test_export_formats() -> None:
    plan = api.plan(api.make_problem("gpt-1.7b", "a100-80gb:8", num_stages=2, num_microbatches=4, data_parallel=1))
    assert api.export(plan, "torch-csv").count("\n") >= 1
    assert "--pipeline-model-parallel-size 2" in api.export(plan, "megatron")
    with pytest.raises(InvalidProblemError, match="unknown export format"):
        api.export(plan, "deepspeed")  # type: ignore[arg-type]


def test_top_level_package_exposes_the_api() -> None:
    import planner

    assert planner.plan is api.plan and planner.simulate is api.simulate
