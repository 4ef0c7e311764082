"""The profiler: the analytic profile's structure, measured values, and the closed loop
profile -> plan -> run on the bundled model."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")

from pathlib import Path  # noqa: E402

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
    # the non-reentrant checkpoint re-runs the forward but the FFN output projection (w2, timed alone)
    assert 0 <= options["full"].extra_s < block.forward_s
    assert all(0 < x.backward_weight_s < x.backward_s for x in profile.layers)


LLAMA_JSON = Path(__file__).resolve().parents[2] / "docs" / "examples" / "llama-tiny.json"


def _loop_ratio(tmp_path, attempt: int, clock: str) -> float:
    """docs/runtime-bridge.md's closed loop for a Llama-style model (GQA, RoPE, SwiGLU, RMSNorm):
    profile -> plan -> run through the CLI, back to back; measured / predicted step time (with
    ``clock="cpu"``: process CPU times on both sides)."""
    prof, plan_path = tmp_path / f"profile{attempt}.json", tmp_path / f"plan{attempt}.json"
    assert main(["profile", "--model", str(LLAMA_JSON), "--microbatch-size", "2", "--repeats", "20",
                 "--clock", clock, "-o", str(prof)]) == 0
    assert main(["plan", "--model", str(prof), "--cluster", "cpu:1", "--pipeline", "1", "--schedule", "gpipe",
                 "--global-batch", "8", "-o", str(plan_path)]) == 0
    plan = api.load_plan(plan_path)
    assert plan.transformer is None and plan.model.source == "profiler" and plan.num_microbatches == 4
    report = run_plan(plan, model=api.load_model(str(LLAMA_JSON)), steps=12, check=attempt == 0,
                      options=LaunchOptions(timeout_s=30))
    assert report is not None and (attempt > 0 or report["check_passed"])
    return report["ratio"]["step_cpu_time" if clock == "cpu" else "step_time"]


CLOSE_BOUNDS = {"wall": (0.85, 1.15), "cpu": (0.85, 1.20)}
"""Measured / predicted step time that closes the loop, per clock. Wall clock: the issue's 15%
(quiet hosts give 0.91 to 1.14, docs/runtime-bridge.md). Process CPU time on a host whose 2 cores
other jobs share: 1.03 to 1.17 measured at load 6-11 (cache and core sharing slow the long run
more than the profiler's short loops), so up to 1.20; the profile without its in-sequence factors
gave 1.2 to 1.3 even on a quiet host, and a missing schedule or microbatch term is off by 2x or
more, so both still fail."""


@pytest.mark.timeout(900)
def test_cli_profile_plan_run_closes_the_loop(tmp_path) -> None:
    # The profile's per-layer times summed over the 4 microbatches against the measured one-stage
    # step (the profiler's default m = 4 is this plan's). One wall-clock attempt; on a loaded host
    # (wall-clock ratios swing from 0.6 to 7 there) up to three attempts on process CPU time (profile
    # --clock cpu, run's step_cpu_time_s), which measures the modelled work without the other jobs'
    # share. One attempt must land within its clock's bound; a wrong model misses it in all.
    ratios = []
    for attempt, clock in enumerate(("wall", "cpu", "cpu", "cpu")):
        ratios.append((clock, _loop_ratio(tmp_path, attempt, clock)))
        low, high = CLOSE_BOUNDS[clock]
        if low <= ratios[-1][1] <= high:
            break
    assert any(CLOSE_BOUNDS[clock][0] <= r <= CLOSE_BOUNDS[clock][1] for clock, r in ratios), ratios


def test_mixtral_style_profile_counts_every_expert() -> None:
    from tests.runtime_bridge.plans import MIXTRAL_TINY

    prof = profile_model(MIXTRAL_TINY, microbatch_size=1, repeats=1, warmup=0, num_microbatches=2)
    h, kv, e, f = 32, 16, 4, 32  # hidden, K/V width (2 of 4 heads of 8), experts, expert FFN
    attention, experts = h * h * 2 + 2 * h * kv, e * 3 * h * f  # wq, wo; wk, wv; SwiGLU w1, w3, w2
    assert prof.layers[1].param_bytes == 4 * (attention + h * e + experts + 2 * h)  # + router + 2 RMSNorm
    assert len(prof.layers) == 6 and all(x.forward_s > 0 for x in prof.layers)
    mixed = MIXTRAL_TINY.model_copy(update={"first_dense_layers": 1})
    with pytest.raises(InvalidProblemError, match="first_dense_layers=1 of 4"):
        profile_model(mixed)


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
    cpu = profile_model(TINY, microbatch_size=1, repeats=1, warmup=0, num_microbatches=2, clock="cpu")
    assert all(x.forward_s > 0 and x.backward_s > 0 for x in cpu.layers)
    with pytest.raises(InvalidProblemError, match="clock 'gpu'"):
        profile_model(TINY, repeats=1, warmup=0, clock="gpu")


@pytest.mark.cuda
def test_profile_on_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    prof = profile_model(TINY, device="cuda", microbatch_size=2, repeats=3)
    assert prof.device == torch.cuda.get_device_name(0)
    assert all(x.forward_s > 0 for x in prof.layers)


def test_cli_profile_reads_a_hugging_face_config_at_the_training_length(tmp_path) -> None:
    """`profile --model hf:config.json --seq-length S` measures at S tokens, not the config's maximum."""
    pytest.importorskip("transformers")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
        "intermediate_size": 88, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "vocab_size": 64, "max_position_embeddings": 128,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False}))
    out = tmp_path / "profile.json"
    assert main(["profile", "--model", f"hf:{cfg}", "--seq-length", "16", "--repeats", "1", "-o", str(out)]) == 0
    prof = ModelProfile.model_validate_json(out.read_text())
    assert prof.tokens_per_sample == 16
    assert prof.num_layers == 2 + 2  # embedding, two blocks, head
