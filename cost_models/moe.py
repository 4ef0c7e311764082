"""Parameters and FLOPs of today's decoder blocks: mixture of experts, multi-latent attention,
explicit head widths, QK-norm and Q/K/V biases.

Counting rules (the same as ``cost_models.transformer`` for dense GPT/LLaMA blocks: a matmul of an
m x k input with a k x n weight costs 2mkn FLOPs forward, PTD-P Sec. 4.3.1 / dissertation Eq. 4.2):

- Mixture of experts (Shazeer et al., ICLR 2017 Sec. 2; Switch Transformer, Fedus et al., JMLR 2022
  Sec. 2.1; Mixtral, Jiang et al., arXiv:2401.04088 Sec. 2.1; DeepSeekMoE, Dai et al., ACL 2024
  Sec. 3 for shared experts): an MoE layer holds a router ``h x E`` and ``E`` expert FFNs; a token
  runs the router and ``k`` routed experts plus the shared experts. Total parameters count every
  expert; active parameters count ``k`` routed plus the shared ones. The first
  ``first_dense_layers`` decoder layers use the dense FFN (``ffn_hidden_size``) instead.
- Multi-latent attention (DeepSeek-V2, arXiv:2405.04434 Sec. 2.1.2-2.1.3, Eqs. 9-19; DeepSeek-V3,
  arXiv:2412.19437 Sec. 2.1.1): queries go through a low-rank ``h x d_c'`` down and ``d_c' x n_h
  (d_nope + d_rope)`` up projection (with an RMSNorm on the latent); keys and values share one
  latent ``h x (d_c + d_rope)`` (the ``d_rope`` part is the decoupled RoPE key, shared by all heads)
  expanded by ``d_c x n_h (d_nope + d_v)``; the output projection is ``n_h d_v x h``. Training
  runs the expanded form, so the attention core costs ``2 s^2 n_h (d_nope + d_rope)`` for the scores
  and ``2 s^2 n_h d_v`` for the weighted values per sequence. The KV cache per token and layer is
  ``d_c + d_rope`` elements (Sec. 2.1.2, Table 1 of DeepSeek-V2).
- Standard attention with an explicit per-head width ``d`` (Qwen3): Q and O are ``h x n_h d``, K and
  V ``h x n_kv d`` (grouped-query attention, Ainslie et al., EMNLP 2023); QK-norm adds two RMSNorm
  scales of width ``d`` per layer.

Published totals these reproduce (tests/cost_models/test_moe.py): Mixtral 8x7B 46.7B total / 12.9B
active, DeepSeek-V3 671B / 37B, Llama-3 8B/70B/405B 8.03B/70.6B/405.9B.
"""

from __future__ import annotations

from cost_models.windows import attention_span_factor
from planner.schema import TransformerConfig

__all__ = [
    "attention_core_forward_flops",
    "attention_kv_widths",
    "attention_matmul_params",
    "attention_params",
    "decoder_layer_params",
    "decoder_matmul_params",
    "expert_params",
    "forward_flops_per_token",
    "is_moe_layer",
    "kv_cache_elements_per_token",
    "mean_decoder_layer_params",
    "mean_decoder_matmul_params",
    "mlp_params",
    "num_active_parameters",
    "num_parameters",
    "qk_head_dim",
    "router_params",
    "uses_extended_counts",
    "v_head_dim",
]


def uses_extended_counts(cfg: TransformerConfig) -> bool:
    """True when the config needs this module's counts (MoE, MLA, explicit head width, QK-norm, QKV bias)."""
    return cfg.is_moe or cfg.is_mla or cfg.head_dim is not None or cfg.qk_norm or cfg.qkv_bias


def _norm_params(cfg: TransformerConfig, width: int) -> int:
    return (2 if cfg.norm == "layernorm" else 1) * width


# ------------------------------------------------------------------------------------------
# Attention
# ------------------------------------------------------------------------------------------


def qk_head_dim(cfg: TransformerConfig) -> int:
    """Per-head query/key width: d_nope + d_rope with MLA, else ``cfg.head_size``."""
    return _qk_head_dim(cfg)


def v_head_dim(cfg: TransformerConfig) -> int:
    """Per-head value width: d_v with MLA, else ``cfg.head_size``."""
    return _v_head_dim(cfg)


def _qk_head_dim(cfg: TransformerConfig) -> int:
    if cfg.is_mla:
        return int(cfg.qk_nope_head_dim or 0) + int(cfg.qk_rope_head_dim or 0)
    return cfg.head_size


def _v_head_dim(cfg: TransformerConfig) -> int:
    return int(cfg.v_head_dim or 0) if cfg.is_mla else cfg.head_size


