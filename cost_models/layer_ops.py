"""Per-operation times of one transformer layer on one device (per microbatch).

Each decoder layer is costed operation by operation with ``cost_models.compute``: the four linear
layers (QKV, attention projection, MLP up/gate, MLP down) as GEMMs split by tensor parallelism
(Megatron's column/row split: QKV and MLP-up divide N by t, the projection and MLP-down divide
K by t), the attention core (unfused: two batched GEMMs per direction plus softmax and dropout
over b (a/t) s^2 scores; flash: one fused kernel whose FLOPs, halved by the causal mask, run at
its kernel family's share of peak, ``compute.flash_attention_s``, with no score traffic), and the
memory-bound kernels by the bytes they move. Tensor-parallel
collectives (two all-reduces per layer per direction, or an all-gather and a reduce-scatter
each with sequence parallelism: the same volume) come from ``cost_models.collectives``.
Byte counts per kernel are listed in docs/cost-model.md. Mixture-of-experts, multi-latent attention
and explicit head widths take their GEMM shapes and extra traffic from ``cost_models.moe_ops``.
"""

from __future__ import annotations

from dataclasses import dataclass

from cost_models import fp8, moe, moe_ops, windows
from cost_models.collectives import ring_allreduce_s
from cost_models.compute import compute_constants, flash_attention_s, gemm_fwd_bwd_s, gemm_time_s, memory_op_s
from cost_models.moe_ops import Gemm
from planner.schema import Device, TransformerConfig

_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}
FLASH_BACKWARD_FACTOR = 2.5
"""Flash backward / forward time: 5 GEMMs of the score size against 2 (FlashAttention-2, Sec. 3)."""
CROSS_ENTROPY_FWD_BYTES = 16
CROSS_ENTROPY_BWD_BYTES = 10
"""Bytes per logit of the vocab-parallel cross-entropy: fp32 upcast, max, exp-sum and target
passes forward (4 x 4 B); read the fp32 softmax and write the 16-bit gradient backward."""


FP32_BYTES = 4
EAGER_BACKWARD_FACTOR = 2.0
"""Backward bytes of an eager elementwise chain over its forward: autograd runs one kernel per
forward op that reads the incoming gradient and the op's saved input(s) and writes a gradient
(at least twice the forward op's traffic; the fused backward kernels read each tensor once)."""


def eager_norm_bytes(e: int) -> float:
    """Forward bytes per element of an eager RMSNorm (torchtitan's: upcast to fp32, square, mean,
    scale by the reciprocal root, cast back, multiply by the weight): (e + 4) + 8 + 4 + 8 + (4 + e)
    + 2e = 4e + 28, against 2e fused. PyTorch's ``nn.LayerNorm`` is one native kernel: no extra."""
    return 4 * e + 7 * FP32_BYTES


def eager_rope_bytes(e: int) -> float:
    """Bytes per element of q and k of eager rotary (complex form: upcast, complex multiply, cast
    back) = (e + 4) + 8 + (4 + e), both directions, against 2e fused."""
    return 2 * e + 4 * FP32_BYTES


@dataclass(frozen=True, slots=True)
class OpTimes:
    """Times of one layer per microbatch on one device; ``*_comm_s`` are the tensor-parallel
    collectives included in ``forward_s`` and ``backward_input_s``."""

    forward_s: float
    backward_input_s: float
    backward_weight_s: float
    selective_s: float = 0.0
    """Forward time of the attention core (what selective recompute repeats)."""
    forward_comm_s: float = 0.0
    backward_comm_s: float = 0.0
    forward_gemm_s: float = 0.0
    forward_memory_s: float = 0.0
    tail_s: float = 0.0
    """Forward time after the layer's last saved tensor: a dense FFN's output projection and the
    tensor-parallel collective after it (an MoE layer's combine saves its inputs: 0). PyTorch's
    non-reentrant checkpoint stops its recompute before them (``ComputeModel.full_recompute``)."""

    @property
    def backward_s(self) -> float:
        return self.backward_input_s + self.backward_weight_s


