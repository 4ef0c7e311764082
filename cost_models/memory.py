"""Device memory as a GPU holds it: usable capacity, headroom, and model-state bytes per precision,
optimizer and ZeRO stage.

Usable memory = device memory - headroom. The default headroom is
``RUNTIME_RESERVED_FRACTION`` of the memory for the CUDA context, cuBLAS/cuDNN workspaces and NCCL
buffers (capped at ``RUNTIME_RESERVED_BYTES``), plus ``FRAGMENTATION_FRACTION`` for the caching
allocator's fragmentation: 1 GiB + 5 % = 5 GiB of an 80 GiB GPU, 1.6 GiB of 16 GiB (why these
values: docs/cost-model.md, "Memory headroom"). ``--memory-headroom`` overrides it with a
fraction (``0.1``) or an amount (``6GiB``); every solver and the simulator compare peaks against
``usable_memory_bytes``.

Model states (ZeRO, Rajbhandari et al., SC'20, Sec. 3.1 and 5): a 16-bit weight (2 B), its
gradient (2 B, or 4 B when accumulated in fp32) and the optimizer's fp32 state: Adam keeps a
master copy, m and v (12 B), SGD with momentum a master copy and the momentum (8 B). Stage 1
shards the optimizer state over the d data-parallel ranks, stage 2 the gradients too, stage 3
the weights too.
"""

from __future__ import annotations

import re

from planner.errors import InvalidProblemError
from planner.schema import Device

GIB = 2.0**30
RUNTIME_RESERVED_BYTES = 1.0 * GIB
RUNTIME_RESERVED_FRACTION = 0.05
FRAGMENTATION_FRACTION = 0.05
OPTIMIZER_STATE_BYTES = {"adam": 12.0, "sgd": 8.0, "none": 0.0}
GRAD_BYTES_PER_PARAM = 2.0
"""16-bit gradients (the ZeRO paper's 2 + 2 + 12 bytes of mixed-precision Adam)."""
DEEPSPEED_BF16_GRAD_BYTES_PER_PARAM = 6.0
"""DeepSpeed's BF16 optimizer: the bf16 gradients plus an fp32 accumulation buffer of the whole
parameter set on every data-parallel rank, not sharded by ZeRO-1 ([deepspeed-bf16],
``runtime/bf16_optimizer.py``: the fp32 gradients are allocated like the full flat bf16 group)."""
_AMOUNT_RE = re.compile(r"^\s*(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>gib|gb|mib|mb|b)?\s*$", re.IGNORECASE)


def default_headroom_bytes(memory_bytes: float) -> float:
    """Runtime reserve (min(1 GiB, 5 %)) plus fragmentation (5 %) of a device's memory."""
    return min(RUNTIME_RESERVED_BYTES, RUNTIME_RESERVED_FRACTION * memory_bytes) + FRAGMENTATION_FRACTION * memory_bytes


def headroom_bytes(device: Device) -> float:
    """The device's headroom: its own ``memory_headroom_bytes`` or the default."""
    if device.memory_headroom_bytes is not None:
        return float(device.memory_headroom_bytes)
    return default_headroom_bytes(device.memory_bytes)


def usable_memory_bytes(device: Device) -> float:
    """Bytes a plan's peak may reach: memory minus headroom."""
    return device.memory_bytes - headroom_bytes(device)


def parse_headroom(text: str | float, memory_bytes: float) -> float:
    """Headroom bytes from ``--memory-headroom``: a fraction in [0, 1) of the memory, or an amount
    with a unit (``6GiB``, ``512MiB``; a bare number >= 1 is GiB).

    Raises:
        InvalidProblemError: not a number, negative, or as large as the memory.
    """
    value: float
    match = _AMOUNT_RE.match(str(text))
    if match is None:
        raise InvalidProblemError(
            f"--memory-headroom={text!r}: give a fraction of device memory (0.1) or an amount (6GiB, 512MiB)")
    num, unit = float(match.group("num")), (match.group("unit") or "").lower()
    scale = {"gib": GIB, "gb": 1e9, "mib": 2.0**20, "mb": 1e6, "b": 1.0}
    if unit:
        value = num * scale[unit]
    else:
        value = num * memory_bytes if num < 1 else num * GIB
    if value >= memory_bytes:
        raise InvalidProblemError(
            f"--memory-headroom={text!r} is {value / GIB:.1f} GiB, not less than the device's "
            f"{memory_bytes / GIB:.1f} GiB; use a smaller fraction or amount")
    return value


def with_headroom(device: Device, text: str | float | None) -> Device:
    """The device with ``--memory-headroom`` applied (unchanged when None)."""
    if text is None:
        return device
    return device.model_copy(update={"memory_headroom_bytes": parse_headroom(text, device.memory_bytes)})


def model_state_bytes_per_param(*, zero_stage: int = 0, data_parallel: int = 1, optimizer: str = "adam",
                                weight_bytes: float = 2.0, grad_bytes: float = 2.0) -> float:
    """Resident bytes per parameter on one data-parallel rank under a ZeRO stage.

    Raises:
        InvalidProblemError: unknown optimizer or stage.
    """
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise InvalidProblemError(f"optimizer={optimizer!r}; choose from {sorted(OPTIMIZER_STATE_BYTES)}")
    if zero_stage not in (0, 1, 2, 3):
        raise InvalidProblemError(f"zero_stage={zero_stage} must be 0, 1, 2 or 3")
    d = max(1, data_parallel)
    opt = OPTIMIZER_STATE_BYTES[optimizer] / (d if zero_stage >= 1 else 1)
    grad = grad_bytes / (d if zero_stage >= 2 else 1)
    weight = weight_bytes / (d if zero_stage >= 3 else 1)
    return weight + grad + opt


def zero_static_scale(zero_stage: int, data_parallel: int, optimizer: str = "adam",
                      grad_bytes: float = GRAD_BYTES_PER_PARAM) -> float:
    """Factor applied to 16-B/param mixed-precision Adam static bytes under a ZeRO stage, with
    ``grad_bytes`` of gradients per parameter (sharded from ZeRO-2 on)."""
    full = model_state_bytes_per_param(optimizer=optimizer)
    return model_state_bytes_per_param(zero_stage=zero_stage, data_parallel=data_parallel, optimizer=optimizer,
                                       grad_bytes=grad_bytes) / full


def grad_bytes_per_param(optimizer: str | None) -> float:
    """Resident gradient bytes per parameter under a gradient handling (the ptdp option
    ``optimizer``, kept in the plan's options): 6 for ``deepspeed-bf16``, else 2."""
    return DEEPSPEED_BF16_GRAD_BYTES_PER_PARAM if optimizer == "deepspeed-bf16" else GRAD_BYTES_PER_PARAM
