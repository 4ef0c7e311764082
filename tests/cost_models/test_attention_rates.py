"""The flash-attention core is one fused kernel whose FLOPs run at its kernel family's share of
peak (docs/cost-model.md, section 2, "Attention core"): one thread block per 128 query rows of a
head, in waves over the SMs, each looping over the keys it attends plus one step of prologue and
epilogue. Hand counts, the families' published rates, and the published length curve."""

from __future__ import annotations

import math

import pytest

from cost_models import layer_ops
from cost_models.compute import FLASH_BLOCK, FLASH_GEMM_RELATIVE_RATE, compute_constants, flash_attention_s
from cost_models.hardware import device_preset
from planner.schema import Device, TransformerConfig

CFG = TransformerConfig(name="t", hidden_size=4096, num_layers=2, num_heads=32, seq_length=8192, vocab_size=32000)


def _core_fwd(device: Device, cfg: TransformerConfig = CFG) -> float:
    return layer_ops.decoder_op_times(cfg, device, microbatch_size=1, attention="flash").selective_s


def _with_kernel(device: Device, kernel: str) -> Device:
    compute = compute_constants(device).model_copy(update={"attention_kernel": kernel})
    return device.model_copy(update={"compute": compute})


def test_hand_count_on_h100() -> None:
    """s = 8,192, 32 heads of 128, b = 1 on H100 (132 SMs) with FlashAttention-3: 32 x 64 = 2,048
    query blocks in ceil(2048 / 132) = 16 waves; each block runs 2 x 128 x (4,096 causal keys + 128)
    x (128 + 128) FLOPs at 0.59 of an SM's share of 989.4 TF/s; plus one launch."""
    h100 = device_preset("h100")
    c = compute_constants(h100)
    per_block = 2 * 128 * (8192 / 2 + 128) * (128 + 128)
    expected = 16 * per_block / (989.4e12 / 132 * 0.59) + c.kernel_launch_s
    assert FLASH_BLOCK == 128 and c.gemm_k_overhead == 128 and c.attention_kernel == "fa3"
    assert _core_fwd(h100) == pytest.approx(expected, rel=1e-12)
    fwd = layer_ops.decoder_op_times(CFG, h100, microbatch_size=1, attention="flash")
    assert fwd.selective_s == pytest.approx(expected, rel=1e-12)


def test_backward_is_two_and_a_half_forwards() -> None:
    """The backward runs 5 score-sized matmuls against the forward's 2 at the same rate."""
    h100 = device_preset("h100")
    fwd, bwd = layer_ops._attention_core(CFG, h100, 1, 1, "flash")
    assert bwd == pytest.approx(layer_ops.FLASH_BACKWARD_FACTOR * fwd) and layer_ops.FLASH_BACKWARD_FACTOR == 2.5


def test_family_rates_are_the_published_ones() -> None:
    """H100: FlashAttention-3's training rate from its paper's head-dim-128 BF16 benchmarks at 16k
    (forward 648, backward 561 TFLOP/s: 3.5 / (1/648 + 2.5/561) = 583 TFLOP/s = 0.59 of 989.4),
    FlashAttention-2 at 35 % of peak; FlashAttention (v1, and its Triton port) at half of
    FlashAttention-2 on both devices ("about 2x"); A100 FlashAttention-2 at 0.612."""
    h100, a100 = compute_constants(device_preset("h100")), compute_constants(device_preset("a100-80gb"))
    assert 3.5 / (1 / 648 + 2.5 / 561) / 989.4 == pytest.approx(h100.attention_fractions["fa3"], abs=0.005)
    assert h100.attention_fractions == {"fa1": 0.175, "fa2": 0.35, "fa3": 0.59, "cudnn": 0.59}
    assert a100.attention_fractions == {"fa1": 0.306, "fa2": 0.612}
    for c in (h100, a100):
        assert c.attention_fractions["fa1"] == pytest.approx(c.attention_fractions["fa2"] / 2)


