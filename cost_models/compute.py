"""Per-operation compute times on one device: GEMMs, the attention core and memory-bound kernels.

Every function is pure and takes the ``Device`` (its ``compute`` constants, or the preset's of
the same name, or generic defaults). Formulas (docs/cost-model.md has them with sources):

- GEMM of (M x K) by (K x N), ``batch`` independent ones: 2 M N K FLOPs. The output is cut in
  tiles of ``gemm_tile_m x gemm_tile_n``; tiles run in waves of ``num_sms`` (one tile per SM), so
  the last, partial wave costs as much as a full one (tile and wave quantization, NVIDIA's
  "Matrix Multiplication Background" guide). A tile with reduction length K costs
  2 tm tn (K + k0) / (peak / num_sms x gemm_max_fraction): the prologue/epilogue k0 makes short-K
  GEMMs slow (size-dependent saturation). The roofline bound (Williams et al., CACM 2009) is
  the bytes of A, B and C over HBM bandwidth; the time is the larger of the two, plus a launch.
- memory-bound kernels (norms, dropout, activations, residual adds, rotary, softmax, optimizer
  step): bytes moved / (HBM bandwidth x ``memory_bandwidth_fraction``) plus a launch.
"""

from __future__ import annotations

import math
from functools import lru_cache

from planner.errors import InvalidProblemError
from planner.schema import ComputeModel, Device

_GENERIC = ComputeModel(num_sms=64)


@lru_cache(maxsize=64)
def _preset_compute(name: str) -> ComputeModel | None:
    from cost_models.hardware import preset_compute  # lazy: hardware imports nothing from here

    return preset_compute(name)


def compute_constants(device: Device) -> ComputeModel:
    """The device's compute constants: its own, else its preset's, else generic defaults."""
    if device.compute is not None:
        return device.compute
    return _preset_compute(device.name) or _GENERIC


@lru_cache(maxsize=64)
def _preset_field(name: str, field: str) -> float | None:
    from cost_models.hardware import preset_device_field  # lazy, as _preset_compute

    return preset_device_field(name, field)


def memory_bandwidth_bytes_per_s(device: Device) -> float:
    """Nominal HBM bandwidth: the device's own, else its preset's (a cluster file that names a
    preset device and omits the field), else, for a toy device without compute constants, its
    peak FLOP/s (1 byte ~ 1 FLOP, a crude floor of the flat-efficiency model).

    Raises:
        InvalidProblemError: the device carries compute constants (the per-operation model, which
            costs memory-bound kernels by bytes over this bandwidth) but no bandwidth and is no preset.
    """
    own = device.memory_bandwidth_bytes_per_s or _preset_field(device.name, "memory_bandwidth_bytes_per_s")
    if own:
        return float(own)
    if device.compute is not None:
        raise InvalidProblemError(
            f"device {device.name!r} gives compute constants but no memory_bandwidth_bytes_per_s: the "
            f"per-operation model costs norms, activations and the optimizer step by bytes over HBM "
            f"bandwidth; set device.memory_bandwidth_bytes_per_s in the cluster JSON (e.g. 2.039e12 "
            f"for an A100 80 GB), or name a device preset")
    return device.peak_flops


def host_link_bytes_per_s(device: Device) -> float | None:
    """Device-host (PCIe / C2C) bandwidth: the device's own, else its preset's, else None."""
    own = device.host_link_bytes_per_s or _preset_field(device.name, "host_link_bytes_per_s")
    return float(own) if own else None


def host_memory_bytes(device: Device) -> float | None:
    """Host memory each device may fill with offloaded activations: its own, else its preset's (the
    node's system memory over its devices), else None (not checked)."""
    own = device.host_memory_bytes or _preset_field(device.name, "host_memory_bytes")
    return float(own) if own else None


