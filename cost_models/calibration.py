"""Fit the per-operation compute model's constants to measurements (no torch here).

``runtime_bridge.calibrate`` measures GEMMs and memory copies with torch on the machine it runs
on; this module fits ``ComputeModel`` constants to those samples so that
``cost_models.compute.gemm_time_s`` and ``memory_op_s`` reproduce them:

- ``gemm_k_overhead`` (k0) by a grid search, and for each k0 the ``gemm_max_fraction`` that
  minimises the squared log error of the compute-bound samples (closed form: the geometric mean
  of the per-sample fractions), keeping the pair with the smallest error;
- ``memory_bandwidth_fraction``: the median achieved share of HBM bandwidth of the copies;
- ``collective_bandwidth_fraction``: the median bus bandwidth / link bandwidth of all-reduce
  samples (e.g. from nccl-tests), when given;
- the flash-attention rate: timed causal attention forward + backward (torch's SDPA, whatever
  kernel it runs on the machine) as a kernel family of its own, ``measured``, at the geometric
  mean of the samples' shares of peak (``compute.flash_attention_s``).

A fraction above 1 means the device's nominal peak is too low (a CPU's nominal figures): the
peak is raised to the measured rate and the fraction set to 1.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from cost_models import compute
from cost_models.layer_ops import FLASH_BACKWARD_FACTOR
from cost_models.offload import DEFAULT_PINNED_EFFICIENCY
from planner.errors import InvalidProblemError
from planner.schema import ComputeModel, Device

K_OVERHEAD_GRID = (0.0, 16.0, 32.0, 64.0, 96.0, 128.0, 192.0, 256.0, 384.0, 512.0, 768.0, 1024.0)


@dataclass(frozen=True, slots=True)
class GemmSample:
    """One timed GEMM: ``batch`` products of (m x k)(k x n) in ``seconds``."""

    m: int
    n: int
    k: int
    seconds: float
    batch: int = 1


@dataclass(frozen=True, slots=True)
class CopySample:
    """One timed memory-bound kernel moving ``num_bytes`` (read + write) in ``seconds``."""

    num_bytes: float
    seconds: float


@dataclass(frozen=True, slots=True)
class AllReduceSample:
    """One timed ring all-reduce of ``num_bytes`` over ``num_ranks`` on a link of ``link_bytes_per_s``."""

    num_bytes: float
    num_ranks: int
    link_bytes_per_s: float
    seconds: float


@dataclass(frozen=True, slots=True)
class AttentionSample:
    """One timed causal attention forward + backward: ``heads`` (batch x heads) heads of ``seq``
    tokens of width ``head_dim``, in ``seconds``."""

    heads: int
    seq: int
    head_dim: int
    seconds: float


MEASURED_ATTENTION = "measured"
"""The kernel family a calibration's attention samples define (``ComputeModel.attention_fractions``)."""


def _with(device: Device, constants: ComputeModel) -> Device:
    return device.model_copy(update={"compute": constants})


def _fractions(samples: Sequence[GemmSample], device: Device, k0: float) -> list[float]:
    """Per-sample gemm_max_fraction that would reproduce each time exactly at this k0."""
    unit = _with(device, compute.compute_constants(device).model_copy(
        update={"gemm_max_fraction": 1.0, "gemm_k_overhead": k0}))
    launch = compute.compute_constants(device).kernel_launch_s
    out = []
    for s in samples:
        ideal = compute.gemm_compute_s(s.m, s.n, s.k, unit, batch=s.batch)
        out.append(ideal / max(s.seconds - launch, 1e-12))
    return out


