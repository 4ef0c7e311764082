"""Analytic costs of a decoder-only transformer: parameters, FLOPs, memory, communication.

Sources (seed line numbers refer to ``shared/seeds/``):

- PTD-P, Narayanan's dissertation Ch. 4 (seed 001): matmul FLOPs 2mkn (L4119-4121), per-layer
  forward 24Bsh^2 + 4Bs^2h (L4123-4133), backward = 2x forward, recompute = +1 forward
  (L4135-4156), logits 2BshV forward / 4BshV backward (L4158-4164), Eq. 4.2 FLOPs per iteration
  (L4166-4190), Eq. 4.3 parameters (L4192-4207), Eq. 4.4 training time (L4295-4308), tensor- and
  pipeline-parallel communication volumes (L3778-3823, L4008-4039).
- Zero Bubble (Qi et al., arXiv:2401.10241) Table 1: the backward split into B (input gradient,
  sbh(24h + 8s)) and W (weight gradient, 24sbh^2).
- Korthikanti et al. (arXiv:2205.05198) activation bytes per layer, restated in BPipe (seed 004
  L396-413): none = sbh(34 + 5as/h)/t, selective = 34sbh/t, full = 2sbh (/t with sequence
  parallelism), for unfused attention. With FlashAttention (Dao et al., NeurIPS'22, Sec. 3.1)
  the 5as^2b/t of the scores becomes 4asb/t (fp32 log-sum-exp), all that selective recompute saves.
- ZeRO (Rajbhandari et al., SC'20): mixed-precision Adam keeps 16 bytes per parameter.

Symbols: b microbatch, B global batch, s sequence, h hidden, a heads, l layers, V vocabulary,
f FFN size, t tensor-parallel degree, e bytes per element of ``cfg.dtype``. GPT-style configs
(the defaults of ``TransformerConfig``) reproduce the PTD-P formulas exactly; LLaMA-style configs
(swiglu, rmsnorm, no bias, GQA, untied) use the same counting rules on their own matrices.
"""

from __future__ import annotations

import logging

from cost_models import compute, moe, moe_memory
from cost_models import recompute as recompute_mod
from cost_models.activation_offload import with_offload
from cost_models.layer_ops import tp_collectives_per_layer
from cost_models.windows import attention_span_factor
from planner.errors import InvalidProblemError
from planner.schema import RECOMPUTE_MODULES, Device, ModelProfile, TransformerConfig, recompute_modules_of

logger = logging.getLogger(__name__)

DEFAULT_EFFICIENCY = 0.5
"""Achieved fraction of the device's peak FLOP/s (and memory bandwidth). PTD-P reports 44-52% of
peak end to end on A100 (seed 001 L4291-4293); 0.5 is the round middle of that range."""
ADAM_BYTES_PER_PARAM = 16
"""fp16/bf16 weight 2 + gradient 2 + fp32 master weight 4 + Adam m 4 + v 4 (ZeRO, Sec. 3.1)."""
BPIPE_SELECTIVE_RECOMPUTE_FRACTION = 0.26
"""Selective (attention) recompute time as a fraction of the forward, measured by BPipe Table 4
(seed 004 L282-287: (83.57 - 74.12) / 36.32 ms, GPT-3 13B). Optional calibration; the default
uses the FLOPs of the attention core instead."""
SECONDS_PER_DAY = 86400.0
_BYTES_PER_ELEMENT = {"fp16": 2, "bf16": 2, "fp32": 4}
_TOKEN_ID_BYTES = 8  # int64 token ids kept by the embedding for its backward


# ------------------------------------------------------------------------------------------
# Parameters (Eq. 4.3, L4192-4207)
# ------------------------------------------------------------------------------------------


def ptdp_num_parameters(num_layers: int, hidden: int, vocab: int, seq: int) -> float:
    """Eq. 4.3 literally: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)) (seed 001 L4192-4207)."""
    l, h = num_layers, hidden
    return 12 * l * h**2 * (1 + 13 / (12 * h) + (vocab + seq) / (12 * l * h))


