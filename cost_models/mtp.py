"""Multi-token-prediction modules ([deepseek-v3] Sec. 2.2; Megatron-Core's ``MultiTokenPredictionLayer``,
``--mtp-num-layers``): what each adds beside its decoder block, and the head layer with the modules
folded in, so that every solver and the simulator put them on the last pipeline stage, where
Megatron-Core places them (docs/cost-model.md, section 6, "Multi-token prediction")."""

from __future__ import annotations

from cost_models import compute
from cost_models.activation_offload import OFFLOAD
from cost_models.transformer import _element_bytes, _norm_params, static_bytes
from planner.schema import Device, LayerProfile, RecomputeOption, TransformerConfig


def mtp_extra_layer(cfg: TransformerConfig, device: Device, b: int, t: int, sp: bool,
                    efficiency: float | None) -> LayerProfile:
    """What one multi-token-prediction module adds beside its decoder block and the output head
    ([deepseek-v3] Sec. 2.2; Megatron-Core's ``MultiTokenPredictionLayer``): the two RMSNorms and the
    concatenation of the hidden state with the next token's embedding, the 2h -> h projection (column
    parallel over t) and the module's final norm; the embedding lookup is the embedding layer's again.
    Per-operation model: the GEMM by ``compute.gemm_fwd_bwd_s``, the norms and the concatenation as
    memory-bound traffic; flat model (``efficiency``): the projection's FLOPs at that fraction of peak."""
    e, h = _element_bytes(cfg), cfg.hidden_size
    tokens = b * cfg.seq_length
    n_h = tokens * h / (t if sp else 1)
    params = 2 * h * h / t + 3 * _norm_params(cfg)
    flops = 3 * 2 * tokens * 2 * h * h / t
    if efficiency is None:
        fwd, bwd_in, bwd_w = compute.gemm_fwd_bwd_s(tokens, h / t, 2 * h, device)
        norms_f = compute.memory_op_s(3 * 2 * e * n_h + 2 * 2 * e * n_h, device, num_kernels=4)  # 3 norms, concat
        norms_b = compute.memory_op_s(3 * 3 * e * n_h + 2 * 2 * e * n_h, device, num_kernels=4)
    else:
        rate = device.peak_flops * efficiency
        fwd = bwd_in = bwd_w = flops / 3 / rate
        norms_f = norms_b = 0.0
    return LayerProfile(
        name="mtp", kind="head", forward_s=fwd + norms_f, backward_s=bwd_in + bwd_w + norms_b, backward_weight_s=bwd_w,
        activation_bytes=4 * e * n_h + e * tokens * 2 * h,  # two norm inputs and outputs, the projection input
        static_bytes=static_bytes(params), param_bytes=e * params, output_bytes=0.0, flops=flops)


def fold_mtp(head: LayerProfile, block: LayerProfile, embedding: LayerProfile, extra: LayerProfile,
             count: int) -> LayerProfile:
    """The output head with ``count`` multi-token-prediction modules folded in: each runs the embedding
    lookup, its own norms and projection (``mtp_extra_layer``), a decoder block like the last layer
    (``block``, at the layer's own degrees) and the shared head again, so the modules sit on the last
    pipeline stage as Megatron-Core places them. The block's weights join the head's (the head's and
    the embedding's are shared); its recompute strategies become the head's (Megatron-Core applies the
    model's recompute setting to the module's transformer layer too): each keeps the head's activations,
    the lookup's and the projection's in full and the block's as the strategy says, and adds the block's
    recompute time. Activation offloading is not offered on the head (its ``none`` serves there)."""
    if not count:
        return head

    def add(name: str) -> float | None:
        parts = [getattr(layer, name) for layer in (head, block, embedding, extra)]
        if all(part is None for part in parts):
            return None
        h, bl, em, ex = (part or 0.0 for part in parts)
        return h + count * (h + bl + em + ex)

    kept = (head.activation_bytes or 0.0) * (1 + count) + count * (
        (embedding.activation_bytes or 0.0) + (extra.activation_bytes or 0.0))
    options = {name: RecomputeOption(activation_bytes=kept + count * option.activation_bytes,
                                     extra_s=count * option.extra_s)
               for name, option in block.strategies().items() if name != OFFLOAD}
    return head.model_copy(update={
        "forward_s": add("forward_s"), "backward_s": add("backward_s"), "backward_weight_s": add("backward_weight_s"),
        "forward_comm_s": add("forward_comm_s"), "backward_comm_s": add("backward_comm_s"),
        "activation_bytes": options["none"].activation_bytes, "recompute": options,
        "static_bytes": head.static_bytes + count * (block.static_bytes + extra.static_bytes),
        "param_bytes": head.param_bytes + count * (block.param_bytes + extra.param_bytes),
        "flops": None if head.flops is None else head.flops * (1 + count) + count * ((block.flops or 0.0) + (extra.flops or 0.0)),
    })
