"""Cost model of offloaded training: host links, pinned transfers, CPU optimizer, memory.

Implements the hardware side of SPipe (Ryu et al., seed 003; reading
shared/design/stage-ilp-spipe-bpipe.md Part B). Parameters, gradients and optimizer states live
in CPU memory (L47, L105-113); each stage's fp16 parameters stream to a GPU before it runs
(p_i), its accumulated gradients stream back after its last backward (g_i), and the CPU runs
the Adam step (o_i). The paper gives no formulas (reading B.6); the ones here are ours:

- host-device transfer: ``bytes / (link_bytes_per_s x pinned_efficiency)``; several GPUs behind
  one PCIe switch share one link (the simulator serializes their transfers on it);
- CPU optimizer step: ``num_params / cpu_optimizer_params_per_s`` per node, threads sharing the
  node's cores (a work-conserving pool, so one FIFO resource per node);
- CPU memory: 20 bytes per parameter (fp16 weight 2, fp16 gradient 2, fp32 gradient 4, fp32
  master 4, Adam m 4, v 4): seed 003 L39 "0.1 trillion ... 1.83 terabytes" = 1e11 x 20 B in TiB;
- GPU memory per GPU: two parameter buffers (prefetch double buffering, L101), two gradient
  buffers (accumulate + offload), one checkpoint per backward stage and microbatch (c_{i,k}^j is
  the input of b_{i,k}, kept on the GPU until its backward, L174, L186; AFAB keeps all J of them,
  Fig. 2, Fig. 8; activations never go to the CPU, L105), and the working set of recomputing one
  stage for one microbatch (per-layer full recompute inside the stage, artifact arguments.py).
  The forward pass keeps nothing else: the artifact runs every forward stage, the last one's
  logits and loss included, under ``torch.no_grad`` and recomputes the stage from its input in the
  backward (mcrl/spipe megatron/spipe/schedules/spipe_schedule.py and mobius_schedule.py).

Host parameters are not part of ``planner.schema.Cluster``; ``HostSpec`` carries them, read from
the cluster's ``device.host_link_bytes_per_s`` and an options mapping (key ``host``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from cost_models import compute
from planner.errors import InfeasibleError, InvalidProblemError
from planner.schema import Cluster, LayerProfile, ModelProfile

CPU_STATE_BYTES_PER_PARAM = 20
"""Seed 003 L39: 1e11 parameters need 1.83 TB (1e11 x 20 B = 1.82 TiB); BPipe L17 also says 20."""
GPU_PARAM_BYTES_PER_PARAM = 2
"""fp16/bf16 copy streamed to the GPU and fp16 gradient streamed back."""
ADAM_BYTES_PER_PARAM = 16
"""Static bytes of mixed-precision Adam in a layer profile (cost_models.transformer)."""
DEFAULT_CPU_OPTIMIZER_PARAMS_PER_S = 1.9e9
"""Calibrated from SPipe Fig. 15 CFG0 (artifact expected.csv, reading B.9): 19B (18.6e9 params by
our count) with a serialized post-flush step, 17525 - 7759 ms = 9.77 s non-overlapped CPU time on
one 32-core EPYC 7452 node -> 18.6e9 / 9.77 s = 1.9e9 params/s. Override with measured values."""
DEFAULT_CPU_MEMORY_BYTES = 512 * 2**30
"""SPipe Table 1 (L247-254): 8 x 64 GB DDR4 per node."""
DEFAULT_PINNED_EFFICIENCY = 0.8
"""Nominal fraction of the PCIe peak reached by pinned-memory copies (about 12.5 of 15.75 GB/s on
Gen3 x16); not from a seed."""
PAGEABLE_EFFICIENCY = 0.4
"""Nominal fraction for pageable (unpinned) copies, which go through a staging buffer."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HostSpec:
    """Host side of an offloading node (per node unless a name says otherwise)."""

    host_link_bytes_per_s: float
    """Peak bandwidth of one host-device link (PCIe), per direction."""
    gpus_per_host_link: int = 1
    """GPUs sharing one link behind a PCIe switch (1 = a full link per GPU, SPipe Table 1)."""
    pinned: bool = True
    pinned_efficiency: float = DEFAULT_PINNED_EFFICIENCY
    cpu_optimizer_params_per_s: float = DEFAULT_CPU_OPTIMIZER_PARAMS_PER_S
    """CPU Adam throughput of one node, all cores together (measured by a profiler, or the default)."""
    cpu_memory_bytes: float = DEFAULT_CPU_MEMORY_BYTES
    peer_over_host_link: bool = False
    """GPU peer copies and collectives inside a node travel over the host links (no NVLink, as in
    SPipe's Table 1 cluster): they then hold the sender's device-to-host and the receiver's
    host-to-device link and queue with parameter prefetches and gradient offloads."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the plan's ``options['offload']['host']``)."""
        return asdict(self)


