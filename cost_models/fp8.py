"""Transformer Engine FP8 linear layers: the GEMMs at the FP8 peak and the traffic FP8 adds.

Opt-in (``ComputeModel.linear_precision``; ``paraplan plan --precision fp8|fp8-cs``); the default
``bf16`` changes nothing. What runs in FP8 follows Transformer Engine's ``te.Linear`` /
``LayerNormLinear`` / ``LayerNormMLP`` ([transformer-engine], ``pytorch/module/linear.py``): the GEMMs
of QKV, the attention projection and the MLP (forward, input gradient, weight gradient); the
attention core, norms, softmax, embedding and logits stay BF16. Formulas (docs/cost-model.md, "FP8"):

- GEMMs: the tile/wave model of ``cost_models.compute`` at the FP8 peak
  (``ComputeModel.peak_flops_by_dtype["fp8"]``) times ``fp8_gemm_max_fraction``, 1-byte operands
  in the roofline.
- Quantization: before each FP8 GEMM its 16-bit operand is cast to FP8 and transposed (the weight
  gradient needs X^T and dY^T), TE's fused cast-transpose: read 2 B, write 1 B + 1 B
  (``CAST_TRANSPOSE_BYTES``) per element of the input X (M x K) in the forward and of the output
  gradient dY (M x N) in the backward, every microbatch. Current scaling (``fp8-cs``) first reads the
  tensor once more for its amax (``AMAX_PASS_BYTES``). One launch per cast, one per amax pass, one per
  linear layer for the amax/scale bookkeeping.
- Weights: cast (and transposed) once per training step, not per microbatch: Megatron-Core marks the
  first microbatch of every step (``set_is_first_microbatch``) and TE's linear layers quantize their
  weights then and reuse the cached FP8 copies for the step's other microbatches ([transformer-engine]
  ``is_first_microbatch``). ``weight_cast_s`` is that per-step pass; the copies (weight and transpose,
  ``WEIGHT_COPY_BYTES_PER_PARAM``) stay resident (``weight_copy_bytes``). Under ZeRO-3/FSDP the weights
  are gathered again for every microbatch, so there the cast runs per microbatch and nothing stays.
- Activations: each linear layer saves its FP8 input (1 B instead of 2) for the weight gradient;
  ``activation_saving_bytes`` counts the inputs only the GEMMs keep (``saving_parts``: dense, MoE and
  MLA layers), ``module_saving_bytes`` what of it a recompute module set frees.
- Communication: with sequence parallelism TE quantizes the local input before the column-parallel
  all-gather (FP8 all-gather, 1 B) while the row-parallel reduce-scatter carries the BF16 GEMM
  output; ``TP_COMM_SCALE`` is the resulting share of the BF16 volume.
"""

from __future__ import annotations

import math

from cost_models import moe, moe_memory, moe_ops
from cost_models.compute import compute_constants, has_constants, memory_op_s
from planner.schema import Device, TransformerConfig

CAST_TRANSPOSE_BYTES = 4.0
"""Bytes per element of TE's fused cast-transpose: read the 16-bit tensor (2), write its FP8 copy
(1) and its FP8 transpose (1) ([transformer-engine] ``fp8_cast_transpose_fused``)."""
AMAX_PASS_BYTES = 2.0
"""Current scaling computes each tensor's amax before quantizing it ([transformer-engine]
``Float8CurrentScalingQuantizer``): one more read of the 16-bit tensor."""
FP8_ELEMENT_BYTES = 1
WEIGHT_COPY_BYTES_PER_PARAM = 2.0
"""The FP8 weight and its FP8 transpose TE keeps between microbatches (per linear parameter)."""
TP_COMM_SCALE = 0.75
"""Tensor-parallel volume with sequence parallelism relative to BF16: the all-gather half in FP8
(1 B), the reduce-scatter half in BF16 (2 B): (1 + 2) / (2 + 2)."""
_BF16 = 2


def is_fp8(device: Device) -> bool:
    return has_constants(device) and compute_constants(device).linear_precision != "bf16"


