"""Layer builders behind ``cost_models.transformer.transformer_profile``: the per-operation model
(``layer_ops``) and the older flat-efficiency model. Formulas: docs/cost-model.md sections 2 and 6."""

from __future__ import annotations

from cost_models import compute, fp8, layer_ops, moe, recompute
from cost_models.layer_ops import tp_collectives_per_layer
from cost_models.transformer import (
    _TOKEN_ID_BYTES,
    _element_bytes,
    _norm_params,
    allreduce_time_s,
    attention_core_forward_flops,
    decoder_activation_bytes,
    decoder_backward_input_flops,
    decoder_backward_weight_flops,
    decoder_forward_flops,
    decoder_layer_params,
    embedding_params,
    logits_forward_flops,
    p2p_bytes,
    static_bytes,
)
from planner.schema import Device, LayerProfile, RecomputeOption, TransformerConfig


def _tp_allreduce_s(cfg: TransformerConfig, b: int, t: int, bytes_per_s: float | None) -> float:
    """One all-reduce of the bsh activation among the t tensor-parallel ranks."""
    if t == 1 or bytes_per_s is None:
        return 0.0
    return allreduce_time_s(p2p_bytes(cfg, microbatch_size=b), t, bytes_per_s)


def _memory_time_s(num_bytes: float, device: Device, efficiency: float) -> float:
    """Memory-bound work; without a bandwidth, 1 byte counts as 1 FLOP (a crude floor)."""
    return num_bytes / (compute.memory_bandwidth_bytes_per_s(device) * efficiency)


def _embedding_layer(cfg: TransformerConfig, device: Device, b: int, t: int, eff: float, bw: float | None,
                     sg: bool) -> LayerProfile:
    """Vocab-parallel lookup: memory-bound; the forward all-reduces its output over t. The backward
    applies the output gradient (I: read it) and scatter-adds it into the table (W: read + write)."""
    e, bsh = _element_bytes(cfg), b * cfg.seq_length * cfg.hidden_size
    word = cfg.vocab_size * cfg.hidden_size
    params = word / t + (embedding_params(cfg) - word)  # position embeddings are replicated
    weight_s = _memory_time_s(2 * e * bsh, device, eff)
    return LayerProfile(
        name="embedding", kind="embedding",
        forward_s=_memory_time_s(2 * e * bsh, device, eff) + _tp_allreduce_s(cfg, b, t, bw),
        backward_s=_memory_time_s(e * bsh, device, eff) + weight_s,
        backward_weight_s=weight_s,
        activation_bytes=bsh / t + _TOKEN_ID_BYTES * b * cfg.seq_length,
        static_bytes=static_bytes(params), param_bytes=e * params,
        output_bytes=p2p_bytes(cfg, microbatch_size=b, tensor_parallel=t, scatter_gather=sg), flops=0.0,
    )


def _recompute_options(cfg: TransformerConfig, mkw: dict, attention: str, forward_s: float,
                       selective_s: float) -> dict[str, RecomputeOption]:
    """none / selective / full of one decoder layer. Selective re-runs the attention core
    (``selective_s``); with flash attention it saves only the core's log-sum-exp statistics. Full
    re-runs ``forward_s``: the layer's forward, or with PyTorch's early-stopping checkpoint all but
    its tail (``OpTimes.tail_s``)."""
    def option(recompute: str, extra_s: float) -> RecomputeOption:
        return RecomputeOption(activation_bytes=decoder_activation_bytes(cfg, **mkw, recompute=recompute,
                                                                         attention=attention), extra_s=extra_s)

    return {"none": option("none", 0.0), "selective": option("selective", selective_s), "full": option("full", forward_s)}


