"""Partitioning pieces shared by the baselines of the stage-ILP (reading stage-ilp-spipe-bpipe.md §A.6.8).

- ``partition_bounds``: the min-max dynamic program over contiguous partitions of a layer chain
  into a fixed number of parts, where a part's cost may depend on its position (its in-flight
  count): best[q][j] = min_i max(best[q-1][i], cost(i, j, q)) (PipeDream's bottleneck objective,
  dissertation L1237-1245, for a fixed depth and one replica per stage).
- ``recompute_frontier``: the per-stage recompute knapsack (AdaPipe, ASPLOS'24: per-stage
  recompute chosen to use the memory a stage has): over the layers of a range, the Pareto set
  of (activation bytes, recompute time) of all strategy assignments; layers of one type are
  interchangeable, so an assignment is a count per (type, strategy).
- ``pipedream_fixed``: the benchmark's "pipedream" baseline, the bottleneck partition for the
  problem's fixed p with one uniform recompute strategy (the cheapest whose partition fits);
  the registered ``pipedream`` solver chooses its own depth and replication instead.

Memory of a part on rank x, chunk c: static bytes + k_{c,x} x activation bytes, where k_{c,x} is
the chunk's peak in-flight count in the schedule's action order (``_stage_ilp_model``); with
C > 1 chunks each chunk gets 1/C of the device memory (a conservative split).
"""

from __future__ import annotations

import bisect
import itertools
import math
import struct
import sys
import time
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

from planner.errors import InfeasibleError, InvalidProblemError
from planner.schema import PipelineProblem, Plan
from solvers._stage_ilp_model import LayerType, StageModel, build_model
from solvers.common import build_plan, memory_shortfall_message, resolve_layout, with_prediction

Frontier = tuple[tuple[float, float, tuple[tuple[int, ...], ...]], ...]
"""(activation bytes, recompute seconds, counts per type and strategy), bytes ascending, time descending."""


def partition_bounds(num_layers: int, num_parts: int, cost: Callable[[int, int, int], float], *,
                     part_trend: str | None = None) -> tuple[float, list[int]]:
    """Min over contiguous partitions into non-empty parts of the largest part cost.

    Args:
        cost: cost(i, j, q) of layers [i, j) as part q; ``math.inf`` when they cannot be part q.
            It must not decrease when the range grows at a fixed q (true of time plus a memory
            check: a subset of a part that fits also fits, and takes no longer).

    Returns:
        (value, bounds) with bounds[0] = 0, bounds[-1] = num_layers; value inf if none is feasible.
        Ties go to the smallest last boundary at every step (deterministic).

    With ``part_trend`` ("increasing" or "decreasing": how a range's cost moves with the part
    index q) long chains use ``parametric_partition`` instead (same optimum, its own tie-break).

    For each (q, j) the last part [i, j) is found by bisection: with G(i) the smallest prefix
    value over [i, j) (nondecreasing in i, from a sparse table) and C(i) = cost(i, j, q)
    (non-increasing), min_i max(prev(i), C(i)) = min_i max(G(i), C(i)) lies where G and C
    cross. With N layers this takes O(P N log N) part costs instead of O(P N^2).
    """
    if part_trend is not None and num_layers * num_parts > _DP_CELLS:
        return parametric_partition(num_layers, num_parts, cost, part_trend=part_trend)
    inf = math.inf
    best = [[inf] * (num_layers + 1) for _ in range(num_parts + 1)]
    arg = [[0] * (num_layers + 1) for _ in range(num_parts + 1)]
    best[0][0] = 0.0
    for q in range(1, num_parts + 1):
        left = num_parts - q  # parts still to come need a layer each
        prev = best[q - 1]
        table = _min_table(prev)
        for j in range(q, num_layers - left + 1):
            best[q][j], arg[q][j] = _best_last_part(prev, table, q - 1, j, q - 1, cost)
    value = best[num_parts][num_layers]
    if math.isinf(value):
        return value, []
    bounds = [num_layers]
    for q in range(num_parts, 0, -1):
        bounds.append(arg[q][bounds[-1]])
    return value, bounds[::-1]


_DP_CELLS = 4096
"""Above this many (layer, part) cells ``partition_bounds`` uses the parametric search."""


