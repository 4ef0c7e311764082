"""Transformer analytics against the published numbers (PTD-P, Zero Bubble, Korthikanti/BPipe)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_models import hardware, models
from cost_models import transformer as tr
from planner.errors import InvalidProblemError
from planner.schema import ComputeModel, Device, TransformerConfig

A100 = hardware.device_preset("a100-80gb")
# Eq. 4.3 assumes tied embeddings: the GPT presets of the papers (gpt-tiny, the runtime test model, unties them)
GPT_PRESETS = [n for n in models.list_model_presets() if n.startswith("gpt") and models.model_preset(n).tied_embeddings]

# PTD-P Table 1 (dissertation Table 4.1; ptdp-gavel-cloud.md Sec. 1.12): parameters in billions.
TABLE_4_1 = [
    ("gpt-1.7b", 1.7), ("gpt-3.6b", 3.6), ("gpt-7.5b", 7.5), ("gpt-18.4b", 18.4), ("gpt-39.1b", 39.1),
    ("gpt-76.1b", 76.1), ("gpt-145.6b", 145.6), ("gpt-310.1b", 310.1), ("gpt-529.6b", 529.6), ("gpt-1t", 1008.0),
]
# Table 4.2 (seed 001 L4214-4281): model, batch, GPUs, TF/s per GPU, days for 300B tokens.
TABLE_4_2 = [
    ("gpt3-175b", 1536, 384, 144, 90), ("gpt3-175b", 1536, 768, 88, 74), ("gpt3-175b", 1536, 1536, 44, 74),
    ("gpt-529.6b", 2560, 640, 138, 169), ("gpt-529.6b", 2240, 1120, 98, 137), ("gpt-529.6b", 2240, 2240, 48, 140),
    ("gpt3-175b", 1536, 384, 153, 84), ("gpt3-175b", 1536, 768, 149, 43), ("gpt3-175b", 1536, 1536, 141, 23),
    ("gpt-529.6b", 2240, 560, 171, 156), ("gpt-529.6b", 2240, 1120, 167, 80), ("gpt-529.6b", 2240, 2240, 159, 42),
]
TRAINING_DAYS_TOLERANCE = 1.0  # the table rounds days and per-GPU TF/s
PARAMS_TOLERANCE_B = 0.05  # the tables print parameters to 0.1B


def _gpt(h: int = 64, l: int = 2, a: int = 4, s: int = 32, v: int = 100) -> TransformerConfig:
    return TransformerConfig(name="toy", hidden_size=h, num_layers=l, num_heads=a, seq_length=s, vocab_size=v)


# ---------------------------------------------------------------- parameters (Eq. 4.3)


@pytest.mark.parametrize("name", GPT_PRESETS)
def test_gpt_parameters_are_eq_4_3_plus_the_final_layernorm(name: str) -> None:
    cfg = models.model_preset(name)
    eq = tr.ptdp_num_parameters(cfg.num_layers, cfg.hidden_size, cfg.vocab_size, cfg.seq_length)
    assert tr.num_parameters(cfg) - 2 * cfg.hidden_size == pytest.approx(eq, rel=1e-12)


@pytest.mark.parametrize(("name", "billions"), TABLE_4_1)
def test_table_4_1_parameter_counts(name: str, billions: float) -> None:
    assert abs(tr.num_parameters(models.model_preset(name)) / 1e9 - billions) <= PARAMS_TOLERANCE_B


def test_table_4_2_parameter_counts() -> None:
    assert round(tr.num_parameters(models.model_preset("gpt3-175b")) / 1e9, 1) == 174.6
    assert round(tr.num_parameters(models.model_preset("gpt-529.6b")) / 1e9, 1) == 529.6


@pytest.mark.parametrize(("name", "billions"), [("llama2-7b", 6.74), ("llama2-13b", 13.0), ("llama2-70b", 69.0)])
def test_llama2_parameter_counts_within_half_a_percent(name: str, billions: float) -> None:
    assert tr.num_parameters(models.model_preset(name)) / 1e9 == pytest.approx(billions, rel=0.005)


def test_hand_counted_tiny_gpt() -> None:
    # h=8, l=1, f=32, V=10, s=4: 12h^2 + 13h = 872 per layer; Vh + sh = 112; final LN 16.
    assert tr.num_parameters(_gpt(h=8, l=1, a=2, s=4, v=10)) == 872 + 112 + 16


# ---------------------------------------------------------------- FLOPs (Eq. 4.2, ZB Table 1)


@pytest.mark.parametrize("name", GPT_PRESETS)
@pytest.mark.parametrize("batch", [1, 1536])
def test_gpt_flops_per_iteration_is_eq_4_2(name: str, batch: int) -> None:
    cfg = models.model_preset(name)
    eq = tr.ptdp_flops_per_iteration(batch, cfg.seq_length, cfg.num_layers, cfg.hidden_size, cfg.vocab_size)
    assert tr.flops_per_iteration(cfg, global_batch_size=batch) == pytest.approx(eq, rel=1e-12)


def test_without_recompute_one_forward_per_layer_less() -> None:
    cfg = models.model_preset("gpt3-175b")
    diff = tr.flops_per_iteration(cfg, global_batch_size=8) - tr.flops_per_iteration(
        cfg, global_batch_size=8, recompute=False
    )
    assert diff == pytest.approx(cfg.num_layers * tr.decoder_forward_flops(cfg, microbatch_size=8), rel=1e-12)
    assert tr.model_flops_per_sample(cfg) * 8 == pytest.approx(
        tr.flops_per_iteration(cfg, global_batch_size=8, recompute=False), rel=1e-12
    )


@pytest.mark.parametrize(("b", "t"), [(1, 1), (3, 2), (2, 8)])
def test_zero_bubble_table_1_split(b: int, t: int) -> None:
    cfg = _gpt(h=256, a=8, s=128)
    s, h = cfg.seq_length, cfg.hidden_size
    kw = {"microbatch_size": b, "tensor_parallel": t}
    assert tr.decoder_forward_flops(cfg, **kw) == pytest.approx(s * b * h * (24 * h + 4 * s) / t, rel=1e-12)
    assert tr.decoder_backward_input_flops(cfg, **kw) == pytest.approx(s * b * h * (24 * h + 8 * s) / t, rel=1e-12)
    assert tr.decoder_backward_weight_flops(cfg, **kw) == pytest.approx(s * b * h * 24 * h / t, rel=1e-12)
    assert tr.logits_forward_flops(cfg, **kw) == pytest.approx(2 * b * s * h * cfg.vocab_size / t, rel=1e-12)


@pytest.mark.parametrize(("name", "batch", "gpus", "tflops", "days"), TABLE_4_2)
def test_table_4_2_training_days_with_eq_4_2(name: str, batch: int, gpus: int, tflops: int, days: int) -> None:
    cfg = models.model_preset(name)
    got = tr.training_days(
        cfg, tokens=300e9, num_devices=gpus, flops_per_device_s=tflops * 1e12, global_batch_size=batch
    )
    assert abs(got - days) <= TRAINING_DAYS_TOLERANCE


def test_eq_4_4_examples_gpt3_34_days_and_1t_84_days() -> None:
    # seed 001 L4310-4320
    assert round(tr.training_days_eq44(175e9, 300e9, 1024, 140e12)) == 34
    p_1t = tr.ptdp_num_parameters(128, 25600, 51200, 2048)
    assert round(tr.training_days_eq44(p_1t, 450e9, 3072, 163e12)) == 84
    gpt3 = tr.training_days(models.model_preset("gpt3-175b"), tokens=300e9, num_devices=1024,
                            flops_per_device_s=140e12, global_batch_size=1536)
    one_t = tr.training_days(models.model_preset("gpt-1t"), tokens=450e9, num_devices=3072,
                             flops_per_device_s=163e12, global_batch_size=3072)
    assert abs(gpt3 - 34) <= TRAINING_DAYS_TOLERANCE and abs(one_t - 84) <= TRAINING_DAYS_TOLERANCE


# ---------------------------------------------------------------- memory (Korthikanti / BPipe App. B)


@pytest.mark.parametrize("t", [1, 2, 8])
def test_korthikanti_activation_bytes_for_gpt(t: int) -> None:
    cfg = _gpt(h=512, a=8, s=256)
    b, s, h, a = 2, cfg.seq_length, cfg.hidden_size, cfg.num_heads
    kw = {"microbatch_size": b, "tensor_parallel": t, "attention": "unfused"}  # the paper's 2022 kernels
    assert tr.decoder_activation_bytes(cfg, **kw) == pytest.approx(s * b * h * (34 + 5 * a * s / h) / t, rel=1e-12)
    assert tr.decoder_activation_bytes(cfg, **kw, recompute="selective") == pytest.approx(34 * s * b * h / t, rel=1e-12)
    assert tr.decoder_activation_bytes(cfg, **kw, recompute="full") == pytest.approx(2 * s * b * h / t, rel=1e-12)


def test_bpipe_appendix_b_gpt3_96b_transfer_sizes_and_bandwidths() -> None:
    # seed 004 L431: t=4, p=8, b=2, attention scope: 3.48 GB, 24.25 GB/s at f = 143.37 ms; none: 100.31 GB/s.
    cfg = models.model_preset("gpt3-96b")
    layers_per_stage = cfg.num_layers // 8
    kw = {"microbatch_size": 2, "tensor_parallel": 4, "attention": "unfused"}  # Megatron-LM 22.09
    selective = layers_per_stage * tr.decoder_activation_bytes(cfg, **kw, recompute="selective")
    none = layers_per_stage * tr.decoder_activation_bytes(cfg, **kw, recompute="none")
    assert selective == 3_476_029_440
    assert selective / 0.14337 / 1e9 == pytest.approx(24.25, abs=0.005)
    assert none / 0.14337 / 1e9 == pytest.approx(100.31, abs=0.005)


def test_static_bytes_are_16_per_parameter_split_over_t() -> None:
    assert tr.static_bytes(1e9, tensor_parallel=8) == 2e9


def test_unknown_recompute_strategy_is_rejected() -> None:
    with pytest.raises(InvalidProblemError, match="unknown recompute strategy 'partial'"):
        tr.decoder_activation_bytes(_gpt(), microbatch_size=1, recompute="partial")


# ---------------------------------------------------------------- communication (Sec. 1.4)


def test_gpt3_communication_volumes() -> None:
    # ptdp-gavel-cloud.md Sec. 1.4 worked numbers, b = 1, s = 2048, h = 12288, t = 8 (elements).
    cfg = models.model_preset("gpt3-175b")
    assert tr.p2p_bytes(cfg, microbatch_size=1) == 2 * 25_165_824
    assert tr.p2p_bytes(cfg, microbatch_size=1, tensor_parallel=8, scatter_gather=True) == 2 * 3_145_728
    assert tr.tensor_parallel_volume_elements(cfg, microbatch_size=1, tensor_parallel=8) == 176_160_768


def test_parallel_block_reduces_once_per_layer() -> None:
    """GPT-NeoX's parallel block sums the attention and MLP partial outputs before one all-reduce
    ([gpt-neox] Sec. 2.1): half the tensor-parallel volume and collective time of the sequential
    block, the same GEMMs; at t = 1 the two blocks cost the same."""
    from cost_models.layer_ops import decoder_op_times

    cfg = models.model_preset("gpt3-175b")
    neox = cfg.model_copy(update={"parallel_block": True})
    assert tr.tensor_parallel_volume_elements(neox, microbatch_size=1, tensor_parallel=8) == 176_160_768 / 2
    a100 = hardware.device_preset("a100-80gb")
    kw = {"microbatch_size": 1, "tensor_parallel": 8, "tp_link_bytes_per_s": 300e9}
    seq, par = decoder_op_times(cfg, a100, **kw), decoder_op_times(neox, a100, **kw)
    assert par.forward_comm_s == pytest.approx(seq.forward_comm_s / 2)
    assert par.forward_gemm_s == seq.forward_gemm_s and par.backward_weight_s == seq.backward_weight_s
    assert par.forward_s == pytest.approx(seq.forward_s - seq.forward_comm_s / 2)
    one = {"microbatch_size": 1, "tensor_parallel": 1}
    assert decoder_op_times(neox, a100, **one) == decoder_op_times(cfg, a100, **one)


def test_ring_allreduce_closed_form() -> None:
    assert tr.allreduce_time_s(1e9, 1, 1e9) == 0.0
    assert tr.allreduce_time_s(1e9, 4, 1e9) == pytest.approx(1.5)
    assert tr.allreduce_time_s(1e9, 4, 1e9, latency_s=1e-3) == pytest.approx(1.5 + 6e-3)


# ---------------------------------------------------------------- layer profile


def test_profile_shape_and_invariants() -> None:
    cfg = models.model_preset("gpt3-175b")
    prof = tr.transformer_profile(cfg, device=A100, microbatch_size=2, tensor_parallel=8, intra_node_bytes_per_s=300e9)
    assert prof.num_layers == cfg.num_layers + 2
    assert [x.kind for x in prof.layers[:2]] == ["embedding", "decoder"] and prof.layers[-1].kind == "head"
    assert (prof.microbatch_size, prof.tensor_parallel, prof.tokens_per_sample, prof.source) == (2, 8, 2048, "analytic")
    for layer in prof.layers:
        assert layer.forward_s > 0 and layer.backward_s > layer.backward_weight_s > 0  # type: ignore[operator]
        assert layer.output_bytes >= 0 and layer.static_bytes > 0
    assert prof.layers[-1].output_bytes == 0
    assert set(prof.layers[1].strategies()) == {"none", "selective", "full"}
    assert len({x.name for x in prof.layers}) == prof.num_layers
    # model FLOPs per device add up to the per-sample model FLOPs x b / t
    per_device_flops = sum(x.flops or 0.0 for x in prof.layers)
    assert per_device_flops * 8 == pytest.approx(2 * tr.model_flops_per_sample(cfg), rel=1e-12)


def test_profile_times_are_flops_over_peak_times_efficiency_plus_tp_allreduces() -> None:
    cfg = _gpt(h=256, a=8, s=128)
    bare = tr.transformer_profile(cfg, device=A100, microbatch_size=4, tensor_parallel=2, efficiency=0.25)
    dec = bare.layers[1]
    forward_flops = tr.decoder_forward_flops(cfg, microbatch_size=4, tensor_parallel=2)
    assert dec.forward_s * 312e12 * 0.25 == pytest.approx(forward_flops)
    full, sel = dec.strategies()["full"], dec.strategies()["selective"]
    assert full.extra_s == dec.forward_s
    assert sel.extra_s * 312e12 * 0.25 == pytest.approx(
        tr.attention_core_forward_flops(cfg, microbatch_size=4, tensor_parallel=2)
    )
    linked = tr.transformer_profile(cfg, device=A100, microbatch_size=4, tensor_parallel=2, efficiency=0.25,
                                    intra_node_bytes_per_s=1e9)
    one_ar = tr.allreduce_time_s(2 * 4 * 128 * 256, 2, 1e9)
    assert linked.layers[1].forward_s - dec.forward_s == pytest.approx(2 * one_ar)
    assert linked.layers[1].backward_s - dec.backward_s == pytest.approx(2 * one_ar)
    assert linked.layers[1].backward_weight_s == dec.backward_weight_s


def test_bpipe_selective_calibration_option() -> None:
    cfg = _gpt(h=256, a=8, s=128)
    prof = tr.transformer_profile(cfg, device=A100, microbatch_size=1,
                                  selective_recompute_fraction=tr.BPIPE_SELECTIVE_RECOMPUTE_FRACTION)
    dec = prof.layers[1]
    assert dec.strategies()["selective"].extra_s == pytest.approx(0.26 * dec.forward_s)


@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(min_value=1, max_value=64),
    t=st.sampled_from([1, 2, 4]),
    h_per_head=st.sampled_from([16, 32]),
    s=st.sampled_from([16, 64, 256]),
    swiglu=st.booleans(),
)
def test_decoder_costs_scale_linearly_with_microbatch(b: int, t: int, h_per_head: int, s: int, swiglu: bool) -> None:
    cfg = TransformerConfig(name="p", hidden_size=8 * h_per_head, num_layers=2, num_heads=8, num_kv_heads=4,
                            seq_length=s, vocab_size=96, mlp="swiglu" if swiglu else "gelu", ffn_hidden_size=64)
    device = Device(name="d", memory_bytes=1e12, peak_flops=1e14, memory_bandwidth_bytes_per_s=1e12,
                    compute=ComputeModel(num_sms=8))

    def decoder(mb: int, **kw: float):  # noqa: ANN202
        return tr.transformer_profile(cfg, device=device, microbatch_size=mb, tensor_parallel=t,
                                      intra_node_bytes_per_s=1e10, **kw).layers[1]

    one, many = decoder(1, efficiency=0.5), decoder(b, efficiency=0.5)  # the flat model is linear in b
    for field in ("forward_s", "backward_s", "backward_weight_s", "flops", "output_bytes"):
        assert getattr(many, field) == pytest.approx(b * getattr(one, field), rel=1e-9)
    # the per-operation model: FLOPs linear, time per sample never worse with a larger microbatch
    # (fuller waves, fewer launches: a larger microbatch raises efficiency)
    op_one, op_many = decoder(1), decoder(b)
    assert op_many.flops == pytest.approx(b * op_one.flops, rel=1e-9)
    for field in ("forward_s", "backward_s", "backward_weight_s"):
        assert getattr(op_many, field) <= b * getattr(op_one, field) * (1 + 1e-9)
    for name, option in many.strategies().items():
        assert option.activation_bytes == pytest.approx(b * one.strategies()[name].activation_bytes, rel=1e-9)
    assert many.static_bytes == one.static_bytes


def test_gqa_and_swiglu_change_the_counts_as_expected() -> None:
    mha = TransformerConfig(name="m", hidden_size=64, num_layers=1, num_heads=8, seq_length=16, vocab_size=10,
                            mlp="swiglu", ffn_hidden_size=96, bias=False, norm="rmsnorm")
    gqa = mha.model_copy(update={"num_kv_heads": 2})
    # K and V shrink from h x h to h x (2 heads x 8) each: 2 * 64 * (64 - 16) fewer weights.
    assert tr.num_parameters(mha) - tr.num_parameters(gqa) == 2 * 64 * 48
    assert tr.decoder_matmul_params(mha) == 4 * 64 * 64 + 3 * 64 * 96


@pytest.mark.parametrize("name", sorted(models.list_model_presets()))
def test_every_model_preset_profiles_on_a100(name: str) -> None:
    cfg = models.model_preset(name)
    t = math.gcd(8, cfg.num_heads, cfg.kv_heads, cfg.ffn_size)
    prof = tr.transformer_profile(cfg, device=A100, microbatch_size=1, tensor_parallel=t, intra_node_bytes_per_s=300e9)
    assert prof.num_layers == cfg.num_layers + 2


def test_invalid_profile_arguments_name_the_fix() -> None:
    cfg = models.model_preset("gpt3-96b")  # 104 heads
    with pytest.raises(InvalidProblemError, match=r"tensor_parallel=16 must divide num_heads=104"):
        tr.transformer_profile(cfg, device=A100, microbatch_size=1, tensor_parallel=16)
    with pytest.raises(InvalidProblemError, match="efficiency=0"):
        tr.transformer_profile(cfg, device=A100, microbatch_size=1, efficiency=0)
    with pytest.raises(InvalidProblemError, match="microbatch_size=0"):
        tr.transformer_profile(cfg, device=A100, microbatch_size=0)


def test_model_presets_unknown_name_and_case() -> None:
    assert models.model_preset("GPT3-175B").name == "gpt3-175b"
    with pytest.raises(InvalidProblemError, match=r"unknown model preset 'gpt-5'.*gpt3-175b"):
        models.model_preset("gpt-5")
    assert {"llama2-70b", "gpt3-96b", "gpt3-134b", "llama-175b", "pipefill-40b", "spipe-110b"} <= set(
        models.list_model_presets()
    )
