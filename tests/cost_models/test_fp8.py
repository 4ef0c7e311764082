"""Transformer Engine FP8 linear layers (cost_models.fp8, docs/cost-model.md "FP8"): opt-in, hand-checked
traffic, and the published FP8 rows (bench/fidelity_fp8.py) at the accuracy reached: the H100 FP8 GEMM
fraction was fitted on the Megatron-Bridge rows; the llm-foundry rows are held out and disagree (+1 to
+16 %), pinned with their sign so a change that moves them is seen."""

from __future__ import annotations

import dataclasses
import math

import pytest

from cost_models import fp8, layer_ops
from cost_models.compute import (compute_constants, gemm_compute_s, gemm_fwd_bwd_s, memory_op_s,
                                 profile_optimizer_step_s,
                                 with_linear_precision)
from cost_models.hardware import device_preset
from cost_models.simulate import simulate
from cost_models.transformer import transformer_profile
from planner import api
from planner.errors import InvalidProblemError
from planner.schema import TransformerConfig
from solvers import ptdp
from tests.bench_loader import load_bench

TOY = TransformerConfig(name="toy", hidden_size=256, num_layers=2, num_heads=4, seq_length=128, vocab_size=1024,
                        ffn_hidden_size=1024, dtype="bf16")


def test_bf16_is_the_default_and_changes_nothing() -> None:
    h100 = device_preset("h100")
    assert compute_constants(h100).linear_precision == "bf16"
    explicit = with_linear_precision(h100, "bf16")
    a = transformer_profile(api.load_model("llama3-8b"), device=h100, microbatch_size=1, tensor_parallel=2)
    b = transformer_profile(api.load_model("llama3-8b"), device=explicit, microbatch_size=1, tensor_parallel=2)
    assert a.layers == b.layers


def test_cast_transpose_bytes_by_hand() -> None:
    """One GEMM (M, N, K) = (8, 4, 2): per microbatch the forward casts X (16 elements) and the backward
    dY (32) at 4 B, with one launch per cast and one for the scale bookkeeping; current scaling adds a
    2-byte amax read and a launch each. The weight W is not cast per microbatch (once per step)."""
    h100 = device_preset("h100")
    assert fp8.quantize_bytes([(8, 4, 2, 1)], h100) == (0.0, 0.0, 0, 0)
    assert fp8.quantize_bytes([(8, 4, 2, 1)], with_linear_precision(h100, "fp8")) == (64.0, 128.0, 2, 2)
    assert fp8.quantize_bytes([(8, 4, 2, 1)], with_linear_precision(h100, "fp8-cs")) == (96.0, 192.0, 3, 3)


def test_weights_cast_once_per_step_by_hand() -> None:
    """The per-step weight pass: 4 B per parameter (6 with current scaling's amax read), four linear
    modules per layer for the launches; the cached copies hold 2 B per parameter (FP8 weight and its
    transpose). Nothing in BF16, nothing for measured or flat-efficiency profiles (their times hold
    whatever casts they ran), nothing under ZeRO-3 (cast per microbatch there, nothing cached)."""
    h100 = device_preset("h100")
    f8, cs = with_linear_precision(h100, "fp8"), with_linear_precision(h100, "fp8-cs")
    params = 1e9
    assert fp8.weight_cast_s(params, f8, num_layers=3) == pytest.approx(memory_op_s(4 * params, f8, num_kernels=12))
    assert fp8.weight_cast_s(params, cs, num_layers=3) == pytest.approx(memory_op_s(6 * params, cs, num_kernels=24))
    assert fp8.weight_cast_s(params, h100) == 0.0
    assert fp8.step_weight_terms("analytic", 2 * params, 2, cs, num_layers=3) == (
        pytest.approx(fp8.weight_cast_s(params, cs, num_layers=3)), pytest.approx(2 * params))
    assert fp8.step_weight_terms("analytic", 2 * params, 2, h100) == (0.0, 0.0)
    assert fp8.step_weight_terms("analytic", 2 * params, 2, cs, zero_stage=3) == (0.0, 0.0)
    assert fp8.step_weight_terms("measured", 2 * params, 2, cs) == (0.0, 0.0)
    assert fp8.step_weight_terms("analytic:efficiency=0.5", 2 * params, 2, cs) == (0.0, 0.0)