def has_constants(device: Device) -> bool:
    """Whether the device (or its preset) carries compute constants. Devices without them (the
    nominal ``cpu`` preset, hand-written toy devices) get the flat-efficiency model."""
    return device.compute is not None or _preset_compute(device.name) is not None


ELEMENTWISE_KERNELS = ("fused", "eager")


def with_elementwise_kernels(device: Device, kernels: str) -> Device:
    """The device with ``ComputeModel.elementwise_kernels`` set (its other constants kept):
    ``fused`` (Megatron-LM / Transformer Engine, torch.compile) or ``eager`` (PyTorch eager).

    Raises:
        InvalidProblemError: ``kernels`` is neither.
    """
    if kernels not in ELEMENTWISE_KERNELS:
        raise InvalidProblemError(f"kernels={kernels!r} must be 'fused' (Megatron-LM, Transformer Engine, "
                                  f"torch.compile) or 'eager' (PyTorch eager, e.g. torchtitan without compile)")
    return device.model_copy(update={"compute": compute_constants(device).model_copy(
        update={"elementwise_kernels": kernels})})


FULL_RECOMPUTE = ("whole", "early-stop")


def with_full_recompute(device: Device, mode: str) -> Device:
    """The device with ``ComputeModel.full_recompute`` set (its other constants kept): ``whole``
    (Megatron-LM, Transformer Engine: reentrant checkpointing) or ``early-stop`` (PyTorch's
    non-reentrant ``torch.utils.checkpoint``: torchtitan, FSDP's ``checkpoint_wrapper``).

    Raises:
        InvalidProblemError: ``mode`` is neither.
    """
    if mode not in FULL_RECOMPUTE:
        raise InvalidProblemError(f"full_recompute={mode!r} must be 'whole' (Megatron-LM, Transformer Engine: the "
                                  f"layer's whole forward again) or 'early-stop' (PyTorch's non-reentrant "
                                  f"torch.utils.checkpoint: torchtitan, FSDP, paraplan run)")
    if not has_constants(device):  # the flat-efficiency model re-runs the whole forward
        if mode == "whole":
            return device
        raise InvalidProblemError(f"full_recompute='early-stop' needs the per-operation model, and device "
                                  f"{device.name!r} has no compute constants (the flat-efficiency model); use a "
                                  f"device preset such as a100-80gb, calibrate this one (paraplan calibrate), or "
                                  f"drop the setting")
    return device.model_copy(update={"compute": compute_constants(device).model_copy(
        update={"full_recompute": mode})})


def with_attention_kernel(device: Device, kernel: str) -> Device:
    """The device running flash-attention kernel family ``kernel`` (``ComputeModel.attention_kernel``,
    a key of its ``attention_fractions``: ``fa1`` FlashAttention and its Triton port, ``fa2``, ``fa3`` (Hopper), ``cudnn`` and ``fa4``
    (Blackwell)).

    Raises:
        InvalidProblemError: the device lists no such family.
    """
    c = compute_constants(device)
    if kernel not in c.attention_fractions:
        listed = ", ".join(sorted(c.attention_fractions)) or "none"
        raise InvalidProblemError(
            f"attention_kernel={kernel!r} is not a flash-attention kernel family of device {device.name!r} "
            f"(it lists: {listed}); choose one of those, or give the family's share of peak in a cluster "
            f"file's device compute.attention_fractions")
    return device.model_copy(update={"compute": c.model_copy(update={"attention_kernel": kernel})})


LINEAR_PRECISIONS = ("bf16", "fp8", "fp8-cs")