def attention_matmul_params(cfg: TransformerConfig) -> int:
    """Weights of the attention matmuls of one layer (MLA: DeepSeek-V2 Eqs. 9-19; else Q, K, V, O)."""
    h, a = cfg.hidden_size, cfg.num_heads
    if not cfg.is_mla:
        d = cfg.head_size
        return 2 * h * a * d + 2 * h * cfg.kv_heads * d
    qk, v, rope, c = _qk_head_dim(cfg), _v_head_dim(cfg), int(cfg.qk_rope_head_dim or 0), int(cfg.kv_lora_rank or 0)
    query = h * cfg.q_lora_rank + cfg.q_lora_rank * a * qk if cfg.q_lora_rank else h * a * qk
    key_value = h * (c + rope) + c * a * (int(cfg.qk_nope_head_dim or 0) + v)
    return query + key_value + a * v * h


def attention_params(cfg: TransformerConfig) -> int:
    """All attention parameters of one layer: matmuls, biases, QK-norm and MLA latent norms."""
    h, a = cfg.hidden_size, cfg.num_heads
    extra = 0
    if cfg.is_mla:
        extra += _norm_params(cfg, int(cfg.kv_lora_rank or 0))
        extra += _norm_params(cfg, cfg.q_lora_rank) if cfg.q_lora_rank else 0
    else:
        d = cfg.head_size
        if cfg.bias or cfg.qkv_bias:
            extra += a * d + 2 * cfg.kv_heads * d
        if cfg.bias:
            extra += h
        if cfg.qk_norm:
            extra += 2 * _norm_params(cfg, d)
    return attention_matmul_params(cfg) + extra


def kv_cache_elements_per_token(cfg: TransformerConfig) -> int:
    """K/V elements one layer keeps per token: 2 n_kv d, or d_c + d_rope with MLA (DeepSeek-V2 Table 1)."""
    if cfg.is_mla:
        return int(cfg.kv_lora_rank or 0) + int(cfg.qk_rope_head_dim or 0)
    return 2 * cfg.kv_heads * cfg.head_size


def attention_kv_widths(cfg: TransformerConfig) -> tuple[int, int]:
    """(K, V) elements per token the attention core reads: n_kv d each; MLA expands its latent to
    n_h (d_nope + d_rope) and n_h d_v (what context parallelism passes around the ring)."""
    if cfg.is_mla:
        return cfg.num_heads * _qk_head_dim(cfg), cfg.num_heads * _v_head_dim(cfg)
    width = cfg.kv_heads * cfg.head_size
    return width, width


def attention_core_forward_flops(cfg: TransformerConfig, *, microbatch_size: int, tensor_parallel: int = 1) -> float:
    """Scores 2bs^2 n_h d_qk plus weighted values 2bs^2 n_h d_v, split over t; 4bs^2h for GPT shapes;
    times the share sliding windows leave (``windows.attention_span_factor``)."""
    b, s, a = microbatch_size, cfg.seq_length, cfg.num_heads
    return 2 * b * s**2 * a * (_qk_head_dim(cfg) + _v_head_dim(cfg)) / tensor_parallel * attention_span_factor(cfg)


# ------------------------------------------------------------------------------------------
# MLP: dense FFN, experts, router
# ------------------------------------------------------------------------------------------


def _ffn_params(cfg: TransformerConfig, width: int, *, with_bias: bool) -> int:
    h, mats = cfg.hidden_size, (3 if cfg.gated_mlp else 2)
    bias = ((2 if cfg.gated_mlp else 1) * width + h) if with_bias else 0
    return mats * h * width + bias


def mlp_params(cfg: TransformerConfig) -> int:
    """A dense FFN of width ``ffn_size`` (weights, plus biases when ``cfg.bias``)."""
    return _ffn_params(cfg, cfg.ffn_size, with_bias=cfg.bias)


def expert_params(cfg: TransformerConfig) -> int:
    """One expert FFN of width ``moe_ffn_hidden_size`` (default ``ffn_size``)."""
    return _ffn_params(cfg, cfg.moe_ffn_hidden_size or cfg.ffn_size, with_bias=cfg.bias)


def router_params(cfg: TransformerConfig) -> int:
    """The router's h x E gate (plus a per-expert bias when ``cfg.bias``)."""
    e = cfg.num_experts or 0
    return cfg.hidden_size * e + (e if cfg.bias else 0)


def is_moe_layer(cfg: TransformerConfig, index: int) -> bool:
    """Whether decoder layer ``index`` (0-based) is an MoE layer."""
    return cfg.is_moe and index >= cfg.first_dense_layers


def _layer_mlp_params(cfg: TransformerConfig, index: int, *, active: bool) -> int:
    if not is_moe_layer(cfg, index):
        return mlp_params(cfg)
    routed = int(cfg.experts_per_token if active else cfg.num_experts or 0)
    return router_params(cfg) + (routed + cfg.num_shared_experts) * expert_params(cfg)