def test_step_cast_and_weight_copies_in_plan_and_simulator() -> None:
    """A one-GPU FP8 plan (Llama-like toy, 8 microbatches): the simulated step is the microbatches'
    forward and backward, the Adam step and the weight cast once (not once per microbatch); the
    closed form agrees, and the rank's model states hold 2 B per decoder parameter more than in BF16."""
    cfg = TOY.model_copy(update={"num_layers": 4, "hidden_size": 1024, "ffn_hidden_size": 4096, "num_heads": 8})
    options = {"tensor_parallel": 1, "pipeline_parallel": 1, "microbatch_size": 1, "recompute": "none",
               "zero_stage": 0, "num_simulated": 1}
    plans = {}
    for precision in ("bf16", "fp8-cs"):
        problem = api.make_problem(cfg, "h100:1", global_batch_size=8, precision=precision)
        plans[precision] = ptdp.solve(problem, options=options)
    plan = plans["fp8-cs"]
    layers, device = plan.model.layers, plan.cluster.device
    decoder = [layer for layer in layers if layer.kind == "decoder"]
    cast = fp8.weight_cast_s(math.fsum(layer.param_bytes for layer in decoder) / 2, device, num_layers=len(decoder))
    adam = profile_optimizer_step_s(plan.model.source, math.fsum(layer.static_bytes for layer in layers), device)
    expected = 8 * math.fsum(layer.forward_s + layer.backward_s for layer in layers) + adam + cast
    assert cast > 0
    assert simulate(plan).iteration_time_s == pytest.approx(expected, rel=1e-9)
    assert float(plan.candidates[0]["closed_form_s"]) == pytest.approx(expected, rel=1e-9)
    copies = 2 * math.fsum(layer.param_bytes for layer in decoder) / 2
    states = [math.fsum(layer.static_bytes for layer in p.model.layers) for p in plans.values()]
    assert states[0] == pytest.approx(states[1])  # the profiles' model states agree; the copies are the rank's
    peak = {k: simulate(p).stages[0].peak_memory_bytes for k, p in plans.items()}
    saving = math.fsum(fp8.activation_saving_bytes(cfg, cfg.seq_length, 1, False) for _ in decoder)
    assert peak["fp8-cs"] - peak["bf16"] == pytest.approx(copies - saving, rel=1e-6)  # one microbatch in flight


def test_fp8_gemm_runs_at_the_fitted_fraction_of_the_fp8_peak() -> None:
    """A full-wave GEMM's compute time scales by (989.4 TF/s x 0.58) / (1,978.9 TF/s x 0.62)."""
    h100 = device_preset("h100")
    m, n, k = 132 * 256, 128, 8192
    ratio = gemm_compute_s(m, n, k, h100, dtype="fp8") / gemm_compute_s(m, n, k, h100)
    assert ratio == pytest.approx(989.4e12 * 0.58 / (1978.9e12 * 0.62), rel=1e-9)


def test_activation_saving_by_hand() -> None:
    """QKV and MLP inputs (T h / t each with SP) and the second MLP GEMM's input (T f / t) at 1 B less."""
    tokens, t = 128, 2
    assert fp8.activation_saving_bytes(TOY, tokens, t, True) == (2 - 1) * (2 * tokens * 256 / 2 + tokens * 1024 / 2)
    h100 = device_preset("h100")
    bf = transformer_profile(TOY, device=h100, microbatch_size=1, tensor_parallel=t, sequence_parallel=True)
    f8 = transformer_profile(TOY, device=with_linear_precision(h100, "fp8"), microbatch_size=1, tensor_parallel=t,
                             sequence_parallel=True)
    saved = bf.layers[1].recompute["none"].activation_bytes - f8.layers[1].recompute["none"].activation_bytes
    assert saved == pytest.approx(fp8.activation_saving_bytes(TOY, tokens, t, True))
    assert bf.layers[1].recompute["full"] == f8.layers[1].recompute["full"] or (
        bf.layers[1].recompute["full"].activation_bytes == f8.layers[1].recompute["full"].activation_bytes)


