"""``paraplan plan --activation-offload``: ptdp searches offload next to its recompute settings and
the plan carries it to simulate and the exports (one stage: Megatron-Core offloads without a
pipeline only); a device without a host link exits 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli import main


def test_ptdp_plan_with_offload_simulates_and_exports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "llama3-70b", "--cluster", "gb200:64", "--global-batch", "512", "--solver", "ptdp",
                 "--activation-offload", "--option", "pipeline_parallel=1", "--option", "num_simulated=1",
                 "-o", str(out)]) == 0
    plan = json.loads(out.read_text())
    assert plan["options"]["recompute"].endswith(",offload")
    used = {s for stage in plan["stages"] for chunk in stage["chunks"] for s in chunk["recompute"]}
    assert used == {"offload"}
    capsys.readouterr()
    assert main(["simulate", str(out)]) == 0
    assert main(["export", str(out), "--format", "megatron"]) == 0
    assert "--cpu-offloading-num-layers 79" in capsys.readouterr().out


def test_offload_without_a_host_link_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps({"format": "paraplan.cluster/v1", "name": "toy",
                                   "device": {"name": "gpu", "memory_bytes": 8e10, "peak_flops": 1e15},
                                   "num_nodes": 1, "devices_per_node": 8,
                                   "intra_node_bytes_per_s": 3e11, "inter_node_bytes_per_s": 5e10}))
    assert main(["plan", "--model", "gpt-tiny", "--cluster", str(cluster), "--solver", "stage-ilp", "--pipeline", "2",
                 "--activation-offload"]) == 2
    err = capsys.readouterr().err
    assert "host_link_bytes_per_s" in err and "Traceback" not in err


def test_per_layer_solver_plans_again_without_offload_when_the_host_cannot_hold_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """stage-ilp picks offload per layer but does not check host memory: with 256 GiB per GPU its plan
    keeps the offloaded layers; with 4 GiB the plan (76.6 GiB of activations on rank 0) is refused
    and planned again without offload (full recompute), and the note says why; ``simulate`` of the
    kept plan on a host of 4 GiB exits 3."""
    from planner import api

    cluster = api.load_cluster("h100:2")

    def planned(host_gib: float):
        device = cluster.device.model_copy(update={"host_memory_bytes": host_gib * 2**30, "host_link_bytes_per_s": 900e9})
        problem = api.make_problem("llama3-8b", cluster.model_copy(update={"device": device}), num_stages=2,
                                   global_batch_size=64, microbatch_size=2, activation_offload=True)
        return api.plan(problem, solver="stage-ilp", options={"ilp_time_s": 20})

    def used(plan) -> set[str]:
        return {s for stage in plan.stages for chunk in stage.chunks for s in chunk.layer_strategies()} - {"none"}

    kept = planned(256)
    assert used(kept) == {"offload"}
    # simulate reports the host memory taken, and says it in its exit status when the host the plan
    # names cannot hold it
    path = tmp_path / "plan.json"
    path.write_text(kept.model_dump_json())
    assert main(["simulate", str(path)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("host memory (offloaded"))
    assert line.endswith("of 256.00 GiB, fits")
    data = json.loads(kept.model_dump_json())
    data["cluster"]["device"]["host_memory_bytes"] = 4 * 2**30
    path.write_text(json.dumps(data))
    assert main(["simulate", str(path)]) == 3
    assert "does not fit host memory" in capsys.readouterr().err
    small = planned(4)
    assert used(small) == {"full"}
    assert "activation offload dropped" in small.notes[-1] and "76.6 GiB of host memory" in small.notes[-1]
