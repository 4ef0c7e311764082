"""Per-module recompute (cost_models.recompute): hand-checked bytes and times, and the strategies'
names in the schema."""

from __future__ import annotations

import pytest

from cost_models import recompute as rc
from cost_models.compute import gemm_fwd_bwd_s, memory_op_s
from cost_models.hardware import cluster_preset
from cost_models.layer_ops import decoder_op_times
from cost_models.moe_memory import attention_block_activation_bytes
from cost_models.transformer import decoder_activation_bytes, transformer_profile
from planner.errors import InvalidProblemError
from planner.schema import TransformerConfig, module_strategy, recompute_modules_of

# T = s b = 4 tokens, h = 8, a = 2 heads of 4, f = 32 (GELU), e = 2 bytes
DENSE = TransformerConfig(name="d", hidden_size=8, num_layers=2, num_heads=2, seq_length=4, vocab_size=16,
                          ffn_hidden_size=32, dtype="fp16")
# SwiGLU MoE: E = 4 experts, top-2 (R = 8 rows), expert width 16, one shared expert
MOE = TransformerConfig(name="m", hidden_size=8, num_layers=2, num_heads=2, seq_length=4, vocab_size=16,
                        num_experts=4, experts_per_token=2, moe_ffn_hidden_size=16, num_shared_experts=1,
                        mlp="swiglu", dtype="fp16")
# MLA: a = 2 heads, d_nope 4 + d_rope 2 = 6 (Q.K), d_v 4, latents d_c' = 6, d_c = 4
MLA = DENSE.model_copy(update={"q_lora_rank": 6, "kv_lora_rank": 4, "qk_nope_head_dim": 4, "qk_rope_head_dim": 2,
                               "v_head_dim": 4, "position_embedding": "rope"})
H100 = cluster_preset("h100:1x8").device


def _bytes(cfg: TransformerConfig, module: str, **kw: object) -> float:
    return rc.module_bytes(cfg, module, microbatch_size=1, **kw)  # type: ignore[arg-type]


def test_dense_module_bytes_by_hand() -> None:
    assert _bytes(DENSE, "layernorm") == 2 * 2 * 4 * 8  # two norm outputs e T h
    assert _bytes(DENSE, "mlp") == 2 * 2 * 4 * 32  # GELU input and output e 2 T f
    assert _bytes(DENSE, "core_attn") == 4 * 2 * 4  # flash: fp32 LSE per head and token
    assert _bytes(DENSE, "core_attn", attention="unfused") == 5 * 2 * 4 * 4  # 5 a s^2 b
    assert _bytes(DENSE, "layernorm", tensor_parallel=2) == 64  # split by t with sequence parallelism
    assert _bytes(DENSE, "layernorm", tensor_parallel=2, sequence_parallel=False) == 128
    assert _bytes(DENSE, "moe") == _bytes(DENSE, "moe_act") == _bytes(DENSE, "mla_up_proj") == 0.0


def test_moe_module_bytes_by_hand() -> None:
    assert _bytes(MOE, "moe_act") == 2 * 8 * 16  # e R f_e: the SwiGLU product FC2 reads
    assert _bytes(MOE, "shared_experts") == 2 * 4 * 3 * 16  # e T (3 f_e): two halves and the product
    # block 1488 = input+mask 96, router 80, dispatched 128, experts 768, routing weights 32, shared 384
    assert _bytes(MOE, "moe") == 1488 - 96
    assert _bytes(MOE, "mlp") == 0.0  # no dense MLP in an MoE layer
    assert _bytes(MOE.model_copy(update={"first_dense_layers": 1}), "mlp", layer_index=0) == 2 * 3 * 4 * 32  # f = 4h


def test_mla_bytes_by_hand() -> None:
    # up-projected Q, K (a x 6) and V (a x 4): 2 x 4 x 2 x (6 + 6 + 4) = 256
    assert _bytes(MLA, "mla_up_proj") == 256
    # + the output (a d_v = 8) and, replicated, latents 2 x 6 + 2 x 4 + 2 = 22; norm output + mask 3 T h
    assert attention_block_activation_bytes(MLA, microbatch_size=1) == 2 * 4 * (2 * (12 + 8) + 22) + 3 * 4 * 8
    # GPT shapes keep Korthikanti's e(2sbh + 2sb n_kv d) + (e + 1) sbh
    assert attention_block_activation_bytes(DENSE, microbatch_size=1) == 2 * (2 * 32 + 2 * 32) + 3 * 32


