"""Parameter and FLOP counts of MoE / MLA / explicit-head-width configs against published totals
and hand arithmetic."""

from __future__ import annotations

import pytest

from cost_models import moe, transformer
from cost_models.models import list_model_presets, model_preset
from planner.schema import TransformerConfig

# (preset, published total, published active, relative tolerance). Sources: each preset's "source".
PUBLISHED = [
    ("llama3-8b", 8.03e9, None, 0.001),
    ("llama3-70b", 70.6e9, None, 0.001),
    ("llama3-405b", 405.9e9, None, 0.001),
    ("mixtral-8x7b", 46.7e9, 12.9e9, 0.002),
    ("mixtral-8x22b", 141e9, 39e9, 0.005),
    ("qwen3-8b", 8.2e9, None, 0.002),
    ("qwen3-32b", 32.8e9, None, 0.002),
    ("qwen3-30b-a3b", 30.5e9, 3.3e9, 0.02),
    ("qwen3-235b-a22b", 235e9, 22e9, 0.01),
    ("deepseek-v3", 682.6e9, 37e9, 0.02),  # 671B main model + its MTP module (test below)
    ("opt-175b", 175e9, None, 0.003),
    ("gpt-neox-20b", 20.55e9, None, 0.001),
    ("mpt-30b", 30e9, None, 0.002),
    ("gemma-7b", 8.54e9, None, 0.001),
]


@pytest.mark.parametrize(("name", "total", "active", "tol"), PUBLISHED)
def test_published_totals(name: str, total: float, active: float | None, tol: float) -> None:
    cfg = model_preset(name)
    assert moe.num_parameters(cfg) == pytest.approx(total, rel=tol)
    assert moe.num_active_parameters(cfg) == pytest.approx(active or total, rel=tol)
    # the transformer module's hook gives the same total, so planning sees every expert
    assert transformer.num_parameters(cfg) == moe.num_parameters(cfg)


def test_exact_counts_of_released_checkpoints() -> None:
    """The parameter counts of the released safetensors (sum of tensor sizes)."""
    assert moe.num_parameters(model_preset("llama3-8b")) == 8_030_261_248
    assert moe.num_parameters(model_preset("llama3-70b")) == 70_553_706_496
    assert moe.num_parameters(model_preset("mixtral-8x7b")) == 46_702_792_704
    # less the tensors paraplan does not model (docs/models-and-configs.md section 1): BLOOM's
    # embedding LayerNorm; plus the ones it counts that the model lacks: Falcon-7B's second LayerNorm
    # per block, MPT-7B's LayerNorm biases
    assert moe.num_parameters(model_preset("bloom-176b")) == 176_247_271_424 - 2 * 14336
    assert moe.num_parameters(model_preset("falcon-7b")) == 6_921_720_704 + 32 * 2 * 4544
    assert moe.num_parameters(model_preset("mpt-7b")) == 6_649_286_656 + 65 * 4096


def test_mixtral_by_hand() -> None:
    h, f, kv, v, layers = 4096, 14336, 1024, 32000, 32
    attention = 2 * h * h + 2 * h * kv
    expert = 3 * h * f
    per_layer_total = attention + 8 * expert + 8 * h + 2 * h  # router 8h, two RMSNorm scales
    per_layer_active = attention + 2 * expert + 8 * h + 2 * h
    ends = 2 * v * h + h  # embedding, untied head, final norm
    cfg = model_preset("mixtral-8x7b")
    assert moe.num_parameters(cfg) == layers * per_layer_total + ends
    assert moe.num_active_parameters(cfg) == layers * per_layer_active + ends


def test_deepseek_v3_mla_by_hand() -> None:
    """DeepSeek-V2 Eqs. 9-19 with V3's sizes: d_c' 1536, d_c 512, d_nope 128, d_rope 64, d_v 128."""
    h, a = 7168, 128
    query = h * 1536 + 1536 * a * (128 + 64)
    key_value = h * (512 + 64) + 512 * a * (128 + 128)
    output = a * 128 * h
    cfg = model_preset("deepseek-v3")
    assert moe.attention_matmul_params(cfg) == query + key_value + output
    assert moe.attention_params(cfg) == query + key_value + output + 1536 + 512  # two latent RMSNorms
    assert moe.kv_cache_elements_per_token(cfg) == 512 + 64
    # first 3 layers dense (18432-wide FFN), the rest MoE: router, 256 routed + 1 shared 2048-wide experts
    dense = moe.decoder_layer_params(cfg, 2)
    sparse = moe.decoder_layer_params(cfg, 3)
    assert dense - moe.attention_params(cfg) - 2 * h == 3 * h * 18432
    assert sparse - moe.attention_params(cfg) - 2 * h == 256 * h + 257 * 3 * h * 2048
    assert (
        moe.decoder_layer_params(cfg, 3, active=True) - moe.attention_params(cfg) - 2 * h == 256 * h + 9 * 3 * h * 2048
    )


def test_gpt_oss_active_excludes_input_embedding() -> None:
    """OpenAI's model card counts active parameters without the input embedding (a lookup)."""
    for name, total, active in (("gpt-oss-120b", 116.83e9, 5.13e9), ("gpt-oss-20b", 20.91e9, 3.61e9)):
        cfg = model_preset(name)
        assert moe.num_parameters(cfg) == pytest.approx(total, rel=1e-3)
        embedding = cfg.vocab_size * cfg.hidden_size
        assert moe.num_active_parameters(cfg) - embedding == pytest.approx(active, rel=2e-3)