def _decoder_layer(cfg: TransformerConfig, index: int, device: Device, b: int, t: int, eff: float,
                   bw: float | None, sg: bool, selective_fraction: float | None,
                   attention: str = "flash") -> LayerProfile:
    rate = device.peak_flops * eff
    kw = {"microbatch_size": b, "tensor_parallel": t}
    f_flops, bi_flops, w_flops = (decoder_forward_flops(cfg, **kw), decoder_backward_input_flops(cfg, **kw),
                                  decoder_backward_weight_flops(cfg, **kw))
    params = decoder_layer_params(cfg) / t
    if moe.uses_extended_counts(cfg):  # this layer's own shape (dense first layers or router + experts)
        matmul = 2 * b * cfg.seq_length * moe.decoder_matmul_params(cfg, index) / t
        core = attention_core_forward_flops(cfg, **kw)
        f_flops, bi_flops, w_flops = matmul + core, matmul + 2 * core, matmul
        params = moe.decoder_layer_params(cfg, index) / t
    comm_s = tp_collectives_per_layer(cfg) * _tp_allreduce_s(cfg, b, t, bw)  # two all-reduces each way (L3709-3713)
    forward_s = f_flops / rate + comm_s
    if selective_fraction is None:
        selective_s = attention_core_forward_flops(cfg, **kw) / rate
    else:
        selective_s = selective_fraction * f_flops / rate
    options = _recompute_options(cfg, {**kw, "layer_index": index}, attention, forward_s, selective_s)
    return LayerProfile(
        name=f"decoder{index}", kind="decoder", forward_s=forward_s,
        backward_s=(bi_flops + w_flops) / rate + comm_s, backward_weight_s=w_flops / rate,
        static_bytes=static_bytes(params), param_bytes=_element_bytes(cfg) * params,
        output_bytes=p2p_bytes(cfg, microbatch_size=b, tensor_parallel=t, scatter_gather=sg),
        flops=f_flops + bi_flops + w_flops, recompute=options,
    )


def _head_layer(cfg: TransformerConfig, device: Device, b: int, t: int, eff: float, bw: float | None) -> LayerProfile:
    """Final norm + vocab-parallel logits + loss. The logits dominate; the norm's and the softmax's
    memory traffic is left out. The last stage holds its own copy of tied word embeddings, as
    Megatron-LM does, so the head always carries V h / t weights."""
    rate = device.peak_flops * eff
    logits = logits_forward_flops(cfg, microbatch_size=b, tensor_parallel=t)
    e, bsh = _element_bytes(cfg), b * cfg.seq_length * cfg.hidden_size
    params = cfg.vocab_size * cfg.hidden_size / t + _norm_params(cfg)
    return LayerProfile(
        name="head", kind="head", forward_s=logits / rate,
        backward_s=2 * logits / rate + _tp_allreduce_s(cfg, b, t, bw), backward_weight_s=logits / rate,
        # norm input and logit-matmul input (e sbh/t each), fp32 logits for the loss (4 sbV/t)
        activation_bytes=2 * e * bsh / t + 4 * b * cfg.seq_length * cfg.vocab_size / t,
        static_bytes=static_bytes(params), param_bytes=e * params, output_bytes=0.0, flops=3 * logits,
    )


def _layer_flops_and_params(cfg: TransformerConfig, b: int, t: int, index: int) -> tuple[float, float]:
    """(F + B + W FLOPs, parameters per device) of decoder layer ``index``: the mean layer for dense
    configs; MoE configs count the layer's own FFN (dense first layers or router + experts)."""
    akw = {"microbatch_size": b, "tensor_parallel": t}
    if not cfg.is_moe:
        flops = decoder_forward_flops(cfg, **akw) + decoder_backward_input_flops(cfg, **akw) + (
            decoder_backward_weight_flops(cfg, **akw))
        return flops, decoder_layer_params(cfg) / t
    matmul = 2 * b * cfg.seq_length * moe.decoder_matmul_params(cfg, index) / t
    flops = 3 * matmul + 3 * moe.attention_core_forward_flops(cfg, **akw)  # F + B + W, core F + 2F
    return flops, moe.decoder_layer_params(cfg, index) / t


