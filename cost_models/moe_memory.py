"""Activation memory of a mixture-of-experts FFN block: what its backward keeps, per microbatch
and device, with no recompute (``transformer.decoder_activation_bytes`` uses it for MoE layers).

The dense MLP keeps its input, the activation function's input(s) and output and a dropout mask:
``e sbh/t_sp + e (2 or 3) sbf / t + sbh/t_sp`` (Korthikanti et al., MLSys 2023, Sec. 4.1, Eq. 1;
2 for GELU, 3 for SwiGLU's two halves and product). An MoE block (router, token permutation, k
routed experts per token, shared experts, weighted combine; Megatron-Core's MoE layer with the
all-gather/all-to-all token dispatchers, grouped GEMM) keeps, with ``T = s b`` tokens, ``E``
experts, top-``k``, expert width ``f_e`` and ``R = T k`` routed rows (``c T k`` with a capacity
factor ``c``: every expert padded to ``c T k / E`` rows, Switch Transformer, Fedus et al., JMLR
2022, Sec. 2.2):

- the block input (the norm output, ``e sbh/t_sp``) and the dropout mask (``sbh/t_sp``), as dense;
- router: the fp32 scores after softmax/sigmoid (``4 T E``, their backward needs them) and the
  boolean routing map (``T E``); every tensor-parallel rank routes all tokens;
- permute: the dispatched token copies, FC1's input (``e R h``): not split over t (with sequence
  parallelism the tokens are all-gathered before routing);
- routed experts: FC1's output(s) and the activation's output, as the dense MLP but over ``R``
  rows of width ``f_e / t``: ``e R f_e (2 or 3) / t``;
- routing weights: Megatron-Core (0.16, ``experts.py``) multiplies each routed row by its weight
  inside the experts' activation (``act(FC1 x) * p``, the weighted SwiGLU), which keeps the
  permuted weights in fp32 (``4 R``) for its backward; the FC2 outputs are then only scattered
  back and summed (unpermute), whose backward is a gather that keeps nothing. (Counting the
  expert outputs ``e R h`` as well, as an older combine that weighted them after FC2 needed,
  over-counts today's Megatron by ``e R h`` per MoE layer: 470 MB for DeepSeek-V3 at 4096 tokens.)
- shared experts (DeepSeekMoE, Dai et al., ACL 2024, Sec. 3.2): a dense FFN of width
  ``n_shared f_e`` over all ``T`` tokens, reading the same block input: ``e T n_shared f_e (2 or 3) / t``.

Expert parallelism over ``e`` ranks leaves these counts unchanged under balanced routing: each
rank sends its ``T k`` routed copies out and receives ``T k / e`` from each of the ``e`` ranks,
so it still holds ``T k`` rows (for its own experts); what EP divides is the expert weights. Routing
imbalance (a hot expert's rank holding more rows) and dropped tokens are not modelled.
"""

from __future__ import annotations

from planner.schema import TransformerConfig

_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}
ROUTER_SCORE_BYTES = 4
"""Router scores are computed and kept in fp32 (Megatron-Core ``--moe-router-dtype`` fp32 default
for the softmax/sigmoid, DeepSeek-V3 Sec. 3.3.2: the gating is computed in fp32)."""


def routed_rows(cfg: TransformerConfig, tokens: float) -> float:
    """Rows the routed experts process for ``tokens`` tokens: T k, or c T k with a capacity factor."""
    rows = tokens * int(cfg.experts_per_token or 0)
    return rows * cfg.capacity_factor if cfg.capacity_factor else rows


def moe_mlp_activation_bytes(cfg: TransformerConfig, *, microbatch_size: int, tensor_parallel: int = 1,
                             sequence_parallel: bool = True) -> float:
    """Bytes an MoE FFN block keeps for its backward (no recompute), per microbatch and device:
    the MoE replacement of the dense MLP term of ``decoder_activation_bytes`` (module docstring)."""
    e, h, t = _BYTES[cfg.dtype], cfg.hidden_size, tensor_parallel
    t_sp = t if sequence_parallel else 1
    tokens = cfg.seq_length * microbatch_size
    experts = int(cfg.num_experts or 0)
    width = cfg.moe_ffn_hidden_size or cfg.ffn_size
    acts = 3 if cfg.gated_mlp else 2
    rows = routed_rows(cfg, tokens)
    block_input_and_mask = (e + 1) * tokens * h / t_sp
    router = (ROUTER_SCORE_BYTES + 1) * tokens * experts
    dispatched = e * rows * h
    routed = e * rows * acts * width / t
    combine = ROUTER_SCORE_BYTES * rows  # the permuted routing weights the weighted activation keeps
    shared = e * tokens * acts * cfg.num_shared_experts * width / t
    return block_input_and_mask + router + dispatched + routed + combine + shared


def dense_mlp_activation_bytes(cfg: TransformerConfig, *, microbatch_size: int, tensor_parallel: int = 1,
                               sequence_parallel: bool = True) -> float:
    """The dense MLP term of ``decoder_activation_bytes`` (Korthikanti et al. Eq. 1), for comparison."""
    e, t = _BYTES[cfg.dtype], tensor_parallel
    t_sp = t if sequence_parallel else 1
    tokens = cfg.seq_length * microbatch_size
    acts = 3 if cfg.gated_mlp else 2
    return e * acts * tokens * cfg.ffn_size / t + (e + 1) * tokens * cfg.hidden_size / t_sp


def attention_block_activation_bytes(cfg: TransformerConfig, *, microbatch_size: int, tensor_parallel: int = 1,
                                     sequence_parallel: bool = True) -> float:
    """Bytes the attention block keeps besides the core's own (no recompute), per microbatch and device:
    the norm output (QKV input) and the dropout mask, ``(e + 1) T h / t_sp``; Q, K, V (the core's
    inputs) and the core output (the projection's input), each its own width over t: ``e T (n_h d_qk
    + 2 n_kv d + n_h d) / t``, which is ``e T (2h + 2 n_kv d) / t`` for ``n_h d = h`` (Korthikanti
    et al. Eq. 1). MLA (DeepSeek-V2 Sec. 2.1.2-2.1.3; Megatron-Core's MLA) keeps the up-projected
    ``Q, K`` of width ``n_h (d_nope + d_rope)``, ``V`` and the output of width ``n_h d_v`` (all over
    t), and, replicated over t, the latents: the query latent before and after its norm
    (``2 d_c'`` when it has one), the key-value latent before and after its norm (``2 d_c``) and
    the shared rotary key (``d_rope``)."""
    e, h, t = _BYTES[cfg.dtype], cfg.hidden_size, tensor_parallel
    t_sp = t if sequence_parallel else 1
    tokens = cfg.seq_length * microbatch_size
    a = cfg.num_heads
    if cfg.is_mla:
        qk = int(cfg.qk_nope_head_dim or 0) + int(cfg.qk_rope_head_dim or 0)
        v = int(cfg.v_head_dim or 0)
        heads = a * (2 * qk + 2 * v) / t
        latents = 2 * int(cfg.q_lora_rank or 0) + 2 * int(cfg.kv_lora_rank or 0) + int(cfg.qk_rope_head_dim or 0)
        return e * tokens * (heads + latents) + (e + 1) * tokens * h / t_sp
    d = cfg.head_size
    return e * tokens * (2 * a * d + 2 * cfg.kv_heads * d) / t + (e + 1) * tokens * h / t_sp