def test_module_sets_free_the_fp8_bytes_not_the_bf16_ones() -> None:
    """Under FP8 the norm outputs and the second MLP GEMM's input are kept at 1 B: recomputing
    ``layernorm`` frees 2 T h / t bytes (not 4), ``mlp`` its BF16 bytes less T f / t, so a module set
    keeps the FP8 layer's ``none`` bytes less exactly that (it used to free the BF16 bytes again, a peak
    too low by 2 (T h + T f / 2) / t here)."""
    tokens, t = 128, 2
    h100 = device_preset("h100")
    kw = {"microbatch_size": 1, "tensor_parallel": t, "sequence_parallel": True, "recompute_modules": True}
    bf = transformer_profile(TOY, device=h100, **kw).layers[1].recompute
    f8 = transformer_profile(TOY, device=with_linear_precision(h100, "fp8"), **kw).layers[1].recompute
    none = f8["none"].activation_bytes
    assert f8["layernorm"].activation_bytes == pytest.approx(none - 2 * 1 * tokens * 256 / t)
    mlp_bf16 = bf["none"].activation_bytes - bf["mlp"].activation_bytes
    assert f8["mlp"].activation_bytes == pytest.approx(none - (mlp_bf16 - (2 - 1) * tokens * 1024 / t))
    both = bf["none"].activation_bytes - bf["layernorm+mlp"].activation_bytes
    assert f8["layernorm+mlp"].activation_bytes == pytest.approx(
        none - (both - (2 - 1) * (2 * tokens * 256 / t + tokens * 1024 / t)))


def test_tp_all_gathers_in_fp8_with_sequence_parallelism() -> None:
    h100 = device_preset("h100")
    kw = {"microbatch_size": 1, "tensor_parallel": 4, "tp_link_bytes_per_s": 450e9}
    bf = layer_ops.decoder_op_times(TOY, h100, **kw, sequence_parallel=True)
    f8 = layer_ops.decoder_op_times(TOY, with_linear_precision(h100, "fp8"), **kw, sequence_parallel=True)
    assert f8.forward_comm_s == pytest.approx(0.75 * bf.forward_comm_s)
    no_sp = layer_ops.decoder_op_times(TOY, with_linear_precision(h100, "fp8"), **kw, sequence_parallel=False)
    assert no_sp.forward_comm_s == pytest.approx(
        layer_ops.decoder_op_times(TOY, h100, **kw, sequence_parallel=False).forward_comm_s)


def test_bad_precisions_are_refused() -> None:
    with pytest.raises(InvalidProblemError, match="precision='int8'"):
        api.make_problem("llama3-8b", "h100:8", precision="int8")
    with pytest.raises(InvalidProblemError, match="needs an FP8 peak"):
        api.make_problem("llama3-8b", "a100-80gb:8", precision="fp8")


PUBLISHED_ERRORS = [  # Megatron-Bridge (fit set), then llm-foundry, torchtitan H100 and H200 (held out)
    -0.008, -0.047, 0.042, -0.034, -0.037, 0.078, -0.037, 0.062,
    0.027, 0.055, 0.132, 0.158, 0.011, 0.089, 0.131,
    0.090, 0.105,
    0.096, 0.112,
]


@pytest.fixture(scope="module")
def rows() -> list[dict[str, object]]:
    return load_bench("fidelity_fp8").fp8_rows()


def test_published_fp8_rows(rows: list[dict[str, object]]) -> None:
    """Per-row errors at the accuracy reached (+-0.005)."""
    assert [float(r["error"]) for r in rows] == pytest.approx(PUBLISHED_ERRORS, abs=0.005)


