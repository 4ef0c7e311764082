"""The flash-attention core runs at the rate of the device's kernel family (docs/cost-model.md,
section 2): FlashAttention-2 at 35 % of H100 peak, FlashAttention-3 at 75 % ([fa3] Sec. 1 and
abstract), FlashAttention-2 on A100 at 0.612 of peak (0.85 of the fitted GEMM fraction)."""

from __future__ import annotations

import pytest

from cost_models import layer_ops
from cost_models.compute import compute_constants, gemm_compute_s
from cost_models.hardware import device_preset
from planner.schema import Device, TransformerConfig

CFG = TransformerConfig(name="t", hidden_size=4096, num_layers=2, num_heads=32, seq_length=8192, vocab_size=32000)


def _core_fwd(device: Device) -> float:
    return layer_ops.decoder_op_times(CFG, device, microbatch_size=1, attention="flash").selective_s


def _with_kernel(device: Device, kernel: str) -> Device:
    compute = compute_constants(device).model_copy(update={"attention_kernel": kernel})
    return device.model_copy(update={"compute": compute})


def _core_tiles_s(device: Device) -> float:
    """Half (causal) of the two score GEMMs' tile time at the GEMM fraction, b = 1, t = 1."""
    s, d = CFG.seq_length, CFG.hidden_size // CFG.num_heads
    heads = CFG.num_heads
    return 0.5 * (gemm_compute_s(s, s, d, device, batch=heads) + gemm_compute_s(s, d, s, device, batch=heads))


def test_h100_kernel_families() -> None:
    h100 = device_preset("h100")
    launch = compute_constants(h100).kernel_launch_s
    tiles, gemm = _core_tiles_s(h100), compute_constants(h100).gemm_max_fraction
    for kernel, fraction in (("fa2", 0.35), ("fa3", 0.75)):
        fwd = _core_fwd(_with_kernel(h100, kernel))
        assert fwd == pytest.approx(tiles * gemm / fraction + launch, rel=1e-12)
    assert _core_fwd(h100) == _core_fwd(_with_kernel(h100, "fa3"))  # the H100 preset runs FlashAttention-3-class kernels


def test_a100_keeps_the_rate_its_rows_were_checked_with() -> None:
    a100 = device_preset("a100-80gb")
    fwd = _core_fwd(a100)
    old = _core_tiles_s(a100) / layer_ops.FLASH_FORWARD_RATE + compute_constants(a100).kernel_launch_s
    assert fwd == pytest.approx(old, rel=1e-9)


def test_unknown_family_falls_back_to_the_gemm_relative_rate() -> None:
    v100 = device_preset("v100")  # no flash kernel family listed (FlashAttention-2 needs Ampere)
    fwd = _core_fwd(v100)
    launch = compute_constants(v100).kernel_launch_s
    assert fwd == pytest.approx(_core_tiles_s(v100) / layer_ops.FLASH_FORWARD_RATE + launch, rel=1e-12)
