"""PipeFill's Fill Job Executor: Algorithm 1 and the configuration choice (seed 000 L121-154).

Algorithm 1 (rebuilt in the reading, Sec. 2.2) replicates the fill job's linearized node chain
F while ``dur(F') + dur(F) < sum(B)`` (lines 3-7: k iterations per period, k = max(1,
ceil(sum B / dur F) - 1)), then walks the bubble cycle, putting the next nodes into bubble i
while ``dur(P') + dur(F[0]) < B[i]`` (strict) and ``mem(F[0]) <= M[i]`` (per node), one partition
per bubble, empty ones allowed (lines 10-18). The literal loop never ends when some node fits no
bubble; ``partition`` checks that first and raises ``InfeasibleError`` (each full cycle then places
at least one node, so the walk ends). The walk jumps over whole runs of nodes with prefix sums
and a binary search instead of moving one node at a time; the pieces are the same.

Node chains (reading Sec. 2.1, 2.3 [GAP]): inference runs each layer's forward; training runs
the forwards, the backwards in reverse and an optimizer step. A node's memory is its peak
footprint: the job's resident state (fp16 weights; for training Adam's 16 bytes per parameter,
or weights + gradients when the optimizer state is offloaded to the CPU) plus the activations
held at that point plus the node's output. Activation checkpointing keeps only each layer's
output and re-runs the forward inside the backward. Offload moves the optimizer step to the CPU:
gradients down and weights up over the host link. The configuration (batch size, checkpointing,
offload) with the highest throughput k b / (n T_iter) is chosen (L107, L125).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cost_models import compute
from planner.errors import InfeasibleError
from planner.schema import Device, ModelProfile
from planner.schema_fill import ExecutorPlan, FillBubble, FillMode, Piece


@dataclass(frozen=True, slots=True)
class NodeChain:
    """One fill-job iteration (one batch) as a chain of nodes under one configuration."""

    names: tuple[str, ...]
    duration_s: np.ndarray
    memory_bytes: np.ndarray
    samples: int
    flops: float
    """Useful FLOPs of one iteration (recomputation not counted)."""


@dataclass(frozen=True, slots=True)
class Config:
    batch_size: int
    checkpointing: bool = False
    offload: bool = False


def node_chain(profile: ModelProfile, mode: FillMode, config: Config, device: Device) -> NodeChain:
    """The linearized graph of one fill-job batch under ``config`` (see the module docstring)."""
    scale = config.batch_size / profile.microbatch_size
    layers = profile.layers
    f = [layer.forward_s * scale for layer in layers]
    act = [layer.strategies()["none"].activation_bytes * scale for layer in layers]
    out = [layer.output_bytes * scale for layer in layers]
    weights = math.fsum(layer.param_bytes for layer in layers)
    useful = math.fsum(_flops(layer, device) for layer in layers) * scale
    if mode == "inference":
        mem = [weights + a + o for a, o in zip(act, out)]
        return NodeChain(tuple(f"F:{x.name}" for x in layers), np.array(f), np.array(mem), config.batch_size,
                         useful / 3)
    static = math.fsum(layer.static_bytes for layer in layers)
    resident = 2 * weights if config.offload else static  # weights + grads on the GPU, Adam on the CPU
    kept = out if config.checkpointing else act
    held = list(itertools.accumulate(kept))
    names, dur, mem = [], [], []
    for j, layer in enumerate(layers):
        names.append(f"F:{layer.name}")
        dur.append(f[j])
        mem.append(resident + held[j] + out[j])
    for j in reversed(range(len(layers))):
        names.append(f"B:{layers[j].name}")
        dur.append(layers[j].backward_s * scale + (f[j] if config.checkpointing else 0.0))
        mem.append(resident + held[j] + (act[j] if config.checkpointing else 0.0) + out[j])
    names.append("optimizer")
    if config.offload:
        dur.append(2 * weights / (compute.host_link_bytes_per_s(device) or compute.memory_bandwidth_bytes_per_s(device)))
    else:
        dur.append(static / compute.memory_bandwidth_bytes_per_s(device))
    mem.append(resident)
    return NodeChain(tuple(names), np.array(dur), np.array(mem), config.batch_size, useful)


def _flops(layer, device: Device) -> float:  # noqa: ANN001 - LayerProfile
    if layer.flops is not None:
        return layer.flops
    # Measured profiles without FLOPs: count the time as work at half of peak (DEFAULT_EFFICIENCY).
    return (layer.forward_s + layer.backward_s) * device.peak_flops * 0.5


def check_fits(chain: NodeChain, durations_s: Sequence[float], memory_bytes: Sequence[float]) -> None:
    """The guard the literal Algorithm 1 lacks: every node must fit some bubble.

    Raises:
        InfeasibleError: names the first node that fits no bubble, its needs and the largest bubble.
    """
    b, m = np.asarray(durations_s), np.asarray(memory_bytes)
    fits = (chain.duration_s[:, None] < b[None, :]) & (chain.memory_bytes[:, None] <= m[None, :])
    bad = np.nonzero(~fits.any(axis=1))[0]
    if len(bad):
        j = int(bad[0])
        raise InfeasibleError(
            f"fill node {chain.names[j]!r} (batch {chain.samples}) needs {chain.duration_s[j]:.4g} s and "
            f"{chain.memory_bytes[j] / 1e9:.3g} GB, but no bubble has both (longest usable "
            f"{float(b.max(initial=0)):.4g} s, most free memory {float(m.max(initial=0)) / 1e9:.3g} GB); "
            "use a smaller batch size, activation checkpointing or offload, or a larger fill_fraction"
        )


def partition(chain: NodeChain, durations_s: Sequence[float], memory_bytes: Sequence[float]) -> tuple[int, list[tuple[int, int]]]:
    """Algorithm 1: k and the partitions P as [start, end) ranges of the replicated chain.

    Returns:
        (k, partitions), one partition per bubble visited, in visiting order (bubble i mod len(B)).

    Raises:
        InfeasibleError: a node fits no bubble (the literal algorithm would loop forever).
    """
    check_fits(chain, durations_s, memory_bytes)
    size, one = len(chain.names), float(chain.duration_s.sum())
    total_b = math.fsum(durations_s)
    k = 1
    if one > 0:
        k = max(1, math.ceil(total_b / one) - 1)
        while (k + 1) * one < total_b:  # float guard around the closed form (lines 4-6)
            k += 1
        while k > 1 and k * one >= total_b:
            k -= 1
    prefix = np.concatenate([[0.0], np.cumsum(chain.duration_s)])
    n_total, x, parts, i = k * size, 0, [], 0
    while x < n_total:
        end = _pack_one(chain, prefix, x, n_total, durations_s[i], memory_bytes[i])
        parts.append((x, end))
        x = end
        i = (i + 1) % len(durations_s)
    return k, parts


def _pack_one(chain: NodeChain, prefix: np.ndarray, x: int, n_total: int, budget_s: float, memory: float) -> int:
    """Largest y with every node in [x, y) within ``memory`` and dur([x, y)) < budget (strict)."""
    size, one = len(chain.names), float(prefix[-1])

    def cum(y: int) -> float:  # duration of the replicated chain's first y nodes
        return (y // size) * one + float(prefix[y % size])

    over = np.nonzero(chain.memory_bytes > memory)[0]
    limit = n_total
    if len(over):
        q, j = divmod(x, size)
        nxt = over[over >= j]
        limit = min(n_total, q * size + int(nxt[0]) if len(nxt) else (q + 1) * size + int(over[0]))
    base = cum(x)
    # cum is non-decreasing: the first y with cum(y) - base >= budget ends the partition before it
    first_over = bisect.bisect_left(range(x, limit + 1), True, key=lambda y: cum(y) - base >= budget_s)
    return x + first_over - 1 if first_over > 0 else x


def plan_config(chain: NodeChain, bubbles: Sequence[FillBubble], iteration_s: float) -> tuple[float, int, int, list[tuple[int, int]]]:
    """Throughput (samples/s), k, n and the partitions of one configuration on one bubble cycle."""
    durations = [b.usable_s for b in bubbles]
    memory = [b.free_memory_bytes for b in bubbles]
    k, parts = partition(chain, durations, memory)
    n = math.ceil(len(parts) / len(bubbles))
    return k * chain.samples / (n * iteration_s), k, n, parts


def plan_executor(
    job_id: str,
    stage: int,
    chains: Sequence[tuple[Config, NodeChain]],
    bubbles: Sequence[FillBubble],
    iteration_s: float,
) -> ExecutorPlan:
    """The configuration with the highest fill throughput and its pieces (L107, L125).

    Ties go to the earlier configuration in ``chains`` (smaller batch, no checkpointing, no offload).

    Raises:
        InfeasibleError: no configuration fits the stage's bubbles; the first (smallest)
            configuration's reason is kept.
    """
    if not bubbles:
        raise InfeasibleError(f"stage {stage} has no bubble to fill")
    best, error = None, None
    for config, chain in chains:
        try:
            result = plan_config(chain, bubbles, iteration_s)
        except InfeasibleError as e:
            error = error or e  # the smallest, most lenient configuration's reason
            continue
        if best is None or result[0] > best[1][0]:
            best = (config, result, chain)
    if best is None:
        raise InfeasibleError(f"fill job {job_id!r} fits no bubble of stage {stage}: {error}")
    config, (throughput, k, n, parts), chain = best
    return ExecutorPlan(
        job_id=job_id, stage=stage, batch_size=config.batch_size, checkpointing=config.checkpointing,
        offload=config.offload, num_iterations=k, num_cycles=n, nodes_per_iteration=len(chain.names),
        throughput_samples_per_s=throughput, flops_per_s=throughput * chain.flops / chain.samples,
        pieces=_pieces(chain, parts, len(bubbles)),
    )


def _pieces(chain: NodeChain, parts: list[tuple[int, int]], num_bubbles: int) -> tuple[Piece, ...]:
    size = len(chain.names)
    dur, mem = chain.duration_s, chain.memory_bytes
    out = []
    for index, (x, y) in enumerate(parts):
        if y == x:
            continue  # an empty partition: the bubble is skipped (Algorithm 1 allows it)
        full, (q0, j0), (q1, j1) = y - x >= size, divmod(x, size), divmod(y, size)
        if q0 == q1:
            seg_dur, seg_mem = float(dur[j0:j1].sum()), float(mem[j0:j1].max())
        else:  # wraps into the next iteration(s) of the fill job
            seg_dur = float(dur[j0:].sum() + (q1 - q0 - 1) * dur.sum() + dur[:j1].sum())
            seg_mem = float(mem.max() if full else max(mem[j0:].max(), mem[:j1].max(initial=0.0)))
        out.append(Piece(cycle=index // num_bubbles, bubble=index % num_bubbles, first_node=x, num_nodes=y - x,
                         duration_s=seg_dur, peak_memory_bytes=seg_mem))
    return tuple(out)
