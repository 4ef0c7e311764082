"""PipeDream-2BW's planner (Narayanan's dissertation Ch. 3, seed 001 L2255-2821, L3035-3077).

Equi-replicated pipelines (Sec. 3.2.3, L2426-2455): every stage gets the same number of blocks
and d replicas, d p = N workers. Following Algorithm 1 (L2561-2587) the planner sweeps

- depth p over the divisors of N with p <= number of layers, width d = N / p (L3004);
- microbatch size b (re-deriving a transformer's layer profile per b; a measured profile keeps
  its own b), keeping b d that divide the global batch B, m = B / (b d) gradient accumulation
  steps (L2649-2651);
- recompute none or full (the three executions of L2595-2605; p = 1 is the non-pipelined one);
- schedule 2BW (double-buffered weights, no flush; needs m >= p, L2282-2287 and L2310-2312) and
  Flush (1F1B with a pipeline flush, one weight version, L2392-2424);

ranks every configuration with the closed forms of ``solvers._pipedream_2bw_model`` (Sec. 3.3.3),
drops those whose memory exceeds the device and returns the fastest as a Plan. The whole sweep
is the plan's ``candidates`` table; ``predicted`` comes from the simulator.

2BW's semantics (L2306-2312, L2353-2390): microbatch k (1-based) of the run uses weight version
``weight_version(k, m)`` for its forward and backward pass, so the update of batch t + 1 uses the
gradient computed on W^(t-1) (a constant delay of one batch) and each worker keeps at most two
weight versions (``max_live_weight_versions``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from cost_models.memory import usable_memory_bytes
from cost_models.schedules import build_actions
from cost_models.transformer import ATTENTION_KINDS, decoder_backward_weight_flops, transformer_profile
from planner.errors import InfeasibleError, InvalidProblemError
from planner.schema import ModelProfile, PipelineProblem, Plan
from solvers.budget import Budget, out_of_time, untried_note
from solvers import _pipedream_2bw_model as cm
from solvers._pipedream_2bw_errors import batch_message, check_problem, memory_message
from solvers.common import Layout, build_plan, with_prediction
from solvers.even import even_bounds
from solvers.options import parse_options

log = logging.getLogger(__name__)

SOLVER = "pipedream-2bw"
DEFAULT_GLOBAL_BATCH_SIZE = 512
"""The chapter's GPT batch (L2903-2905), used when the problem gives neither batch nor m."""
_GIB = 2.0**30


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    schedules: str = "2bw,flush"
    """Comma-separated schedules to sweep, from ``2bw`` and ``flush``."""
    recompute: str = "auto"
    """``auto`` sweeps ``none`` and ``full`` (where layers offer it); ``none`` or ``full`` fixes it."""
    microbatch_sizes: str | None = None
    """Comma-separated microbatch sizes to try (default: powers of two up to max_microbatch_size)."""
    max_microbatch_size: int = 64
    """Largest microbatch size of the default list."""
    runtime_memory: str = "pipedream-2bw"
    """Resident bytes per parameter: ``pipedream-2bw`` (the chapter's runtime: fp32 main gradients
    and, for 2BW, an fp32 second version; 24 B with 2BW, 20 with Flush in mixed precision) or
    ``profile`` (the profile's static bytes, 16 B, plus a 16-bit second version)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One swept configuration with its closed-form throughput and memory."""

    schedule: str
    num_stages: int
    data_parallel: int
    microbatch_size: int
    num_microbatches: int
    recompute: str
    peak_memory_bytes: float
    fits: bool
    iteration_s: float
    samples_per_s: float
    microbatch_time_s: float
    bounds: tuple[int, ...] = ()
    """Stage boundaries (p + 1 layer indices) of this configuration's placement."""

    def rank_key(self) -> tuple[Any, ...]:
        """Fitting first, then fastest; ties: less memory, shallower, smaller b, no recompute."""
        return (not self.fits, -self.samples_per_s, self.peak_memory_bytes, self.num_stages,
                self.microbatch_size, self.recompute != "none", self.schedule)

    def row(self) -> dict[str, Any]:
        """The flat row of ``Plan.candidates``."""
        return {
            "schedule": self.schedule, "p": self.num_stages, "d": self.data_parallel, "b": self.microbatch_size,
            "m": self.num_microbatches, "recompute": self.recompute, "fits": self.fits,
            "peak_memory_gib": self.peak_memory_bytes / _GIB, "samples_per_s": self.samples_per_s,
            "iteration_s": self.iteration_s, "microbatch_time_s": self.microbatch_time_s,
        }