def _kv_dim(cfg: TransformerConfig) -> int:
    return cfg.kv_heads * cfg.head_size


def decoder_matmul_params(cfg: TransformerConfig) -> int:
    """Weights of the matmuls of one decoder layer: Q, K, V, output projection and MLP. MoE/MLA
    configs: the weights one token uses, averaged over the layers (``cost_models.moe``)."""
    if moe.uses_extended_counts(cfg):
        return moe.mean_decoder_matmul_params(cfg)  # type: ignore[return-value]
    h, f = cfg.hidden_size, cfg.ffn_size
    attention = 2 * h * h + 2 * h * _kv_dim(cfg)
    mlp = (3 if cfg.gated_mlp else 2) * h * f
    return attention + mlp


def _norm_params(cfg: TransformerConfig) -> int:
    """LayerNorm has a scale and a bias per channel, RMSNorm only a scale."""
    return (2 if cfg.norm == "layernorm" else 1) * cfg.hidden_size


def decoder_layer_params(cfg: TransformerConfig) -> int:
    """All parameters of one decoder layer: matmul weights, biases, two norms (GPT: 12h^2 + 13h).
    MoE/MLA configs: every expert, averaged over the layers (``cost_models.moe``)."""
    if moe.uses_extended_counts(cfg):
        return moe.mean_decoder_layer_params(cfg)  # type: ignore[return-value]
    h, f = cfg.hidden_size, cfg.ffn_size
    biases = 0
    if cfg.bias:
        biases = (h + 2 * _kv_dim(cfg)) + h + (2 if cfg.gated_mlp else 1) * f + h
    return decoder_matmul_params(cfg) + biases + 2 * _norm_params(cfg)


def embedding_params(cfg: TransformerConfig) -> int:
    """Word embeddings V h, plus learned position embeddings s h."""
    positions = cfg.seq_length * cfg.hidden_size if cfg.position_embedding == "learned" else 0
    return cfg.vocab_size * cfg.hidden_size + positions


def head_params(cfg: TransformerConfig) -> int:
    """The final norm, plus the output projection V h when it is not tied to the embedding."""
    return _norm_params(cfg) + (0 if cfg.tied_embeddings else cfg.vocab_size * cfg.hidden_size)


def num_parameters(cfg: TransformerConfig) -> int:
    """Exact parameter count. For GPT-style configs this is Eq. 4.3 plus the final layernorm's 2h,
    which Eq. 4.3 omits. MoE/MLA configs: ``cost_models.moe.num_parameters`` (every expert)."""
    if moe.uses_extended_counts(cfg):
        return moe.num_parameters(cfg)
    return (cfg.num_layers * decoder_layer_params(cfg) + embedding_params(cfg) + head_params(cfg)
            + cfg.mtp_layers * moe.mtp_module_params(cfg))


# ------------------------------------------------------------------------------------------
# FLOPs (L4119-4190; Zero Bubble Table 1)
# ------------------------------------------------------------------------------------------


def attention_core_forward_flops(cfg: TransformerConfig, *, microbatch_size: int, tensor_parallel: int = 1) -> float:
    """Scores QK^T plus attention over values: 2bs^2h + 2bs^2h = 4bs^2h, split over t (L4127-4129),
    times the share sliding windows leave (``windows.attention_span_factor``, 1 without one).
    Explicit head widths and MLA: ``cost_models.moe.attention_core_forward_flops``."""
    if moe.uses_extended_counts(cfg):
        return moe.attention_core_forward_flops(cfg, microbatch_size=microbatch_size, tensor_parallel=tensor_parallel)
    b, s, h = microbatch_size, cfg.seq_length, cfg.hidden_size
    return 4 * b * s**2 * h / tensor_parallel * attention_span_factor(cfg)


def decoder_forward_flops(cfg: TransformerConfig, *, microbatch_size: int, tensor_parallel: int = 1) -> float:
    """F = 2bs x (matmul weights) + 4bs^2h; GPT: 24bsh^2 + 4bs^2h (L4133; ZB Table 1 sbh(24h+4s))."""
    matmul = 2 * microbatch_size * cfg.seq_length * decoder_matmul_params(cfg) / tensor_parallel
    return matmul + attention_core_forward_flops(cfg, microbatch_size=microbatch_size, tensor_parallel=tensor_parallel)


