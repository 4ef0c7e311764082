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