def parametric_partition(num_layers: int, num_parts: int, cost: Callable[[int, int, int], float], *,
                         part_trend: str = "increasing",
                         largest_end: Callable[[int, int, int, float], int] | None = None) -> tuple[float, list[int]]:
    """The same optimum as ``partition_bounds`` in O(64 P log N) part costs, for long chains.

    Parametric search (Frederickson's scheme for min-max partitioning): whether every part can
    cost at most V is decided greedily, each part taking the most layers whose cost stays <= V
    (optimal for costs that grow with the range: the greedy boundaries are never behind those of
    any feasible partition). V* is the smallest feasible V; it is a part cost, found by bisection
    over the ordered bit patterns of non-negative floats (at most 64 steps), exactly. Ties go to
    the greedy partition at V* (parts as long as possible from the front), which is deterministic
    but may differ from the DP's choice among equally good partitions.

    The greedy argument needs a range to cost no less at a later part than at an earlier one
    (``part_trend="increasing"``, greedy from the first layer); with ``"decreasing"`` (e.g. 1F1B's
    memory: early stages hold more microbatches) the chain is partitioned from its last layer.

    ``largest_end(first, last, q, limit)``, optional (increasing trend only), answers the greedy's
    question directly: the largest end in [first + 1, last] with cost(first, end, q) <= limit, or
    ``first`` if there is none; a caller with prefix sums answers it by bisection on them, far
    cheaper than the ~log N cost calls of the generic search (same answer for monotone costs).
    """
    if part_trend == "decreasing":
        assert largest_end is None, "largest_end is for the increasing trend (reverse the chain yourself)"
        n, last = num_layers, num_parts - 1
        value, bounds = parametric_partition(num_layers, num_parts, lambda i, j, q: cost(n - j, n - i, last - q))
        return value, [n - b for b in reversed(bounds)]
    feasible, _ = _greedy(num_layers, num_parts, cost, sys.float_info.max, largest_end)
    if feasible is None:
        return math.inf, []
    hi = _max_part(feasible, cost)
    lo_bits, hi_bits = -1, _bits(hi)  # lo: known infeasible (below 0.0 for the first step)
    best = feasible
    while hi_bits - lo_bits > 1:
        mid_bits = (lo_bits + hi_bits) // 2
        bounds, next_limit = _greedy(num_layers, num_parts, cost, _float(mid_bits), largest_end)
        if bounds is None:
            # every limit below next_limit runs this same failing greedy: skip to just below it
            lo_bits = max(mid_bits, min(_bits(next_limit), hi_bits) - 1)
        else:
            best, hi_bits = bounds, _bits(_max_part(bounds, cost))
    return _float(hi_bits), best


def _greedy(n: int, parts: int, cost: Callable[[int, int, int], float], limit: float,
            largest_end: Callable[[int, int, int, float], int] | None = None) -> tuple[list[int] | None, float]:
    """The bounds of the greedy partition whose parts all cost <= limit, or None if there is none,
    and, when there is none, the smallest limit at which one of its parts would take one more layer
    (every limit below it fails the same way; inf if no limit helps)."""
    bounds, grow = [0], math.inf
    for q in range(parts):
        first, last = bounds[-1], n - (parts - q - 1)  # leave a layer for each part still to come
        if first >= last:
            return None, grow
        if largest_end is not None:
            end = largest_end(first, last, q, limit)
        elif cost(first, first + 1, q) > limit:
            end = first
        else:
            end, b = first + 1, last
            while end < b:
                mid = (end + b + 1) // 2
                if cost(first, mid, q) <= limit:
                    end = mid
                else:
                    b = mid - 1
        if end < last:
            grow = min(grow, cost(first, end + 1, q))
        if end <= first:
            return None, grow
        bounds.append(end)
    return (bounds, grow) if bounds[-1] == n else (None, grow)


def _max_part(bounds: list[int], cost: Callable[[int, int, int], float]) -> float:
    return max(cost(bounds[q], bounds[q + 1], q) for q in range(len(bounds) - 1))


def _bits(value: float) -> int:
    """Non-negative floats in order as integers."""
    return int(struct.unpack("<q", struct.pack("<d", max(value, 0.0)))[0])


def _float(bits: int) -> float:
    return float(struct.unpack("<d", struct.pack("<q", max(bits, 0)))[0])


def _min_table(values: list[float]) -> list[list[float]]:
    """Sparse table: table[k][i] = min(values[i : i + 2**k])."""
    table = [values]
    width = 1
    while 2 * width <= len(values):
        row = table[-1]
        table.append([min(row[i], row[i + width]) for i in range(len(values) - 2 * width + 1)])
        width *= 2
    return table


def _range_min(table: list[list[float]], lo: int, hi: int) -> float:
    """min(values[lo:hi]) for lo < hi."""
    k = (hi - lo).bit_length() - 1
    return min(table[k][lo], table[k][hi - (1 << k)])


