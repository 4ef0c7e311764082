"""Megatron-Bridge's published BF16 pre-training rows (bench/fidelity_bridge.py, docs/cost-model.md
"Held-out runs"): held out on H100, B200 and GB200 (no constant was set on them; the Blackwell
presets' efficiency constants come from published microbenchmarks, not from training rows). Tolerances are the accuracy reached, with
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
    domain. The efficiency constants follow the published microbenchmarks, not these rows: GEMMs at
    H100's fractions times the share of peak Blackwell's cuBLASLt reaches against Hopper's in one
    harness (FP8 8192-32768 cubed: GB200 2,781.5/2,819.5/2,755.3 of 5,000 TF/s, H200 1,269.4/1,305.0/
    1,333.2 of 1,979); attention: cuDNN at FlashAttention-4's 1,613 TF/s forward over 1.3, FA4 itself,
    both with FA3's H100 backward/forward ratio (561/648) for the 2.5 forwards of the backward;
    FlashAttention-2 at its measured 373.9 TF/s on GB200; no fa3 (Hopper-only)."""
    b200, gb200, h100 = device_preset("b200"), device_preset("gb200"), device_preset("h100")
    assert (b200.memory_bytes, b200.peak_flops, b200.memory_bandwidth_bytes_per_s) == (180 * 2**30, 2.25e15, 8e12)
    assert (gb200.memory_bytes, gb200.peak_flops) == (186 * 2**30, 2.5e15)
    b, g, h = compute_constants(b200), compute_constants(gb200), compute_constants(h100)
    assert b.num_sms == 148 and b.peak_flops_by_dtype["fp8"] == 4.5e15
    ratio = (sum([2781.5, 2819.5, 2755.3]) / 3 / 5000) / (sum([1269.4, 1305.0, 1333.2]) / 3 / 1978.9)
    assert ratio == pytest.approx(0.846, abs=0.001)
    for c in (b, g):
        assert c.gemm_max_fraction == pytest.approx(h.gemm_max_fraction * ratio, abs=0.005)
        assert c.fp8_gemm_max_fraction == pytest.approx(h.fp8_gemm_max_fraction * ratio, abs=0.005)
        step = 3.5 / (1 / (1613 / 1.3) + 2.5 / (1613 / 1.3 * 561 / 648)) / 2250
        assert c.attention_fractions["cudnn"] == pytest.approx(step, abs=0.005) and c.attention_kernel == "cudnn"
        assert c.attention_fractions["fa4"] == pytest.approx(step * 1.3, abs=0.005)
        assert c.attention_fractions["fa2"] == pytest.approx(373.9 / 2500, abs=0.001)
        assert c.attention_fractions["fa1"] == c.attention_fractions["fa2"] / 2 and "fa3" not in c.attention_fractions
    node = cluster_preset("b200:64")
    assert (node.num_nodes, node.devices_per_node, node.intra_node_bytes_per_s, node.inter_node_bytes_per_s) == \
        (8, 8, 900e9, 50e9)
    rack = cluster_preset("gb200")
    assert (rack.num_nodes, rack.devices_per_node) == (1, 72)
    assert device_preset("b200-sxm") == b200 and device_preset("gb200-nvl72") == gb200


def test_gpt_oss_on_h100(rows: list[dict[str, object]]) -> None:
    """GPT-OSS 120B on 64 DGX-H100 (t1 p4 e8): 25.11 (b = 4, GBS 512) +8.5 %, 26.02 (b = 1, GBS 1,280,
    80 microbatches) +37.0 % in tokens/s/GPU (+2.8 and +29.8 % while its 128-token windows were costed
    as full causal attention: the windowed layers are cheaper, and what the runs spend instead is not
    in the model)."""
    errors = [float(r["error"]) for r in rows if r["system"] == "DGX-H100"]
    assert errors == pytest.approx([0.085, 0.370], abs=0.005)


def test_gpt_oss_on_b200(rows: list[dict[str, object]]) -> None:
    """GPT-OSS 120B on 64 DGX-B200 (t1 p1): EP 8 (25.11, all-to-all inside a node) +91.3 %, EP 64
    (26.02, all-to-all across nodes) +15.3 % (+85.4 and +11.7 % with its windows costed as full
    attention; +95.1 and +17.3 % with Hopper's efficiency constants):
    the measured throughput is the same for both (8,213 and 8,047), the predicted one falls by 41 %
    with the cross-node all-to-all, so what limits the real runs is not the all-to-all we cost."""
    errors = [float(r["error"]) for r in rows if r["system"] == "DGX-B200"]
    assert errors == pytest.approx([0.913, 0.153], abs=0.005)


def test_moe_rows_on_gb200(rows: list[dict[str, object]]) -> None:
    """GB200 (64 GPUs of one NVL72 domain for GPT-OSS, four 64-GPU domains for DeepSeek-V3 and
    Qwen3-235B-A22B): GPT-OSS +70.2 % (s = 8,192, b = 1) and +93.6 % (s = 4,096, b = 4, its all-to-all
    overlapped: the compute under it runs on the SMs NCCL leaves it; +98.1 % before that was costed;
    +44.7 and +80.6 % with full attention in the windowed layers);
    DeepSeek-V3 +2.4 % (+5.7 % without its multi-token-prediction module, which the recipe trains),
    Qwen3-235B-A22B +6.7 % (+65.0, +109.4, +20.8, +20.4 % with Hopper's efficiency constants)."""
    errors = [float(r["error"]) for r in rows if r["system"] == "DGX-GB200"]
    assert errors == pytest.approx([0.702, 0.936, 0.024, 0.067], abs=0.005)


def test_model_flops_accounting_differs(rows: list[dict[str, object]]) -> None:
    """Megatron-Bridge's model TFLOP/s per token is below ours on every row (GPT-OSS: 27 GFLOP per token
    at s = 4,096 against our 35, which counts the causal global layers in full as Eq. 4.2 does; its
    count is not published), so the TFLOP/s error is always the larger of the two: compared in
    tokens/s/GPU."""
    for r in rows:
        assert float(r["tflops_error"]) > float(r["error"])


def test_bridge_summary_by_system(rows: list[dict[str, object]]) -> None:
    """Mean |error| in tokens/s/GPU: H100 22.8 % (max 37.0 %), B200 53.3 % (max 91.3 %), GB200 43.2 %
    (max 93.6 %); every row over-predicts."""
    summary = BRIDGE.system_summary(rows)
    assert summary["DGX-H100"] == pytest.approx((0.228, 0.370, 2), abs=0.003)
    assert summary["DGX-B200"] == pytest.approx((0.533, 0.913, 2), abs=0.003)
    assert summary["DGX-GB200"] == pytest.approx((0.432, 0.936, 4), abs=0.003)
    assert all(float(r["error"]) > 0 for r in rows)
