"""Activation offloading to host memory: the ``offload`` strategy of a decoder layer.

A layer whose strategy is ``offload`` keeps none of the tensors it saves for its backward in device
memory: its forward copies them to pinned host memory while the next layer computes, and its
backward's prefetch copies them back while the layer after it (in backward order: before it)
computes (Megatron-Core's ``--cpu-offloading`` through Transformer Engine's CPU-offload context;
PyTorch's ``torch.autograd.graph.save_on_cpu``; the GB200 NVL72 recipes of Megatron-Bridge, whose
Grace memory sits behind NVLink-C2C). Per layer and microbatch, with A the bytes the layer would
keep (its ``none`` activations) and B the device-host bandwidth (``Device.host_link_bytes_per_s``
at the pinned-copy efficiency of ``cost_models.offload``):

- time: only what the copies do not hide, ``max(0, A / B - forward) + max(0, A / B - backward)``,
  charged as the strategy's extra time;
- device memory: the layer input (what ``full`` recompute keeps) per microbatch in flight, standing
  in for the staging buffers the copies pass through (an upper bound: the staging is per rank);
- host memory: A per layer and microbatch in flight, which must fit ``Device.host_memory_bytes`` (the
  node's system memory over its devices: ``host_memory_bytes``; the ptdp search checks it).

Formulas, sources and the limits: docs/cost-model.md, section 4, "Activation offloading".
"""

from __future__ import annotations

from collections.abc import Sequence

from cost_models.compute import host_link_bytes_per_s, host_memory_bytes
from cost_models.offload import DEFAULT_PINNED_EFFICIENCY
from planner.errors import InvalidProblemError
from planner.schema import Device, LayerProfile, Plan, RecomputeOption, SimResult

OFFLOAD = "offload"
"""The strategy's name in a layer's ``recompute`` options and in plans."""


def offload_bandwidth_bytes_per_s(device: Device) -> float:
    """Bytes per second one device's activation copies reach over its host link, per direction.

    Raises:
        InvalidProblemError: the device (or its preset) states no host link.
    """
    link = host_link_bytes_per_s(device)
    if link is None:
        raise InvalidProblemError(
            f"activation offloading needs the device-host bandwidth, but device {device.name!r} gives none: set "
            f"device.host_link_bytes_per_s in the cluster JSON (e.g. 63e9 for PCIe 5.0 x16), or drop the offload")
    return link * DEFAULT_PINNED_EFFICIENCY


def host_bytes(layer: LayerProfile) -> float:
    """Host bytes one microbatch in flight of an offloaded layer holds: what it would keep on the
    device without recompute."""
    return layer.strategies()["none"].activation_bytes


def offload_option(layer: LayerProfile, bandwidth_bytes_per_s: float) -> RecomputeOption:
    """The ``offload`` strategy of a decoder layer at its current forward and backward times."""
    options = layer.strategies()
    saved = host_bytes(layer)
    copy = saved / bandwidth_bytes_per_s
    exposed = max(0.0, copy - layer.forward_s) + max(0.0, copy - layer.backward_s)
    staging = options["full"].activation_bytes if "full" in options else saved
    return RecomputeOption(activation_bytes=min(staging, saved), extra_s=exposed)


def with_offload(layers: Sequence[LayerProfile], device: Device) -> tuple[LayerProfile, ...]:
    """The layers with an ``offload`` strategy added to every decoder layer."""
    bandwidth = offload_bandwidth_bytes_per_s(device)
    out = []
    for layer in layers:
        if layer.kind == "decoder":
            options = {**layer.strategies(), OFFLOAD: offload_option(layer, bandwidth)}
            layer = layer.model_copy(update={"recompute": options})
        out.append(layer)
    return tuple(out)


def without_offload(layer: LayerProfile) -> LayerProfile:
    """The layer without its ``offload`` strategy (for planning again when the host cannot hold it)."""
    options = layer.strategies()
    if OFFLOAD not in options:
        return layer
    return layer.model_copy(update={"recompute": {k: v for k, v in options.items() if k != OFFLOAD}})


def plan_offloads(plan: Plan) -> bool:
    """Whether some layer of the plan runs the ``offload`` strategy."""
    return any(s == OFFLOAD for stage in plan.stages for chunk in stage.chunks for s in chunk.layer_strategies())


def plan_host_bytes(plan: Plan, sim: SimResult) -> list[tuple[int, int, float]]:
    """Per pipeline rank: (offloaded layers, peak microbatches in flight, host bytes they need), the
    bytes being the layers' ``host_bytes`` times the simulated peak in flight (an upper bound with
    interleaved chunks)."""
    layers = plan.model.layers
    out = []
    for stage, result in zip(plan.stages, sim.stages):
        offloaded = [i for chunk in stage.chunks for i, s in zip(range(*chunk.layers), chunk.layer_strategies())
                     if s == OFFLOAD]
        inflight = result.peak_inflight_microbatches
        out.append((len(offloaded), inflight, inflight * sum(host_bytes(layers[i]) for i in offloaded)))
    return out


def plan_host_overflow(plan: Plan, sim: SimResult) -> str | None:
    """What a plan's offloaded activations need of host memory per device against what the host
    holds, when some pipeline rank's exceed it (``plan_host_bytes``). None when they fit, nothing is
    offloaded, or the device states no host memory."""
    capacity = host_memory_bytes(plan.cluster.device) if plan.cluster.device is not None else None
    if capacity is None:
        return None
    for stage, (count, inflight, need) in zip(plan.stages, plan_host_bytes(plan, sim)):
        if need > capacity:
            return (f"pipeline rank {stage.index} offloads the activations of {count} layers with "
                    f"{inflight} microbatches in flight: {_size(need)} of host "
                    f"memory per device, but the host holds {_size(capacity)} (device.host_memory_bytes)")
    return None


def _size(num_bytes: float) -> str:
    """GiB to one decimal, or MiB / bytes below 0.1 GiB."""
    if num_bytes >= 0.1 * 2**30:
        return f"{num_bytes / 2**30:.1f} GiB"
    return f"{num_bytes / 2**20:.1f} MiB" if num_bytes >= 0.1 * 2**20 else f"{num_bytes:.0f} B"
