"""Megatron-Bridge's published BF16 pre-training rows (bench/fidelity_bridge.py, docs/cost-model.md
"Held-out runs"): held out on H100, B200 and GB200 (no constant was set on them; the Blackwell
presets carry Hopper's efficiency constants unfitted). Tolerances are the accuracy reached, with
the sign of each error, so a change that moves a row is seen; the errors are large and recorded
as such, not as targets met."""

from __future__ import annotations

import pytest

from cost_models.compute import compute_constants
from cost_models.hardware import cluster_preset, device_preset
from tests.bench_loader import load_bench

BRIDGE = load_bench("fidelity_bridge")


@pytest.fixture(scope="module")
def rows() -> list[dict[str, object]]:
    return BRIDGE.bridge_rows()


def test_blackwell_presets_are_the_datasheet_figures() -> None:
    """b200: 180 GB, 2.25 PF dense BF16, 4.5 PF FP8, 8 TB/s, 148 SMs, 8 per node on NVLink 5 (900 GB/s
    per direction), 400 Gb/s per GPU between nodes; gb200: 186 GB, 2.5 PF, 72 GPUs in one NVLink
    domain. The efficiency constants are H100's (unfitted)."""
    b200, gb200, h100 = device_preset("b200"), device_preset("gb200"), device_preset("h100")
    assert (b200.memory_bytes, b200.peak_flops, b200.memory_bandwidth_bytes_per_s) == (180 * 2**30, 2.25e15, 8e12)
    assert (gb200.memory_bytes, gb200.peak_flops) == (186 * 2**30, 2.5e15)
    b, g, h = compute_constants(b200), compute_constants(gb200), compute_constants(h100)
    assert b.num_sms == 148 and b.peak_flops_by_dtype["fp8"] == 4.5e15
    assert b.gemm_max_fraction == g.gemm_max_fraction == h.gemm_max_fraction
    assert b.attention_fractions == g.attention_fractions == h.attention_fractions
    node = cluster_preset("b200:64")
    assert (node.num_nodes, node.devices_per_node, node.intra_node_bytes_per_s, node.inter_node_bytes_per_s) == \
        (8, 8, 900e9, 50e9)
    rack = cluster_preset("gb200")
    assert (rack.num_nodes, rack.devices_per_node) == (1, 72)
    assert device_preset("b200-sxm") == b200 and device_preset("gb200-nvl72") == gb200


def test_gpt_oss_on_h100(rows: list[dict[str, object]]) -> None:
    """GPT-OSS 120B on 64 DGX-H100 (t1 p4 e8): 25.11 (b = 4, GBS 512) +2.8 %, 26.02 (b = 1, GBS 1,280,
    80 microbatches) +29.8 % in tokens/s/GPU (-0.7 and +24.9 % before the flash kernel was costed
    as one kernel at FlashAttention-3's training rate: its 64-wide heads had been slowed as GEMMs)."""
    errors = [float(r["error"]) for r in rows if r["system"] == "DGX-H100"]
    assert errors == pytest.approx([0.028, 0.298], abs=0.005)


def test_gpt_oss_on_b200(rows: list[dict[str, object]]) -> None:
    """GPT-OSS 120B on 64 DGX-B200 (t1 p1): EP 8 (25.11, all-to-all inside a node) +95.1 %, EP 64
    (26.02, all-to-all across nodes) +17.3 % (+91.5 and +15.2 % before the flash-kernel costing):
    the measured throughput is the same for both (8,213
    and 8,047), the predicted one falls by 41 % with the cross-node all-to-all, so what limits the
    real runs is not the all-to-all we cost."""
    errors = [float(r["error"]) for r in rows if r["system"] == "DGX-B200"]
    assert errors == pytest.approx([0.951, 0.173], abs=0.005)


def test_moe_rows_on_gb200(rows: list[dict[str, object]]) -> None:
    """GB200 (64 GPUs of one NVL72 domain for GPT-OSS, four 64-GPU domains for DeepSeek-V3 and
    Qwen3-235B-A22B): GPT-OSS +65.0 % (s = 8,192, b = 1) and +109.4 % (s = 4,096, b = 4);
    DeepSeek-V3 +20.8 %, Qwen3-235B-A22B +20.4 % (+50.6, +97.9, +20.4, +19.1 % before the
    flash-kernel costing)."""
    errors = [float(r["error"]) for r in rows if r["system"] == "DGX-GB200"]
    assert errors == pytest.approx([0.650, 1.094, 0.208, 0.204], abs=0.005)


def test_model_flops_accounting_differs(rows: list[dict[str, object]]) -> None:
    """Megatron-Bridge's model TFLOP/s per token is below ours on every row (GPT-OSS: 27 GFLOP per token
    at s = 4,096 against our 38; its count is not published), so the TFLOP/s error is always the
    larger of the two: compared in tokens/s/GPU."""
    for r in rows:
        assert float(r["tflops_error"]) > float(r["error"])


def test_bridge_summary_by_system(rows: list[dict[str, object]]) -> None:
    """Mean |error| in tokens/s/GPU: H100 16.3 % (max 29.8 %), B200 56.2 % (max 95.1 %), GB200 53.9 %
    (max 109.4 %); every Blackwell row over-predicts."""
    summary = BRIDGE.system_summary(rows)
    assert summary["DGX-H100"] == pytest.approx((0.163, 0.298, 2), abs=0.003)
    assert summary["DGX-B200"] == pytest.approx((0.562, 0.951, 2), abs=0.003)
    assert summary["DGX-GB200"] == pytest.approx((0.539, 1.094, 4), abs=0.003)
    assert all(float(r["error"]) > 0 for r in rows if r["system"] != "DGX-H100")