def test_decoder_bytes_subtract_the_modules_and_moe_subsumes_its_parts() -> None:
    none = decoder_activation_bytes(MOE, microbatch_size=1)
    got = decoder_activation_bytes(MOE, microbatch_size=1, recompute="layernorm+moe_act")
    assert got == none - 128 - 256
    assert decoder_activation_bytes(MOE, microbatch_size=1, recompute="selective") == (
        decoder_activation_bytes(MOE, microbatch_size=1, recompute="core_attn"))
    both = decoder_activation_bytes(MOE, microbatch_size=1, recompute="moe_act+moe+shared_experts")
    assert both == decoder_activation_bytes(MOE, microbatch_size=1, recompute="moe") == none - 1392
    with pytest.raises(InvalidProblemError, match="core_attn"):
        decoder_activation_bytes(MOE, microbatch_size=1, recompute="attn")


def test_module_times_are_the_modules_own_kernels() -> None:
    dec = decoder_op_times(DENSE, H100, microbatch_size=1)
    assert rc.module_forward_s(DENSE, H100, "core_attn", dec, microbatch_size=1) == dec.selective_s
    # two norms each read and write e T h = 64 bytes: one 256-byte pass in two kernels
    assert rc.module_forward_s(DENSE, H100, "layernorm", dec, microbatch_size=1) == memory_op_s(256, H100, num_kernels=2)
    mlp = gemm_fwd_bwd_s(4, 32, 8, H100)[0] + gemm_fwd_bwd_s(4, 8, 32, H100)[0] + memory_op_s(2 * 2 * 4 * 32, H100)
    assert rc.module_forward_s(DENSE, H100, "mlp", dec, microbatch_size=1) == pytest.approx(mlp)
    moe_dec = decoder_op_times(MOE, H100, microbatch_size=1)
    act = memory_op_s(3 * 2 * 8 * 16, H100)  # read both halves, write the product, over R rows
    assert rc.module_forward_s(MOE, H100, "moe_act", moe_dec, microbatch_size=1) == act
    whole = rc.module_forward_s(MOE, H100, "moe", moe_dec, microbatch_size=1)
    assert whole > rc.module_forward_s(MOE, H100, "shared_experts", moe_dec, microbatch_size=1) + act
    assert whole < moe_dec.forward_s


def test_mla_and_shared_expert_times_by_hand() -> None:
    dec = decoder_op_times(MLA, H100, microbatch_size=1)
    # the up projections: query d_c' = 6 -> a d_qk = 12, key-value d_c = 4 -> a (d_nope + d_v) = 16;
    # rotary rewrites the a d_rope = 4 query and the shared d_rope = 2 key columns: 2 e T (4 + 2) bytes
    up = gemm_fwd_bwd_s(4, 12, 6, H100)[0] + gemm_fwd_bwd_s(4, 16, 4, H100)[0] + memory_op_s(2 * 2 * 4 * 6, H100)
    assert rc.module_forward_s(MLA, H100, "mla_up_proj", dec, microbatch_size=1) == pytest.approx(up)
    moe_dec = decoder_op_times(MOE, H100, microbatch_size=1)
    shared = (gemm_fwd_bwd_s(4, 32, 8, H100)[0] + gemm_fwd_bwd_s(4, 8, 16, H100)[0]  # FC1 (both halves), FC2
              + memory_op_s(3 * 2 * 4 * 16, H100))
    assert rc.module_forward_s(MOE, H100, "shared_experts", moe_dec, microbatch_size=1) == pytest.approx(shared)


def test_candidate_sets_and_frontier() -> None:
    assert rc.applicable_modules(DENSE) == ("core_attn", "layernorm", "mlp")
    assert len(rc.candidate_sets(DENSE)) == 7  # every non-empty subset of three
    moe_sets = rc.candidate_sets(MOE)  # core_attn, moe_act, layernorm, moe, shared_experts
    assert ("moe", "shared_experts") not in moe_sets and ("core_attn", "moe") in moe_sets
    assert len(moe_sets) == 2**5 - 1 - 3 * 4  # moe with moe_act and/or shared_experts (3), x 4 for the rest
    profile = transformer_profile(MOE, device=H100, microbatch_size=1, recompute_modules=True)
    options = {k: v for k, v in profile.layers[1].strategies().items() if "+" in k or k in rc.applicable_modules(MOE)}
    front = rc.frontier(options)
    times = [options[n].extra_s for n in front]
    kept = [options[n].activation_bytes for n in front]
    assert times == sorted(times) and kept == sorted(kept, reverse=True) and len(set(kept)) == len(kept)
    assert options[front[-1]].activation_bytes == min(o.activation_bytes for o in options.values())


def test_strategy_names() -> None:
    assert module_strategy(["mlp", "core_attn"]) == "core_attn+mlp"
    assert module_strategy([]) == "none"
    assert recompute_modules_of("layernorm+moe_act") == ("moe_act", "layernorm")
    assert recompute_modules_of("selective") == ("core_attn",)
    assert recompute_modules_of("full") is None and recompute_modules_of("mine") is None
    with pytest.raises(InvalidProblemError, match="attn"):
        module_strategy(["attn"])