def gemm_dtype(device: Device) -> str:
    """The dtype the linear layers' GEMMs are costed in: ``fp8`` or ``bf16``."""
    return "fp8" if is_fp8(device) else "bf16"


def _cast_bytes_and_passes(device: Device) -> tuple[float, int]:
    """(bytes per element, launches per cast) of one FP8 cast-transpose; (0, 0) in BF16."""
    precision = compute_constants(device).linear_precision
    if precision == "bf16":
        return 0.0, 0
    current = precision == "fp8-cs"  # an amax pass before each cast
    return CAST_TRANSPOSE_BYTES + (AMAX_PASS_BYTES if current else 0.0), 2 if current else 1


def quantize_bytes(gemms: list[tuple[float, float, float, float]], device: Device) -> tuple[float, float, int, int]:
    """(forward bytes, backward bytes, forward launches, backward launches) of the per-microbatch FP8
    casts of the layer's linear GEMMs ``(M, N, K, count)``: input X forward, output gradient dY
    backward (0 in BF16). The weights' casts are per step (``weight_cast_s``)."""
    per, passes = _cast_bytes_and_passes(device)
    if not passes:
        return 0.0, 0.0, 0, 0
    fwd = bwd = 0.0
    for m, n, k, count in gemms:
        fwd += count * per * m * k  # input X
        bwd += count * per * m * n  # output gradient dY
    layers = len(gemms)
    return fwd, bwd, layers * (passes + 1), layers * (passes + 1)


LINEAR_MODULES_PER_LAYER = 4
"""Weight casts per decoder layer and step, for their launches: QKV, projection, FC1, FC2 (an MoE
layer's grouped experts quantize in one multi-tensor launch per grouped GEMM)."""


def weight_cast_s(linear_params: float, device: Device, *, num_layers: int = 1) -> float:
    """Casting (and transposing) ``linear_params`` 16-bit weights of ``num_layers`` decoder layers to
    FP8: memory-bound, ``CAST_TRANSPOSE_BYTES`` (+ ``AMAX_PASS_BYTES`` under current scaling) per
    parameter; 0 in BF16. Once per step per rank, or per microbatch under ZeRO-3 (module docstring)."""
    per, passes = _cast_bytes_and_passes(device)
    if not passes or linear_params <= 0:
        return 0.0
    return memory_op_s(per * linear_params, device, num_kernels=passes * LINEAR_MODULES_PER_LAYER * max(1, num_layers))


def step_weight_terms(source: str, decoder_param_bytes: float, element_bytes: int, device: Device | None, *,
                      zero_stage: int = 0, num_layers: int = 1) -> tuple[float, float]:
    """(seconds, resident bytes) of a rank's FP8 weight copies: the per-step cast of its decoder layers'
    weights (``decoder_param_bytes`` at ``element_bytes`` each; ``weight_cast_s``), charged beside the
    optimizer step, and the cached copies (``weight_copy_bytes``), charged with the model states, by the
    simulator and the solvers' closed forms alike. (0, 0) but for per-operation profiles (``source``
    ``analytic``, the model that costs the per-microbatch casts; measured profiles hold theirs) in FP8,
    and under ZeRO-3 (cast per microbatch there, in the layers, and nothing cached)."""
    if device is None or zero_stage == 3 or source != "analytic" or not is_fp8(device) or decoder_param_bytes <= 0:
        return 0.0, 0.0
    params = decoder_param_bytes / element_bytes
    return weight_cast_s(params, device, num_layers=num_layers), weight_copy_bytes(params)


def tp_comm_scale(device: Device, sequence_parallel: bool) -> float:
    """Factor on the BF16 tensor-parallel collective volume: ``TP_COMM_SCALE`` with FP8 and
    sequence parallelism (FP8 all-gathers), else 1 (all-reduces of the BF16 GEMM outputs)."""
    return TP_COMM_SCALE if is_fp8(device) and sequence_parallel else 1.0


