"""The per-operation model on MoE, MLA and explicit-head-width layers: GEMM shapes by hand, FLOPs
equal to ``cost_models.moe``'s counts, per-layer profiles, and Mixtral bracketed by dense layers."""

from __future__ import annotations

import pytest

from cost_models import hardware, layer_ops, moe, moe_ops
from cost_models.models import model_preset
from cost_models.transformer import transformer_profile

A100 = hardware.device_preset("a100-80gb")


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"])
def test_gemm_flops_equal_moe_counts(name: str) -> None:
    cfg = model_preset(name)
    tokens = 4096
    for index in range(cfg.num_layers):
        gemms = layer_ops._linear_gemms(cfg, tokens, 1, index)
        assert moe_ops.gemm_forward_flops(gemms) == 2 * tokens * moe.decoder_matmul_params(cfg, index)
    # one token through the whole model: matmuls + core + logits = moe.forward_flops_per_token, plus per
    # multi-token-prediction module (DeepSeek-V3: 1) its 2h -> h projection, a last-layer block and the logits
    matmul = sum(moe_ops.gemm_forward_flops(layer_ops._linear_gemms(cfg, 1, 1, i)) for i in range(cfg.num_layers))
    core = moe.attention_core_forward_flops(cfg, microbatch_size=1) / cfg.seq_length
    h, logits = cfg.hidden_size, 2 * cfg.hidden_size * cfg.vocab_size
    last = moe_ops.gemm_forward_flops(layer_ops._linear_gemms(cfg, 1, 1, cfg.num_layers - 1))
    mtp = cfg.mtp_layers * (2 * 2 * h * h + last + core + logits)
    assert matmul + cfg.num_layers * core + logits + mtp == pytest.approx(moe.forward_flops_per_token(cfg), rel=1e-12)


def test_mixtral_gemm_shapes_by_hand() -> None:
    cfg = model_preset("mixtral-8x7b")  # h 4096, 32 heads, 8 KV heads, 8 experts top-2 of width 14336
    tokens, t = 4096, 2
    assert layer_ops._linear_gemms(cfg, tokens, t) == [
        (tokens, (32 + 2 * 8) * 128 // t, 4096, 1),  # QKV, column parallel
        (tokens, 4096, 4096 // t, 1),  # output projection, row parallel
        (tokens, 8, 4096, 1),  # router, replicated
        (tokens * 2 / 8, 2 * 14336 // t, 4096, 8),  # each expert's gate+up on its 1024 routed rows
        (tokens * 2 / 8, 4096, 14336 // t, 8),  # each expert's down projection
    ]


def test_qwen3_explicit_head_width() -> None:
    cfg = model_preset("qwen3-30b-a3b")  # h 2048 but 32 heads x 128 = 4096-wide queries, 4 KV heads
    qkv, out = moe_ops.attention_gemms(cfg, 10, 1)
    assert qkv == (10, (32 + 2 * 4) * 128, 2048, 1)
    assert out == (10, 2048, 32 * 128, 1)


def test_deepseek_v3_mla_shapes_and_dense_first_layers() -> None:
    cfg = model_preset("deepseek-v3")  # h 7168, 128 heads, q_lora 1536, kv_lora 512, d_nope 128, d_rope 64, d_v 128
    tokens, t = 100, 8
    assert moe_ops.attention_gemms(cfg, tokens, t) == [
        (tokens, 1536, 7168, 1),  # query down, replicated
        (tokens, 128 * 192 // t, 1536, 1),  # query up, split by heads
        (tokens, 512 + 64, 7168, 1),  # KV latent + shared rope key, replicated
        (tokens, 128 * (128 + 128) // t, 512, 1),  # K_nope and V up, split by heads
        (tokens, 7168, 128 * 128 // t, 1),  # output projection, row parallel
    ]
    dense = moe_ops.mlp_gemms(cfg, tokens, t, 0)
    assert dense == [(tokens, 2 * 18432 // t, 7168, 1), (tokens, 7168, 18432 // t, 1)]
    routed = moe_ops.mlp_gemms(cfg, tokens, t, 3)
    assert routed[0] == (tokens, 256, 7168, 1)
    assert routed[1] == (tokens * 8 / 256, 2 * 2048 // t, 7168, 256)
    assert routed[3] == (tokens, 2 * 2048 // t, 7168, 1)  # the shared expert sees every token


def test_profile_distinguishes_dense_first_layers() -> None:
    cfg = model_preset("deepseek-v3").model_copy(update={"num_layers": 5, "seq_length": 1024})
    prof = transformer_profile(cfg, device=A100, microbatch_size=1, tensor_parallel=8, intra_node_bytes_per_s=300e9)
    decoders = [layer for layer in prof.layers if layer.kind == "decoder"]
    assert [d.name for d in decoders] == [f"decoder{i}" for i in range(5)]
    assert decoders[0].forward_s == decoders[2].forward_s != decoders[3].forward_s == decoders[4].forward_s
    assert decoders[3].param_bytes == pytest.approx(2 * moe.decoder_layer_params(cfg, 3) / 8)
    assert decoders[0].param_bytes == pytest.approx(2 * moe.decoder_layer_params(cfg, 0) / 8)
    assert decoders[3].param_bytes > 10 * decoders[0].param_bytes  # 256 experts against one dense FFN
    matmul = sum(2 * 1024 * moe.decoder_matmul_params(cfg, i) / 8 for i in range(5))
    core = 5 * moe.attention_core_forward_flops(cfg, microbatch_size=1, tensor_parallel=8)
    assert sum(d.flops for d in decoders) == pytest.approx(3 * matmul + 3 * core)


def test_mixtral_layer_between_one_and_all_experts_dense() -> None:
    cfg = model_preset("mixtral-8x7b").model_copy(update={"seq_length": 4096})
    one = cfg.model_copy(update={"num_experts": None, "experts_per_token": None, "ffn_hidden_size": 14336})
    all8 = one.model_copy(update={"ffn_hidden_size": 8 * 14336})
    kw = {"microbatch_size": 1, "tensor_parallel": 1}
    times = [layer_ops.decoder_op_times(c, A100, **kw) for c in (one, cfg, all8)]
    assert times[0].forward_s < times[1].forward_s < times[2].forward_s
    assert times[0].backward_s < times[1].backward_s < times[2].backward_s


def test_routing_traffic_only_in_moe_layers() -> None:
    cfg = model_preset("deepseek-v3")
    assert moe_ops.routing_bytes(cfg, 100, 2, 0) == (0.0, 0.0)
    fwd, _ = moe_ops.routing_bytes(cfg, 100, 2, 3)
    assert fwd == 2 * 4 * 100 * 256 + 2 * 2 * 100 * 7168 * (1 + 8)


def test_tensor_parallel_must_divide_expert_width() -> None:
    from planner.errors import InvalidProblemError

    cfg = model_preset("qwen3-30b-a3b").model_copy(update={"moe_ffn_hidden_size": 772})  # 772 = 4 x 193
    transformer_profile(cfg.model_copy(update={"num_layers": 1}), device=A100, microbatch_size=1, tensor_parallel=4)
    with pytest.raises(InvalidProblemError, match=r"experts' 772"):
        transformer_profile(cfg, device=A100, microbatch_size=1, tensor_parallel=8)