# --------------------------------------------------------------------------------------
# 2BW weight-version semantics (Sec. 3.2.1)
# --------------------------------------------------------------------------------------


def weight_version(microbatch: int, num_microbatches: int) -> int:
    """Weight version used by the forward and backward pass of a microbatch (L2306-2312).

    v(k) = max(floor((k - 1) / m) - 1, 0) for microbatch k, 1-based over the whole run; version
    v is the weights after v batch updates. The same on every stage.

    Raises:
        InvalidProblemError: k < 1 or m < 1.
    """
    if microbatch < 1 or num_microbatches < 1:
        raise InvalidProblemError(
            f"weight_version needs microbatch >= 1 (1-based) and num_microbatches >= 1; "
            f"got microbatch={microbatch}, num_microbatches={num_microbatches}"
        )
    return max((microbatch - 1) // num_microbatches - 1, 0)


def max_live_weight_versions(num_stages: int, num_microbatches: int, num_batches: int = 4) -> tuple[int, ...]:
    """Most weight versions each stage must hold at once when running 2BW's 1F1B order.

    Walks every stage's 1F1B action order over ``num_batches`` batches. A version is live while an
    in-flight microbatch (forward done, backward not) uses it, and the newest version (generated
    after the backward of a batch's last microbatch on that stage) is always live. The chapter
    states at most 2 when m >= p (L2289-2304).
    """
    m = num_microbatches
    actions = build_actions("2bw", num_stages=num_stages, num_microbatches=num_batches * m)
    out = []
    for rank in actions:
        in_flight: set[int] = set()
        newest, most = 0, 1
        for action in rank:
            k = action.microbatch + 1
            if action.kind == "F":
                in_flight.add(k)
            else:
                in_flight.discard(k)
                if k % m == 0:
                    newest = k // m
            live = {weight_version(j, m) for j in in_flight} | {newest}
            most = max(most, len(live))
        out.append(most)
    return tuple(out)


# --------------------------------------------------------------------------------------
# The sweep
# --------------------------------------------------------------------------------------


def solve(problem: PipelineProblem, *, options: Mapping[str, Any] | Options | None = None) -> Plan:
    """Sweep depth, width, microbatch size, recompute and schedule; return the fastest that fits.

    Raises:
        InvalidProblemError: a bad option or a problem field the planner cannot honour.
        InfeasibleError: no configuration splits the batch, or none fits device memory; the
            message says what would make it feasible.
    """
    opts = parse_options(Options, options, solver=SOLVER)
    start = time.perf_counter()
    schedules, recomputes = check_problem(problem, opts)
    profiles, profile_note = _profile_source(problem)
    sizes = _microbatch_sizes(problem, opts, fixed=profiles is None)
    batch = problem.global_batch_size
    if batch is None and problem.num_microbatches is None:
        batch = DEFAULT_GLOBAL_BATCH_SIZE
    derive = profiles or (lambda b: problem.model)
    element = _bytes_per_element(problem)

    @lru_cache(maxsize=None)
    def get_profile(b: int, schedule: str) -> ModelProfile:
        return cm.runtime_profile(derive(b), schedule, bytes_per_element=element, runtime_memory=opts.runtime_memory)

    budget = Budget.of(problem)
    candidates, skipped = _sweep(problem, get_profile, sizes, schedules, recomputes, batch, budget)
    pairs = len(depth_width_pairs(problem))
    untried = (untried_note(problem, tried=skipped["pairs_tried"], total=pairs, what="(depth, width) pairs")
               if skipped["pairs_tried"] < pairs else "")
    if not candidates:
        raise InfeasibleError(batch_message(problem, sizes, schedules, batch, skipped) + untried)
    candidates.sort(key=Candidate.rank_key)
    best = candidates[0]
    if not best.fits:
        raise InfeasibleError(memory_message(problem, get_profile, candidates) + untried)
    plan = _build(problem, get_profile(best.microbatch_size, best.schedule), best, opts)
    plan, _ = with_prediction(plan)
    notes = _notes(best, len(candidates), batch, profile_note, problem)
    plan = plan.model_copy(update={
        "status": "optimal", "candidates": tuple(c.row() for c in candidates), "notes": notes,
        "solve_time_s": time.perf_counter() - start,
    })
    return out_of_time(plan, problem, tried=skipped["pairs_tried"], total=pairs, what="(depth, width) pairs") if untried else plan


def depth_width_pairs(problem: PipelineProblem) -> list[tuple[int, int]]:
    """(p, d) pairs to sweep: the problem's num_stages / data_parallel when given, else every
    divisor p of the N = devices / t workers with p <= layers and d = N / p (L3004).

    Raises:
        InfeasibleError: no depth has enough layers (fewer layers than stages).
    """
    workers = problem.cluster.num_devices // problem.model.tensor_parallel
    num_layers = problem.model.num_layers
    if problem.num_stages is not None:
        depths = [problem.num_stages]
    elif problem.data_parallel is not None:
        depths = [max(1, workers // problem.data_parallel)]
    else:
        depths = [p for p in range(1, workers + 1) if workers % p == 0]
    pairs = [(p, problem.data_parallel or max(1, workers // p)) for p in depths if p <= num_layers]
    if not pairs:
        raise InfeasibleError(
            f"{problem.model.name} has {num_layers} layers but the pipeline would need {depths[0]} stages "
            f"(one layer each at least); give a larger data_parallel (at least "
            f"{math.ceil(workers / num_layers)}) or fewer devices"
        )
    return pairs


def evaluate(
    problem: PipelineProblem, model: ModelProfile, *, schedule: str, num_stages: int, data_parallel: int,
    num_microbatches: int, recompute: str,
) -> Candidate:
    """Closed-form throughput and memory of one configuration (``_pipedream_2bw_model``) on the
    better of two placements: the even split and the time-balanced one that fits memory
    (``placements``): fitting first, then faster, then less memory."""
    p, d, m = num_stages, data_parallel, num_microbatches
    capacity = usable_memory_bytes(problem.cluster.device) if problem.cluster.device else math.inf
    b = model.microbatch_size
    out = []
    for bounds in placements(model, p, recompute=recompute, schedule=schedule, num_microbatches=m,
                             capacity_bytes=capacity):
        terms = cm.stage_terms(model, problem.cluster, bounds, recompute=recompute, data_parallel=d,
                               tensor_parallel=model.tensor_parallel)
        memory = max(cm.stage_memory_bytes(terms, schedule, m))
        iteration = cm.iteration_time_s(terms, schedule, m)
        out.append(Candidate(
            schedule=schedule, num_stages=p, data_parallel=d, microbatch_size=b, num_microbatches=m,
            recompute=recompute, peak_memory_bytes=memory, fits=memory <= capacity, iteration_s=iteration,
            samples_per_s=b * d * m / iteration, microbatch_time_s=cm.time_per_microbatch_s(terms, m),
            bounds=tuple(bounds),
        ))
    # throughputs equal to 9 digits (the same split summed in another order) tie-break on memory
    return min(out, key=lambda c: (not c.fits, -float(f"{c.samples_per_s:.9g}"), c.peak_memory_bytes))


def placements(model: ModelProfile, num_stages: int, *, recompute: str, schedule: str, num_microbatches: int,
               capacity_bytes: float) -> list[list[int]]:
    """The placements ``evaluate`` compares: the even split (``solvers.even.even_bounds``: blocks
    split evenly, embedding and head with the first and last stage) and, when it differs and some
    split fits memory, the time-balanced one (``_pipedream_2bw_model.balanced_bounds``)."""
    even = even_bounds(model, num_stages)
    balanced = cm.balanced_bounds(model, num_stages, recompute=recompute, schedule=schedule,
                                  num_microbatches=num_microbatches, capacity_bytes=capacity_bytes)
    return [even] if balanced is None or balanced == even else [even, balanced]


def _sweep(
    problem: PipelineProblem, get_profile: Callable[[int, str], ModelProfile], sizes: list[int],
    schedules: list[str], recomputes: list[str], batch: int | None, budget: Budget,
) -> tuple[list[Candidate], dict[str, int]]:
    """Every valid configuration; ``skipped`` counts why others were left out (and
    ``pairs_tried`` the (p, d) pairs swept before ``budget`` was spent)."""
    out: list[Candidate] = []
    skipped = {"batch": 0, "m<p": 0, "pairs_tried": 0}
    for p, d in depth_width_pairs(problem):
        if budget.stop_before(len(out)):
            break
        skipped["pairs_tried"] += 1
        for b in sizes:
            if problem.num_microbatches is not None:
                m = problem.num_microbatches
                if batch is not None and batch != m * b * d:
                    skipped["batch"] += 1
                    continue
            elif batch is None or batch % (b * d):
                skipped["batch"] += 1
                continue
            else:
                m = batch // (b * d)
            offered = {name for layer in get_profile(b, schedules[0]).layers for name in layer.strategies()}
            for schedule in schedules:
                if schedule == "2bw" and m < p:
                    skipped["m<p"] += 1
                    continue
                model = get_profile(b, schedule)
                for r in (r for r in recomputes if r in offered):
                    out.append(evaluate(problem, model, schedule=schedule, num_stages=p, data_parallel=d,
                                        num_microbatches=m, recompute=r))
    return out, skipped


def _microbatch_sizes(problem: PipelineProblem, opts: Options, *, fixed: bool) -> list[int]:
    own = problem.model.microbatch_size
    if opts.microbatch_sizes is not None:
        try:
            sizes = sorted({int(x) for x in opts.microbatch_sizes.replace(" ", "").split(",") if x})
        except ValueError:
            sizes = []
        if not sizes or sizes[0] < 1:
            raise InvalidProblemError(
                f"option microbatch_sizes={opts.microbatch_sizes!r} of solver {SOLVER!r} must be positive "
                "integers separated by commas, e.g. 1,2,4,8")
        if fixed and sizes != [own]:
            raise InvalidProblemError(
                f"option microbatch_sizes={opts.microbatch_sizes!r}: the measured profile {problem.model.name!r} "
                f"fixes the microbatch size at {own}; use microbatch_sizes={own} or plan from a transformer config")
        return sizes
    if fixed:
        return [own]
    if opts.max_microbatch_size < 1:
        raise InvalidProblemError(
            f"option max_microbatch_size={opts.max_microbatch_size} of solver {SOLVER!r} must be at least 1")
    sizes = {2**i for i in range(opts.max_microbatch_size.bit_length()) if 2**i <= opts.max_microbatch_size}
    return sorted(sizes | ({own} if own <= opts.max_microbatch_size else set()))


def _bytes_per_element(problem: PipelineProblem) -> int:
    """Bytes of one weight in the profile's ``param_bytes``: the transformer's dtype; measured
    profiles (PipeDream's are fp32) count as fp32, i.e. without mixed-precision extras."""
    if problem.transformer is None:
        return 4
    return 4 if problem.transformer.dtype == "fp32" else 2


def _profile_source(problem: PipelineProblem) -> tuple[Callable[[int], ModelProfile] | None, str]:
    """A function re-deriving the layer profile at microbatch size b, or None when b is fixed.

    The efficiency is recovered from a decoder layer's weight-gradient time, which has no
    communication term; if the re-derived profile at the problem's b differs from the given one
    (a hand-edited profile), b stays fixed.
    """
    cfg, model, device = problem.transformer, problem.model, problem.cluster.device
    if cfg is None or device is None:
        return None, f"measured profile: microbatch size fixed at {model.microbatch_size}"
    t, b0 = model.tensor_parallel, model.microbatch_size
    decoder = next((layer for layer in model.layers if layer.kind == "decoder" and layer.backward_weight_s), None)
    if decoder is None or decoder.backward_weight_s is None:
        return None, "profile without a decoder layer: microbatch size fixed"
    kwargs: dict[str, float | str] = {}
    how = "per-operation compute model"
    if model.source.startswith("analytic:efficiency="):
        kwargs["efficiency"] = float(model.source.split("=", 1)[1])
    elif model.source != "analytic":
        flops = decoder_backward_weight_flops(cfg, microbatch_size=b0, tensor_parallel=t)
        kwargs["efficiency"] = min(1.0, flops / (device.peak_flops * decoder.backward_weight_s))
    if "efficiency" in kwargs:
        how = f"flat efficiency {kwargs['efficiency']:.3g}"

    @lru_cache(maxsize=None)
    def derive(b: int) -> ModelProfile:
        if b == b0:
            return model
        return transformer_profile(cfg, device=device, microbatch_size=b, tensor_parallel=t,
                                   intra_node_bytes_per_s=problem.cluster.intra_node_bytes_per_s, **kwargs)

    for attention in ATTENTION_KINDS:  # the kind the profile was built with (it sets activation bytes)
        again = transformer_profile(cfg, device=device, microbatch_size=b0, tensor_parallel=t, attention=attention,
                                    intra_node_bytes_per_s=problem.cluster.intra_node_bytes_per_s, **kwargs)
        if _same_profile(again, model):
            kwargs["attention"] = attention
            return derive, f"layer profile re-derived from {cfg.name} per microbatch size ({how}, {attention} attention)"
    return None, (f"the layer profile differs from {cfg.name}'s analytic one: microbatch size fixed at {b0}")


def _same_profile(a: ModelProfile, b: ModelProfile) -> bool:
    return len(a.layers) == len(b.layers) and all(
        _close(x.model_dump(), y.model_dump()) for x, y in zip(a.layers, b.layers))


def _close(x: Any, y: Any) -> bool:
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_close(x[k], y[k]) for k in x)
    if isinstance(x, float) and isinstance(y, float):
        return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-30)
    return bool(x == y)


def _build(problem: PipelineProblem, model: ModelProfile, best: Candidate, opts: Options) -> Plan:
    strategies = [best.recompute if best.recompute in layer.strategies() else "none" for layer in model.layers]
    layout = Layout(num_stages=best.num_stages, num_chunks=1, data_parallel=best.data_parallel,
                    tensor_parallel=model.tensor_parallel, microbatch_size=best.microbatch_size,
                    num_microbatches=best.num_microbatches)
    chosen = problem.model_copy(update={"model": model, "schedule": best.schedule})
    options = {k: getattr(opts, k) for k in ("schedules", "recompute", "microbatch_sizes", "max_microbatch_size",
                                             "runtime_memory")}
    return build_plan(chosen, layout, bounds=list(best.bounds), strategies=strategies,
                      solver=SOLVER, options={k: v for k, v in options.items() if v is not None})


def _notes(best: Candidate, num_rows: int, batch: int | None, profile_note: str,
           problem: PipelineProblem) -> tuple[str, ...]:
    semantics = (
        "2BW: microbatch k (1-based) uses weight version max(floor((k-1)/m) - 1, 0); updates apply the "
        "gradient of the previous batch (one-batch delay), 2 weight versions per worker"
        if best.schedule == "2bw" else "Flush: 1F1B with a pipeline flush per batch, one weight version "
        "(vanilla semantics)"
    )
    notes = [
        f"gradient accumulation steps: {best.num_microbatches} microbatches of {best.microbatch_size} per "
        f"pipeline and batch, {best.data_parallel} parallel pipelines of {best.num_stages} stages",
        semantics,
        f"closed-form model: {best.microbatch_time_s:.4g} s per microbatch, {best.iteration_s:.4g} s per batch, "
        f"peak {best.peak_memory_bytes / _GIB:.3g} GiB; {num_rows} configurations swept",
        profile_note,
    ]
    if problem.global_batch_size is None and problem.num_microbatches is None:
        notes.append(f"global batch defaulted to {batch} (the chapter's GPT batch); give --global-batch to change it")
    return tuple(notes)


__all__ = ["Candidate", "Options", "depth_width_pairs", "evaluate", "max_live_weight_versions", "placements",
           "solve", "weight_version"]