def decoder_backward_input_flops(cfg: TransformerConfig, *, microbatch_size: int, tensor_parallel: int = 1) -> float:
    """B = 2bs x (matmul weights) + 8bs^2h; GPT: sbh(24h + 8s) (ZB Table 1)."""
    matmul = 2 * microbatch_size * cfg.seq_length * decoder_matmul_params(cfg) / tensor_parallel
    return matmul + 2 * attention_core_forward_flops(
        cfg, microbatch_size=microbatch_size, tensor_parallel=tensor_parallel
    )


def decoder_backward_weight_flops(cfg: TransformerConfig, *, microbatch_size: int, tensor_parallel: int = 1) -> float:
    """W = 2bs x (matmul weights); GPT: 24bsh^2 (ZB Table 1). B + W = 2F (L4135-4137)."""
    return 2 * microbatch_size * cfg.seq_length * decoder_matmul_params(cfg) / tensor_parallel


def logits_forward_flops(cfg: TransformerConfig, *, microbatch_size: int, tensor_parallel: int = 1) -> float:
    """Logit layer forward 2bshV, split over t (L4158-4162); its backward is twice this."""
    return 2 * microbatch_size * cfg.seq_length * cfg.hidden_size * cfg.vocab_size / tensor_parallel


def ptdp_flops_per_iteration(batch: int, seq: int, num_layers: int, hidden: int, vocab: int) -> float:
    """Eq. 4.2 literally: F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) (seed 001 L4166-4190)."""
    B, s, l, h, V = batch, seq, num_layers, hidden, vocab
    return 96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))


def flops_per_iteration(cfg: TransformerConfig, *, global_batch_size: int, recompute: bool = True) -> float:
    """FLOPs of one iteration: each layer F + B + W (= 3F) plus one more F with full recompute,
    plus the logits' 6BshV (not recomputed) and 3F of each multi-token-prediction module
    (``mtp.fold_mtp``; its block's recompute forward is not added). Equals Eq. 4.2 for GPT-style configs; other configs
    use their own matmul sizes (swiglu's 3 matrices, GQA's smaller K and V)."""
    b = global_batch_size
    layer = 3 * decoder_forward_flops(cfg, microbatch_size=b)
    if recompute:
        layer += decoder_forward_flops(cfg, microbatch_size=b)
    mtp = 3 * cfg.mtp_layers * moe.mtp_forward_flops_per_token(cfg) * b * cfg.seq_length  # kept, not recomputed
    return cfg.num_layers * layer + 3 * logits_forward_flops(cfg, microbatch_size=b) + mtp


def model_flops_per_sample(cfg: TransformerConfig) -> float:
    """Model FLOPs of one sample (forward + backward, no recompute): Eq. 4.2's terms per sample
    with 3F per layer, i.e. 6 x (matmul parameters) x tokens plus attention and logits. This is
    the numerator of MFU (recomputation is not useful work)."""
    return flops_per_iteration(cfg, global_batch_size=1, recompute=False)


def training_days(
    cfg: TransformerConfig, *, tokens: float, num_devices: int, flops_per_device_s: float, global_batch_size: int
) -> float:
    """Days to train on ``tokens``: I = T/(B s) iterations of Eq. 4.2 FLOPs at X FLOP/s on each of
    n devices (seed 001 L4295-4300). Reproduces Table 4.2's days column within 1 day."""
    iterations = tokens / (global_batch_size * cfg.seq_length)
    total = iterations * flops_per_iteration(cfg, global_batch_size=global_batch_size, recompute=True)
    return total / (num_devices * flops_per_device_s) / SECONDS_PER_DAY


def training_days_eq44(num_parameters: float, tokens: float, num_devices: int, flops_per_device_s: float) -> float:
    """Eq. 4.4: end-to-end training time ~ 8 T P / (n X), in days (seed 001 L4301-4308)."""
    return 8 * tokens * num_parameters / (num_devices * flops_per_device_s) / SECONDS_PER_DAY


