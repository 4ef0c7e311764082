"""Full recompute as the stack runs it (``ComputeModel.full_recompute``): Megatron-LM's reentrant
checkpoint re-runs a layer's whole forward; PyTorch's non-reentrant checkpoint (torchtitan, FSDP's
``checkpoint_wrapper``, ``paraplan run``) stops once the last saved tensor is back, before the dense
FFN's output projection and the tensor-parallel collective after it (the bridge's own block:
tests/runtime_bridge/test_recompute_modules.py counts its matrix products)."""

from __future__ import annotations

import pytest

from cost_models import layer_ops
from cost_models import simulate as sim
from cost_models.compute import compute_constants, gemm_fwd_bwd_s, with_full_recompute
from cost_models.hardware import device_preset
from cost_models.transformer import transformer_profile
from planner import api
from planner.cli import main
from planner.errors import InvalidProblemError
from planner.export import megatron_args_text
from planner.export_torchtitan import torchtitan_args_text
from solvers import _ptdp_model as model
from solvers import ptdp

A100 = device_preset("a100-80gb")
EARLY = with_full_recompute(A100, "early-stop")
NVLINK = 300e9


def _full_extra(device, cfg_name: str, *, t: int = 1, index: int = 1) -> float:  # noqa: ANN001
    cfg = api.load_model(cfg_name)
    profile = transformer_profile(cfg, device=device, microbatch_size=1, tensor_parallel=t,
                                  intra_node_bytes_per_s=NVLINK)
    layer = [la for la in profile.layers if la.kind == "decoder"][index]
    assert layer.recompute is not None
    return layer.recompute["full"].extra_s


def test_default_is_whole_and_the_setter_keeps_the_other_constants() -> None:
    assert compute_constants(A100).full_recompute == "whole"
    early = compute_constants(EARLY)
    assert early.full_recompute == "early-stop"
    assert early.model_copy(update={"full_recompute": "whole"}) == compute_constants(A100)


@pytest.mark.parametrize("t", [1, 2])
def test_early_stop_skips_the_ffn_output_projection_and_its_collective(t: int) -> None:
    """Llama 3 8B, b = 1, s = 8,192: whole re-runs the layer's forward; early-stop that minus the
    w2 GEMM (8,192 x 4,096 x 14,336 / t) and, at t = 2, the MLP block's all-reduce (one of the two)."""
    cfg = api.load_model("llama3-8b")
    ops = layer_ops.decoder_op_times(cfg, A100, microbatch_size=1, tensor_parallel=t, tp_link_bytes_per_s=NVLINK,
                                     sequence_parallel=t > 1, attention="flash")
    w2 = gemm_fwd_bwd_s(8192, 4096, 14336 // t, A100)[0]
    assert ops.tail_s == pytest.approx(w2 + ops.forward_comm_s / 2, rel=1e-12)
    assert (ops.forward_comm_s > 0) == (t > 1)
    whole, early = _full_extra(A100, "llama3-8b", t=t), _full_extra(EARLY, "llama3-8b", t=t)
    assert whole == pytest.approx(ops.forward_s, rel=1e-12)
    assert whole - early == pytest.approx(ops.tail_s, rel=1e-12)
    assert 0.2 < ops.tail_s / ops.forward_s < 0.35  # w2 is h f of the layer's 2 h^2 + 2 h kv + 3 h f GEMMs


def test_moe_layers_recompute_their_whole_forward_either_way() -> None:
    """An MoE layer's combine saves its inputs (the experts' outputs and the routing weights): the
    recompute runs through the experts either way; Mixtral's layers are all MoE."""
    assert layer_ops.decoder_op_times(api.load_model("mixtral-8x7b"), A100, microbatch_size=1).tail_s == 0.0
    assert _full_extra(EARLY, "mixtral-8x7b") == _full_extra(A100, "mixtral-8x7b")


def test_ptdp_and_the_simulator_charge_the_shorter_recompute() -> None:
    """ptdp at t = 1, p = 1, d = 8, b = 8 with full recompute: one microbatch of 32 layers, so the
    iteration is shorter by exactly 32 tails at b = 8, in the closed form and the simulator alike;
    the hardware FLOPs drop by the 32 w2 GEMMs (2 s f h per sample each)."""
    opts = {"tensor_parallel": 1, "pipeline_parallel": 1, "microbatch_size": 8, "recompute": "full"}
    times, rows = {}, {}
    for mode in ("whole", "early-stop"):
        problem = api.make_problem("llama3-8b", "a100-80gb:8", global_batch_size=64, full_recompute=mode)
        plan = ptdp.solve(problem, options=opts)
        result = sim.simulate(plan, include_events=False)
        assert plan.predicted is not None and plan.predicted.iteration_time_s == result.iteration_time_s
        assert plan.candidates[0]["closed_form_s"] == pytest.approx(result.iteration_time_s, rel=0.03)
        assert (plan.degrees.pipeline, plan.num_microbatches) == (1, 1)
        times[mode], rows[mode] = result.iteration_time_s, plan.candidates[0]
    tail = layer_ops.decoder_op_times(api.load_model("llama3-8b"), EARLY, microbatch_size=8,
                                      sequence_parallel=False, attention="flash").tail_s
    assert times["whole"] - times["early-stop"] == pytest.approx(32 * tail, rel=1e-9)
    cfg = api.load_model("llama3-8b")
    skipped = 32 * 2 * 8192 * 14336 * 4096
    assert (model.recompute_flops_per_sample(cfg, "full")
            - model.recompute_flops_per_sample(cfg, "full", early_stop=True)) == skipped


def test_bad_values_name_the_setting_and_the_fix() -> None:
    with pytest.raises(InvalidProblemError, match="full_recompute='partial' must be 'whole'"):
        api.make_problem("llama3-8b", "a100-80gb:8", full_recompute="partial")
    with pytest.raises(InvalidProblemError, match="per-operation model.*calibrate"):
        api.make_problem("gpt-tiny", "cpu:4", full_recompute="early-stop")
    assert api.make_problem("gpt-tiny", "cpu:4", full_recompute="whole").cluster.device.compute is None


def test_cli_flag(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", "--model", "llama3-8b", "--cluster", "a100-80gb:8", "--solver", "ptdp", "--global-batch", "64"]
    assert main([*base, "--full-recompute", "sometimes"]) == 2
    assert "argument --full-recompute: invalid choice: 'sometimes'" in capsys.readouterr().err
    assert main([*base, "--full-recompute", "early-stop", "--option", "recompute=full"]) == 0


def test_exports_warn_where_the_framework_recomputes_otherwise() -> None:
    """A plan costed with early stop exported to Megatron (which re-runs the whole layer) and one
    costed whole exported to torchtitan (which stops early) each say so; the matching pairs do not."""
    opts = {"tensor_parallel": 1, "pipeline_parallel": 1, "microbatch_size": 8, "recompute": "full"}
    plans = {mode: ptdp.solve(api.make_problem("llama3-8b", "a100-80gb:8", global_batch_size=64,
                                               full_recompute=mode), options=opts)
             for mode in ("whole", "early-stop")}
    assert "early-stopping checkpoint" in megatron_args_text(plans["early-stop"])
    assert "early-stopping checkpoint" not in megatron_args_text(plans["whole"])
    assert "--full-recompute early-stop" in torchtitan_args_text(plans["whole"])
    assert "--full-recompute" not in torchtitan_args_text(plans["early-stop"])
