"""Megatron-even baseline: equal layer counts per stage and chunk, uniform recompute.

Megatron-LM splits the transformer blocks evenly over the pipeline (dissertation ch. 4,
L3474-3482: "each device gets an equal number of layers") and applies one recompute setting
to every layer. This solver does the same: the embedding joins the first virtual stage, the
output head the last, the blocks are split as evenly as possible over p x v virtual stages,
and the recompute strategy is the cheapest uniform one whose simulated peak memory fits the
device (stage-ilp-spipe-bpipe.md §A.6.8, "Megatron-Even"). When the pipeline depth is not
given, the smallest depth that fits is used (PTD-P takeaway #2, L3897-3900).

With ``problem.bpipe`` (BPipe, seed 004; docs/bpipe.md) every candidate of 4 or more stages
gets ``plan.bpipe`` (pairs (s, p-1-s), target mu_opt), pair-adjacent ranks (seed L156-180) and
the appendix's link check; the simulator then runs the evictions and loads, so the recompute
strategy is chosen against the balanced memory.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cost_models import bpipe
from cost_models.memory import usable_memory_bytes
from planner.errors import InfeasibleError, InvalidProblemError
from planner.schema import BPipeSpec, ModelProfile, PipelineProblem, Plan, Stage
from solvers.common import (
    build_plan,
    even_split,
    lower_bound_is_exact,
    memory_lower_bound_bytes,
    memory_shortfall_message,
    resolve_layout,
    with_prediction,
)
from solvers.budget import Budget, report_phase, untried_note
from solvers.options import parse_options

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    recompute: str | None = None
    """Force this strategy on every layer that offers it, instead of the cheapest that fits."""


def solve(problem: PipelineProblem, *, options: Mapping[str, Any] | Options | None = None) -> Plan:
    """Plan an even split with the cheapest uniform recompute strategy that fits memory.

    Raises:
        InfeasibleError: no depth and strategy fit; the message gives the memory needed.
    """
    opts = parse_options(Options, options, solver="even")
    if problem.bpipe and problem.schedule not in bpipe.SUPPORTED_SCHEDULES:
        raise InvalidProblemError(
            f"bpipe balances the 1F1B and interleaved 1F1B schedules; schedule {problem.schedule!r} "
            "has no memory imbalance to balance or is not supported: use '1f1b' or 'interleaved-1f1b', or drop bpipe"
        )
    start = time.perf_counter()
    link_error: InfeasibleError | None = None
    strategies = _strategy_order(problem.model, opts)
    smallest_peak, from_bound = float("inf"), False
    layout_error: InvalidProblemError | None = None
    budget, depths = Budget.of(problem), _depth_candidates(problem)
    tried = 0
    for p in depths:
        if budget.stop_before(tried):
            break
        report_phase(f"{p} stages", tried, len(depths))
        tried += 1
        try:
            layout = resolve_layout(problem, p)
        except InvalidProblemError as e:
            if problem.num_stages is not None:
                raise
            layout_error = e  # this depth cannot split the batch; try the next one
            continue
        bounds = even_bounds(problem.model, p * layout.num_chunks)
        for strategy in strategies:
            per_layer = [strategy if strategy in layer.strategies() else "none" for layer in problem.model.layers]
            plan = build_plan(
                problem, layout, bounds=bounds, strategies=per_layer, solver="even",
                options={"recompute": opts.recompute} if opts.recompute else {},
            )
            try:
                plan, bpipe_notes = with_bpipe(plan) if problem.bpipe else (plan, ())
            except InfeasibleError as e:
                link_error = e  # the pair link is too slow for this configuration
                continue
            lower_bytes = memory_lower_bound_bytes(plan)
            if lower_bytes > usable_memory_bytes(problem.cluster.device):  # type: ignore[arg-type]
                if lower_bytes < smallest_peak:  # cannot fit: no need to simulate
                    smallest_peak, from_bound = lower_bytes, not lower_bound_is_exact(plan)
                continue
            plan, result = with_prediction(plan)
            if result.fits_memory:
                notes = (f"uniform recompute {strategy!r} on every layer that offers it", *bpipe_notes)
                return plan.model_copy(
                    update={"solve_time_s": time.perf_counter() - start, "notes": notes}
                )
            peak = max(s.peak_memory_bytes for s in result.stages)
            if peak < smallest_peak:
                smallest_peak, from_bound = peak, False
    if smallest_peak == float("inf") and layout_error is not None:
        raise InvalidProblemError(f"no pipeline depth can split the batch: {layout_error}")
    if smallest_peak == float("inf") and link_error is not None:
        raise link_error
    what = f"the even split of {problem.model.name}" + (
        f" on {problem.num_stages} stages" if problem.num_stages else " at every pipeline depth"
    )
    untried = untried_note(problem, tried=tried, total=len(depths), what="pipeline depths") if tried < len(depths) else ""
    if smallest_peak == float("inf") and untried:
        raise InfeasibleError(f"no even split found{untried}")
    raise InfeasibleError(memory_shortfall_message(problem, smallest_peak, what, at_least=from_bound) + untried)


def with_bpipe(plan: Plan) -> tuple[Plan, tuple[str, ...]]:
    """The plan with BPipe: pairs (s, p-1-s), target mu_opt, pair-adjacent ranks; and notes.

    Below 4 stages BPipe moves nothing (seed L100): the plan is returned without it, with a note.

    Raises:
        InfeasibleError: a pair link fails the appendix's relaxed bandwidth bound.
    """
    p, v = plan.degrees.pipeline, plan.degrees.virtual
    if p < 4:
        return plan, (f"bpipe: {p} stages hold at most mu_opt activation sets already (BPipe acts from "
                      "4 stages, [bpipe] Sec. 3.3); planned without it",)
    ranks = bpipe.pair_adjacent_ranks(p, data_parallel=plan.degrees.data, tensor_parallel=plan.degrees.tensor)
    stages = tuple(Stage(index=s.index, replicas=s.replicas, ranks=ranks[s.index], chunks=s.chunks)
                   for s in plan.stages)
    spec = BPipeSpec(pairs=bpipe.pairs(p), target_inflight=bpipe.optimal_inflight(p, num_chunks=v))
    plan = plan.model_copy(update={"stages": stages, "bpipe": spec})
    warnings = bpipe.check_link_bandwidth(plan)
    for warning in warnings:
        log.warning("%s", warning)
    note = (f"bpipe: pairs {[list(x) for x in spec.pairs]}, at most {spec.target_inflight} activation sets "
            "per evictor, pair-adjacent ranks")
    return plan, (note, *warnings)


def even_bounds(model: ModelProfile, num_parts: int) -> list[int]:
    """Virtual-stage boundaries: leading/trailing layers of other kinds (embedding, head) stay
    with the first/last part; the body layers are split as evenly as possible."""
    kinds = [layer.kind for layer in model.layers]
    body_kind, body_count = Counter(kinds).most_common(1)[0]
    lead = next(i for i, k in enumerate(kinds) if k == body_kind)
    trail = next(i for i, k in enumerate(reversed(kinds)) if k == body_kind)
    body = len(kinds) - lead - trail
    if body < num_parts or 2 * body_count < len(kinds):  # no dominant repeated block kind
        lead, trail, body = 0, 0, len(kinds)
    sizes = even_split(body, num_parts)
    bounds = [0]
    for size in sizes:
        bounds.append(bounds[-1] + size)
    bounds = [b + lead for b in bounds]
    bounds[0], bounds[-1] = 0, len(kinds)
    return bounds


def _strategy_order(model: ModelProfile, opts: Options) -> list[str]:
    """Uniform strategies from cheapest (least recompute time) to most memory-saving."""
    names = {name for layer in model.layers for name in layer.strategies()}
    if opts.recompute is not None:
        if opts.recompute not in names:
            raise InvalidProblemError(
                f"option recompute={opts.recompute!r}: no layer of {model.name} offers it; "
                f"choose from {sorted(names)}"
            )
        return [opts.recompute]

    def cost(name: str) -> tuple[float, float]:
        options = [layer.strategies().get(name) for layer in model.layers]
        extra = sum(o.extra_s for o in options if o is not None)
        memory = sum(o.activation_bytes for o in options if o is not None)
        return extra, memory

    return sorted(names, key=lambda n: (*cost(n), n))


def _depth_candidates(problem: PipelineProblem) -> list[int]:
    if problem.num_stages is not None:
        return [problem.num_stages]
    t = problem.model.tensor_parallel
    max_depth = min(problem.cluster.num_devices // t, problem.model.num_layers // problem.num_chunks)
    if max_depth < 1:
        raise InfeasibleError(
            f"tensor_parallel {t} exceeds the cluster's {problem.cluster.num_devices} devices; "
            f"use tensor_parallel <= {problem.cluster.num_devices}"
        )
    usable = problem.cluster.num_devices // t
    depths = [p for p in range(1, max_depth + 1) if usable % p == 0]
    if problem.schedule == "interleaved-1f1b" and problem.num_microbatches is not None:
        depths = [p for p in depths if problem.num_microbatches % p == 0] or depths
    return depths