def saving_parts(cfg: TransformerConfig, tokens: int, t: int, sequence_parallel: bool,
                 layer_index: int = 0) -> dict[str, float]:
    """Bytes decoder layer ``layer_index`` keeps for its backward less than in its dtype, per tensor: the
    inputs only Transformer Engine's FP8 linear layers keep, stored quantized (1 B):

    - ``qkv_input``: the attention norm's output, ``T h / t_sp`` (``LayerNormLinear``); not for MLA,
      whose query and key-value down-projections are two ``Linear`` layers each keeping its own FP8
      copy of that input (two 1-B copies for one 2-B tensor: nothing saved);
    - dense MLP: ``mlp_input`` (the second norm's output, ``LayerNormMLP``) and ``fc2_input`` (the
      activation's output, ``T f / t``);
    - MoE MLP (``GroupedLinear``): ``dispatched`` (FC1's input, the ``T k`` routed rows of width h) and
      ``expert_fc2_input`` (``T k f_e / t``); with shared experts ``shared_fc2_input``
      (``T n_s f_e / t``) and ``shared_fc1_copy``, negative: the router keeps the norm output in
      BF16, so the shared FC1's FP8 copy of it is kept besides it.

    The counts follow ``cost_models.moe_memory`` (which counts the BF16 tensors)."""
    e = {"fp32": 4}.get(cfg.dtype, _BF16)
    d = e - FP8_ELEMENT_BYTES
    n_h = tokens * cfg.hidden_size / (t if sequence_parallel else 1)
    parts: dict[str, float] = {}
    if not cfg.is_mla:
        parts["qkv_input"] = d * n_h
    if cfg.is_moe and moe.is_moe_layer(cfg, layer_index):
        rows = moe_memory.routed_rows(cfg, tokens)
        width = moe_ops.expert_ffn_width(cfg)
        parts["dispatched"] = d * rows * cfg.hidden_size
        parts["expert_fc2_input"] = d * rows * width / t
        if cfg.num_shared_experts:
            parts["shared_fc2_input"] = d * tokens * cfg.num_shared_experts * width / t
            parts["shared_fc1_copy"] = -FP8_ELEMENT_BYTES * n_h
    else:
        parts["mlp_input"] = d * n_h
        parts["fc2_input"] = d * tokens * cfg.ffn_size / t
    return parts


def activation_saving_bytes(cfg: TransformerConfig, tokens: int, t: int, sequence_parallel: bool,
                            layer_index: int = 0) -> float:
    """Bytes decoder layer ``layer_index`` keeps for its backward less than in its dtype: the sum of
    ``saving_parts`` (a dense layer: the QKV and MLP inputs, ``T h / t_sp`` each with sequence
    parallelism, and the MLP's second GEMM input, ``T f / t``, at 1 B less)."""
    return math.fsum(saving_parts(cfg, tokens, t, sequence_parallel, layer_index).values())


_MODULE_PARTS = {"layernorm": ("qkv_input", "mlp_input"), "mlp": ("fc2_input",), "moe_act": ("expert_fc2_input",),
                 "shared_experts": ("shared_fc2_input", "shared_fc1_copy"),
                 "moe": ("dispatched", "expert_fc2_input", "shared_fc2_input", "shared_fc1_copy")}
"""The ``saving_parts`` in the tensors each Megatron-Core recompute module frees (an MoE layer's second
norm output stays BF16 for the router: ``layernorm`` there saves only the QKV side)."""


def module_saving_bytes(cfg: TransformerConfig, module: str, tokens: int, t: int, sequence_parallel: bool,
                        layer_index: int = 0) -> float:
    """The part of ``activation_saving_bytes`` in the tensors a Megatron-Core recompute module frees
    (``_MODULE_PARTS``; 0 for ``core_attn`` and ``mla_up_proj``). What recomputing the module frees
    under FP8 is its BF16 bytes less this (the tensors were kept at one byte, not two)."""
    parts = saving_parts(cfg, tokens, t, sequence_parallel, layer_index)
    return math.fsum(parts.get(name, 0.0) for name in _MODULE_PARTS.get(module, ()))


def weight_copy_bytes(linear_params: float) -> float:
    """Resident FP8 weight copies (weight and transpose) of ``linear_params`` parameters on a rank."""
    return WEIGHT_COPY_BYTES_PER_PARAM * linear_params