def test_fp8_summary(rows: list[dict[str, object]]) -> None:
    """Fit set: mean |error| 4.3 %, max 7.8 % (2.6 and 4.3 % while the weights were cast per
    microbatch: that term grew with t and flattered the t = 8 rows); held out (llm-foundry's 2023 stack
    with its Triton FlashAttention): every row fast, +1.1 to +15.8 % (mean 8.6 %), and the predicted
    FP8/BF16 speedup +3 to +20 % above llm-foundry's own (so not only the BF16 model's error)."""
    summary = load_bench("fidelity_fp8").summary(rows)
    mean, mean_abs, worst, n = summary["megatron-bridge"]
    assert n == 8 and abs(mean) < 0.005 and mean_abs < 0.045 and worst < 0.08
    mean, mean_abs, worst, n = summary["llm-foundry"]
    assert n == 7 and 0.08 < mean < 0.09 and worst < 0.16
    speedups = [float(r["speedup_error"]) for r in rows if r["source"] == "llm-foundry" and "speedup_error" in r]
    assert len(speedups) == 5 and all(0.02 < s < 0.21 for s in speedups)


def test_torchtitan_float8_rows(rows: list[dict[str, object]]) -> None:
    """torchtitan's Llama 3.1 8B with torch.compile + Float8 on 8 and 128 Grand Teton H100 (held out,
    current scaling): +9.0 and +10.5 % at the NVL end of the peak range (where its BF16 compiled rows
    are -0.9 and +1.1 %), +24 and +25 % at the SXM end; the Float8/BF16 speedup, where the peak
    cancels, 1.41 predicted against 1.28 and 1.29 published (+10 %): as on llm-foundry's rows, the FP8
    constant fitted on Megatron-Bridge's 2025 stack over-predicts another stack's FP8 gain."""
    tt = [r for r in rows if r["source"] == "torchtitan"]
    assert [float(r["error"]) for r in tt] == pytest.approx([0.090, 0.105], abs=0.005)
    assert [float(r["error_high"]) for r in tt] == pytest.approx([0.236, 0.253], abs=0.005)
    assert [float(r["speedup_error"]) for r in tt] == pytest.approx([0.100, 0.093], abs=0.005)


def test_torchtitan_float8_on_h200(rows: list[dict[str, object]]) -> None:
    """torchtitan's June 2025 Llama 3.1 8B Float8 runs on 32 and 64 H200 at 700 W (held out): +9.6 and
    +11.2 %, the same +9-11 % the Grand Teton H100 Float8 rows show at their NVL end: torchao's Float8
    gains less than the Transformer Engine stack the FP8 constant is fitted on, on both parts."""
    h200 = [float(r["error"]) for r in rows if r["source"] == "torchtitan-h200"]
    assert h200 == pytest.approx([0.096, 0.112], abs=0.005)


HELD_OUT_ERRORS = [  # Megatron-Bridge DGX-B200/GB200 FP8-CS (25.09, 25.11), then NeMo 24.07 H100, 25.02 B200, 25.04 GB200
    -0.016, 0.026, -0.036, 0.031, 0.028, 0.023,
    0.100, 0.074, 0.133, 0.130, 0.128, 0.227, 0.110,
    -0.080, 0.135, 0.117, 0.090, 0.060,
    -0.035, -0.026, 0.170, 0.111,
]


@pytest.fixture(scope="module")
def held_out() -> list[dict[str, object]]:
    return load_bench("fidelity_fp8").blackwell_and_nemo_rows()


def test_held_out_blackwell_and_nemo_rows(held_out: list[dict[str, object]]) -> None:
    """Per-row errors at the accuracy reached (+-0.005). None was fitted: the Blackwell constants come
    from GEMM and attention microbenchmarks (cost_models/data/hardware.json), the H100 ones from the
    Megatron-Bridge H100 rows above."""
    assert [float(r["error"]) for r in held_out] == pytest.approx(HELD_OUT_ERRORS, abs=0.005)


