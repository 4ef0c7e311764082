"""AdaPipe baseline: per-stage recompute by knapsack plus a partitioning DP.

AdaPipe (Sun et al., ASPLOS'24, "Optimizing pipeline parallelism with adaptive recomputation
and partitioning"; cited by the poster, seed 002 L30 and ref. [6]) chooses recomputation per
stage so that each stage uses the memory it has, and partitions the layers so that stage times
balance. Its full text is not in our corpus (reading stage-ilp-spipe-bpipe.md §A.6.8 says so);
this is our statement of the idea, not its code:

1. For a candidate stage (layers [i, j) as virtual stage k on rank x, chunk c), the recompute
   knapsack picks the strategy counts with the least recompute time whose activations fit:
   static(i, j) + k_{c,x} act <= D / C, over the Pareto set of (act, recompute time) of the
   range's strategy assignments (``_partition.recompute_frontier``).
2. The partition minimizes the largest stage time F + B + R over contiguous partitions into
   p v parts (``_partition.partition_bounds``), each part timed with its own knapsack.

It optimizes recompute and imbalance (the poster's B_R and B_I) but not the warm-up term.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from planner.errors import InfeasibleError
from planner.schema import PipelineProblem, Plan
from solvers._partition import (
    cheapest_within,
    chunk_inflight,
    composition,
    compute_s,
    finish_plan,
    fixed_depth_model,
    inflight_trend,
    partition_bounds,
    recompute_frontier,
    static_bytes,
    strategies_of,
)
from solvers.common import memory_shortfall_message
from solvers.options import parse_options


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    """AdaPipe takes no options; the dataclass rejects unknown keys with the valid list."""


def solve(problem: PipelineProblem, *, options: Mapping[str, Any] | Options | None = None) -> Plan:
    """Partition with per-stage knapsack recompute at the problem's fixed depth.

    Raises:
        InvalidProblemError: no ``num_stages`` or an unsupported schedule.
        InfeasibleError: no partition fits memory even with the most memory-saving strategies.
    """
    parse_options(Options, options, solver="adapipe")
    began = time.perf_counter()
    model = fixed_depth_model(problem, "adapipe")
    types, share = model.types, model.capacity_bytes / model.num_chunks
    cache: dict[tuple[tuple[int, ...], int], tuple[float, tuple[tuple[int, ...], ...]] | None] = {}

    def knapsack(i: int, j: int, q: int) -> tuple[float, tuple[tuple[int, ...], ...]] | None:
        comp = composition(types, i, j)
        key = (comp, q)
        if key not in cache:
            budget = (share - static_bytes(types, comp)) / chunk_inflight(model, q)
            got = cheapest_within(recompute_frontier(types, comp), budget) if budget >= 0 else None
            cache[key] = None if got is None else (compute_s(types, comp) + got[0], got[1])
        return cache[key]

    def cost(i: int, j: int, q: int) -> float:
        got = knapsack(i, j, q)
        return math.inf if got is None else got[0]

    value, bounds = partition_bounds(model.num_layers, model.num_virtual, cost, part_trend=inflight_trend(model))
    if math.isinf(value):
        raise InfeasibleError(memory_shortfall_message(
            problem, _lightest_bytes(model), f"every AdaPipe partition of {problem.model.name} on {model.num_stages} stages"))
    choice = []
    for q in range(model.num_virtual):
        got = knapsack(bounds[q], bounds[q + 1], q)
        assert got is not None  # the DP only keeps feasible parts
        choice.append(got[1])
    return finish_plan(problem, model, bounds=bounds, strategies=strategies_of(types, bounds, choice), solver="adapipe",
                       options={}, notes=(f"largest stage time {value:.6g} s per microbatch (knapsack recompute)",),
                       began=began)


def _lightest_bytes(model: Any) -> float:
    """Peak memory of the most loaded chunk of an even split with the lightest strategies,
    scaled to a whole device (what the message reports as needed)."""
    types = model.types
    per_chunk = model.num_layers / model.num_virtual
    static = math.fsum(t.num_layers * t.static_bytes for t in types) / model.num_virtual
    act = math.fsum(t.num_layers * min(t.activation_bytes) for t in types) / model.num_layers * per_chunk
    return model.num_chunks * (static + chunk_inflight(model, 0) * act)
