"""Closed-form cost model of PipeDream-2BW's planner (dissertation Sec. 3.3.3, seed 001 L2589-2821).

For one configuration (depth p, width d, microbatch size b, recompute r, m microbatches per
batch) the per-microbatch time of an equi-replicated pipeline is (L2675-2694, L2696-2726)

    t = max_i max( T^comp_i + T^comm_{i-1 -> i},  T^comm_i / m )

with T^comp_i the stage's forward + backward (+ recompute) time, T^comm_{i-1 -> i} = 2 x (one
activation transfer) charged to the receiving stage (L2743-2759, the factor 2 covers the gradient
sent back) and T^comm_i the ring all-reduce of the stage's gradients among its d replicas
(L2761-2781), at the intra-node bandwidth when the stage's d t ranks share a node and the
inter-node one otherwise (the chapter's B_high / B_low with "<=": d replicas that fill a server
still communicate inside it). The recompute overhead c_extra is not the chapter's constant 4/3 but each layer's
measured ``extra_s`` (the chapter allows a measured c_extra, L2698-2702; for the analytic
transformer profile it is one more forward, i.e. 4/3 when backward = 2 x forward).

- 2BW (no flush) runs one batch every m t seconds (throughput b d / t, per-GPU microbatch over t
  times the d parallel pipelines, L2728-2730).
- Flush adds the pipeline bubble, (p - 1)/m for identical stages (Ch. 4, L3518-3551); with
  unequal stages the fill and drain take sum_i t_i - max_i t_i, and the gradient all-reduce runs
  after the flush instead of overlapping the next batch:
  iteration = (m - 1) max_i t_i + sum_i t_i + max_i T^comm_i, with t_i = T^comp_i + T^comm_{i-1 -> i}.

Memory per device of stage s (0-based), consistent with the simulator (``cost_models.simulate``):

    static_s (weights + gradients + optimizer state) [+ weights_s for 2BW's second version]
    + min(p - s, m) x activations_s(r)              (1F1B in-flight microbatches, L2314-2322)
    + [with recompute] the activations re-materialized during one backward: the largest
      recomputed layer's full activations less what it keeps anyway

The chapter checkpoints only the stage input and re-materializes the whole stage, |A^total(b)| / p
(L2324-2331, L2809-2821); the profiles' ``full`` strategy keeps every layer's input (per-layer
checkpointing, as Megatron-LM), so the backward re-materializes one layer at a time.

The chapter's MEMORY(.) counts weights only (2|W|/p); it omits gradients and optimizer state,
which are real for Adam (L3197-3201), so ``static_bytes`` of the profile is used instead, plus
what the chapter's runtime keeps on top of it (``runtime_profile``): its Megatron-LM-based FP16
optimizer keeps fp32 main gradients next to the fp16 ones, and 2BW's second weight version is a
copy of the fp32 main weights (msr-fiddle/pipedream, ``megatron/optimizer``): 24 bytes per
parameter with 2BW, 20 with Flush, against the profile's 16 (+ 2 for a 16-bit second version).

Placement (``balanced_bounds``): the chapter gives every stage B/p blocks (L2729-2737), which
ignores the embedding and, above all, the LM head on the last stage (the logits GEMM and the
cross-entropy cost 2V/(24h + 4s) blocks: 2.1 blocks for h = 1920, V = 51200, s = 512). Its planner
measured every configuration end to end, so a stage that is slower by a whole head shows in its
numbers; ours places layers by time instead: the contiguous split into p stages that minimizes
the slowest stage's compute among those whose every stage fits memory (the min-max partition of
PipeDream's optimizer, dissertation Sec. 2.4.1), as Megatron-LM's uneven first/last pipeline
stages do.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

from cost_models.compute import profile_optimizer_step_s
from cost_models.collectives import ranks_allreduce_s
from planner.schema import Cluster, ModelProfile
from solvers._partition import parametric_partition

SCHEDULES = ("2bw", "flush")
RUNTIME_MEMORY = ("pipedream-2bw", "profile")
MAIN_GRAD_BYTES_PER_PARAM = 4.0
"""fp32 main gradients of the chapter's runtime (Megatron-LM's FP16 optimizer allocates an fp32
``grad`` for every fp32 main weight once and keeps it)."""
STASHED_VERSION_BYTES_PER_PARAM = 4.0
"""2BW's second weight version: a copy of the fp32 main weights, from which the fp16 model
weights are refreshed when a microbatch needs the other version."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StageTerms:
    """Per-stage inputs of the closed forms, index = stage."""

    compute_s: tuple[float, ...]
    """T^comp_i: forward + backward + recompute of one microbatch."""
    comm_in_s: tuple[float, ...]
    """T^comm_{i-1 -> i}: activation in and gradient back (0 for the first stage)."""
    allreduce_s: tuple[float, ...]
    """T^comm_i: ring all-reduce of the stage's gradients over its d replicas."""
    static_bytes: tuple[float, ...]
    weight_bytes: tuple[float, ...]
    """One copy of the stage's weights (2BW's second version)."""
    activation_bytes: tuple[float, ...]
    """Bytes kept per in-flight microbatch under the recompute strategy."""
    working_bytes: tuple[float, ...]
    """Activations re-materialized at once: the largest recomputed layer's full activations
    less what it keeps anyway (0 without recompute)."""

    @property
    def num_stages(self) -> int:
        return len(self.compute_s)


