"""MoE activation memory (cost_models.moe_memory): hand-checked byte counts."""

from __future__ import annotations

import pytest

from cost_models import moe_memory as mm
from cost_models.transformer import decoder_activation_bytes, transformer_profile
from planner import api
from planner.schema import TransformerConfig

TINY = TransformerConfig(name="m", hidden_size=8, num_layers=2, num_heads=2, seq_length=4, vocab_size=16,
                         num_experts=4, experts_per_token=2, moe_ffn_hidden_size=6, dtype="fp16")


def test_tiny_moe_block_by_hand() -> None:
    # T = 4 tokens, k = 2: R = 8 routed rows of h = 8; e = 2 bytes; GELU: 2 activations of width 6
    # input + mask (2 + 1) 4 x 8 = 96; router (4 + 1) 4 x 4 = 80; dispatched 2 x 8 x 8 = 128;
    # experts 2 x 8 x 2 x 6 = 192; routing weights in fp32 over the routed rows 4 x 8 = 32
    assert mm.moe_mlp_activation_bytes(TINY, microbatch_size=1) == 96 + 80 + 128 + 192 + 32


def test_capacity_factor_shared_experts_and_tensor_parallelism() -> None:
    padded = TINY.model_copy(update={"capacity_factor": 1.5})  # 12 rows: 192 + 288 + 48
    assert mm.moe_mlp_activation_bytes(padded, microbatch_size=1) == 96 + 80 + 192 + 288 + 48
    shared = TINY.model_copy(update={"num_shared_experts": 1})  # + 2 x 4 x 2 x 6 over all tokens
    assert mm.moe_mlp_activation_bytes(shared, microbatch_size=1) == 528 + 96
    # t = 2 with SP: input and mask halve (48), the experts' widths halve (96), routed copies do not
    assert mm.moe_mlp_activation_bytes(TINY, microbatch_size=1, tensor_parallel=2) == 48 + 80 + 128 + 96 + 32
    assert mm.moe_mlp_activation_bytes(TINY, microbatch_size=2) == 2 * 528


def test_decoder_activation_uses_the_moe_term_in_moe_layers_only() -> None:
    dense = TINY.model_copy(update={"num_experts": None, "experts_per_token": None, "moe_ffn_hidden_size": None})
    extra = mm.moe_mlp_activation_bytes(TINY, microbatch_size=1) - mm.dense_mlp_activation_bytes(TINY, microbatch_size=1)
    for recompute in ("none", "selective"):
        got = decoder_activation_bytes(TINY, microbatch_size=1, recompute=recompute)
        assert got - decoder_activation_bytes(dense, microbatch_size=1, recompute=recompute) == pytest.approx(extra)
    assert decoder_activation_bytes(TINY, microbatch_size=1, recompute="full") == 2 * 4 * 8  # the layer input
    first_dense = TINY.model_copy(update={"first_dense_layers": 1})
    assert decoder_activation_bytes(first_dense, microbatch_size=1, layer_index=0) == decoder_activation_bytes(
        dense, microbatch_size=1)
    assert decoder_activation_bytes(first_dense, microbatch_size=1, layer_index=1) == decoder_activation_bytes(
        TINY, microbatch_size=1)


def test_mixtral_profile_keeps_the_routed_activations() -> None:
    # Mixtral 8x7B, s = 4096, b = 1, t = 1, no SP: input + mask 3 x 4096 x 4096, router 5 x 4096 x 8,
    # routed copies 2 x 8192 x 4096, experts 2 x 8192 x 3 x 14336, fp32 routing weights 4 x 8192:
    # 822 MB, where the dense formula counted 403 MB (2 x 4096 x 3 x 14336 + input + mask)
    cfg = api.load_model("mixtral-8x7b", seq_length=4096)
    device = api.load_cluster("h100:8").device
    layer = transformer_profile(cfg, device=device, microbatch_size=1).layers[1]
    moe_bytes = mm.moe_mlp_activation_bytes(cfg, microbatch_size=1, sequence_parallel=False)
    assert moe_bytes == 3 * 4096 * 4096 + 5 * 4096 * 8 + 2 * 8192 * 4096 + 2 * 8192 * 3 * 14336 + 4 * 8192 == 822_280_192
    assert mm.dense_mlp_activation_bytes(cfg, microbatch_size=1, sequence_parallel=False) == 402_653_184
    dense_cfg = cfg.model_copy(update={"num_experts": None, "experts_per_token": None})
    dense = decoder_activation_bytes(dense_cfg, microbatch_size=1, sequence_parallel=False)
    assert layer.strategies()["none"].activation_bytes == pytest.approx(
        dense - mm.dense_mlp_activation_bytes(cfg, microbatch_size=1, sequence_parallel=False) + moe_bytes)


def test_flat_efficiency_profile_costs_each_layer_shape() -> None:
    # DeepSeek-V3-like: dense first layers and MoE layers differ in FLOPs and memory under --efficiency too
    cfg = api.load_model("deepseek-v3", seq_length=1024)
    device = api.load_cluster("h100:8").device
    prof = transformer_profile(cfg, device=device, microbatch_size=1, efficiency=0.5)
    dense, routed = prof.layers[1], prof.layers[1 + cfg.first_dense_layers]
    assert dense.flops != routed.flops and dense.static_bytes < routed.static_bytes
    for layer in (dense, routed):  # F = matmul + core = (F + B + W) / 3 at half of peak, t = 1
        assert layer.forward_s == pytest.approx(layer.flops / 3 / (0.5 * device.peak_flops), rel=1e-12)
    assert routed.strategies()["none"].activation_bytes > dense.strategies()["none"].activation_bytes