# ------------------------------------------------------------------------------------------
# Memory (Korthikanti et al.; ZeRO)
# ------------------------------------------------------------------------------------------


def _element_bytes(cfg: TransformerConfig) -> int:
    return _BYTES_PER_ELEMENT[cfg.dtype]


ATTENTION_KINDS = ("flash", "unfused")
_LSE_BYTES = 4  # FlashAttention's softmax statistics are fp32


def check_attention(attention: str) -> None:
    """Raises InvalidProblemError unless ``attention`` is one of ``ATTENTION_KINDS``."""
    if attention not in ATTENTION_KINDS:
        raise InvalidProblemError(f"attention={attention!r} must be 'flash' or 'unfused'")


def attention_core_activation_bytes(cfg: TransformerConfig, *, microbatch_size: int, tensor_parallel: int = 1,
                                    attention: str = "flash") -> float:
    """What the attention core itself saves for its backward, per layer and device.

    ``unfused``: softmax output (2as^2b), its dropout mask (as^2b) and dropout output (2as^2b):
    5as^2b/t at 16 bits (Korthikanti et al. Eq. 1-2); selective recompute drops exactly these
    (Sec. 5). ``flash``: the fused kernel never materialises the s x s scores (Dao et al.,
    FlashAttention, NeurIPS 2022, Sec. 3.1) and keeps only the softmax log-sum-exp, one fp32 value
    per head and query token since FlashAttention-2 (Dao, ICLR 2024, Sec. 3.1): 4asb/t. Its
    output O is the projection input, counted already; the dropout RNG seed and offset are a few
    bytes."""
    check_attention(attention)
    a, s, b, e = cfg.num_heads, cfg.seq_length, microbatch_size, _element_bytes(cfg)
    if attention == "flash":
        return _LSE_BYTES * a * s * b / tensor_parallel
    return (2 * e + 1) * a * s**2 * b / tensor_parallel


def decoder_activation_bytes(
    cfg: TransformerConfig, *, microbatch_size: int, tensor_parallel: int = 1, recompute: str = "none",
    sequence_parallel: bool = True, layer_index: int = 0, attention: str = "flash",
) -> float:
    """Bytes one decoder layer keeps for its backward, per microbatch and device.

    ``none``: every saved tensor; for GPT shapes sbh(34 + 5as/h)/t (Korthikanti Eq. 2 with sequence
    parallelism; BPipe Eq. 4, seed 004 L396-400). Attention saves the norm output, Q, K, V, the
    projection input and a dropout mask: e(3sbh + 2sb k) + sbh with k the K/V width; the MLP saves
    its input, the activation's input(s) and output and a dropout mask: e(sbh + 2sbf) + sbh (gelu)
    or e(sbh + 3sbf) + sbh (swiglu); two norms save their inputs: 2e sbh. ``selective``: the same
    without the attention core, 34sbh/t (BPipe Eq. 5). ``full``: only the layer input, e sbh/t
    (BPipe Eq. 6 without the /t, which sequence parallelism adds). Assumes sequence parallelism
    whenever t > 1, activations in ``cfg.dtype``, 1-byte dropout masks always counted. In an MoE
    layer (``layer_index`` at or past ``first_dense_layers`` of an MoE config) the MLP term is
    ``cost_models.moe_memory.moe_mlp_activation_bytes`` (router scores, routed token copies, the
    experts' activations over T k rows, combine inputs, shared experts).

    ``attention`` is the attention core's kernel (``attention_core_activation_bytes``): with
    ``unfused`` (Megatron-LM as in 2021-2022, the papers' tables) ``none`` adds the 5as^2b/t of
    the scores; with ``flash`` (the default, as in the time model) it adds only the 4asb/t
    log-sum-exp statistics, so ``selective`` (which re-runs the core and keeps none of its outputs)
    saves only those (docs/cost-model.md, "Activation memory").

    Raises:
        InvalidProblemError: unknown strategy or attention kind.
    """
    b, s, f, e, t = microbatch_size, cfg.seq_length, cfg.ffn_size, _element_bytes(cfg), tensor_parallel
    sbh = s * b * cfg.hidden_size
    t_sp = t if sequence_parallel else 1  # norm inputs, dropout masks, residuals: split only with SP
    check_attention(attention)
    if recompute == "full":
        return e * sbh / t_sp
    modules = recompute_modules_of(recompute)
    if modules is None:
        raise InvalidProblemError(
            f"unknown recompute strategy {recompute!r}; choose from ['none', 'selective', 'full'] or "
            f"Megatron-Core modules joined by '+' from {list(RECOMPUTE_MODULES)}"
        )
    attn_block = moe_memory.attention_block_activation_bytes(cfg, microbatch_size=b, tensor_parallel=t,
                                                             sequence_parallel=sequence_parallel)
    mlp = e * (3 if cfg.gated_mlp else 2) * s * b * f / t + (e * sbh + sbh) / t_sp
    if cfg.is_moe and moe.is_moe_layer(cfg, layer_index):
        mlp = moe_memory.moe_mlp_activation_bytes(cfg, microbatch_size=b, tensor_parallel=t,
                                                  sequence_parallel=sequence_parallel)
    kept = attn_block + mlp + 2 * e * sbh / t_sp
    kept += attention_core_activation_bytes(cfg, microbatch_size=b, tensor_parallel=t, attention=attention)
    mkw = {"microbatch_size": b, "tensor_parallel": t, "sequence_parallel": sequence_parallel,
           "layer_index": layer_index, "attention": attention}
    return kept - sum(recompute_mod.module_bytes(cfg, m, **mkw) for m in recompute_mod.effective_modules(modules))