def host_spec(cluster: Cluster, options: Mapping[str, Any] | None = None) -> HostSpec:
    """The host spec of a cluster, with overrides from ``options['host']`` (or flat keys).

    Args:
        cluster: the cluster; ``device.host_link_bytes_per_s`` gives the link bandwidth.
        options: a mapping that may hold a ``host`` dict with ``HostSpec`` fields.

    Returns:
        The validated spec.

    Raises:
        InvalidProblemError: no link bandwidth anywhere, an unknown key, or a value out of range.
    """
    given = dict((options or {}).get("host") or {})
    valid = [f.name for f in fields(HostSpec)]
    for key in given:
        if key not in valid:
            raise InvalidProblemError(f"unknown host option {key!r}; valid keys: {valid}")
    if "host_link_bytes_per_s" not in given:
        link = compute.host_link_bytes_per_s(cluster.device) if cluster.device is not None else None
        if link is None:
            raise InvalidProblemError(
                f"offloaded training needs the host-device link bandwidth, but cluster {cluster.name!r} "
                "gives none: set device.host_link_bytes_per_s in the cluster JSON (e.g. 15.75e9 for "
                "PCIe 3.0 x16) or pass option host={'host_link_bytes_per_s': ...}"
            )
        given["host_link_bytes_per_s"] = link
    spec = HostSpec(**given)
    _check_host(spec, cluster)
    return spec


def _check_host(spec: HostSpec, cluster: Cluster) -> None:
    for key in ("host_link_bytes_per_s", "cpu_optimizer_params_per_s", "cpu_memory_bytes"):
        value = getattr(spec, key)
        if not isinstance(value, (int, float)) or not value > 0:
            raise InvalidProblemError(f"host.{key}={value!r} must be a positive number")
    if not 0 < spec.pinned_efficiency <= 1:
        raise InvalidProblemError(f"host.pinned_efficiency={spec.pinned_efficiency} must be in (0, 1]")
    per_node = cluster.devices_per_node
    if spec.gpus_per_host_link < 1 or per_node % spec.gpus_per_host_link:
        raise InvalidProblemError(
            f"host.gpus_per_host_link={spec.gpus_per_host_link} must divide devices_per_node={per_node}"
        )


def effective_link_bytes_per_s(host: HostSpec) -> float:
    """Bandwidth one copy reaches on an otherwise idle link (pinned or pageable)."""
    efficiency = host.pinned_efficiency if host.pinned else PAGEABLE_EFFICIENCY
    return host.host_link_bytes_per_s * efficiency


def host_link_of(gpu: int, host: HostSpec) -> int:
    """Index of the host link a GPU sits behind; consecutive GPUs share a switch."""
    return gpu // host.gpus_per_host_link


def transfer_time_s(num_bytes: float, host: HostSpec) -> float:
    """One host-device copy of ``num_bytes`` over an idle link."""
    return num_bytes / effective_link_bytes_per_s(host)


def optimizer_step_time_s(num_params: float, host: HostSpec) -> float:
    """CPU Adam step over ``num_params`` parameters using all of a node's cores."""
    return num_params / host.cpu_optimizer_params_per_s


def layer_num_params(layer: LayerProfile) -> float:
    """Parameters of a layer, from its static bytes (16 per parameter) or its fp16 bytes.

    Raises:
        InvalidProblemError: the layer gives neither.
    """
    if layer.static_bytes > 0:
        return layer.static_bytes / ADAM_BYTES_PER_PARAM
    if layer.param_bytes > 0:
        return layer.param_bytes / GPU_PARAM_BYTES_PER_PARAM
    raise InvalidProblemError(
        f"layer {layer.name!r} gives neither static_bytes nor param_bytes; offloading needs the "
        "parameter count of every layer (static_bytes = 16 bytes per parameter)"
    )


def range_num_params(model: ModelProfile, layers: tuple[int, int]) -> float:
    """Parameters of the layers [first, last_exclusive)."""
    return sum(layer_num_params(model.layers[i]) for i in range(*layers))