def test_qwen3_head_dim_wider_than_hidden() -> None:
    cfg = model_preset("qwen3-32b")
    h, a, kv, d = 5120, 64, 8, 128
    assert moe.attention_params(cfg) == 2 * h * a * d + 2 * h * kv * d + 2 * d  # + q_norm, k_norm
    assert moe.attention_core_forward_flops(cfg, microbatch_size=1) == 4 * cfg.seq_length**2 * a * d


def test_dense_configs_match_the_ptdp_counts() -> None:
    """For a GPT and a LLaMA shape the module agrees with cost_models.transformer (Eq. 4.3 rules)."""
    for name in ("gpt-1.7b", "llama2-70b"):
        cfg = model_preset(name)
        assert not moe.uses_extended_counts(cfg)
        assert moe.num_parameters(cfg) == transformer.num_parameters(cfg)
        assert moe.mean_decoder_matmul_params(cfg) == transformer.decoder_matmul_params(cfg)
        assert moe.attention_core_forward_flops(cfg, microbatch_size=2, tensor_parallel=2) == pytest.approx(
            transformer.attention_core_forward_flops(cfg, microbatch_size=2, tensor_parallel=2)
        )


def test_moe_flops_use_active_experts_only() -> None:
    cfg = model_preset("mixtral-8x7b")
    dense_twin = cfg.model_copy(update={"num_experts": None, "experts_per_token": None})
    h = cfg.hidden_size
    expert = 3 * h * cfg.ffn_size
    per_layer_extra = 8 * h + expert  # router matmul plus a second expert
    diff = moe.forward_flops_per_token(cfg) - moe.forward_flops_per_token(dense_twin)
    assert diff == 2 * cfg.num_layers * per_layer_extra
    # the profile's per-layer FLOPs (via the transformer hook) are the active ones
    f = transformer.decoder_forward_flops(cfg, microbatch_size=1)
    assert f == pytest.approx(
        2 * cfg.seq_length * moe.decoder_matmul_params(cfg, 0)
        + moe.attention_core_forward_flops(cfg, microbatch_size=1)
    )


def test_first_dense_layers_and_shared_experts() -> None:
    cfg = TransformerConfig(
        name="m",
        hidden_size=8,
        num_layers=4,
        num_heads=2,
        seq_length=4,
        vocab_size=16,
        ffn_hidden_size=32,
        moe_ffn_hidden_size=4,
        num_experts=4,
        experts_per_token=1,
        num_shared_experts=2,
        first_dense_layers=1,
        mlp="swiglu",
        norm="rmsnorm",
        bias=False,
        position_embedding="rope",
        tied_embeddings=True,
    )
    assert [moe.is_moe_layer(cfg, i) for i in range(4)] == [False, True, True, True]
    attention, norms = 4 * 8 * 8, 2 * 8
    assert moe.decoder_layer_params(cfg, 0) == attention + 3 * 8 * 32 + norms
    assert moe.decoder_layer_params(cfg, 1) == attention + 4 * 8 + 6 * 3 * 8 * 4 + norms
    assert moe.decoder_layer_params(cfg, 1, active=True) == attention + 4 * 8 + 3 * 3 * 8 * 4 + norms
    assert moe.num_parameters(cfg) == 16 * 8 + 8 + moe.decoder_layer_params(cfg, 0) + 3 * moe.decoder_layer_params(
        cfg, 1
    )


def test_every_preset_has_a_source() -> None:
    for name, text in list_model_presets().items():
        assert "[" in text and text.rstrip().endswith("]"), name
        assert model_preset(name).name == name


@pytest.mark.parametrize("name", ["mixtral-8x7b", "deepseek-v3", "qwen3-32b"])
def test_iteration_flops_agree_with_per_token_flops(name: str) -> None:
    """transformer.flops_per_iteration (through the hooks) = 3 (F + B + W) x s x moe.forward_flops_per_token."""
    cfg = model_preset(name)
    per_sample = transformer.flops_per_iteration(cfg, global_batch_size=1, recompute=False)
    assert per_sample == pytest.approx(3 * cfg.seq_length * moe.forward_flops_per_token(cfg), rel=1e-12)


def test_deepseek_v3_with_its_multi_token_prediction_module() -> None:
    """DeepSeek-V3: 671B in the main model, 685B on Hugging Face with its MTP module ([deepseek-v3]
    Sec. 2.2: 14B), whose checkpoint repeats the embedding and the head (2 V h) that paraplan, as
    Megatron-Core does, shares: 671.0B + 11.6B + 2 x 0.93B = 684.5B. The module (norms, 2h -> h
    projection, an MoE block like the last layer) adds no active parameters to the published 37B."""
    cfg = model_preset("deepseek-v3")
    assert cfg.mtp_layers == 1
    main = cfg.model_copy(update={"mtp_layers": 0})
    assert moe.num_parameters(main) == pytest.approx(671e9, rel=0.001)
    h = cfg.hidden_size
    assert moe.mtp_module_params(cfg) == 3 * h + 2 * h * h + moe.decoder_layer_params(cfg, cfg.num_layers - 1)
    assert moe.num_parameters(cfg) + 2 * cfg.vocab_size * h == pytest.approx(685e9, rel=0.001)
    assert moe.num_active_parameters(cfg) == moe.num_active_parameters(main)
