"""GEMM shapes and memory-bound bytes of one decoder layer with explicit head widths, multi-latent
attention (MLA) or a mixture-of-experts (MoE) FFN, for the per-operation model (``layer_ops``).

Shapes follow the counting rules of ``cost_models.moe`` (which cites the papers), so the FLOPs
of these GEMMs equal ``moe.decoder_matmul_params`` x 2 per token. Tensor parallelism t splits them
as Megatron does for dense layers: projections into heads or FFN width divide N by t (column
parallel), projections out of them divide K by t (row parallel). Exceptions:

- MLA (DeepSeek-V2 Sec. 2.1.2-2.1.3, DeepSeek-V3 Sec. 2.1.1): the query and key-value down
  projections ``h -> d_c'`` and ``h -> d_c + d_rope`` are small and replicated over t; the up
  projections are split by heads; the core uses d_nope + d_rope for Q.K and d_v for values.
- MoE (Mixtral Sec. 2.1; DeepSeekMoE Sec. 3): the router ``h -> E`` is replicated over t; the
  ``tokens x k`` routed rows are spread evenly over the ``E`` experts (balanced routing, what the
  auxiliary losses aim at), so each expert runs GEMMs of ``tokens k / E`` rows, which sets their
  efficiency; with no expert parallelism in the search every expert sits on each device, its
  width split by t like a dense FFN. Shared experts are dense FFNs over all tokens. Permute and
  unpermute (gather the routed copies, scatter and weight them back) are memory-bound.
"""

from __future__ import annotations

from cost_models import moe
from planner.schema import TransformerConfig

Gemm = tuple[float, int, int, int]
"""(M rows, N, K, how many such GEMMs) of one linear layer Y = X W per device."""


def expert_ffn_width(cfg: TransformerConfig) -> int:
    """FFN width of one routed or shared expert."""
    return cfg.moe_ffn_hidden_size or cfg.ffn_size


def _ffn_gemms(cfg: TransformerConfig, rows: float, width: int, t: int, count: int) -> list[Gemm]:
    up = (2 if cfg.gated_mlp else 1) * width // t
    return [(rows, up, cfg.hidden_size, count), (rows, cfg.hidden_size, width // t, count)]


def attention_gemms(cfg: TransformerConfig, tokens: int, t: int) -> list[Gemm]:
    """Q/K/V/O projections: n_h d and n_kv d wide (explicit ``head_dim``), or MLA's low-rank pairs."""
    h, a = cfg.hidden_size, cfg.num_heads
    if not cfg.is_mla:
        d = cfg.head_size
        return [(tokens, (a + 2 * cfg.kv_heads) * d // t, h, 1), (tokens, h, a * d // t, 1)]
    qk, v = moe.qk_head_dim(cfg), moe.v_head_dim(cfg)
    nope, rope, c = int(cfg.qk_nope_head_dim or 0), int(cfg.qk_rope_head_dim or 0), int(cfg.kv_lora_rank or 0)
    if cfg.q_lora_rank:
        query = [(tokens, cfg.q_lora_rank, h, 1), (tokens, a * qk // t, cfg.q_lora_rank, 1)]
    else:
        query = [(tokens, a * qk // t, h, 1)]
    key_value = [(tokens, c + rope, h, 1), (tokens, a * (nope + v) // t, c, 1)]
    return [*query, *key_value, (tokens, h, a * v // t, 1)]


def mlp_gemms(cfg: TransformerConfig, tokens: int, t: int, layer_index: int) -> list[Gemm]:
    """Dense FFN, or router + routed experts (``tokens k / E`` rows each) + shared experts."""
    if not moe.is_moe_layer(cfg, layer_index):
        return _ffn_gemms(cfg, tokens, cfg.ffn_size, t, 1)
    num_experts, k = int(cfg.num_experts or 0), int(cfg.experts_per_token or 0)
    width = expert_ffn_width(cfg)
    gemms: list[Gemm] = [(tokens, num_experts, cfg.hidden_size, 1)]
    gemms += _ffn_gemms(cfg, tokens * k / num_experts, width, t, num_experts)
    if cfg.num_shared_experts:
        gemms += _ffn_gemms(cfg, tokens, width, t, cfg.num_shared_experts)
    return gemms


def layer_gemms(cfg: TransformerConfig, tokens: int, t: int, layer_index: int = 0) -> list[Gemm]:
    """Every linear layer of decoder layer ``layer_index`` on one device."""
    return attention_gemms(cfg, tokens, t) + mlp_gemms(cfg, tokens, t, layer_index)


def gemm_forward_flops(gemms: list[Gemm]) -> float:
    """2 M N K per GEMM, summed."""
    return sum(2.0 * m * n * k * count for m, n, k, count in gemms)


def mlp_activation_elements(cfg: TransformerConfig, tokens: int, t: int, layer_index: int) -> float:
    """Elements of the FFN hidden activation per device (what the activation function reads)."""
    if not moe.is_moe_layer(cfg, layer_index):
        return tokens * cfg.ffn_size / t
    rows = tokens * (int(cfg.experts_per_token or 0) + cfg.num_shared_experts)
    return rows * expert_ffn_width(cfg) / t


def routing_bytes(cfg: TransformerConfig, tokens: int, bytes_per_element: int, layer_index: int) -> tuple[float, float]:
    """(forward, backward) bytes of the router softmax/top-k (fp32 over E logits) and of permute
    (read tokens x h, write the tokens x k routed copies) and unpermute (read them, write tokens x h);
    0 for a dense layer. Each rank routes all tokens (no expert parallelism)."""
    if not moe.is_moe_layer(cfg, layer_index):
        return 0.0, 0.0
    k, h = int(cfg.experts_per_token or 0), cfg.hidden_size
    router = 2 * 4 * tokens * int(cfg.num_experts or 0)
    permute = 2 * bytes_per_element * tokens * h * (1 + k)  # permute + unpermute, each read + write
    return router + permute, router + permute


def rope_widths(cfg: TransformerConfig) -> tuple[int, int]:
    """(query, key) widths per token that rotary embedding rewrites, before the t split: all of Q
    and K, or with MLA the n_h d_rope query part and the single shared d_rope key."""
    if cfg.is_mla:
        rope = int(cfg.qk_rope_head_dim or 0)
        return cfg.num_heads * rope, rope
    return cfg.num_heads * cfg.head_size, cfg.kv_heads * cfg.head_size
