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
  (``CAST_TRANSPOSE_BYTES``) per element of the input X (M x K) and the weight W (K x N) in the
  forward and of the output gradient dY (M x N) in the backward. Current scaling (``fp8-cs``)
  first reads the tensor once more for its amax (``AMAX_PASS_BYTES``). One launch per cast, one per
  amax pass, one per linear layer for the amax/scale bookkeeping.
- Activations: each linear layer saves its FP8 input (1 B instead of 2) for the weight gradient;
  ``activation_saving_bytes`` counts the inputs only the GEMMs keep.
- Communication: with sequence parallelism TE quantizes the local input before the column-parallel
  all-gather (FP8 all-gather, 1 B) while the row-parallel reduce-scatter carries the BF16 GEMM
  output; ``TP_COMM_SCALE`` is the resulting share of the BF16 volume.
"""

from __future__ import annotations

from cost_models import moe
from cost_models.compute import compute_constants
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
    return compute_constants(device).linear_precision != "bf16"


def gemm_dtype(device: Device) -> str:
    """The dtype the linear layers' GEMMs are costed in: ``fp8`` or ``bf16``."""
    return "fp8" if is_fp8(device) else "bf16"


def quantize_bytes(gemms: list[tuple[float, float, float, float]], device: Device) -> tuple[float, float, int, int]:
    """(forward bytes, backward bytes, forward launches, backward launches) of the FP8 casts of the
    layer's linear GEMMs ``(M, N, K, count)`` (0 in BF16)."""
    precision = compute_constants(device).linear_precision
    if precision == "bf16":
        return 0.0, 0.0, 0, 0
    current = precision == "fp8-cs"  # an amax pass before each cast
    per = CAST_TRANSPOSE_BYTES + (AMAX_PASS_BYTES if current else 0.0)
    passes = 2 if current else 1
    fwd = bwd = 0.0
    for m, n, k, count in gemms:
        fwd += count * per * (m * k + k * n)  # input X and weight W
        bwd += count * per * m * n  # output gradient dY
    layers = len(gemms)
    return fwd, bwd, layers * (2 * passes + 1), layers * (passes + 1)


def tp_comm_scale(device: Device, sequence_parallel: bool) -> float:
    """Factor on the BF16 tensor-parallel collective volume: ``TP_COMM_SCALE`` with FP8 and
    sequence parallelism (FP8 all-gathers), else 1 (all-reduces of the BF16 GEMM outputs)."""
    return TP_COMM_SCALE if is_fp8(device) and sequence_parallel else 1.0


def activation_saving_bytes(cfg: TransformerConfig, tokens: int, t: int, sequence_parallel: bool) -> float:
    """Bytes one dense decoder layer saves for its backward less than in BF16: the inputs that only
    the linear layers keep are stored in FP8, i.e. the QKV and MLP inputs (the norm outputs,
    sbh / t each with sequence parallelism) and the input of the MLP's second GEMM (the activation's
    output, sbf / t). The projection input is flash attention's output O, which the attention core
    keeps in BF16 itself. MoE/MLA layers: 0 (not costed)."""
    if moe.uses_extended_counts(cfg):
        return 0.0
    e = {"fp32": 4}.get(cfg.dtype, _BF16)
    n_h = tokens * cfg.hidden_size / (t if sequence_parallel else 1)
    return (e - FP8_ELEMENT_BYTES) * (2 * n_h + tokens * cfg.ffn_size / t)


def module_saving_bytes(cfg: TransformerConfig, module: str, tokens: int, t: int, sequence_parallel: bool) -> float:
    """The part of ``activation_saving_bytes`` in the tensors a Megatron-Core recompute module frees:
    ``layernorm`` the two norm outputs, ``mlp`` the MLP's second GEMM input; 0 for the other modules
    and for MoE/MLA layers. What recomputing the module frees under FP8 is its BF16 bytes less this
    (the tensors were kept at one byte, not two)."""
    if moe.uses_extended_counts(cfg):
        return 0.0
    e = {"fp32": 4}.get(cfg.dtype, _BF16)
    if module == "layernorm":
        return (e - FP8_ELEMENT_BYTES) * 2 * tokens * cfg.hidden_size / (t if sequence_parallel else 1)
    if module == "mlp":
        return (e - FP8_ELEMENT_BYTES) * tokens * cfg.ffn_size / t
    return 0.0


def weight_copy_bytes(linear_params: float) -> float:
    """Resident FP8 weight copies (weight and transpose) of ``linear_params`` parameters on a rank."""
    return WEIGHT_COPY_BYTES_PER_PARAM * linear_params
