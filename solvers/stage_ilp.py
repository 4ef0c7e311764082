"""The ``stage-ilp`` solver: one ILP over layer-to-stage/chunk assignment and per-layer recompute.

Implements the holistic planner of the poster (seed 002, Algorithm 1, L57-78: layer types x
recompute strategies x chunks x stages, objective B_G = B_R + B_I + B_P under C1-C3) with the
concrete linear formulation of shared/design/stage-ilp-spipe-bpipe.md Sec. A.6
(``_stage_ilp_model`` states it, ``_stage_ilp_milp`` builds it):

1. Phase 1 (pre-computation): layer types are runs of identical layers of the profile; per
   (type, strategy) the forward, backward, recompute time, static and activation bytes; per
   rank the in-flight count vectors of the schedule's action order.
2. Phase 2-3: the MILP, solved by HiGHS through PuLP (default) or CP-SAT (``engine=cpsat``),
   warm-started from the best of the baselines (even, pipedream-fixed, merak, adapipe), under
   ``problem.time_limit_s`` (status ``time_limit`` with the gap in the notes).
3. Re-ranking: the ILP optimum and the baselines are simulated and improved by a local search
   in the simulator (``_stage_ilp_search``): the modelled time only estimates the simulated one.
4. Phase 4: the plan of the fastest simulated candidate (recomputed layers first in a chunk).

Options: ``terms`` (``tri`` = all three bubble terms, ``dual`` = B_R + B_I), ``engine``,
``strategies`` (e.g. ``none,full`` for the two-strategy variant), ``warm_start``, ``rerank``
(simulations spent re-ranking, 0 returns the ILP optimum), ``mip_gap``, ``ilp_time_s``,
``budget_s``. With ``problem.bpipe`` (BPipe, seed 004) the memory rows use the balanced own and
foreign counts plus the pair-link rows, candidates are simulated with their evictions and
loads, and the plan gets ``bpipe``, pair-adjacent ranks and the link check's notes.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cost_models.memory import usable_memory_bytes
from planner.errors import InfeasibleError, InvalidProblemError, PlannerError
from planner.schema import KNOWN_RECOMPUTE, PipelineProblem, Plan, recompute_modules_of
from solvers import _stage_ilp_milp as milp
from solvers._stage_ilp_model import (
    TERMS,
    Counts,
    StageModel,
    build_model,
    counts_from_plan,
    fits,
    model_constant,
    modelled_time_s,
)
from solvers._stage_ilp_model import objective as model_objective
from solvers._stage_ilp_model import plan_layers
from solvers._stage_ilp_search import Search
from solvers.budget import Budget, quiet, report_phase
from solvers.common import bpipe_would_apply, build_plan, format_bytes, resolve_layout, with_prediction
from solvers.options import parse_options

log = logging.getLogger(__name__)
ENGINES = ("highs", "cpsat")


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    terms: str = "tri"
    """``tri``: B_R + B_I + B_P (the modelled iteration time); ``dual``: B_R + B_I."""
    engine: str = "highs"
    """``highs`` (HiGHS through PuLP) or ``cpsat`` (OR-Tools CP-SAT)."""
    strategies: str | None = None
    """Comma-separated recompute strategies the plan may use (e.g. ``none,full``); default all."""
    warm_start: bool = True
    """Run the baselines, start the MILP from the best and re-rank them with its optimum."""
    rerank: int = 200
    """Simulations spent choosing the plan by simulated time (0: return the ILP optimum)."""
    mip_gap: float = 1e-4
    """Optimality gap, relative to the modelled iteration time, at which the MILP stops."""
    ilp_time_s: float = 6.0
    """MILP time limit when the problem gives no ``time_limit_s`` (the tri objective's bound
    closes slowly with HiGHS; the best plan found is returned with status ``time_limit``)."""
    budget_s: float = 9.0
    """Wall-clock target of one depth's whole solve (baselines, MILP, re-ranking): the MILP gets
    at most what is left after 2 s reserved for re-ranking and the final simulation (issue 4:
    every benchmark row under 10 s)."""


def solve(problem: PipelineProblem, *, options: Mapping[str, Any] | Options | None = None) -> Plan:
    """Plan stages, chunks and per-layer recompute with the stage ILP.

    Without ``num_stages`` every depth the cluster allows is solved and the highest simulated
    throughput wins.

    Raises:
        InvalidProblemError: a bad option, or a schedule the ILP does not model.
        InfeasibleError: no plan fits memory; the message gives the smallest per-device memory
            any plan needs and what gets there (more stages, full recompute, BPipe).
    """
    opts = _check(parse_options(Options, options, solver="stage-ilp"))
    budget = Budget.of(problem)
    if problem.num_stages is not None:
        return solve_depth(problem, problem.num_stages, opts, budget=budget)
    best: Plan | None = None
    error: PlannerError | None = None
    depths = _depths(problem)
    skipped: list[int] = []
    for index, p in enumerate(depths):
        if best is not None and budget.spent():
            skipped = depths[index:]
            break
        report_phase(f"{p} stages", index, len(depths))
        try:
            plan = solve_depth(problem, p, opts, budget=budget.share(len(depths) - index))
        except PlannerError as e:
            error = e
            continue
        assert plan.predicted is not None
        if best is None or plan.predicted.throughput_samples_per_s > best.predicted.throughput_samples_per_s:  # type: ignore[union-attr]
            best = plan
    if best is None:
        assert error is not None
        raise error
    if skipped:
        note = (f"time_limit_s={problem.time_limit_s} spent before depths {skipped} were searched; the best plan of "
                f"depths {depths[: len(depths) - len(skipped)]} is returned")
        best = best.model_copy(update={"status": "time_limit", "notes": (*best.notes, note)})
    return best


def _check(opts: Options) -> Options:
    if opts.terms not in TERMS:
        raise InvalidProblemError(f"option terms={opts.terms!r} of solver 'stage-ilp'; choose from {list(TERMS)}")
    if opts.engine not in ENGINES:
        raise InvalidProblemError(f"option engine={opts.engine!r} of solver 'stage-ilp'; choose from {list(ENGINES)}")
    if opts.rerank < 0 or not 0 <= opts.mip_gap < 1 or opts.ilp_time_s <= 0 or opts.budget_s <= 0:
        raise InvalidProblemError(
            f"options rerank={opts.rerank}, mip_gap={opts.mip_gap}, ilp_time_s={opts.ilp_time_s}, "
            f"budget_s={opts.budget_s} of solver 'stage-ilp': rerank must be >= 0, mip_gap in [0, 1), "
            "ilp_time_s and budget_s > 0")
    return opts


def _depths(problem: PipelineProblem) -> list[int]:
    usable = problem.cluster.num_devices // problem.model.tensor_parallel
    limit = min(usable, problem.model.num_layers // problem.num_chunks)
    return [p for p in range(1, limit + 1) if usable % p == 0] or [1]


def _strategies(problem: PipelineProblem, opts: Options) -> list[str] | None:
    if opts.strategies is None:
        return None
    names = [s.strip() for s in opts.strategies.split(",") if s.strip()]
    offered = {s for layer in problem.model.layers for s in layer.strategies()}
    unknown = [s for s in names if s not in offered]
    if unknown or not names:
        raise InvalidProblemError(
            f"option strategies={opts.strategies!r}: {unknown or 'empty'} not offered by {problem.model.name}; "
            f"choose from {sorted(offered)}, comma-separated")
    return names


def solve_depth(problem: PipelineProblem, num_stages: int, opts: Options, *, budget: Budget | None = None) -> Plan:
    """The stage-ILP plan at one pipeline depth (see the module docstring), within ``budget``
    (default: ``problem.time_limit_s`` from now)."""
    began = time.perf_counter()
    budget = budget or Budget.of(problem)
    layout = resolve_layout(problem, num_stages)
    model = build_model(problem, layout, strategies=_strategies(problem, opts))
    left_s = budget.left_s()  # the baselines draw on the same budget (their own searches stop at it)
    fixed = problem.model_copy(update={"num_stages": num_stages,
                                       "time_limit_s": None if left_s is None else max(left_s, 1e-9)})
    report_phase(f"{num_stages} stages: baselines (even, pipedream-fixed, merak, adapipe)")
    seeds = _baseline_seeds(fixed, model, budget) if opts.warm_start else []
    form = milp.formulate(model, opts.terms)
    start = None
    if seeds:
        warm = min(seeds, key=lambda s: model_objective(model, s[1], opts.terms))[1]
        start = milp.start_values(model, form, warm)
    left = budget.left_s()
    total_s = left + (time.perf_counter() - began) if left is not None else opts.budget_s
    cap_s = total_s if left is not None else opts.ilp_time_s
    spent = time.perf_counter() - began  # the baselines and the model build took part of it
    limit = max(min(cap_s, total_s - min(2.0, total_s / 4)) - spent, 0.05)  # leave time to re-rank
    report_phase(f"{num_stages} stages: MILP ({opts.engine}, at most {limit:.0f} s)")
    result = milp.solve_milp(model, form, engine=opts.engine, time_limit_s=limit,
                             mip_gap=opts.mip_gap, start=start, offset=model_constant(model))
    if result.status == "infeasible" or (result.counts is None and not seeds):
        raise InfeasibleError(infeasible_message(problem, model, result.status, opts, budget=budget))
    candidates = list(seeds)
    if result.counts is not None:
        assert fits(model, result.counts), "the MILP's memory rows are exact; a misfit is a formulation bug"
        candidates.insert(0, ("ilp", result.counts))
    rerank_s = max(total_s - 0.5 - (time.perf_counter() - began), 0.05)
    search = Search(model, max_simulations=max(opts.rerank, len(candidates)), time_budget_s=min(rerank_s, 2.0),
                    evaluate=_bpipe_evaluator(problem, model) if model.bpipe_split is not None else None)
    report_phase(f"{num_stages} stages: re-ranking by simulation")
    best = search.run(candidates) if opts.rerank else candidates[0][1]
    if math.isinf(search.simulated.get(best, 0.0)):
        raise InfeasibleError(
            f"every stage-ilp plan of {problem.model.name} on {num_stages} stages with BPipe overflows memory in "
            "simulation or fails the pair-link check ([bpipe] App. B); use more stages, full recompute, or a "
            "faster link between paired stages")
    return _finish(problem, model, best, search, result, opts, began)


def _attach_bpipe(plan: Plan) -> Plan:
    """The plan with BPipe's pairs (s, p-1-s), target mu_opt and pair-adjacent ranks (seed 004 L79-98, L156-180)."""
    from cost_models import bpipe
    from planner.schema import BPipeSpec

    p, v = plan.degrees.pipeline, plan.degrees.virtual
    ranks = bpipe.pair_adjacent_ranks(p, data_parallel=plan.degrees.data, tensor_parallel=plan.degrees.tensor)
    stages = tuple(s.model_copy(update={"ranks": ranks[s.index]}) for s in plan.stages)
    spec = BPipeSpec(pairs=bpipe.pairs(p), target_inflight=bpipe.optimal_inflight(p, num_chunks=v))
    return plan.model_copy(update={"stages": stages, "bpipe": spec})