def tp_collectives_per_layer(cfg: TransformerConfig) -> int:
    """Tensor-parallel collectives of a decoder layer in each direction: one after (before, in the
    backward) the attention block and one after the MLP block, [ptdp] Sec. 2.3 / Fig. 5; a parallel
    block (GPT-J, GPT-NeoX) sums the two branches' partial outputs (input gradients) first and
    reduces them once, one all-reduce per layer in each direction ([gpt-neox] Sec. 2.1)."""
    return 1 if cfg.parallel_block else 2


def _tp_allreduce_s(device: Device, num_bytes: float, t: int, link_bytes_per_s: float | None,
                    latency_s: float) -> float:
    if t <= 1 or not link_bytes_per_s:
        return 0.0
    rate = link_bytes_per_s * compute_constants(device).collective_bandwidth_fraction
    return ring_allreduce_s(num_bytes, t, rate, latency_s)


def _linear_gemms(cfg: TransformerConfig, tokens: int, t: int, layer_index: int = 0) -> list[Gemm]:
    """(M, N, K, count) of every linear layer; MoE/MLA/explicit head widths: ``moe_ops``."""
    if moe.uses_extended_counts(cfg):
        return moe_ops.layer_gemms(cfg, tokens, t, layer_index)
    h, f = cfg.hidden_size, cfg.ffn_size
    kv = cfg.kv_heads * (h // cfg.num_heads)
    up = (2 if cfg.gated_mlp else 1) * f // t
    return [(tokens, (h + 2 * kv) // t, h, 1), (tokens, h, h // t, 1), (tokens, up, h, 1), (tokens, h, f // t, 1)]


def _attention_core(cfg: TransformerConfig, device: Device, b: int, t: int, attention: str) -> tuple[float, float]:
    """(forward, backward) of softmax(QK^T) V for one microbatch. With sliding-window layers the flash
    kernel's time is the model's average over its windowed and global layers (every decoder layer is
    costed alike, so each pipeline stage's sum is its share of the layers at that average); unfused
    attention materialises the whole masked score matrix either way."""
    s, a, e = cfg.seq_length, cfg.num_heads // t, _BYTES[cfg.dtype]
    dh = dv = cfg.hidden_size // cfg.num_heads
    if moe.uses_extended_counts(cfg):  # explicit head width; MLA: d_nope + d_rope for Q.K, d_v for values
        dh, dv = moe.qk_head_dim(cfg), moe.v_head_dim(cfg)
    batch = b * a
    if attention == "flash":
        fwd = flash_attention_s(s, s, dh, dv, batch, device)
        if cfg.windowed_layers:  # sliding-window layers: the model's average layer (docs, "Sliding-window")
            fwd = windows.layer_average(cfg, fwd, flash_attention_s(s, s, dh, dv, batch, device,
                                                                    window=cfg.sliding_window))
        fwd += compute_constants(device).kernel_launch_s
        return fwd, FLASH_BACKWARD_FACTOR * fwd
    scores = batch * s * s
    fwd = gemm_time_s(s, s, dh, device, batch=batch) + gemm_time_s(s, dv, s, device, batch=batch)
    fwd += memory_op_s((4 * e + 1) * scores, device, num_kernels=2)  # softmax, dropout (+ 1-byte mask)
    # dP = dO V^T (reduction d_v); dQ, dK (width d_qk) and dV (width d_v) reduce over s
    dq_dk_dv = (3 * gemm_time_s(s, dh, s, device, batch=batch) if dh == dv else
                2 * gemm_time_s(s, dh, s, device, batch=batch) + gemm_time_s(s, dv, s, device, batch=batch))
    bwd = gemm_time_s(s, s, dv, device, batch=batch) + dq_dk_dv
    bwd += memory_op_s((5 * e + 1) * scores, device, num_kernels=2)
    return fwd, bwd


def _elementwise_bytes(cfg: TransformerConfig, tokens: int, t: int, sequence_parallel: bool,
                       layer_index: int = 0) -> tuple[float, float]:
    """(forward, backward) bytes of the norms, residual/dropout adds, activation, rotary and, in MoE
    layers, the router softmax and the permute/unpermute of the routed copies."""
    e, h, f = _BYTES[cfg.dtype], cfg.hidden_size, cfg.ffn_size
    n_h = tokens * h / (t if sequence_parallel else 1)
    n_f = tokens * f / t
    kv = cfg.kv_heads * (h // cfg.num_heads)
    if moe.uses_extended_counts(cfg):
        return _extended_elementwise_bytes(cfg, tokens, t, n_h, layer_index)
    fwd = 2 * (2 * e * n_h) + 2 * ((3 * e + 1) * n_h)
    bwd = 2 * (3 * e * n_h) + 2 * ((2 * e + 1) * n_h)
    fwd += (3 if cfg.gated_mlp else 2) * e * n_f
    bwd += (5 if cfg.gated_mlp else 3) * e * n_f
    if cfg.position_embedding == "rope":
        rope = 2 * e * tokens * (h + kv) / t
        fwd, bwd = fwd + rope, bwd + rope
    return fwd, bwd


def eager_extra_bytes(cfg: TransformerConfig, tokens: int, t: int, sequence_parallel: bool) -> tuple[float, float]:
    """(forward, backward) bytes that eager PyTorch moves beyond the fused kernels in one decoder
    layer (``ComputeModel.elementwise_kernels == "eager"``): the two RMSNorms' fp32 chains, rotary's
    complex multiply, SwiGLU's separate SiLU and product, grouped K/V expanded to all heads before
    SDPA (``repeat_kv``; its backward sums them back), and the attention output made contiguous."""
    e, h, f = _BYTES[cfg.dtype], cfg.hidden_size, cfg.ffn_size
    head = h // cfg.num_heads
    q_width, kv_width = cfg.num_heads * head / t, cfg.kv_heads * head / t
    n_h = tokens * h / (t if sequence_parallel else 1)
    fwd = bwd = 0.0
    if cfg.norm == "rmsnorm":
        norm = 2 * (eager_norm_bytes(e) - 2 * e) * n_h
        fwd, bwd = fwd + norm, bwd + EAGER_BACKWARD_FACTOR * norm
    if cfg.position_embedding == "rope":
        rope = (eager_rope_bytes(e) - 2 * e) * tokens * (q_width + kv_width)
        fwd, bwd = fwd + rope, bwd + rope
    if cfg.kv_heads < cfg.num_heads:
        expand = 2 * e * tokens * (q_width + kv_width)  # K and V: read kv_width, write q_width
        fwd, bwd = fwd + expand, bwd + expand
    contiguous = 2 * e * tokens * q_width
    fwd, bwd = fwd + contiguous, bwd + contiguous
    if cfg.gated_mlp:
        n_f = tokens * f / t
        fwd, bwd = fwd + 2 * e * n_f, bwd + 4 * e * n_f  # silu + mul: 5e (9e back) against fused 3e (5e)
    return fwd, bwd


def eager_extra_activation_bytes(cfg: TransformerConfig, tokens: int, t: int, sequence_parallel: bool) -> float:
    """Bytes one eager decoder layer keeps for its backward beyond the fused count of
    ``transformer.decoder_activation_bytes`` (no checkpointing, or recompute that keeps the block's
    tensors): each RMSNorm keeps its fp32 input copy (4 B) instead of its 16-bit input (e); SwiGLU's
    product keeps the SiLU output (e n_f); SDPA keeps K and V expanded to all heads (2e (h - k))."""
    e, h, f = _BYTES[cfg.dtype], cfg.hidden_size, cfg.ffn_size
    head = h // cfg.num_heads
    extra = 0.0
    if cfg.norm == "rmsnorm":
        extra += 2 * (FP32_BYTES - e) * tokens * h / (t if sequence_parallel else 1)
    if cfg.gated_mlp:
        extra += e * tokens * f / t
    if cfg.kv_heads < cfg.num_heads:
        extra += 2 * e * tokens * (cfg.num_heads - cfg.kv_heads) * head / t
    return extra


EAGER_EXTRA_KERNELS = (23, 46)
"""Extra launches per layer (forward, backward) of the eager chains above: two RMSNorms of 8 kernels
(upcast, square, mean, add eps, reciprocal root, scale, cast back, weight) instead of 1 each (14),
rotary as 3 kernels for q and 3 for k instead of 1 (5), the K/V expansion (2), the contiguous copy
(1) and SwiGLU's second kernel (1); the backward runs about two per forward kernel."""


def decoder_op_times(cfg: TransformerConfig, device: Device, *, microbatch_size: int, tensor_parallel: int = 1,
                     tp_link_bytes_per_s: float | None = None, tp_latency_s: float = 0.0,
                     sequence_parallel: bool = True, attention: str = "flash", layer_index: int = 0,
                     overlap_tp_backward: bool = False) -> OpTimes:
    """Forward, input-gradient and weight-gradient times of decoder layer ``layer_index`` (0-based;
    it matters only for MoE configs, whose first ``first_dense_layers`` layers are dense).

    ``overlap_tp_backward``: each of the two backward collectives (the input-gradient all-reduce,
    or with sequence parallelism the reduce-scatter, of the attention and MLP blocks) runs while
    its block's weight-gradient GEMMs compute, as Megatron-LM does since 2022 (Korthikanti et al.,
    MLSys 2023, Sec. 6.2; ``--async-tensor-model-parallel-allreduce``); only
    max(0, collective - half the layer's weight-gradient time) per block is exposed."""
    b, t = microbatch_size, tensor_parallel
    tokens = b * cfg.seq_length
    fwd_gemm = bwd_in = bwd_w = f_s = 0.0
    gemms, dtype = _linear_gemms(cfg, tokens, t, layer_index), fp8.gemm_dtype(device)
    for m, n, k, count in gemms:
        f_s, i_s, w_s = gemm_fwd_bwd_s(m, n, k, device, dtype=dtype)  # type: ignore[arg-type]  # MoE rows: fractional
        fwd_gemm, bwd_in, bwd_w = fwd_gemm + count * f_s, bwd_in + count * i_s, bwd_w + count * w_s
    dense = not moe.is_moe_layer(cfg, layer_index)  # f_s: the last GEMM, a dense FFN's output projection
    core_fwd, core_bwd = _attention_core(cfg, device, b, t, attention)
    ew_fwd, ew_bwd = _elementwise_bytes(cfg, tokens, t, sequence_parallel, layer_index)
    kernels = (6, 8)
    if compute_constants(device).elementwise_kernels == "eager":
        extra_fwd, extra_bwd = eager_extra_bytes(cfg, tokens, t, sequence_parallel)
        ew_fwd, ew_bwd = ew_fwd + extra_fwd, ew_bwd + extra_bwd
        kernels = (6 + EAGER_EXTRA_KERNELS[0], 8 + EAGER_EXTRA_KERNELS[1])
    q_fwd, q_bwd, q_kf, q_kb = fp8.quantize_bytes(gemms, device)  # type: ignore[arg-type]  # FP8 casts (0 in BF16)
    ew_fwd, ew_bwd, kernels = ew_fwd + q_fwd, ew_bwd + q_bwd, (kernels[0] + q_kf, kernels[1] + q_kb)
    mem_fwd = memory_op_s(ew_fwd, device, num_kernels=kernels[0])
    comm = tp_collectives_per_layer(cfg) * _tp_allreduce_s(device, _BYTES[cfg.dtype] * tokens * cfg.hidden_size * fp8.tp_comm_scale(
        device, sequence_parallel), t, tp_link_bytes_per_s, tp_latency_s)
    forward = fwd_gemm + core_fwd + mem_fwd + comm
    back_comm = max(0.0, comm - bwd_w) if overlap_tp_backward else comm  # per block: its share of each
    backward_input = bwd_in + core_bwd + memory_op_s(ew_bwd, device, num_kernels=kernels[1]) + back_comm
    return OpTimes(forward_s=forward, backward_input_s=backward_input, backward_weight_s=bwd_w, selective_s=core_fwd,
                   forward_comm_s=comm, backward_comm_s=back_comm, forward_gemm_s=fwd_gemm + core_fwd,
                   forward_memory_s=mem_fwd,
                   tail_s=f_s + comm / tp_collectives_per_layer(cfg) if dense else 0.0)


def _extended_elementwise_bytes(cfg: TransformerConfig, tokens: int, t: int, n_h: float,
                                layer_index: int) -> tuple[float, float]:
    """``_elementwise_bytes`` with the layer's FFN activation width, MLA's rotary widths and routing."""
    e = _BYTES[cfg.dtype]
    n_f = moe_ops.mlp_activation_elements(cfg, tokens, t, layer_index)
    fwd = 2 * (2 * e * n_h) + 2 * ((3 * e + 1) * n_h) + (3 if cfg.gated_mlp else 2) * e * n_f
    bwd = 2 * (3 * e * n_h) + 2 * ((2 * e + 1) * n_h) + (5 if cfg.gated_mlp else 3) * e * n_f
    if cfg.position_embedding == "rope":
        q_width, k_width = moe_ops.rope_widths(cfg)
        rope = 2 * e * tokens * (q_width / t + (k_width if cfg.is_mla else k_width / t))  # MLA's key is shared
        fwd, bwd = fwd + rope, bwd + rope
    route_fwd, route_bwd = moe_ops.routing_bytes(cfg, tokens, e, layer_index)
    return fwd + route_fwd, bwd + route_bwd


def head_op_times(cfg: TransformerConfig, device: Device, *, microbatch_size: int, tensor_parallel: int = 1,
                  tp_link_bytes_per_s: float | None = None, sequence_parallel: bool = True) -> OpTimes:
    """Final norm, vocab-parallel logits GEMM and cross-entropy (backward all-reduces dX over t)."""
    b, t, e = microbatch_size, tensor_parallel, _BYTES[cfg.dtype]
    tokens, h = b * cfg.seq_length, cfg.hidden_size
    f_s, i_s, w_s = gemm_fwd_bwd_s(tokens, cfg.vocab_size // t, h, device)
    logits = tokens * cfg.vocab_size / t
    norm = tokens * h / (t if sequence_parallel else 1)
    fwd = f_s + memory_op_s(CROSS_ENTROPY_FWD_BYTES * logits + 2 * e * norm, device, num_kernels=4)
    comm = _tp_allreduce_s(device, e * tokens * h, t, tp_link_bytes_per_s, 0.0)
    bwd_in = i_s + memory_op_s(CROSS_ENTROPY_BWD_BYTES * logits + 3 * e * norm, device, num_kernels=3) + comm
    return OpTimes(forward_s=fwd, backward_input_s=bwd_in, backward_weight_s=w_s, backward_comm_s=comm,
                   forward_gemm_s=f_s)


def embedding_op_times(cfg: TransformerConfig, device: Device, *, microbatch_size: int, tensor_parallel: int = 1,
                       tp_link_bytes_per_s: float | None = None) -> OpTimes:
    """Vocab-parallel lookup (+ position add), forward all-reduce over t; backward scatter-add."""
    b, t, e = microbatch_size, tensor_parallel, _BYTES[cfg.dtype]
    tokens, h = b * cfg.seq_length, cfg.hidden_size
    comm = _tp_allreduce_s(device, e * tokens * h, t, tp_link_bytes_per_s, 0.0)
    fwd = memory_op_s(3 * e * tokens * h, device, num_kernels=2) + comm
    weight = memory_op_s(3 * e * tokens * h, device, num_kernels=1)
    return OpTimes(forward_s=fwd, backward_input_s=memory_op_s(e * tokens * h, device), backward_weight_s=weight,
                   forward_comm_s=comm)