def _best_last_part(prev: list[float], table: list[list[float]], lo: int, j: int, part: int,
                    cost: Callable[[int, int, int], float]) -> tuple[float, int]:
    """min over lo <= i < j of max(prev[i], cost(i, j, part)), smallest i on ties."""
    if cost(j - 1, j, part) == math.inf or _range_min(table, lo, j) == math.inf:
        return math.inf, 0  # every longer last part costs at least as much, or no prefix is feasible
    # smallest i in [lo, j) with cost(i) <= G(i): G rises and cost falls with i
    a, b = lo, j - 1
    while a < b:
        mid = (a + b) // 2
        if cost(mid, j, part) <= _range_min(table, mid, j):
            b = mid
        else:
            a = mid + 1
    value = max(_range_min(table, a, j), cost(a, j, part))
    if a > lo:
        value = min(value, max(_range_min(table, a - 1, j), cost(a - 1, j, part)))
    if value == math.inf:
        return math.inf, 0
    # the smallest i attaining it: its part must cost at most `value`, so i >= the first such i
    a, b = lo, j - 1
    while a < b:
        mid = (a + b) // 2
        if cost(mid, j, part) <= value:
            b = mid
        else:
            a = mid + 1
    for i in range(a, j):
        if prev[i] <= value:
            return value, i
    raise AssertionError("the minimum is attained")  # pragma: no cover


def composition(types: tuple[LayerType, ...], i: int, j: int) -> tuple[int, ...]:
    """Layers of each type in the range [i, j): a range is costed by its composition only, so
    the repeated layers of a type are grouped (the partition DPs' caches key on it)."""
    out = []
    for t in types:
        end = t.first + t.num_layers
        lo, hi = (i if i > t.first else t.first), (j if j < end else end)
        out.append(hi - lo if hi > lo else 0)
    return tuple(out)


@lru_cache(maxsize=4096)
def _type_frontier(t: LayerType, n: int) -> Frontier:
    r = len(t.strategies)
    points = []
    for split in itertools.combinations(range(n + r - 1), r - 1):  # stars and bars: counts summing to n
        edges = (-1, *split, n + r - 1)
        counts = tuple(edges[a + 1] - edges[a] - 1 for a in range(r))
        act = math.fsum(c * b for c, b in zip(counts, t.activation_bytes))
        extra = math.fsum(c * e for c, e in zip(counts, t.extra_s))
        points.append((act, extra, (counts,)))
    return _prune(points)


def _prune(points: list[tuple[float, float, tuple[tuple[int, ...], ...]]]) -> Frontier:
    points.sort(key=lambda p: (p[0], p[1]))
    out: list[tuple[float, float, tuple[tuple[int, ...], ...]]] = []
    for point in points:
        if not out or point[1] < out[-1][1]:
            out.append(point)
    return tuple(out)


@lru_cache(maxsize=65536)
def recompute_frontier(types: tuple[LayerType, ...], comp: tuple[int, ...]) -> Frontier:
    """Pareto set of (activation bytes, recompute time) over strategy counts for a composition."""
    front: Frontier = ((0.0, 0.0, ()),)
    for t, n in zip(types, comp):
        own = _type_frontier(t, n) if n else ((0.0, 0.0, (tuple(0 for _ in t.strategies),)),)
        front = _prune([(a1 + a2, e1 + e2, c1 + c2) for a1, e1, c1 in front for a2, e2, c2 in own])
    return front


def cheapest_within(front: Frontier, budget_bytes: float) -> tuple[float, tuple[tuple[int, ...], ...]] | None:
    """Least recompute time whose activation bytes fit the budget, with its counts; None if none."""
    pos = bisect.bisect_right([p[0] for p in front], budget_bytes * (1 + 1e-12)) - 1
    if pos < 0:
        return None
    return front[pos][1], front[pos][2]