def _bpipe_evaluator(problem: PipelineProblem, model: StageModel) -> Callable[[Counts], float]:
    """Simulated time of a BPipe candidate with its evictions and loads; inf if it overflows
    memory in simulation or its pair link fails the appendix's relaxed bound."""
    from cost_models import bpipe
    from cost_models.simulate import simulate

    def evaluate(counts: Counts) -> float:
        bounds, strategies = plan_layers(model, counts)
        plan = _attach_bpipe(build_plan(problem, model.layout, bounds=bounds, strategies=strategies,
                                        solver="stage-ilp", options={}))
        try:
            bpipe.check_link_bandwidth(plan)
        except InfeasibleError:
            return math.inf
        result = simulate(plan, include_events=False, include_bubbles=False)  # ranks by time and memory only
        return result.iteration_time_s if result.fits_memory else math.inf

    return evaluate


def _baseline_seeds(problem: PipelineProblem, model: StageModel, budget: Budget) -> list[tuple[str, Counts]]:
    """Plans of the baselines that fit, as counts (warm start and re-ranking seeds); once the
    budget is spent no further baseline starts (the first always runs)."""
    from solvers import _partition, adapipe, even, merak

    out: list[tuple[str, Counts]] = []
    for index, (name, run) in enumerate((("even", even.solve), ("pipedream-fixed", _partition.pipedream_fixed),
                                         ("merak", merak.solve), ("adapipe", adapipe.solve))):
        if budget.stop_before(index):
            log.info("time limit spent: baseline %s and later ones give no warm start", name)
            break
        try:
            with quiet():
                plan = run(problem)
        except PlannerError as e:
            log.info("baseline %s gives no warm start: %s", name, e)
            continue
        chunks = plan.virtual_stages()
        bounds = [c.layers[0] for c in chunks] + [chunks[-1].layers[1]]
        strategies = [s for c in chunks for s in c.layer_strategies()]
        counts = counts_from_plan(model, bounds, strategies)
        if counts is not None and fits(model, counts):
            out.append((name, counts))
    return out