def static_bytes(num_params: float, *, tensor_parallel: int = 1) -> float:
    """Resident bytes of mixed-precision Adam: 16 bytes per parameter, parameters split over t."""
    return ADAM_BYTES_PER_PARAM * num_params / tensor_parallel


# ------------------------------------------------------------------------------------------
# Communication (L3778-3823, L4008-4039)
# ------------------------------------------------------------------------------------------


def allreduce_time_s(num_bytes: float, num_ranks: int, bytes_per_s: float, latency_s: float = 0.0) -> float:
    """Ring all-reduce: each rank sends and receives 2(n-1)/n of the buffer in 2(n-1) steps."""
    if num_ranks <= 1:
        return 0.0
    return 2 * (num_ranks - 1) / num_ranks * num_bytes / bytes_per_s + 2 * (num_ranks - 1) * latency_s


def tensor_parallel_volume_elements(cfg: TransformerConfig, *, microbatch_size: int, tensor_parallel: int) -> float:
    """Per layer, device and microbatch: 8bsh(t-1)/t elements, i.e. 4 ring all-reduces of bsh
    (2 forward, 2 backward) (seed 001 L3778-3823; 2 + 2 all-reduces per layer, L3709-3713); half
    that for a parallel block."""
    t = tensor_parallel
    return 4 * tp_collectives_per_layer(cfg) * microbatch_size * cfg.seq_length * cfg.hidden_size * (t - 1) / t


def p2p_bytes(
    cfg: TransformerConfig, *, microbatch_size: int, tensor_parallel: int = 1, scatter_gather: bool = False
) -> float:
    """Activation sent between consecutive stages per microbatch: bsh elements, or bsh/t per rank
    with the scatter/gather optimization (seed 001 L4008-4039)."""
    elements = microbatch_size * cfg.seq_length * cfg.hidden_size
    return _element_bytes(cfg) * elements / (tensor_parallel if scatter_gather else 1)


# ------------------------------------------------------------------------------------------
# Layer profile
# ------------------------------------------------------------------------------------------