def test_held_out_summary_by_system(held_out: list[dict[str, object]]) -> None:
    """Megatron-Bridge's 2025 Blackwell rows: B200 within 3.6 % (mean |error| 2.3 %), GB200 +2.8 and
    +2.3 %. NeMo's older containers run the same configurations slower than we predict: 24.07 on H100
    +7 to +23 % (mean +12.9 %), 25.02 on B200 mean +6.5 %, 25.04 on GB200 +5.5 %; B200 Llama 3 8B at
    the same configuration went from 26,006 (25.02) to 30,624 tokens/s/GPU (25.11), +18 % by software
    alone, and our one prediction (29,526) sits near the later figure."""
    summary = load_bench("fidelity_fp8").system_summary(held_out)
    mean, mean_abs, worst, n = summary[("megatron-bridge-blackwell", "b200")]
    assert n == 4 and mean_abs < 0.03 and worst < 0.04
    mean, mean_abs, worst, n = summary[("megatron-bridge-blackwell", "gb200")]
    assert n == 2 and 0.02 < mean < 0.03
    mean, mean_abs, worst, n = summary[("nemo", "h100")]
    assert n == 7 and 0.12 < mean < 0.135 and worst < 0.23
    mean, mean_abs, worst, n = summary[("nemo", "b200")]
    assert n == 5 and 0.055 < mean < 0.07 and mean_abs < 0.1
    mean, mean_abs, worst, n = summary[("nemo", "gb200")]
    assert n == 4 and 0.045 < mean < 0.06 and mean_abs < 0.09
    b200_8b = [r for r in held_out if r["system"] == "b200" and str(r["row"]).startswith("llama3-8b")]
    assert len({float(r["predicted"]) for r in b200_8b}) == 1


def test_deepseek_v3_on_h100_with_the_flex_dispatcher() -> None:
    """Megatron-Bridge's DGX-H100 DeepSeek-V3 row (1,024 GPUs, t 2 p 8 v 4 e 64, held out): -9.3 % with
    the node-deduplicated dispatch the recipe runs (HybridEP) and the recipe's own layout, which the
    balanced split now finds: its multi-token-prediction module and the loss alone in the last virtual
    stage ('Et|(tt|)*30mL'; -18.0 % while every chunk kept a decoder layer); -31.9 % with one InfiniBand
    copy per (token, expert); recompute mla_up_proj, the cheapest set that fits. +3.3 % without the
    module; -3.0 % until the experts' regrouped GEMMs were costed in FP8 and the weights cast once per
    step, two errors offsetting."""
    bench = load_bench("fidelity_fp8")
    (row,) = bench.moe_rows()
    assert float(row["error"]) == pytest.approx(-0.093, abs=0.005)
    assert row["recompute"] == "mla_up_proj"
    plain = bench.bridge_row(dataclasses.replace(bench.MOE_ROWS[0], dispatcher="alltoall"))
    assert float(plain["error"]) == pytest.approx(-0.319, abs=0.005)


def test_gb200_fsdp_rows_with_activation_offload() -> None:
    """NeMo 25.07's DGX-GB200 Llama 3 70B and 3.1 405B rows (Megatron-FSDP, activations in Grace memory
    in their recipes), held out: the 70B fits without offloading or recompute in our memory model
    (+2.0 %); the 405B at t = 2 takes offloading, whose copies NVLink-C2C hides (+11.3 %), where the
    cheapest module set without it, now that module recompute re-runs FP8 GEMMs, is -8.8 % (-22.7 % with
    them costed in BF16). (Megatron-FSDP gathers the weights per microbatch, so
    their FP8 casts are per microbatch too.)"""
    rows = load_bench("fidelity_fp8").offload_rows()
    assert [float(r["error"]) for r in rows] == pytest.approx([0.020, 0.113], abs=0.005)
    assert [r["recompute"] for r in rows] == ["none", "offload"]
    assert float(rows[1]["no_offload_error"]) == pytest.approx(-0.088, abs=0.005)