def cpu_state_bytes(num_params: float) -> float:
    """CPU memory holding the model states of ``num_params`` parameters (20 B each, seed 003 L39)."""
    return CPU_STATE_BYTES_PER_PARAM * num_params


def check_cpu_memory(state_bytes_per_node: Sequence[float], host: HostSpec) -> None:
    """Raise when some node's CPU memory cannot hold the states placed on it.

    Raises:
        InfeasibleError: names the node, the bytes needed and the nodes that would suffice.
    """
    worst = max(range(len(state_bytes_per_node)), key=lambda n: state_bytes_per_node[n])
    need = state_bytes_per_node[worst]
    if need <= host.cpu_memory_bytes:
        return
    total = sum(state_bytes_per_node)
    nodes = math.ceil(total / host.cpu_memory_bytes)
    raise InfeasibleError(
        f"CPU memory too small for the model states: node {worst} must hold {need / 2**30:.1f} GiB "
        f"({CPU_STATE_BYTES_PER_PARAM} bytes per parameter: fp16 weight and gradient, fp32 gradient, "
        f"master weight and Adam moments) but has {host.cpu_memory_bytes / 2**30:.1f} GiB; the model "
        f"needs {total / 2**30:.1f} GiB in all: use at least {nodes} nodes, or set "
        "host.cpu_memory_bytes if the nodes have more"
    )


def layer_checkpoint_bytes(layer: LayerProfile) -> float:
    """Bytes a layer keeps per microbatch under full recompute (its input), else all it saves."""
    options = layer.strategies()
    chosen = options.get("full", options["none"])
    return chosen.activation_bytes


def layer_working_bytes(layer: LayerProfile) -> float:
    """Peak working set of one layer's recompute + backward: everything it saves without recompute."""
    return layer.strategies()["none"].activation_bytes


def stage_checkpoint_bytes(model: ModelProfile, layers: tuple[int, int]) -> float:
    """The checkpoint c_{i,k}^j of a backward stage for one microbatch: its input (seed 003 L186).

    Only the stage input crosses from the forward to the backward (L174); it is what the stage's
    first layer keeps under full recompute.
    """
    return layer_checkpoint_bytes(model.layers[layers[0]])


def stage_working_bytes(model: ModelProfile, layers: tuple[int, int]) -> float:
    """Working set of a backward stage for one microbatch, on top of its checkpoint.

    The stage is recomputed from its checkpoint with per-layer full recompute (artifact
    arguments.py: remap forces recompute-num-layers 1), so it holds the inputs of its other layers,
    and the layer being differentiated expands to everything it saves. A layer without a ``full``
    option (the head: logits and loss) is kept whole while its stage runs.
    """
    inner = [model.layers[i] for i in range(*layers)]
    kept = sum(layer_checkpoint_bytes(layer) for layer in inner[1:])
    expand = max(layer_working_bytes(layer) - layer_checkpoint_bytes(layer) for layer in inner)
    return kept + max(expand, 0.0)


def recompute_extra_s(layer: LayerProfile, strategy: str) -> float:
    """Time the backward adds to recompute the layer under ``strategy`` (0 when not offered)."""
    option = layer.strategies().get(strategy)
    return option.extra_s if option is not None else 0.0


def gpu_memory_bytes(
    model: ModelProfile,
    *,
    forward_layers: Sequence[tuple[int, int]],
    backward_layers: Sequence[tuple[int, int]],
    num_microbatches: int,
) -> float:
    """Peak GPU memory of one GPU of an offloaded pipeline: the larger of its two phases.

    Forward phase: two parameter buffers of its largest forward stage (prefetch double
    buffering, L101) and the checkpoints. Backward phase: two parameter and two gradient
    buffers of its largest backward stage (gradients exist only from a stage's backward to its
    offload, L105), the checkpoints and one stage's recompute working set. Both phases count
    every checkpoint of the GPU's backward stages, one per stage and microbatch (L186), so the
    sum is an upper bound of the peak at the forward-to-backward turn of AFAB.

    Args:
        model: the layer profile.
        forward_layers: layer ranges of the GPU's forward stages.
        backward_layers: layer ranges of the GPU's backward stages, one range per stage.
        num_microbatches: microbatches whose checkpoints live at once (all J under AFAB, Fig. 2,
            Fig. 8; 1 for ZeRO-style data parallelism, which finishes a microbatch first).

    Returns:
        max(2 P_fwd, 2 P_bwd + 2 G_bwd + working) + J x checkpoints, in bytes.
    """
    def fp16(layers: tuple[int, int]) -> float:
        return GPU_PARAM_BYTES_PER_PARAM * range_num_params(model, layers)

    forward = 2 * max((fp16(r) for r in forward_layers), default=0.0)
    buffers = 4 * max((fp16(r) for r in backward_layers), default=0.0)
    working = max((stage_working_bytes(model, r) for r in backward_layers), default=0.0)
    checkpoints = num_microbatches * sum(stage_checkpoint_bytes(model, r) for r in backward_layers)
    return max(forward, buffers + working) + checkpoints


