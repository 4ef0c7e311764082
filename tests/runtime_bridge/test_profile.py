"""The profiler: the analytic profile's structure, measured values, and the closed loop
profile -> plan -> run on the bundled model."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from cost_models import transformer  # noqa: E402
from cost_models.hardware import cluster_preset  # noqa: E402
from cost_models.models import model_preset  # noqa: E402
from planner import api  # noqa: E402
from planner.cli import main  # noqa: E402
from planner.errors import InvalidProblemError  # noqa: E402
from planner.schema import LayerProfile, ModelProfile, RecomputeOption  # noqa: E402
from runtime_bridge.launch import LaunchOptions, run_plan  # noqa: E402
from runtime_bridge.profile import _scaled, profile_model  # noqa: E402

TINY = model_preset("gpt-tiny")


@pytest.fixture(scope="module")
def profile() -> ModelProfile:
    return profile_model(TINY, microbatch_size=2, repeats=5)


def test_same_layers_as_the_analytic_profile(profile: ModelProfile) -> None:
    analytic = transformer.transformer_profile(TINY, device=cluster_preset("cpu:1").device, microbatch_size=2)
    assert [(x.name, x.kind) for x in profile.layers] == [(x.name, x.kind) for x in analytic.layers]
    assert [sorted(x.strategies()) for x in profile.layers] == [sorted(x.strategies()) for x in analytic.layers]
    assert profile.source == "profiler" and profile.tokens_per_sample == 16 and profile.microbatch_size == 2


def test_measured_bytes_and_flops(profile: ModelProfile) -> None:
    emb, block, head = profile.layers[0], profile.layers[1], profile.layers[-1]
    b, s, h, v = 2, 16, 32, 128
    # fp32 parameters: embedding V h + s h, head V h + 2h (layernorm), block 12h^2 + 13h
    assert emb.param_bytes == 4 * (v * h + s * h)
    assert head.param_bytes == 4 * (v * h + 2 * h)
    assert block.param_bytes == 4 * transformer.decoder_layer_params(TINY)
    assert block.static_bytes == 2 * block.param_bytes  # weights + gradients, SGD has no state
    assert emb.output_bytes == block.output_bytes == 4 * b * s * h and head.output_bytes == 0
    # the head's matmuls: logits forward 2bshV, backward twice that (PTD-P L4158-4164)
    assert head.flops == 3 * transformer.logits_forward_flops(TINY, microbatch_size=b)
    matmul = 3 * transformer.decoder_backward_weight_flops(TINY, microbatch_size=b)
    assert matmul <= block.flops <= 3 * transformer.decoder_forward_flops(TINY, microbatch_size=b)
    options = block.strategies()
    assert options["full"].activation_bytes == 4 * b * s * h  # only the block input is kept
    assert options["full"].activation_bytes < options["selective"].activation_bytes <= options["none"].activation_bytes
    assert options["full"].extra_s == block.forward_s
    assert all(0 < x.backward_weight_s < x.backward_s for x in profile.layers)


def _loop_ratio(tmp_path, attempt: int) -> float:
    """profile -> plan -> run through the CLI, back to back; measured / predicted step time."""
    prof, plan_path = tmp_path / f"profile{attempt}.json", tmp_path / f"plan{attempt}.json"
    assert main(["profile", "--model", "gpt-tiny", "--microbatch-size", "2", "--repeats", "20", "-o", str(prof)]) == 0
    assert main(["plan", "--model", str(prof), "--cluster", "cpu:1", "--pipeline", "1", "--schedule", "gpipe",
                 "--global-batch", "8", "-o", str(plan_path)]) == 0
    plan = api.load_plan(plan_path)
    assert plan.transformer is None and plan.model.source == "profiler" and plan.num_microbatches == 4
    report = run_plan(plan, steps=12, check=attempt == 0, options=LaunchOptions(timeout_s=30))
    assert report is not None and (attempt > 0 or report["check_passed"])
    return report["step_time_s"] / plan.predicted.iteration_time_s


def test_cli_profile_plan_run_closes_the_loop(tmp_path) -> None:
    # profile -> plan -> run works end to end on the measured profile, and the run matches one
    # process exactly (check_passed). How close measured and predicted step times are is a
    # wall-clock figure: bench/runtime.py measures it (quiet runs: 0.93 to 1.04, within the
    # issue's 15%; docs/runtime-bridge.md), since a loaded machine moves it arbitrarily.
    ratio = _loop_ratio(tmp_path, 0)
    assert math.isfinite(ratio) and ratio > 0


def test_per_step_work_is_spread_over_the_microbatches() -> None:
    # Hand-checked: factors 2 (forward) and 3 (backward), then 0.5 ms of per-step work per microbatch
    # on the weight-gradient part and the whole backward; recompute scales with the forward.
    layer = LayerProfile(name="d", kind="decoder", forward_s=1e-3, backward_s=2e-3, backward_weight_s=1e-3,
                         recompute={"full": RecomputeOption(activation_bytes=1.0, extra_s=1e-3)})
    out = _scaled(layer, 2.0, 3.0, 0.5e-3)
    assert out.forward_s == pytest.approx(2e-3) and out.backward_s == pytest.approx(6.5e-3)
    assert out.backward_weight_s == pytest.approx(3.5e-3)
    assert out.recompute is not None and out.recompute["full"].extra_s == pytest.approx(2e-3)


def test_profiler_leaves_no_process_group_and_checks_m() -> None:
    import torch.distributed as dist

    profile_model(TINY, microbatch_size=1, repeats=1, warmup=0, num_microbatches=2)
    assert not dist.is_initialized()  # its private one-rank group for torch's schedule is gone
    with pytest.raises(InvalidProblemError, match="num_microbatches=0"):
        profile_model(TINY, num_microbatches=0)


@pytest.mark.cuda
def test_profile_on_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    prof = profile_model(TINY, device="cuda", microbatch_size=2, repeats=3)
    assert prof.device == torch.cuda.get_device_name(0)
    assert all(x.forward_s > 0 for x in prof.layers)