def test_deepseek_v3_pretraining_on_h800() -> None:
    """DeepSeek-V3's own pre-training (2,048 H800, p 16, e 64, FP8; 180K GPU hours per trillion tokens
    = 1,543 tokens/s/GPU), held out: the h800 preset (H100 constants, NVLink at 400 GB/s), node-
    deduplicated expert dispatch overlapped with compute on the SMs DeepEP's 20 leave, DualPipeV on the
    61 layers with the paper's recompute set (RMSNorm and MLA up-projections), which fits (74.2 GiB with
    the cached FP8 weight copies), and its multi-token-prediction module with the head on rank 0, which
    under DualPipeV also holds the embedding and so the heaviest rank, its block recomputing as the layers
    do: -6.8 %. Without the module +43.7 %;
    -1.6 % while the experts' regrouped GEMMs were costed in BF16 and every expert's weights cast per
    microbatch (two errors offsetting); docs/cost-model.md, section 2, "FP8", has the history."""
    row = load_bench("fidelity_fp8").deepseek_h800_row()
    assert float(row["published"]) == pytest.approx(1543.2, abs=0.1)
    assert float(row["error"]) == pytest.approx(-0.068, abs=0.005)
    assert row["recompute"] == "layernorm+mla_up_proj" and float(row["peak_memory_gib"]) < 75.0


def test_moe_layer_fp8_saving_by_hand() -> None:
    """An MoE layer (Mixtral-like: 8 experts, top 2, width 512, one shared expert) under FP8 keeps at 1 B
    the QKV input (T h / t_sp), the dispatched rows (T k h) and both expert second-GEMM inputs (T k f / t,
    T f / t), and keeps an FP8 copy of the norm output for the shared FC1 beside the router's BF16 one;
    an MLA layer saves nothing on its attention side (two down-projections, two copies)."""
    moe_cfg = TOY.model_copy(update={"num_experts": 8, "experts_per_token": 2, "moe_ffn_hidden_size": 512,
                                     "num_shared_experts": 1})
    tokens, t = 128, 2
    n_h = tokens * 256 / t
    parts = fp8.saving_parts(moe_cfg, tokens, t, True)
    assert parts == pytest.approx({"qkv_input": n_h, "dispatched": 2 * tokens * 256, "expert_fc2_input": 2 * tokens * 512 / t,
                                   "shared_fc2_input": tokens * 512 / t, "shared_fc1_copy": -n_h})
    assert fp8.module_saving_bytes(moe_cfg, "moe_act", tokens, t, True) == pytest.approx(2 * tokens * 512 / t)
    assert fp8.module_saving_bytes(moe_cfg, "layernorm", tokens, t, True) == pytest.approx(n_h)
    mla = api.load_model("deepseek-v3")
    assert "qkv_input" not in fp8.saving_parts(mla, tokens, t, True, layer_index=5)
    assert set(fp8.saving_parts(mla, tokens, t, True, layer_index=0)) == {"mlp_input", "fc2_input"}  # dense prefix


def test_module_recompute_reruns_the_fp8_forward() -> None:
    """Recomputing ``mlp`` under FP8 re-runs the two MLP GEMMs at the FP8 rate and casts their inputs
    again (the weights' cached copies serve), plus the activation's traffic: not the BF16 GEMMs (until
    29 Nov 2026 the recompute was costed in BF16 under FP8, making module sets look dearer than they are)."""
    from cost_models import moe_ops, recompute

    cs = with_linear_precision(device_preset("h100"), "fp8-cs")
    tokens = TOY.seq_length
    dec = layer_ops.decoder_op_times(TOY, cs, microbatch_size=1)
    gemms = moe_ops.mlp_gemms(TOY, tokens, 1, 0)
    gemm_s = sum(count * gemm_fwd_bwd_s(m, n, k, cs, dtype="fp8")[0] for m, n, k, count in gemms)
    casts = memory_op_s(6 * sum(count * m * k for m, n, k, count in gemms), cs, num_kernels=3 * len(gemms))
    acts = memory_op_s(2 * 2 * tokens * TOY.ffn_size, cs)  # GeLU: read and write T f
    assert recompute.module_forward_s(TOY, cs, "mlp", dec, microbatch_size=1, tensor_parallel=1) == pytest.approx(
        gemm_s + casts + acts)