def _finish(problem: PipelineProblem, model: StageModel, best: Counts, search: Search, result: milp.MilpResult,
            opts: Options, began: float) -> Plan:
    bounds, strategies = plan_layers(model, best)
    status = "time_limit" if result.status in ("time_limit", "no_solution") else "optimal"
    notes = [f"ILP ({opts.engine}, terms={opts.terms}): status {result.status}, objective {result.objective:.6g}, "
             f"gap {result.gap:.3g}"]
    if result.counts is not None:
        notes.append(f"ILP optimum: modelled {modelled_time_s(model, result.counts):.6g} s, simulated "
                     f"{search.simulated.get(result.counts, math.nan):.6g} s")
    notes.append(f"returned plan ({search.source.get(best, 'ilp')}): modelled {modelled_time_s(model, best):.6g} s, "
                 f"chosen by simulation among {len(search.simulated)} plans")
    plan = build_plan(problem, model.layout, bounds=bounds, strategies=strategies, solver="stage-ilp",
                      options=_plan_options(opts), status=status, notes=notes)
    if problem.bpipe:
        from solvers.even import with_bpipe

        plan, bpipe_notes = with_bpipe(plan)  # below 4 stages: no BPipe, with a note
        plan = plan.model_copy(update={"notes": (*plan.notes, *bpipe_notes)})
    plan, sim = with_prediction(plan)
    assert sim.fits_memory, "every re-ranked plan passed the exact in-flight memory check"
    table = search.table()
    if result.counts in search.simulated and all(c != result.counts for c, _, _ in table):
        table.append((result.counts, search.simulated[result.counts], "ilp"))  # always report the ILP's own plan
    rows = tuple({"rank": i, "source": src, **_shape(model, c), "modelled_time_s": modelled_time_s(model, c),
                  "simulated_time_s": t} for i, (c, t, src) in enumerate(table))
    return plan.model_copy(update={"solve_time_s": time.perf_counter() - began, "candidates": rows})