def test_kernel_families_scale_the_time_by_their_rates() -> None:
    h100 = device_preset("h100")
    launch = compute_constants(h100).kernel_launch_s
    fa3 = _core_fwd(_with_kernel(h100, "fa3")) - launch
    for kernel, fraction in (("fa1", 0.175), ("fa2", 0.35)):
        assert _core_fwd(_with_kernel(h100, kernel)) - launch == pytest.approx(fa3 * 0.59 / fraction, rel=1e-12)
    assert _core_fwd(h100) == _core_fwd(_with_kernel(h100, "fa3"))  # the H100 preset runs FlashAttention-3-class


def test_unknown_family_falls_back_to_the_gemm_relative_rate() -> None:
    """V100 lists no flash family (FlashAttention-2 needs Ampere): 0.85 of its GEMM fraction."""
    v100 = device_preset("v100")
    c = compute_constants(v100)
    assert not c.attention_fractions
    blocks = 32 * 64
    per_block = 2 * 128 * (4096 + 128) * 256
    expected = math.ceil(blocks / c.num_sms) * per_block / (v100.peak_flops / c.num_sms * 0.85 * c.gemm_max_fraction)
    assert FLASH_GEMM_RELATIVE_RATE == 0.85
    assert _core_fwd(v100) == pytest.approx(expected + c.kernel_launch_s, rel=1e-12)


def test_head_width_sets_the_flops_not_the_rate() -> None:
    """64 heads of 64 and 32 heads of 128 (the same h) take the same time: the kernel loops over
    keys, so its rate does not depend on the head width (a GEMM over K = d_head would make the
    64-wide heads a third slower)."""
    a100 = device_preset("a100-80gb")
    narrow = CFG.model_copy(update={"num_heads": 64})
    assert _core_fwd(a100, narrow) == pytest.approx(_core_fwd(a100), rel=1e-12)


def test_causal_mask_halves_the_keys() -> None:
    a100 = device_preset("a100-80gb")
    causal = flash_attention_s(8192, 8192, 128, 128, 32, a100)
    full = flash_attention_s(8192, 8192, 128, 128, 32, a100, causal=False)
    assert causal / full == pytest.approx((4096 + 128) / (8192 + 128), rel=1e-12)


def test_length_curve_follows_flashattention3_benchmark() -> None:
    """Rate at sequence length s relative to 16k, non-causal, head dim 128, batch x s = 16k tokens,
    16 heads (the [fa3] Sec. 4.1 setting): published FlashAttention-3 forward 467, 565, 625, 638, 646
    and 648 TFLOP/s at 512 ... 16k. The model's relative rates agree within 0.09 (0.81 against 0.72
    at 512, where the measured kernel loses more than one step of overhead), within 0.03 from 1k."""
    h100 = device_preset("h100")
    published = {512: 467, 1024: 565, 2048: 625, 4096: 638, 8192: 646, 16384: 648}

    def rate(s: int) -> float:
        heads = 16 * (16384 // s)
        flops = 4 * s * s * 128 * heads
        return flops / flash_attention_s(s, s, 128, 128, heads, h100, causal=False)

    for s, tflops in published.items():
        tolerance = 0.09 if s == 512 else 0.03
        assert rate(s) / rate(16384) == pytest.approx(tflops / 648, abs=tolerance)


def test_short_waves_are_quantized() -> None:
    """One head of 128 query rows is one thread block: the same time as 132 heads on 132 SMs."""
    h100 = device_preset("h100")
    one = flash_attention_s(128, 128, 128, 128, 1, h100)
    assert flash_attention_s(128, 128, 128, 128, 132, h100) == pytest.approx(one, rel=1e-12)
    assert flash_attention_s(128, 128, 128, 128, 133, h100) == pytest.approx(2 * one, rel=1e-12)
    assert flash_attention_s(0, 128, 128, 128, 1, h100) == 0.0