def decoder_layer_params(cfg: TransformerConfig, index: int, *, active: bool = False) -> int:
    """Parameters of decoder layer ``index``: attention, MLP (all experts, or the active ones), two norms."""
    return attention_params(cfg) + _layer_mlp_params(cfg, index, active=active) + 2 * _norm_params(cfg, cfg.hidden_size)


def decoder_matmul_params(cfg: TransformerConfig, index: int) -> int:
    """Matmul weights one token multiplies in decoder layer ``index`` (router and active experts only)."""
    if not is_moe_layer(cfg, index):
        mlp = (3 if cfg.gated_mlp else 2) * cfg.hidden_size * cfg.ffn_size
    else:
        width = cfg.moe_ffn_hidden_size or cfg.ffn_size
        experts = int(cfg.experts_per_token or 0) + cfg.num_shared_experts
        mlp = (
            cfg.hidden_size * int(cfg.num_experts or 0)
            + experts * (3 if cfg.gated_mlp else 2) * cfg.hidden_size * width
        )
    return attention_matmul_params(cfg) + mlp


def mean_decoder_matmul_params(cfg: TransformerConfig) -> float:
    """Active matmul weights per decoder layer averaged over the layers (for uniform-block profiles)."""
    return sum(decoder_matmul_params(cfg, i) for i in range(cfg.num_layers)) / cfg.num_layers


def mean_decoder_layer_params(cfg: TransformerConfig) -> float:
    """All parameters per decoder layer averaged over the layers (num_layers x this = the blocks' total)."""
    return sum(decoder_layer_params(cfg, i) for i in range(cfg.num_layers)) / cfg.num_layers


# ------------------------------------------------------------------------------------------
# Model totals
# ------------------------------------------------------------------------------------------


def _embedding_and_head_params(cfg: TransformerConfig) -> int:
    h, v = cfg.hidden_size, cfg.vocab_size
    positions = cfg.seq_length * h if cfg.position_embedding == "learned" else 0
    return v * h + positions + _norm_params(cfg, h) + (0 if cfg.tied_embeddings else v * h)


def num_parameters(cfg: TransformerConfig) -> int:
    """Every parameter: embeddings, all decoder layers with every expert, final norm, output head and
    the multi-token-prediction modules (``mtp_module_params``; they share the embedding and head)."""
    return (_embedding_and_head_params(cfg) + sum(decoder_layer_params(cfg, i) for i in range(cfg.num_layers))
            + cfg.mtp_layers * mtp_module_params(cfg))


def num_active_parameters(cfg: TransformerConfig) -> int:
    """Parameters one token uses: as ``num_parameters`` with k routed (plus shared) experts per MoE layer.
    Embeddings count, as in the published figures (Mixtral 12.9B, DeepSeek-V3 37B); the
    multi-token-prediction modules do not (the published figures leave them out)."""
    blocks = sum(decoder_layer_params(cfg, i, active=True) for i in range(cfg.num_layers))
    return _embedding_and_head_params(cfg) + blocks


def mtp_module_params(cfg: TransformerConfig) -> int:
    """One multi-token-prediction module ([deepseek-v3] Sec. 2.2, Megatron-Core's
    ``MultiTokenPredictionLayer``): the norms of the previous depth's hidden state and of the next
    token's embedding, the 2h -> h projection, a decoder block like the model's last layer and its
    final norm; the embedding and the output head are the main model's."""
    h = cfg.hidden_size
    return 3 * _norm_params(cfg, h) + 2 * h * h + decoder_layer_params(cfg, cfg.num_layers - 1)


def mtp_forward_flops_per_token(cfg: TransformerConfig) -> float:
    """Forward FLOPs of one token through one multi-token-prediction module: the projection (2 x 2h x h),
    the block (as the last layer's) and the shared head's logits 2hV."""
    h, last = cfg.hidden_size, cfg.num_layers - 1
    core = attention_core_forward_flops(cfg, microbatch_size=1) / cfg.seq_length
    return 2 * 2 * h * h + 2 * decoder_matmul_params(cfg, last) + core + 2 * h * cfg.vocab_size


def forward_flops_per_token(cfg: TransformerConfig) -> float:
    """Forward FLOPs of one token over the whole model: 2 x active matmul weights per layer, the
    attention core at the config's sequence length, the logits 2hV and any multi-token-prediction
    modules (training: x3 for F+B+W)."""
    matmul = 2 * sum(decoder_matmul_params(cfg, i) for i in range(cfg.num_layers))
    core = cfg.num_layers * attention_core_forward_flops(cfg, microbatch_size=1) / cfg.seq_length
    return matmul + core + 2 * cfg.hidden_size * cfg.vocab_size + cfg.mtp_layers * mtp_forward_flops_per_token(cfg)