def chunk_inflight(model: StageModel, k: int) -> int:
    """Peak in-flight count of virtual stage k's chunk on its rank."""
    p = model.num_stages
    return max(vec[k // p] for vec in model.inflight[k % p])


def inflight_trend(model: StageModel) -> str | None:
    """How the part costs of the baselines move with the part index: they depend on it only
    through the chunk's in-flight count (more in flight, less memory per microbatch), so
    "decreasing" when the counts never rise over the virtual stages (1F1B: p - s), "increasing"
    when they never fall, else None (``partition_bounds`` then runs the DP)."""
    counts = [chunk_inflight(model, k) for k in range(model.num_virtual)]
    if all(a >= b for a, b in zip(counts, counts[1:])):
        return "decreasing"
    if all(a <= b for a, b in zip(counts, counts[1:])):
        return "increasing"
    return None


def static_bytes(types: tuple[LayerType, ...], comp: tuple[int, ...]) -> float:
    return math.fsum(n * t.static_bytes for n, t in zip(comp, types))


def compute_s(types: tuple[LayerType, ...], comp: tuple[int, ...]) -> float:
    return math.fsum(n * (t.forward_s + t.backward_s) for n, t in zip(comp, types))


def strategies_of(types: tuple[LayerType, ...], bounds: list[int], choice: list[tuple[tuple[int, ...], ...]]) -> list[str]:
    """Per-layer strategies from per-part counts (the most recompute first within each type run)."""
    out: list[str] = []
    for per_type in choice:
        for t, counts in zip(types, per_type):
            for name, c in zip(t.strategies, counts):
                out.extend([name] * c)
    assert len(out) == bounds[-1]
    return out


def finish_plan(problem: PipelineProblem, model: StageModel, *, bounds: list[int], strategies: list[str], solver: str,
                options: dict[str, Any], notes: tuple[str, ...], began: float) -> Plan:
    """Build, simulate and check a baseline's plan.

    Raises:
        InfeasibleError: the simulated peak memory exceeds the device.
    """
    plan = build_plan(problem, model.layout, bounds=bounds, strategies=strategies, solver=solver, options=options,
                      notes=notes)
    plan, result = with_prediction(plan)
    if not result.fits_memory:
        peak = max(s.peak_memory_bytes for s in result.stages)
        raise InfeasibleError(memory_shortfall_message(problem, peak, f"the {solver} plan on {model.num_stages} stages"))
    return plan.model_copy(update={"solve_time_s": time.perf_counter() - began})


def fixed_depth_model(problem: PipelineProblem, solver: str) -> StageModel:
    """The stage model of a problem with a fixed depth (the baselines need ``num_stages``).

    Raises:
        InvalidProblemError: no depth given or a schedule the baselines do not model.
    """
    if problem.num_stages is None:
        raise InvalidProblemError(
            f"solver {solver!r} partitions for a fixed pipeline depth; give num_stages (--pipeline P)")
    return build_model(problem, resolve_layout(problem, problem.num_stages), strategies=None)


def pipedream_fixed(problem: PipelineProblem, options: Mapping[str, Any] | None = None) -> Plan:
    """PipeDream-style bottleneck partition at the problem's p with one uniform strategy.

    Strategies are tried from the least recompute time (as ``even``); the first whose
    memory-constrained min-max partition exists is returned.

    Raises:
        InfeasibleError: no uniform strategy admits a partition that fits.
    """
    began = time.perf_counter()
    model = fixed_depth_model(problem, "pipedream-fixed")
    types, num_k = model.types, model.num_virtual
    share = model.capacity_bytes / model.num_chunks
    names = sorted({s for t in types for s in t.strategies},
                   key=lambda s: (sum(t.num_layers * t.extra_s[t.strategies.index(s)] for t in types if s in t.strategies), s))
    for name in names:
        pick = [t.strategies.index(name) if name in t.strategies else t.strategies.index("none") for t in types]

        cache: dict[tuple[tuple[int, ...], int], float] = {}  # ranges of one composition cost the same

        def cost(i: int, j: int, q: int, pick: list[int] = pick,
                 cache: dict[tuple[tuple[int, ...], int], float] = cache) -> float:
            comp = composition(types, i, j)
            key = (comp, chunk_inflight(model, q))
            if key not in cache:
                act = math.fsum(n * t.activation_bytes[s] for n, t, s in zip(comp, types, pick))
                if static_bytes(types, comp) + key[1] * act > share:
                    cache[key] = math.inf
                else:
                    cache[key] = compute_s(types, comp) + math.fsum(n * t.extra_s[s] for n, t, s in zip(comp, types, pick))
            return cache[key]

        value, bounds = partition_bounds(model.num_layers, num_k, cost, part_trend=inflight_trend(model))
        if math.isinf(value):
            continue
        strategies = [types[next(a for a, t in enumerate(types) if t.first <= i < t.first + t.num_layers)].strategies[
            pick[next(a for a, t in enumerate(types) if t.first <= i < t.first + t.num_layers)]] for i in range(bounds[-1])]
        return finish_plan(problem, model, bounds=bounds, strategies=strategies, solver="pipedream-fixed",
                           options={"recompute": name}, notes=(f"bottleneck partition, uniform recompute {name!r}",),
                           began=began)
    raise InfeasibleError(
        f"no uniform recompute strategy gives a bottleneck partition of {problem.model.name} on {model.num_stages} "
        "stages that fits device memory (each chunk gets 1/C of the device); use more stages or a larger device")