def _check_profile_args(cfg: TransformerConfig, b: int, t: int, efficiency: float) -> None:
    if b < 1:
        raise InvalidProblemError(f"microbatch_size={b} must be at least 1")
    if not 0 < efficiency <= 1:
        raise InvalidProblemError(f"efficiency={efficiency} must be in (0, 1]; PTD-P reaches 0.44-0.52")
    if t < 1 or cfg.num_heads % t or cfg.kv_heads % t or cfg.ffn_size % t or (cfg.moe_ffn_hidden_size or 0) % t:
        raise InvalidProblemError(
            f"tensor_parallel={t} must divide num_heads={cfg.num_heads}, the KV heads ({cfg.kv_heads}) "
            f"and ffn size ({cfg.ffn_size}, experts' {cfg.moe_ffn_hidden_size}) of {cfg.name!r}; "
            "use a common divisor such as 1"
        )


def transformer_profile(
    cfg: TransformerConfig,
    *,
    device: Device,
    microbatch_size: int,
    tensor_parallel: int = 1,
    efficiency: float | None = None,
    intra_node_bytes_per_s: float | None = None,
    scatter_gather: bool = False,
    selective_recompute_fraction: float | None = None,
    sequence_parallel: bool | None = None,
    attention: str = "flash",
    overlap_tp_backward: bool = False,
    recompute_modules: bool | list[tuple[str, ...]] = False,
    grad_accum_bytes_per_param: float = 0.0,
    activation_offload: bool = False,
) -> ModelProfile:
    """The layer profile of a transformer on one device: embedding, one layer per decoder block, head
    (with any multi-token-prediction modules folded in: ``mtp.fold_mtp``).

    By default every operation is costed by the per-operation model (``cost_models.layer_ops``:
    shape-dependent GEMM efficiency, attention core, memory-bound kernels by bytes over HBM
    bandwidth, tensor-parallel all-reduces over ``intra_node_bytes_per_s``); devices without
    compute constants (the nominal ``cpu`` preset, hand-written devices) get the flat model at
    ``DEFAULT_EFFICIENCY``. With an explicit
    ``efficiency`` the older flat model is used instead: each decoder layer's own FLOPs (a dense
    first layer's, or an MoE layer's attention + router + k routed + shared experts) / (peak x
    efficiency), the embedding's memory traffic at the same fraction of HBM bandwidth (for
    calibration against one measured number). It has no tile/wave or roofline effects, so its
    times are linear in ``b``, and it leaves out the norms, activations and the head's softmax
    traffic (docs/cost-model.md, "Flat efficiency").
    Decoder layers offer recompute ``none``, ``selective`` and ``full``; every layer sets
    ``backward_weight_s`` so the zero-bubble schedules apply.

    Args:
        cfg: the transformer.
        device: the device the times are for.
        microbatch_size: samples per microbatch (b).
        tensor_parallel: tensor-parallel degree t; costs are per device.
        efficiency: None (per-operation model) or a flat achieved fraction of peak.
        intra_node_bytes_per_s: link for the tensor-parallel all-reduces; None leaves them out.
        scatter_gather: stage outputs are bsh/t per rank (PTD-P scatter/gather) instead of bsh.
        selective_recompute_fraction: selective recompute time as a fraction of the forward
            (e.g. ``BPIPE_SELECTIVE_RECOMPUTE_FRACTION``); None times the attention core.
        sequence_parallel: norms/dropouts split over t (Korthikanti et al.); None = on when t > 1.
        attention: ``flash`` (fused, no score traffic, no saved scores) or ``unfused`` (softmax
            and dropout over the b a s^2 scores, saved for the backward, as Megatron-LM ran in
            2021-2022). It sets the activation bytes in both models (``decoder_activation_bytes``)
            and the attention core's kernels in the per-operation model; with ``flash``,
            ``selective`` recompute still re-runs the core but saves only its 4asb/t statistics.
        overlap_tp_backward: hide the backward tensor-parallel collectives behind the
            weight-gradient GEMMs (Megatron-LM since 2022; ``layer_ops.decoder_op_times``);
            per-operation model only.
        recompute_modules: also offer Megatron-Core's per-module selective recompute: True for
            every non-redundant set of the modules the model has (``cost_models.recompute``), or
            the sets to offer; each becomes a strategy named by its modules joined with ``+``.
            Per-operation model only (the flat model has no per-module times).
        grad_accum_bytes_per_param: HBM bytes per parameter of a gradient-accumulation pass run
            after every microbatch's backward outside the GEMMs (DeepSpeed's BF16 optimizer:
            ``compute.DEEPSPEED_BF16_ACCUM_BYTES_PER_PARAM``), added to each layer's backward;
            0 (Megatron-LM's accumulation fused into the weight-gradient GEMM).
        activation_offload: also offer the ``offload`` strategy on every decoder layer: its saved
            activations go to host memory and back over the device's host link
            (``cost_models.activation_offload``).

    Returns:
        A ``ModelProfile`` with ``num_layers + 2`` layers, ``source="analytic"``.

    Raises:
        InvalidProblemError: microbatch size below 1, efficiency outside (0, 1], an unknown
            attention kind, a tensor-parallel degree that does not divide the heads, KV heads
            and FFN size, or activation offloading on a device without a host link.
    """
    b, t = microbatch_size, tensor_parallel
    _check_profile_args(cfg, b, t, 0.5 if efficiency is None else efficiency)
    check_attention(attention)
    if t > 1 and intra_node_bytes_per_s is None:
        logger.info("no intra-node bandwidth given: tensor-parallel all-reduces are not timed for %s", cfg.name)
    sp = t > 1 if sequence_parallel is None else sequence_parallel
    if efficiency is None and not compute.has_constants(device):
        efficiency = DEFAULT_EFFICIENCY  # no compute constants (cpu, toy devices): the flat model
    from cost_models import _layer_profiles as lp  # the builders import this module's formulas

    sets = recompute_modules or None  # True: every candidate set (``recompute.candidate_sets``)
    if efficiency is None:
        embedding, block, head = lp._op_layers(cfg, device, b, t, intra_node_bytes_per_s, scatter_gather, sp, attention,
                                            selective_recompute_fraction, overlap_tp_backward=overlap_tp_backward,
                                            module_sets=sets)
    else:
        block = lp._decoder_layer(cfg, 0, device, b, t, efficiency, intra_node_bytes_per_s, scatter_gather,
                               selective_recompute_fraction, attention)
        embedding = lp._embedding_layer(cfg, device, b, t, efficiency, intra_node_bytes_per_s, scatter_gather)
        head = lp._head_layer(cfg, device, b, t, efficiency, intra_node_bytes_per_s)
    decoders = [block.model_copy(update={"name": f"decoder{i}"}) for i in range(cfg.num_layers)]
    if cfg.is_moe and cfg.first_dense_layers:  # dense first layers, then MoE layers (either model)
        if efficiency is None:
            moe_block = lp._op_layers(cfg, device, b, t, intra_node_bytes_per_s, scatter_gather, sp, attention,
                                      selective_recompute_fraction, index=cfg.first_dense_layers,
                                      overlap_tp_backward=overlap_tp_backward, module_sets=sets)[1]
        else:
            moe_block = lp._decoder_layer(cfg, cfg.first_dense_layers, device, b, t, efficiency,
                                          intra_node_bytes_per_s, scatter_gather, selective_recompute_fraction,
                                          attention)
        decoders = decoders[:cfg.first_dense_layers] + [
            moe_block.model_copy(update={"name": f"decoder{i}"}) for i in range(cfg.first_dense_layers, cfg.num_layers)]
    if cfg.mtp_layers:  # the multi-token-prediction modules ride with the head on the last stage
        from cost_models import mtp  # it imports this module's formulas

        head = mtp.fold_mtp(head, decoders[-1], embedding, mtp.mtp_extra_layer(cfg, device, b, t, sp, efficiency),
                            cfg.mtp_layers)
    layers = lp.with_grad_accum_pass((embedding, *decoders, head), device, grad_accum_bytes_per_param,
                                     _element_bytes(cfg))
    if activation_offload:
        layers = with_offload(layers, device)
    return ModelProfile(
        name=cfg.name, layers=layers, microbatch_size=b, tensor_parallel=t,
        tokens_per_sample=cfg.seq_length, device=device.name,
        source="analytic" if efficiency is None else f"analytic:efficiency={efficiency:g}",
    )
