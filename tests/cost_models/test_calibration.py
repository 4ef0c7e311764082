"""Fitting the compute constants to measurements (synthetic samples; a CPU smoke run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cost_models import calibration as cal
from cost_models import compute, hardware
from planner import api
from planner.errors import InvalidProblemError
from planner.schema import ComputeModel

A100 = hardware.device_preset("a100-80gb")
SHAPES = [(256, 256, 256), (1024, 1024, 1024), (4096, 4096, 4096), (8192, 4096, 128), (2048, 8192, 64),
          (512, 16384, 2048), (300, 700, 900)]


@pytest.mark.parametrize("fraction,k0", [(0.6, 64.0), (0.85, 256.0), (0.72, 128.0)])
def test_fit_recovers_the_constants_that_made_the_samples(fraction: float, k0: float) -> None:
    truth = A100.model_copy(update={"compute": compute.compute_constants(A100).model_copy(
        update={"gemm_max_fraction": fraction, "gemm_k_overhead": k0})})
    samples = [cal.GemmSample(m, n, k, compute.gemm_time_s(m, n, k, truth)) for m, n, k in SHAPES]
    # start from wrong constants: the fit must move both
    start = A100.model_copy(update={"compute": ComputeModel(num_sms=108, gemm_max_fraction=0.3, gemm_k_overhead=0)})
    fitted, error = cal.fit_gemm_constants(samples, start)
    assert fitted.compute is not None
    assert fitted.compute.gemm_k_overhead == k0
    assert fitted.compute.gemm_max_fraction == pytest.approx(fraction, rel=0.02)
    assert max(abs(e) for e in cal.prediction_errors(samples, fitted)) < 0.02 and error < 0.02


def test_fraction_above_one_raises_the_nominal_peak() -> None:
    slow_nominal = A100.model_copy(update={"peak_flops": 100e12})
    samples = [cal.GemmSample(m, n, k, compute.gemm_time_s(m, n, k, A100)) for m, n, k in SHAPES]
    fitted, _ = cal.fit_gemm_constants(samples, slow_nominal)
    assert fitted.compute.gemm_max_fraction == 1.0 and fitted.peak_flops > 100e12


def test_memory_and_collective_fractions() -> None:
    bw = A100.memory_bandwidth_bytes_per_s
    launch = compute.compute_constants(A100).kernel_launch_s
    copies = [cal.CopySample(n, n / (0.6 * bw) + launch) for n in (1e8, 1e9, 4e9)]
    assert cal.fit_memory_fraction(copies, A100).compute.memory_bandwidth_fraction == pytest.approx(0.6)
    # ring all-reduce of 1 GB over 8 ranks at 180 GB/s bus bandwidth on a 300 GB/s link: 0.6
    ar = [cal.AllReduceSample(1e9, 8, 300e9, 2 * 7 / 8 * 1e9 / 180e9)]
    assert cal.fit_collective_fraction(ar, A100).compute.collective_bandwidth_fraction == pytest.approx(0.6)
    with pytest.raises(InvalidProblemError, match="at least two GEMM samples"):
        cal.fit_gemm_constants(ar and [], A100)


def test_host_link_fit_makes_offload_copies_run_at_the_measured_rate() -> None:
    """Pinned copies timed at 25 GB/s (PCIe 4.0 under load): the fitted link, at activation offloading's
    pinned efficiency, moves a layer's activations at exactly that rate; no samples (CPU): unchanged."""
    from cost_models.activation_offload import offload_bandwidth_bytes_per_s

    copies = [cal.CopySample(n, n / 25e9) for n in (6.7e7, 2.7e8)]
    fitted = cal.fit_host_link(copies, A100)
    assert offload_bandwidth_bytes_per_s(fitted) == pytest.approx(25e9)
    assert cal.fit_host_link([], A100) is A100


@pytest.mark.parametrize("share", [0.3, 0.55])
def test_attention_fit_recovers_the_share_that_made_the_samples(share: float) -> None:
    """Samples timed as the layer model times a kernel at ``share`` of peak (forward + 2.5 forwards
    of backward, each with its launch) give back that share as the family ``measured``, now the
    device's."""
    from cost_models.layer_ops import FLASH_BACKWARD_FACTOR

    c = compute.compute_constants(A100)
    truth = A100.model_copy(update={"compute": c.model_copy(update={
        "attention_fractions": {"measured": share}, "attention_kernel": "measured"})})
    shapes = [(32, 1024, 128), (8, 4096, 128), (4, 8192, 64), (64, 512, 64)]
    samples = [cal.AttentionSample(h, s, d, (1 + FLASH_BACKWARD_FACTOR) * (compute.flash_attention_s(s, s, d, d, h, truth)
                                                                           + c.kernel_launch_s)) for h, s, d in shapes]
    fitted = cal.fit_attention_fraction(samples, A100)
    assert fitted.compute is not None and fitted.compute.attention_kernel == "measured"
    assert fitted.compute.attention_fractions["measured"] == pytest.approx(share, rel=1e-9)
    assert fitted.compute.attention_fractions["fa2"] == c.attention_fractions["fa2"]  # the published families stay
    assert cal.fit_attention_fraction([], A100) == A100


def test_calibrate_cli_writes_a_cluster_every_solver_accepts(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from planner.cli import main

    out = tmp_path / "cal.json"
    assert main(["calibrate", "--cluster", "cpu:2", "--quick", "--repeats", "1", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["device"]["compute"]["num_sms"] == 64  # the generic constants, fitted
    assert data["device"]["compute"]["attention_kernel"] == "measured"  # SDPA timed on this machine
    assert 0 < data["device"]["compute"]["attention_fractions"]["measured"] <= 1
    problem = api.make_problem("gpt-tiny", str(out), num_stages=2, global_batch_size=8)
    assert problem.model.source == "analytic"  # the per-operation model with the fitted constants
    assert api.plan(problem, solver="even").predicted is not None


def test_calibrate_cli_refuses_before_measuring(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A directory as output, an unbounded repeat count and a CUDA device this torch lacks: exit 2
    at once, naming the flag (the output was written only after the measurements before)."""
    torch = pytest.importorskip("torch")
    from planner.cli import main

    base = ["calibrate", "--cluster", "cpu:1", "--quick", "--repeats", "1"]
    assert main([*base, "-o", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert main([*base, "--repeats", "99999999999999"]) == 2
    assert "--repeats" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main([*base, "--device", "cuda"]) == 2
        assert "--device cuda" in capsys.readouterr().err