def fit_gemm_constants(samples: Sequence[GemmSample], device: Device) -> tuple[Device, float]:
    """The device with fitted ``gemm_max_fraction`` and ``gemm_k_overhead``, and the fit's RMS
    relative error (over the samples, in log space).

    Raises:
        InvalidProblemError: fewer than two samples or a non-positive time.
    """
    if len(samples) < 2 or any(s.seconds <= 0 for s in samples):
        raise InvalidProblemError("calibration needs at least two GEMM samples with positive times")
    best: tuple[float, float, float] | None = None
    for k0 in K_OVERHEAD_GRID:
        fractions = _fractions(samples, device, k0)
        geo = math.exp(statistics.fmean(math.log(f) for f in fractions))
        error = math.sqrt(statistics.fmean(math.log(f / geo) ** 2 for f in fractions))
        if best is None or error < best[2] - 1e-12:
            best = (k0, geo, error)
    assert best is not None
    k0, fraction, error = best
    constants = compute.compute_constants(device).model_copy(update={"gemm_k_overhead": k0})
    if fraction > 1.0:  # the nominal peak is below what was measured
        device = device.model_copy(update={"peak_flops": device.peak_flops * fraction})
        fraction = 1.0
    return _with(device, constants.model_copy(update={"gemm_max_fraction": fraction})), error


def fit_memory_fraction(samples: Sequence[CopySample], device: Device) -> Device:
    """The device with ``memory_bandwidth_fraction`` = median achieved / nominal HBM bandwidth."""
    if not samples:
        return device
    launch = compute.compute_constants(device).kernel_launch_s
    rate = compute.memory_bandwidth_bytes_per_s(device)
    share = statistics.median(s.num_bytes / max(s.seconds - launch, 1e-12) / rate for s in samples)
    constants = compute.compute_constants(device)
    if share > 1.0:
        device = device.model_copy(update={"memory_bandwidth_bytes_per_s": rate * share})
        share = 1.0
    return _with(device, constants.model_copy(update={"memory_bandwidth_fraction": share}))


def fit_host_link(samples: Sequence[CopySample], device: Device) -> Device:
    """The device with ``host_link_bytes_per_s`` set so that activation offloading's copies
    (``cost_models.activation_offload``: the link at the pinned-copy efficiency) run at the median
    rate of the timed pinned host-device copies (``num_bytes`` one way each). No samples (a CPU
    device has no host link to time): the device unchanged."""
    if not samples:
        return device
    rate = statistics.median(s.num_bytes / max(s.seconds, 1e-12) for s in samples)
    return device.model_copy(update={"host_link_bytes_per_s": rate / DEFAULT_PINNED_EFFICIENCY})


def fit_collective_fraction(samples: Sequence[AllReduceSample], device: Device) -> Device:
    """The device with ``collective_bandwidth_fraction`` = median ring bus bandwidth / link."""
    if not samples:
        return device
    shares = [2 * (s.num_ranks - 1) / s.num_ranks * s.num_bytes / s.seconds / s.link_bytes_per_s
              for s in samples if s.num_ranks > 1]
    if not shares:
        return device
    constants = compute.compute_constants(device)
    return _with(device, constants.model_copy(update={"collective_bandwidth_fraction": min(1.0, statistics.median(shares))}))


def fit_attention_fraction(samples: Sequence[AttentionSample], device: Device) -> Device:
    """The device running the measured attention kernel: ``attention_fractions["measured"]`` the
    geometric mean of the samples' shares of peak (at most 1), ``attention_kernel`` "measured". A
    sample's time inverts the layer model's: (1 + FLASH_BACKWARD_FACTOR) forwards, each with its
    launch (``layer_ops._attention_core``)."""
    if not samples:
        return device
    constants = compute.compute_constants(device)
    passes = 1 + FLASH_BACKWARD_FACTOR
    unit = _with(device, constants.model_copy(update={"attention_fractions": {MEASURED_ATTENTION: 1.0},
                                                      "attention_kernel": MEASURED_ATTENTION}))
    shares = []
    for s in samples:
        ideal = passes * compute.flash_attention_s(s.seq, s.seq, s.head_dim, s.head_dim, s.heads, unit)
        shares.append(ideal / max(s.seconds - passes * constants.kernel_launch_s, 1e-12))
    share = min(1.0, math.exp(statistics.fmean(math.log(x) for x in shares)))
    return _with(device, constants.model_copy(update={
        "attention_fractions": {**constants.attention_fractions, MEASURED_ATTENTION: share},
        "attention_kernel": MEASURED_ATTENTION}))


def prediction_errors(samples: Sequence[GemmSample], device: Device) -> list[float]:
    """Relative errors (predicted / measured - 1) of the device's model on the samples."""
    return [compute.gemm_time_s(s.m, s.n, s.k, device, batch=s.batch) / s.seconds - 1 for s in samples]