def with_linear_precision(device: Device, precision: str) -> Device:
    """The device with ``ComputeModel.linear_precision`` set (its other constants kept): ``bf16``,
    ``fp8`` (Transformer Engine, delayed scaling) or ``fp8-cs`` (current scaling); ``cost_models.fp8``.

    Raises:
        InvalidProblemError: ``precision`` is none of these, or FP8 on a device with no FP8 peak.
    """
    if precision not in LINEAR_PRECISIONS:
        raise InvalidProblemError(f"precision={precision!r} must be 'bf16', 'fp8' (Transformer Engine FP8 "
                                  f"linear layers, delayed scaling) or 'fp8-cs' (current scaling)")
    c = compute_constants(device)
    if precision != "bf16" and "fp8" not in c.peak_flops_by_dtype:
        raise InvalidProblemError(f"precision={precision!r} needs an FP8 peak, which device {device.name!r} does "
                                  f"not give (compute.peak_flops_by_dtype.fp8); use precision='bf16' or an "
                                  f"FP8 device such as h100")
    return device.model_copy(update={"compute": c.model_copy(update={"linear_precision": precision})})


def peak_flops_per_s(device: Device, dtype: str = "bf16") -> float:
    """Dense peak FLOP/s of a precision (16-bit: ``Device.peak_flops``)."""
    if dtype in ("fp16", "bf16"):
        return device.peak_flops
    return compute_constants(device).peak_flops_by_dtype.get(dtype, device.peak_flops)


def _memory_rate_bytes_per_s(device: Device) -> float:
    c = compute_constants(device)
    return memory_bandwidth_bytes_per_s(device) * c.memory_bandwidth_fraction


SMALLER_TILE_FRACTION = 0.9
"""Throughput of a tile with half the output of the largest, relative to it (less operand reuse
per loaded byte); cuBLAS picks the tile that finishes first (CUTLASS profiler behaviour)."""