def _shape(model: StageModel, counts: Counts) -> dict[str, str]:
    """What tells candidates apart in the table: layers per virtual stage and recomputed layers."""
    bounds, strategies = plan_layers(model, counts)
    spans = list(zip(bounds, bounds[1:]))
    recomputed = ["+".join(f"{strategies[a:b].count(s)}{_label(s)}" for s in sorted(set(strategies[a:b]) - {"none"}))
                  or "0" for a, b in spans]
    return {"layers": "-".join(str(b - a) for a, b in spans), "recompute": "-".join(recomputed)}


def _label(strategy: str) -> str:
    """A strategy in the candidate table: its initial (s, f, o), a module set in brackets
    (``[layernorm+mlp]``: initials would not tell ``layernorm`` from ``layernorm+mlp``)."""
    module_set = strategy not in KNOWN_RECOMPUTE and recompute_modules_of(strategy) is not None
    return f"[{strategy}]" if module_set else strategy[0]


def _plan_options(opts: Options) -> dict[str, Any]:
    return {"terms": opts.terms, "engine": opts.engine, "strategies": opts.strategies, "warm_start": opts.warm_start,
            "rerank": opts.rerank, "mip_gap": opts.mip_gap, "ilp_time_s": opts.ilp_time_s,
            "budget_s": opts.budget_s}