def stage_terms(
    model: ModelProfile,
    cluster: Cluster,
    bounds: Sequence[int],
    *,
    recompute: str,
    data_parallel: int,
    tensor_parallel: int,
) -> StageTerms:
    """The closed-form terms of every stage of an equi-replicated pipeline.

    Args:
        bounds: p + 1 layer indices; stage x holds layers [bounds[x], bounds[x+1]).
        recompute: the strategy applied to every layer that offers it (others keep ``none``).
        data_parallel: d, the replicas of every stage.
        tensor_parallel: t, devices per stage replica (ranks are stage-major, see
            ``solvers.common.stage_ranks``), used to find the links.
    """
    p, d, t = len(bounds) - 1, data_parallel, tensor_parallel
    compute, comm, allreduce, static, weights, act, work = [], [], [], [], [], [], []
    for x in range(p):
        own = model.layers[bounds[x] : bounds[x + 1]]
        names = [recompute if recompute in layer.strategies() else "none" for layer in own]
        chosen = [layer.strategies()[name] for layer, name in zip(own, names)]
        full = [layer.strategies()["none"].activation_bytes for layer in own]
        compute.append(math.fsum(layer.forward_s + layer.backward_s + o.extra_s for layer, o in zip(own, chosen)))
        act.append(math.fsum(o.activation_bytes for o in chosen))
        work.append(max((f - o.activation_bytes for f, o, n in zip(full, chosen, names) if n != "none"), default=0.0))
        static.append(math.fsum(layer.static_bytes for layer in own))
        # the Adam step after the reduction, as the simulator charges it
        optimizer = profile_optimizer_step_s(model.source, static[-1], cluster.device) if cluster.device else 0.0
        params = math.fsum(layer.param_bytes for layer in own)
        weights.append(params)
        base = x * d * t  # tensor rank 0 of replica 0 of stage x
        if x == 0:
            comm.append(0.0)
        else:
            bandwidth, latency = cluster.link(base - d * t, base)
            comm.append(2 * (latency + model.layers[bounds[x] - 1].output_bytes / bandwidth))
        if d > 1 and params > 0:
            # bwdth_cross-pipeline(d) (L2769-2781): the simulator's collective over the d replicas
            # (collectives.ranks_allreduce_s: NCCL ring/tree in a node, hierarchical across nodes)
            allreduce.append(ranks_allreduce_s(cluster, params, [base + j * t for j in range(d)]) + optimizer)
        else:
            allreduce.append(optimizer)
    return StageTerms(
        compute_s=tuple(compute), comm_in_s=tuple(comm), allreduce_s=tuple(allreduce),
        static_bytes=tuple(static), weight_bytes=tuple(weights), activation_bytes=tuple(act),
        working_bytes=tuple(work),
    )


def runtime_profile(model: ModelProfile, schedule: str, *, bytes_per_element: int,
                    runtime_memory: str = "pipedream-2bw") -> ModelProfile:
    """The layer profile with the resident bytes of the runtime the plan runs on.

    ``pipedream-2bw`` (the chapter's runtime, mixed precision: ``bytes_per_element`` < 4): every
    layer's ``static_bytes`` gains the fp32 main gradients (4 B per parameter) and, for 2BW, what
    its fp32 second version holds beyond the 16-bit one that ``stage_memory_bytes`` and the
    simulator count (4 - e bytes): 16 + 4 + 4 = 24 B per parameter with 2BW, 20 with Flush.
    fp32 training (``bytes_per_element`` 4) and ``profile`` keep the profile as it is.
    """
    if runtime_memory == "profile" or bytes_per_element >= 4:
        return model
    assert runtime_memory == "pipedream-2bw", runtime_memory
    version = STASHED_VERSION_BYTES_PER_PARAM - bytes_per_element if schedule == "2bw" else 0.0
    per_byte = (MAIN_GRAD_BYTES_PER_PARAM + version) / bytes_per_element  # extra bytes per byte of 16-bit weights
    layers = tuple(layer.model_copy(update={"static_bytes": layer.static_bytes + per_byte * layer.param_bytes})
                   for layer in model.layers)
    return model.model_copy(update={"layers": layers, "source": model.source})


