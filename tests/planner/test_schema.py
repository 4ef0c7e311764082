"""Schema: JSON round trips, unknown keys, the contract examples, cross-field validation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.errors import InfeasibleError, InvalidProblemError
from planner.schema import (
    Action,
    Chunk,
    Cluster,
    Degrees,
    LayerProfile,
    ModelProfile,
    PipelineProblem,
    Plan,
    Predicted,
    SimResult,
    Stage,
    StageResult,
    Bubble,
    TransformerConfig,
    json_schemas,
)

# The examples of architecture.md, verbatim.
PROFILE_JSON = """{"format": "paraplan.profile/v1", "name": "toy",
 "layers": [
   {"name": "block0", "forward_s": 1.0, "backward_s": 2.0,
    "static_bytes": 8, "output_bytes": 0, "param_bytes": 2,
    "recompute": {"none": {"activation_bytes": 8, "extra_s": 0.0},
                  "full": {"activation_bytes": 1, "extra_s": 1.0}}}]}"""
CLUSTER_JSON = """{"format": "paraplan.cluster/v1", "name": "toy2",
 "device": {"name": "gpu", "memory_bytes": 128, "peak_flops": 1e12},
 "num_nodes": 1, "devices_per_node": 2,
 "intra_node_bytes_per_s": 1e18, "inter_node_bytes_per_s": 1e18}"""
GAVEL_CLUSTER_JSON = '{"format": "paraplan.cluster/v1", "name": "c", "worker_types": {"v100": 1, "k80": 1}}'


def _toy_plan() -> Plan:
    layer = LayerProfile(name="l", forward_s=1, backward_s=2, activation_bytes=4, static_bytes=8)
    model = ModelProfile(name="m", layers=(layer,) * 4)
    return Plan(
        solver="even",
        model=model,
        cluster=Cluster.from_json(CLUSTER_JSON),
        degrees=Degrees(pipeline=2),
        schedule="1f1b",
        microbatch_size=1,
        num_microbatches=4,
        global_batch_size=4,
        stages=(
            Stage(index=0, ranks=(0,), chunks=(Chunk(layers=(0, 2), recompute={"none": 2}),)),
            Stage(index=1, ranks=(1,), chunks=(Chunk(layers=(2, 4)),)),
        ),
        predicted=Predicted(
            iteration_time_s=15, throughput_samples_per_s=4 / 15, bubble_fraction=0.2, bottleneck_s=6,
            peak_memory_bytes=(32, 24),
        ),
    )


def test_contract_examples_parse() -> None:
    profile = ModelProfile.from_json(PROFILE_JSON)
    assert profile.layers[0].strategies()["full"].extra_s == 1.0
    cluster = Cluster.from_json(CLUSTER_JSON)
    assert cluster.num_devices == 2
    assert cluster.link(0, 1) == (1e18, 0.0)
    gavel = Cluster.from_json(GAVEL_CLUSTER_JSON)
    assert gavel.num_devices == 2


@pytest.mark.parametrize(
    "obj",
    [
        ModelProfile.from_json(PROFILE_JSON),
        Cluster.from_json(CLUSTER_JSON),
        TransformerConfig(name="t", hidden_size=64, num_layers=2, num_heads=4, seq_length=16, vocab_size=100),
        _toy_plan(),
        SimResult(
            iteration_time_s=1.0, bubble_fraction=0.1, throughput_samples_per_s=2.0, memory_capacity_bytes=10,
            fits_memory=True,
            stages=(StageResult(index=0, busy_s=0.9, idle_s=0.1, peak_memory_bytes=3, peak_inflight_microbatches=1,
                                bubbles=(Bubble(start_s=0.9, end_s=1.0, free_memory_bytes=7),)),),
        ),
    ],
)
def test_json_round_trip(obj) -> None:
    again = type(obj).from_json(obj.to_json())
    assert again == obj


def test_unknown_key_rejected_with_its_path() -> None:
    data = json.loads(PROFILE_JSON)
    data["layers"][0]["fwd_ms"] = 3
    with pytest.raises(InvalidProblemError, match=r"unknown key 'layers\.0\.fwd_ms'"):
        ModelProfile.from_dict(data)


def test_malformed_json_names_position() -> None:
    with pytest.raises(InvalidProblemError, match="malformed JSON for ModelProfile: .* line 1"):
        ModelProfile.from_json('{"name": "x", "layers": [}')


@pytest.mark.parametrize("field,value", [("forward_s", 0), ("backward_s", -1.0), ("static_bytes", -4)])
def test_nonpositive_times_and_negative_sizes_rejected(field: str, value: float) -> None:
    data = json.loads(PROFILE_JSON)
    data["layers"][0][field] = value
    with pytest.raises(InvalidProblemError, match=rf"layers\.0\.{field} = {value!r}"):
        ModelProfile.from_dict(data)


def test_backward_weight_must_be_part_of_backward() -> None:
    with pytest.raises(ValueError, match="backward_weight_s=2.0 must be smaller than backward_s=2.0"):
        LayerProfile(name="l", forward_s=1, backward_s=2, backward_weight_s=2)


def test_chunk_recompute_counts_and_lists() -> None:
    chunk = Chunk(layers=(4, 8), recompute={"full": 2, "selective": (7,)})
    assert chunk.layer_strategies() == ("full", "full", "none", "selective")
    with pytest.raises(ValueError, match="layer 5 has two recompute strategies"):
        Chunk(layers=(4, 8), recompute={"full": 2, "selective": (5,)})
    with pytest.raises(ValueError, match="outside the chunk"):
        Chunk(layers=(4, 8), recompute={"full": (9,)})


def test_plan_must_cover_layers_exactly_once() -> None:
    plan = _toy_plan()
    data = json.loads(plan.to_json())
    data["stages"][1]["chunks"][0]["layers"] = [3, 4]
    with pytest.raises(InvalidProblemError, match="layer 2 is missing"):
        Plan.from_dict(data)


def test_plan_rejects_unknown_strategy() -> None:
    data = json.loads(_toy_plan().to_json())
    data["stages"][0]["chunks"][0]["recompute"] = {"full": 1}
    with pytest.raises(InvalidProblemError, match="no recompute strategy 'full'"):
        Plan.from_dict(data)


def test_problem_more_stages_than_layers_is_left_to_the_solvers() -> None:
    # infeasibility (exit 3) is the solvers' to report, with the depth that would work
    from solvers.common import resolve_layout

    model = ModelProfile.from_json(PROFILE_JSON)
    problem = PipelineProblem(model=model, cluster=Cluster.from_json(CLUSTER_JSON), num_stages=2)
    with pytest.raises(InfeasibleError, match="need at least 2 layers but model .* has 1; use at most 1 stages"):
        resolve_layout(problem, 2)


def test_problem_interleaved_microbatches_multiple_of_stages() -> None:
    layer = LayerProfile(name="l", forward_s=1, backward_s=2)
    model = ModelProfile(name="m", layers=(layer,) * 8)
    cluster = Cluster.from_json(CLUSTER_JSON)
    with pytest.raises(ValueError, match="multiple of num_stages=2 .* use 4 or 6"):
        PipelineProblem(
            model=model, cluster=cluster, schedule="interleaved-1f1b", num_stages=2, num_chunks=2, num_microbatches=5
        )


def test_action_strings_round_trip() -> None:
    for text in ("0F0", "12B31", "3I7", "1W0"):
        assert str(Action.parse(text)) == text
    with pytest.raises(InvalidProblemError, match="cannot parse action '2X0'"):
        Action.parse("2X0")


def test_json_schema_docs_are_current() -> None:
    docs = Path(__file__).resolve().parents[2] / "docs" / "schema"
    for name, schema in json_schemas().items():
        committed = json.loads((docs / name).read_text())
        assert committed == json.loads(json.dumps(schema)), f"docs/schema/{name} is stale: run scripts/export_schemas.py"