def min_memory_bytes(problem: PipelineProblem, num_stages: int, strategies: list[str] | None, *,
                     bpipe_on: bool | None = None, time_limit_s: float = 30.0) -> float:
    """The smallest per-device peak memory of any plan at a depth (the min-memory MILP); with
    BPipe (default ``problem.bpipe``) by its balanced own + foreign counts."""
    model = build_model(problem, resolve_layout(problem, num_stages), strategies=strategies, bpipe_on=bpipe_on)
    form = milp.formulate(model, "tri", min_memory=True)
    got = milp.solve_milp(model, form, engine="highs", time_limit_s=time_limit_s, mip_gap=1e-6, start=None)
    return got.objective if got.counts is not None else math.inf


def infeasible_message(problem: PipelineProblem, model: StageModel, status: str, opts: Options, *,
                       budget: Budget | None = None) -> str:
    """What the smallest feasible memory is and which setting reaches the device's memory.

    Its min-memory solves share the command's ``budget``; fixes it has no time left to check
    are named without their memory figure.
    """
    budget = budget or Budget(None)
    device = problem.cluster.device
    assert device is not None  # PipelineProblem requires a device
    p = model.num_stages
    if status == "no_solution":
        return (f"stage-ilp found no plan within time_limit_s={problem.time_limit_s} on {p} stages and no baseline "
                "fits; raise time_limit_s or use more stages")
    allowed = _strategies(problem, opts)
    here = min_memory_bytes(problem, p, allowed, time_limit_s=budget.limit_s(30.0))
    fixes = []
    if allowed is not None:
        fixes.append(f"allow every recompute strategy incl. full (drop option strategies): needs "
                     f"{format_bytes(min_memory_bytes(problem, p, None, time_limit_s=budget.limit_s(30.0)))}")
    for deeper in _depths(problem):
        if deeper > p and (problem.schedule != "interleaved-1f1b" or model.num_microbatches % deeper == 0):
            if budget.spent():
                fixes.append(f"use more stages ({deeper} or more; the time limit left no time to size them)")
                break
            try:
                need = min_memory_bytes(problem.model_copy(update={"num_stages": deeper}), deeper, None,
                                        time_limit_s=budget.limit_s(30.0))
            except PlannerError:
                continue
            fixes.append(f"use {deeper} stages: needs {format_bytes(need)}")
            if need <= usable_memory_bytes(device):
                break
    if bpipe_would_apply(problem, p):
        need = min_memory_bytes(problem, p, allowed, bpipe_on=True, time_limit_s=budget.limit_s(30.0))
        fixes.append(f"BPipe (--bpipe, stage s hands activations to stage p-1-s): needs {format_bytes(need)}")
    return (f"no stage-ilp plan of {problem.model.name} on {p} stages fits device memory: the smallest peak any plan "
            f"needs is {format_bytes(here)} per device but {device.name} has {format_bytes(usable_memory_bytes(device))} "
            f"usable of {format_bytes(device.memory_bytes)} (--memory-headroom). "
            f"To make it feasible: " + "".join(f"{fix}; " for fix in fixes)
            + f"{'or ' if fixes else ''}a device with at least {format_bytes(here)}")