def _op_layers(cfg: TransformerConfig, device: Device, b: int, t: int, bw: float | None, sg: bool,
               sp: bool, attention: str, selective_fraction: float | None = None, index: int = 0,
               overlap_tp_backward: bool = False, module_sets: bool | list[tuple[str, ...]] | None = None,
               ) -> tuple[LayerProfile, LayerProfile, LayerProfile]:
    """Embedding, decoder block ``index`` and head from the per-operation model (``layer_ops``);
    ``module_sets`` adds a recompute option per Megatron-Core module set (``cost_models.recompute``;
    True: every candidate set)."""
    kw = {"microbatch_size": b, "tensor_parallel": t, "tp_link_bytes_per_s": bw}
    dec = layer_ops.decoder_op_times(cfg, device, **kw, sequence_parallel=sp, attention=attention, layer_index=index,
                                     overlap_tp_backward=overlap_tp_backward)
    head = layer_ops.head_op_times(cfg, device, **kw, sequence_parallel=sp)
    emb = layer_ops.embedding_op_times(cfg, device, **kw)
    e, bsh = _element_bytes(cfg), b * cfg.seq_length * cfg.hidden_size
    akw = {"microbatch_size": b, "tensor_parallel": t}
    flops, params = _layer_flops_and_params(cfg, b, t, index)
    mkw = {**akw, "sequence_parallel": sp, "layer_index": index}
    selective_s = dec.selective_s if selective_fraction is None else selective_fraction * dec.forward_s
    constants = compute.compute_constants(device)
    rerun_s = dec.forward_s - (dec.tail_s if constants.full_recompute == "early-stop" else 0.0)
    options = _recompute_options(cfg, mkw, attention, rerun_s, selective_s)
    if constants.elementwise_kernels == "eager":  # fp32 norm copies, SiLU output, K/V
        extra = layer_ops.eager_extra_activation_bytes(cfg, b * cfg.seq_length, t, sp)
        options = {k: o if k == "full" else o.model_copy(update={"activation_bytes": o.activation_bytes + extra})
                   for k, o in options.items()}
    kept_smaller = None
    if fp8.is_fp8(device):  # linear-layer inputs kept in FP8 (cost_models.fp8)
        tokens = b * cfg.seq_length
        saving = fp8.activation_saving_bytes(cfg, tokens, t, sp, index)
        options = {k: o if k == "full" else o.model_copy(update={"activation_bytes": o.activation_bytes - saving})
                   for k, o in options.items()}
        kept_smaller = {m: fp8.module_saving_bytes(cfg, m, tokens, t, sp, index)
                        for m in ("layernorm", "mlp", "moe_act", "shared_experts", "moe")}
    if module_sets:
        options.update(recompute.module_set_options(cfg, device, dec, options["none"].activation_bytes, **mkw,
                                                    attention=attention,
                                                    sets=None if module_sets is True else module_sets,
                                                    kept_smaller=kept_smaller))
    out = p2p_bytes(cfg, microbatch_size=b, tensor_parallel=t, scatter_gather=sg)
    decoder = LayerProfile(
        name=f"decoder{index}", kind="decoder", forward_s=dec.forward_s, backward_s=dec.backward_s,
        backward_weight_s=dec.backward_weight_s, static_bytes=static_bytes(params), param_bytes=e * params,
        output_bytes=out, flops=flops, recompute=options)
    word = cfg.vocab_size * cfg.hidden_size
    emb_params = word / t + (embedding_params(cfg) - word)
    embedding = LayerProfile(
        name="embedding", kind="embedding", forward_s=emb.forward_s, backward_s=emb.backward_s,
        backward_weight_s=emb.backward_weight_s, activation_bytes=bsh / t + _TOKEN_ID_BYTES * b * cfg.seq_length,
        static_bytes=static_bytes(emb_params), param_bytes=e * emb_params, output_bytes=out, flops=0.0)
    logits = logits_forward_flops(cfg, **akw)
    head_params = cfg.vocab_size * cfg.hidden_size / t + _norm_params(cfg)
    head_layer = LayerProfile(
        name="head", kind="head", forward_s=head.forward_s, backward_s=head.backward_s,
        backward_weight_s=head.backward_weight_s,
        activation_bytes=2 * e * bsh / (t if sp else 1) + 4 * b * cfg.seq_length * cfg.vocab_size / t,
        static_bytes=static_bytes(head_params), param_bytes=e * head_params, output_bytes=0.0, flops=3 * logits)
    return embedding, decoder, head_layer


def with_grad_accum_pass(layers: tuple[LayerProfile, ...], device: Device, bytes_per_param: float,
                         element_bytes: int) -> tuple[LayerProfile, ...]:
    """The layers with a gradient-accumulation pass over their own parameters added to the backward
    (and to its weight-gradient part, where the zero-bubble schedules put it); unchanged at 0 bytes."""
    if bytes_per_param <= 0:
        return layers
    out = []
    for layer in layers:
        extra = compute.grad_accum_pass_s(layer.param_bytes / element_bytes, device, bytes_per_param=bytes_per_param)
        update = {"backward_s": layer.backward_s + extra}
        if layer.backward_weight_s is not None:
            update["backward_weight_s"] = layer.backward_weight_s + extra
        out.append(layer.model_copy(update=update))
    return tuple(out)