# ------------------------------------------------------------------------------------------
# Stage layout and the placement rule (reading B.3, verified against Fig. 5 and the Fig. 8 caption)
# ------------------------------------------------------------------------------------------


def forward_gpu(stage: int, num_gpus: int) -> int:
    """GPU of forward stage i: ``i mod G`` (Mobius and SPipe, seed 003 L96-105, Fig. 8 caption)."""
    return stage % num_gpus


def spipe_backward_gpu(stage: int, num_gpus: int) -> int:
    """GPU of backward stage n = d i + k under decoupled assignment: ``(G - 1 - n) mod G``.

    Backward stages are dealt round-robin in reverse, so the first backward (the last stage)
    lands on GPU 0, which finished its forwards first (seed 003 L168-182, Fig. 5(c), Fig. 8).
    """
    return (num_gpus - 1 - stage) % num_gpus


def _core_range(model: ModelProfile) -> tuple[int, int]:
    """The decoder layers: an embedding first and a head last ride with their neighbours."""
    first = 1 if model.layers[0].kind == "embedding" and model.num_layers > 2 else 0
    last = model.num_layers - 1 if model.layers[-1].kind == "head" and model.num_layers - first > 1 else model.num_layers
    return first, last


def split_layers(model: ModelProfile, num_stages: int) -> tuple[tuple[int, int], ...]:
    """Contiguous layer ranges of ``num_stages`` stages with equal decoder counts (+-1).

    The embedding joins the first stage and the head the last (Megatron's split).

    Raises:
        InfeasibleError: more stages than decoder layers.
    """
    first, last = _core_range(model)
    if num_stages > last - first:
        raise InfeasibleError(
            f"{num_stages} stages need at least {num_stages} decoder layers; the model has {last - first}"
        )
    return _widen(_split(first, last, num_stages), 0, model.num_layers)


def _split(first: int, last: int, num_parts: int) -> tuple[tuple[int, int], ...]:
    base, extra = divmod(last - first, num_parts)
    bounds = [first]
    for part in range(num_parts):
        bounds.append(bounds[-1] + base + (1 if part < extra else 0))
    return tuple((bounds[i], bounds[i + 1]) for i in range(num_parts))


def _widen(parts: tuple[tuple[int, int], ...], first: int, last: int) -> tuple[tuple[int, int], ...]:
    """Stretch the first part down to ``first`` and the last up to ``last``."""
    out = list(parts)
    out[0] = (first, out[0][1])
    out[-1] = (out[-1][0], last)
    return tuple(out)


def split_backward(
    forward: Sequence[tuple[int, int]], num_sub: int, model: ModelProfile
) -> tuple[tuple[int, int], ...]:
    """Backward stages b_{i,k}: forward stage i cut into ``num_sub`` = d parts (seed 003 Eq. 1, L178).

    Backward stage n = d i + k covers part k of forward stage i, in model order.

    Raises:
        InfeasibleError: a forward stage has fewer decoder layers than d.
    """
    first, last = _core_range(model)
    out: list[tuple[int, int]] = []
    for a, b in forward:
        lo, hi = max(a, first), min(b, last)
        if hi - lo < num_sub:
            raise InfeasibleError(
                f"forward stage [{a}, {b}) has {hi - lo} decoder layers, fewer than the {num_sub} backward "
                "stages it should split into; use fewer backward stages per forward stage"
            )
        out.extend(_widen(_split(lo, hi, num_sub), a, b))
    return tuple(out)


def cross_gpu_checkpoints(
    forward_gpus: Sequence[int], backward_gpus: Sequence[int], num_sub: int
) -> int:
    """Checkpoint transfers per microbatch: backward stages on another GPU than their forward (L182)."""
    return sum(1 for n, gpu in enumerate(backward_gpus) if gpu != forward_gpus[n // num_sub])