def _tiles(c: ComputeModel) -> tuple[tuple[int, int, float], ...]:
    """(tile_m, tile_n, relative rate): the largest tile and two halvings."""
    tm, tn = c.gemm_tile_m, c.gemm_tile_n
    return ((tm, tn, 1.0), (max(tm // 2, 16), tn, SMALLER_TILE_FRACTION),
            (max(tm // 2, 16), max(tn // 2, 16), SMALLER_TILE_FRACTION**2))


def gemm_compute_s(m: int, n: int, k: int, device: Device, *, batch: int = 1, dtype: str = "bf16") -> float:
    """Tile/wave-quantized compute time of ``batch`` GEMMs (M x K)(K x N), without the roofline:
    the fastest of the device's tile sizes."""
    c = compute_constants(device)
    fraction = (c.fp8_gemm_max_fraction or c.gemm_max_fraction) if dtype == "fp8" else c.gemm_max_fraction
    per_sm_flops = peak_flops_per_s(device, dtype) / c.num_sms * fraction
    best = math.inf
    for tm, tn, rate in _tiles(c):
        waves = math.ceil(batch * math.ceil(m / tm) * math.ceil(n / tn) / c.num_sms)
        best = min(best, waves * 2.0 * tm * tn * (k + c.gemm_k_overhead) / (per_sm_flops * rate))
    return best


FLASH_BLOCK = 128
"""Query rows (one thread block) and key columns per inner step of the flash-attention kernels
(FlashAttention-2 on A100/H100: 128-row query blocks, [flash2] Sec. 3.2-3.3)."""


def flash_attention_s(s_q: int, s_kv: int, d_qk: int, d_v: int, heads: int, device: Device, *,
                      causal: bool = True, window: int | None = None) -> float:
    """One fused flash-attention kernel over ``heads`` (batch x heads) independent heads: its
    FLOPs (4 s_q s_kv d per head forward, halved by the causal mask) at the kernel family's share
    of peak (``ComputeModel.attention_fractions[attention_kernel]``; a family not listed runs at
    0.85 of the GEMM fraction). The kernel is tiled over the query: one thread block per
    ``FLASH_BLOCK`` query rows of one head, run in waves over the SMs; each block loops over the
    keys it attends (half of them on average under the causal mask) and pays one step of
    prologue/epilogue (load Q, rescale and write O: ``gemm_k_overhead`` keys), so short sequences
    run below the family's rate. The head width sets the FLOPs, not the rate (the inner loop runs
    over keys, not over the head dimension). This is the forward; the backward runs 5 score-sized
    matmuls against its 2 (``layer_ops.FLASH_BACKWARD_FACTOR``). ``window``: a causal sliding window
    of that many keys; a block then loops over the window's keys plus the half block its far edge
    cuts (the kernel skips the key blocks outside it), never more than the causal half."""
    if min(s_q, s_kv, heads) <= 0:
        return 0.0
    c = compute_constants(device)
    fraction = c.attention_fractions.get(c.attention_kernel) or FLASH_GEMM_RELATIVE_RATE * c.gemm_max_fraction
    blocks = heads * math.ceil(s_q / FLASH_BLOCK)
    waves = math.ceil(blocks / c.num_sms)
    keys = s_kv / 2 if causal else s_kv
    if window is not None and causal:
        keys = min(keys, window + FLASH_BLOCK / 2)
    per_block_flops = 2.0 * FLASH_BLOCK * (keys + c.gemm_k_overhead) * (d_qk + d_v)
    return waves * per_block_flops / (device.peak_flops / c.num_sms * fraction)


FLASH_GEMM_RELATIVE_RATE = 0.85
"""Flash attention's share of peak relative to the GEMM fraction when the device lists no rate for
its kernel family: FlashAttention-2 reaches 70-73 % of A100 peak forward against ~85 % for large
GEMMs ([flash2] Sec. 4.1)."""


def gemm_memory_s(m: int, n: int, k: int, device: Device, *, batch: int = 1, bytes_per_element: int = 2) -> float:
    """Roofline memory time: read A and B, write C once."""
    return batch * bytes_per_element * (m * k + k * n + m * n) / _memory_rate_bytes_per_s(device)


def gemm_time_s(m: int, n: int, k: int, device: Device, *, batch: int = 1, dtype: str = "bf16") -> float:
    """Time of ``batch`` GEMMs: max(compute, memory) plus one kernel launch."""
    if min(m, n, k, batch) <= 0:
        return 0.0
    e = {"fp32": 4, "fp8": 1}.get(dtype, 2)  # FP8: 1-byte operands (the 16-bit output is left at 1 byte)
    compute = gemm_compute_s(m, n, k, device, batch=batch, dtype=dtype)
    return max(compute, gemm_memory_s(m, n, k, device, batch=batch, bytes_per_element=e)) + (
        compute_constants(device).kernel_launch_s)


def gemm_efficiency(m: int, n: int, k: int, device: Device, *, batch: int = 1, dtype: str = "bf16") -> float:
    """Achieved fraction of peak: 2 M N K batch / (time x peak)."""
    time_s = gemm_time_s(m, n, k, device, batch=batch, dtype=dtype)
    return 2.0 * m * n * k * batch / (time_s * peak_flops_per_s(device, dtype))


def gemm_fwd_bwd_s(m: int, n: int, k: int, device: Device, *, batch: int = 1,
                   dtype: str = "bf16") -> tuple[float, float, float]:
    """(forward, input-gradient, weight-gradient) times of a linear layer Y = X W with X (M x K),
    W (K x N): dX = dY W^T is (M x K) with reduction N; dW = X^T dY is (K x N) with reduction M."""
    kw = {"batch": batch, "dtype": dtype}
    return (gemm_time_s(m, n, k, device, **kw), gemm_time_s(m, k, n, device, **kw),
            gemm_time_s(k, n, m, device, **kw))


def memory_op_s(num_bytes: float, device: Device, *, num_kernels: int = 1) -> float:
    """A memory-bound kernel: bytes moved over the achieved HBM bandwidth, plus launches."""
    if num_bytes <= 0:
        return 0.0
    return num_bytes / _memory_rate_bytes_per_s(device) + num_kernels * compute_constants(device).kernel_launch_s


def optimizer_step_s(num_params: float, device: Device, *, bytes_per_param_moved: float = 36.0) -> float:
    """Mixed-precision Adam step over the parameters a device updates: memory-bound. Default 36 B
    per parameter: read fp16 gradient (2), fp32 master, m, v (12) and write them (12) plus the
    16-bit weight (2); the unscale/inf check and the gradient-norm pass read the gradient twice
    more (4) and the fp32 gradient copy is written and read (8)."""
    return memory_op_s(bytes_per_param_moved * num_params, device, num_kernels=4)


ADAM_STATIC_BYTES_PER_PARAM = 16.0
"""Static bytes per parameter of mixed-precision Adam (``transformer.ADAM_BYTES_PER_PARAM``)."""


def profile_optimizer_step_s(source: str, static_bytes: float, device: Device, *, shard: int = 1) -> float:
    """Optimizer step of layers holding ``static_bytes`` on one rank, charged after its gradient
    reduction by the simulator and the solvers' closed forms alike. Only analytic profiles
    (``source`` ``analytic...``) on devices with compute constants: measured profiles already
    spread the step over their microbatches (``paraplan profile --num-microbatches``), and toy
    devices have no bandwidth to cost it with. ``shard``: ranks the optimizer state is split over
    (ZeRO stage >= 1)."""
    if not source.startswith("analytic") or not has_constants(device) or static_bytes <= 0:
        return 0.0
    return optimizer_step_s(static_bytes / ADAM_STATIC_BYTES_PER_PARAM / max(1, shard), device)


DEEPSPEED_BF16_ACCUM_BYTES_PER_PARAM = 18.0
"""HBM bytes per parameter that DeepSpeed's BF16 optimizer moves after every microbatch's backward
under its pipeline engine ([deepspeed-bf16] ``runtime/bf16_optimizer.py``, ``update_hp_grads``,
called from ``runtime/pipe/engine.py`` ``_exec_backward_pass``): ``hp_grad.add_(lp_grad.to(fp32))``
is two eager kernels, the cast (read the bf16 gradient, 2, write an fp32 copy, 4) and the add
(read both fp32 tensors, 8, write the sum, 4). Megatron-LM instead accumulates the fp32 main
gradient inside the weight-gradient GEMM (``--gradient-accumulation-fusion``): no extra pass."""


def grad_accum_pass_s(num_params: float, device: Device, *, bytes_per_param: float) -> float:
    """A gradient-accumulation pass outside the GEMMs over ``num_params`` parameters of one rank,
    once per microbatch: memory-bound, two kernels (cast and add)."""
    if bytes_per_param <= 0 or num_params <= 0:
        return 0.0
    return memory_op_s(bytes_per_param * num_params, device, num_kernels=2)


NCCL_COLLECTIVE_CTAS = 24
"""Thread blocks an NCCL all-gather or reduce-scatter keeps resident on their SMs while it runs on an
8-GPU NVSwitch node: one CTA per channel ([nccl-env], ``NCCL_MIN_CTAS``/``NCCL_MAX_CTAS``), and NCCL
builds 24 ring channels on an 8-GPU HGX A100 node ([nccl-a100-channels]: its log lists channels
00/24-23/24); an Nsight Systems trace on an H100 node shows the all-gather of FSDP's prefetch
launching 24 blocks beside a GEMM ([nccl-overlap-trace]). Nodes of other shapes may differ (NCCL
picks the count from the topology); the planner uses 24 throughout."""


def collective_sm_share(device: Device) -> float:
    """Share of the device's SMs an overlapped NCCL collective holds, so the compute that runs
    under it proceeds on the rest (``parallelism.fsdp_exposed_comm_s``); 0 for devices without
    compute constants."""
    if not has_constants(device):
        return 0.0
    return min(1.0, NCCL_COLLECTIVE_CTAS / compute_constants(device).num_sms)