def balanced_bounds(model: ModelProfile, num_stages: int, *, recompute: str, schedule: str, num_microbatches: int,
                    capacity_bytes: float) -> list[int] | None:
    """Stage boundaries minimizing the slowest stage's compute (forward + backward + recompute)
    among the contiguous splits whose every stage fits ``capacity_bytes`` under
    ``stage_memory_bytes``; None when no split fits."""
    p, m = num_stages, num_microbatches
    names = [recompute if recompute in layer.strategies() else "none" for layer in model.layers]
    chosen = [layer.strategies()[name] for layer, name in zip(model.layers, names)]
    time_s = _prefix([la.forward_s + la.backward_s + o.extra_s for la, o in zip(model.layers, chosen)])
    fixed = _prefix([la.static_bytes + (la.param_bytes if schedule == "2bw" else 0.0) for la in model.layers])
    act = _prefix([o.activation_bytes for o in chosen])
    work = _RangeMax([la.strategies()["none"].activation_bytes - o.activation_bytes if name != "none" else 0.0
                      for la, o, name in zip(model.layers, chosen, names)])

    n, last = len(model.layers), p - 1

    def fits(i: int, j: int, q: int) -> bool:
        return fixed[j] - fixed[i] + min(p - q, m) * (act[j] - act[i]) + work.max(i, j) <= capacity_bytes

    def cost(i: int, j: int, q: int) -> float:
        return time_s[j] - time_s[i] if fits(i, j, q) else math.inf

    # A range costs no more on a later stage (fewer in-flight microbatches), so the parametric
    # min-max search (``solvers._partition``) partitions the chain from its last layer: position
    # (i, j, q) of the reversed chain is layers [n - j, n - i) on stage last - q.
    lowest_start: dict[tuple[int, int], int] = {}

    def first_fitting(end: int, stage: int) -> int:
        """The smallest start whose range up to ``end`` fits memory on ``stage`` (end if none);
        memory grows as the start moves back, so every later start fits too."""
        key = (end, stage)
        if key not in lowest_start:
            lo, hi = 0, end  # hi: fits or is the sentinel
            while lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if fits(mid, end, stage) else (mid + 1, hi)
            lowest_start[key] = hi
        return lowest_start[key]

    def largest_end(first: int, stop: int, q: int, limit: float) -> int:
        end, stage, floor = n - first, last - q, n - stop  # original range [k, end), k >= floor
        k = max(bisect.bisect_left(time_s, time_s[end] - limit, floor, end - 1), floor)
        while k > floor and time_s[end] - time_s[k - 1] <= limit:  # exact comparisons near the bisection
            k -= 1
        while k < end - 1 and time_s[end] - time_s[k] > limit:
            k += 1
        if time_s[end] - time_s[k] > limit:
            return first
        if not fits(k, end, stage):  # memory binds before time: its frontier (cached per end and stage)
            k = first_fitting(end, stage)
        return n - k if k < end else first

    value, bounds = parametric_partition(n, p, lambda i, j, q: cost(n - j, n - i, last - q), largest_end=largest_end)
    return [n - b for b in reversed(bounds)] if math.isfinite(value) else None


class _RangeMax:
    """max(values[i:j]) in O(1) (sparse table); 0 for an empty range."""

    def __init__(self, values: Sequence[float]) -> None:
        self.rows = [list(values)]
        width = 1
        while 2 * width <= len(values):
            prev = self.rows[-1]
            self.rows.append([max(prev[k], prev[k + width]) for k in range(len(prev) - width)])
            width *= 2

    def max(self, i: int, j: int) -> float:
        if j <= i:
            return 0.0
        level = (j - i).bit_length() - 1
        row = self.rows[level]
        return max(row[i], row[j - (1 << level)])


def _prefix(values: Sequence[float]) -> list[float]:
    out = [0.0]
    for v in values:
        out.append(out[-1] + v)
    return out


def time_per_microbatch_s(terms: StageTerms, num_microbatches: int) -> float:
    """The chapter's t: max over stages of max(compute + incoming transfers, all-reduce / m)."""
    return max(
        max(c + k, a / num_microbatches)
        for c, k, a in zip(terms.compute_s, terms.comm_in_s, terms.allreduce_s)
    )


def iteration_time_s(terms: StageTerms, schedule: str, num_microbatches: int) -> float:
    """Seconds per batch of m microbatches on every pipeline (see the module docstring)."""
    m = num_microbatches
    if schedule == "2bw":
        return m * time_per_microbatch_s(terms, m)
    assert schedule == "flush", schedule
    per_stage = [c + k for c, k in zip(terms.compute_s, terms.comm_in_s)]
    return (m - 1) * max(per_stage) + math.fsum(per_stage) + max(terms.allreduce_s)


def stage_memory_bytes(terms: StageTerms, schedule: str, num_microbatches: int) -> tuple[float, ...]:
    """Peak bytes per device of every stage (see the module docstring)."""
    p, m = terms.num_stages, num_microbatches
    out = []
    for s in range(p):
        versions = terms.weight_bytes[s] if schedule == "2bw" else 0.0
        inflight = min(p - s, m)
        out.append(
            terms.static_bytes[s] + versions + inflight * terms.activation_bytes[s] + terms.working_bytes[s]
        )
    return tuple(out)
