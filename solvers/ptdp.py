"""PTD-P configuration search: tensor x pipeline x data degrees, interleaving, microbatch size and
recompute for Megatron-LM (Narayanan's dissertation ch. 4, seed 001 L3241-4776).

The dissertation leaves the search over (p, t, d, b) to heuristics and future work (L3445-3451,
L4724-4738). This solver does it exhaustively: every configuration with t p d = n devices
(L3738-3756), m = B/(b d) microbatches (ptdp-gavel-cloud.md Sec. 1.14 item 1), layers that
Megatron-LM can split, and a uniform recompute setting is costed by the closed form of
``solvers._ptdp_model``; the best few that fit memory are simulated with the one simulator and
the fastest in simulation is returned. Megatron's split rule (NVIDIA/Megatron-LM
``megatron/training/arguments.py`` at 000c4ac2, ``validate_args``): without uneven-stage flags
``num_layers % pipeline_model_parallel_size == 0``; with ``--num-layers-per-virtual-pipeline-stage``
the layers per stage must divide by the layers per virtual stage (so l % (p v) == 0) and the
interleaved schedule needs p > 2, or p = 2 with ``--overlap-p2p-comm`` (which the exporter adds).
The interleaved schedule also needs m to be a multiple of p (L3612-3616).

The takeaways (TP up to the node size, then PP, L3825-3829; the smallest t p that fits,
L3897-3900; the microbatch trade-off, L3930-3932) are not coded in: they come out of the search.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from cost_models.memory import usable_memory_bytes
from cost_models.transformer import ADAM_BYTES_PER_PARAM, num_parameters, transformer_profile
from planner.errors import InfeasibleError, InvalidProblemError
from planner.schema import V_SCHEDULES, PipelineProblem, Plan, SimResult, TransformerConfig
from solvers import _ptdp_model as model
from solvers import _ptdp_v as v_model
from solvers.budget import Budget
from solvers.common import Layout, build_plan, format_bytes, memory_shortfall_message, with_prediction
from solvers.even import even_bounds
from solvers.options import parse_options

log = logging.getLogger(__name__)

SCHEDULES = ("1f1b", model.INTERLEAVED, *V_SCHEDULES)
RECOMPUTE = ("none", "selective", "full")
_GIB = 2.0**30
CLOSED_FORM_MARGIN = 0.06
"""Configurations whose closed-form time exceeds the best simulated time by more than this are
not simulated: the closed form is within 3 % of the simulator (tested), so they cannot win."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    tensor_parallel: int | None = None
    """Fix t (default: searched; a problem whose profile was derived at t > 1 fixes it too)."""
    microbatch_size: int | None = None
    """Fix b (default: searched; a problem whose profile was derived at b > 1 fixes it too)."""
    schedules: str = "1f1b,interleaved-1f1b,zb-v,dualpipe-v"
    """Comma-separated schedules to search; the problem's schedule 'interleaved-1f1b' restricts to it."""
    recompute: str = "none,selective,full"
    """Comma-separated uniform recompute settings to search."""
    efficiency: float | None = None
    """A flat achieved fraction of peak FLOP/s instead of the per-operation model (default: the
    per-operation model, or the flat efficiency the problem's profile was derived at)."""
    attention: str = "flash"
    """Attention core: 'flash' (fused) or 'unfused' (softmax/dropout over the scores, Megatron-LM 2021)."""
    sequence_parallel: bool | None = None
    """Split norms/dropouts over t (default: on when t > 1); off reproduces the 2021 runs."""
    overlap_tp_comm: bool = False
    """Hide the backward tensor-parallel collectives behind the weight-gradient GEMMs (Megatron-LM
    since 2022, Korthikanti et al. Sec. 6.2); off charges them in full (2021 runs)."""
    overlap_grad_reduce: bool = False
    """Overlap the data-parallel gradient all-reduce with the last backward in buckets
    (Megatron's --overlap-grad-reduce); off charges it in full after the backward (2021 runs)."""
    efficiency_by_microbatch: str | None = None
    """Per-b efficiencies, e.g. '1:0.40,2:0.46,4:0.5' (Eq. 4.1 needs t_f(b), L3902-3932); only
    the listed b are searched."""
    scatter_gather: bool = True
    """Send bsh/t per tensor rank between stages (L4008-4039) instead of bsh."""
    allow_cross_node_tp: bool = False
    """Let t exceed the devices per node (TP all-reduces then run on the inter-node link)."""
    num_simulated: int = 5
    """Best closed-form configurations to simulate; the fastest in simulation is returned."""
    num_candidates: int = 20
    """Rows of ``plan.candidates``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Search:
    """What the search needs besides the options: the model, the cluster and the fixed values."""

    cfg: TransformerConfig
    problem: PipelineProblem
    global_batch_size: int
    efficiencies: dict[int, float] | None
    efficiency: float | None
    settings: model.ProfileSettings


def solve(problem: PipelineProblem, *, options: Mapping[str, Any] | Options | None = None) -> Plan:
    """Search (t, p, d, v, b, recompute) for the fastest Megatron-LM configuration that fits memory.

    Raises:
        InvalidProblemError: no transformer config, no global batch, a schedule other than 1F1B or
            interleaved 1F1B, BPipe, or a bad option.
        InfeasibleError: fewer layers than stages, a batch no configuration can split, or no
            configuration that fits memory; the message says what would make it feasible.
    """
    opts = parse_options(Options, options, solver="ptdp")
    start = time.perf_counter()
    search = _prepare(problem, opts)
    units: dict[tuple[int, int], model.UnitCosts] = {}
    scored: list[tuple[model.Config, model.Estimate]] = []
    for c in enumerate_configs(search, opts):
        key = (c.tensor, c.microbatch_size)
        if key not in units:
            units[key] = model.unit_costs(search.cfg, problem.cluster, c.tensor, c.microbatch_size,
                                          _settings(search, c.microbatch_size))
        scored.append((c, model.estimate(units[key], search.cfg, problem.cluster, c,
                                         overlap_grad_reduce=opts.overlap_grad_reduce)))
    if not scored:
        raise InfeasibleError(_no_layout_message(search, opts))
    scored.sort(key=lambda item: (not item[1].fits, item[1].iteration_s, _tie_key(item[0])))
    if not scored[0][1].fits:
        raise InfeasibleError(_memory_message(search, scored))
    budget = Budget(None if problem.time_limit_s is None else start + problem.time_limit_s)
    best, simulated = _simulate_best(search, opts, scored, budget=budget)
    rows = candidate_rows(search, scored, simulated, opts.num_candidates)
    plan, _ = best
    notes = (*_notes(search, opts, scored, simulated), *v_model.megatron_notes(plan.schedule, rows))
    wanted = min(opts.num_simulated, sum(1 for _, est in scored if est.fits))
    status = "feasible"
    if len(simulated) < wanted:
        status = "time_limit"
        notes = (*notes, f"time_limit_s={problem.time_limit_s} spent after simulating {len(simulated)} of the "
                         f"{wanted} best closed-form configurations; the fastest simulated one is returned")
    return plan.model_copy(update={"solve_time_s": time.perf_counter() - start, "notes": notes,
                                   "candidates": rows, "status": status})


def _tie_key(c: model.Config) -> tuple[int, ...]:
    """Equal times: fewer model-parallel devices, then smaller t, v, b (deterministic)."""
    return (c.tensor * c.pipeline, c.tensor, c.virtual, c.microbatch_size, RECOMPUTE.index(c.recompute))


# --------------------------------------------------------------------------------------
# Problem checks
# --------------------------------------------------------------------------------------


def _prepare(problem: PipelineProblem, opts: Options) -> Search:
    cfg = problem.transformer
    if cfg is None:
        raise InvalidProblemError(
            f"solver 'ptdp' re-derives the layer costs for every (t, b) and needs a transformer config; "
            f"profile {problem.model.name!r} was measured. Pass a preset (--model gpt3-175b) or a "
            "transformer config JSON, or use solver 'even' or 'pipedream' for a measured profile")
    if problem.global_batch_size is None:
        raise InvalidProblemError(
            "solver 'ptdp' searches d and b for a fixed global batch (B = b d m, [narayanan-thesis] Sec. 4.3.1); give "
            "global_batch_size (--global-batch), e.g. 512")
    if problem.bpipe:
        raise InvalidProblemError("solver 'ptdp' plans stock Megatron-LM schedules; remove bpipe=true")
    if problem.schedule not in SCHEDULES:
        raise InvalidProblemError(
            f"solver 'ptdp' searches 1F1B, interleaved 1F1B, ZB-V and DualPipeV; schedule={problem.schedule!r} "
            f"is not supported. Use '1f1b' (searches all, see option schedules) or one of {list(SCHEDULES[1:])}")
    _check_options(opts, cfg)
    if problem.num_stages is not None and problem.num_stages > cfg.num_layers:
        raise InfeasibleError(
            f"num_stages={problem.num_stages} exceeds the {cfg.num_layers} decoder layers of {cfg.name!r}: "
            f"every stage needs at least one layer; use at most {cfg.num_layers} stages")
    if problem.num_stages is not None and cfg.num_layers % (problem.num_stages * problem.num_chunks):
        valid = [p for p in range(1, cfg.num_layers + 1) if cfg.num_layers % (p * problem.num_chunks) == 0]
        raise InfeasibleError(
            f"num_stages={problem.num_stages} x num_chunks={problem.num_chunks} does not divide the "
            f"{cfg.num_layers} layers of {cfg.name!r} (Megatron-LM splits layers evenly); use num_stages "
            f"in {valid}")
    efficiencies = _parse_efficiencies(opts.efficiency_by_microbatch)
    if opts.attention not in ("flash", "unfused"):
        raise InvalidProblemError(f"option attention={opts.attention!r} of solver 'ptdp' must be 'flash' or 'unfused'")
    settings = model.ProfileSettings(scatter_gather=opts.scatter_gather, sequence_parallel=opts.sequence_parallel,
                                     attention=opts.attention, overlap_tp_comm=opts.overlap_tp_comm)
    return Search(cfg=cfg, problem=problem, global_batch_size=problem.global_batch_size, efficiencies=efficiencies,
                  efficiency=opts.efficiency or _profile_efficiency(problem), settings=settings)


def _csv(text: str, valid: tuple[str, ...], key: str) -> tuple[str, ...]:
    items = tuple(s.strip() for s in text.split(",") if s.strip())
    bad = [s for s in items if s not in valid]
    if bad or not items:
        raise InvalidProblemError(
            f"option {key}={text!r} of solver 'ptdp': {bad or 'empty'}; give a comma-separated subset of {list(valid)}")
    return items


def _check_options(opts: Options, cfg: TransformerConfig) -> None:
    _csv(opts.schedules, SCHEDULES, "schedules")
    _csv(opts.recompute, RECOMPUTE, "recompute")
    if opts.efficiency is not None and not 0 < opts.efficiency <= 1:
        raise InvalidProblemError(f"option efficiency={opts.efficiency} must be in (0, 1]; PTD-P reaches 0.44-0.52")
    for key in ("tensor_parallel", "microbatch_size", "num_simulated", "num_candidates"):
        value = getattr(opts, key)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise InvalidProblemError(f"option {key}={value!r} of solver 'ptdp' must be a positive integer")
    t = opts.tensor_parallel
    if t is not None and (cfg.num_heads % t or cfg.kv_heads % t or cfg.ffn_size % t):
        raise InvalidProblemError(
            f"option tensor_parallel={t} must divide num_heads={cfg.num_heads}, the KV heads ({cfg.kv_heads}) "
            f"and the FFN size ({cfg.ffn_size}) of {cfg.name!r}")


def _parse_efficiencies(text: str | None) -> dict[int, float] | None:
    if text is None:
        return None
    out: dict[int, float] = {}
    try:
        for item in text.split(","):
            b, eff = item.split(":")
            out[int(b)] = float(eff)
    except ValueError:
        out = {}
    if not out or any(b < 1 or not 0 < e <= 1 for b, e in out.items()):
        raise InvalidProblemError(
            f"option efficiency_by_microbatch={text!r} of solver 'ptdp' must list b:efficiency pairs with "
            "b >= 1 and efficiency in (0, 1], e.g. '1:0.40,2:0.46,4:0.5'")
    return out


def _profile_efficiency(problem: PipelineProblem) -> float | None:
    """The flat efficiency the problem's profile was derived at (``transformer_profile`` marks
    such profiles ``analytic:efficiency=<x>``); None for the per-operation model."""
    source = problem.model.source
    if source.startswith("analytic:efficiency="):
        return float(source.split("=", 1)[1])
    return None


def _efficiency(search: Search, b: int) -> float | None:
    return search.efficiencies[b] if search.efficiencies else search.efficiency


def _settings(search: Search, b: int) -> model.ProfileSettings:
    return replace(search.settings, efficiency=_efficiency(search, b))


# --------------------------------------------------------------------------------------
# Enumeration
# --------------------------------------------------------------------------------------


def _divisors(n: int, limit: int | None = None) -> list[int]:
    """Divisors of n up to ``limit`` (default n), ascending; O(min(limit, sqrt n)) steps."""
    limit = n if limit is None else min(n, limit)
    small, large = [], []
    k = 1
    while k * k <= n and k <= limit:
        if n % k == 0:
            small.append(k)
            if k * k != n and n // k <= limit:
                large.append(n // k)
        k += 1
    return small + large[::-1]


MAX_MICROBATCH_SIZE = 1 << 16
"""Largest microbatch size the search tries (a bound that keeps --global-batch 10^18 finite)."""


def tensor_degrees(search: Search, opts: Options) -> list[int]:
    """t that divides the heads, KV heads and FFN size, within a node (t | devices per node) or,
    with allow_cross_node_tp, whole nodes; fixed by the option or a profile derived at t > 1."""
    cfg, cluster = search.cfg, search.problem.cluster
    fixed = opts.tensor_parallel or (search.problem.model.tensor_parallel
                                     if search.problem.model.tensor_parallel > 1 else None)
    out = []
    for t in _divisors(cluster.num_devices):
        if cfg.num_heads % t or cfg.kv_heads % t or cfg.ffn_size % t:
            continue
        within = cluster.devices_per_node % t == 0
        across = opts.allow_cross_node_tp and t % cluster.devices_per_node == 0
        if (within or across or t == fixed) and (fixed is None or t == fixed):
            out.append(t)
    return out


def microbatch_sizes(search: Search, opts: Options, per_replica: int) -> list[int]:
    """b that divides B / d; fixed by the option, a profile derived at b > 1, or the efficiency table."""
    fixed = opts.microbatch_size or (search.problem.model.microbatch_size
                                     if search.problem.model.microbatch_size > 1 else None)
    sizes = [fixed] if fixed else (sorted(search.efficiencies) if search.efficiencies else _divisors(per_replica, MAX_MICROBATCH_SIZE))
    return [b for b in sizes if per_replica % b == 0]


def enumerate_configs(search: Search, opts: Options) -> Iterator[model.Config]:
    """Every configuration the problem and options allow (see the module docstring)."""
    problem, cfg, n = search.problem, search.cfg, search.problem.cluster.num_devices
    schedules = _csv(opts.schedules, SCHEDULES, "schedules")
    if problem.schedule in V_SCHEDULES:
        schedules = (problem.schedule,)
    elif problem.schedule == model.INTERLEAVED or problem.num_chunks > 1:
        schedules = (model.INTERLEAVED,)
    recompute = _csv(opts.recompute, RECOMPUTE, "recompute")
    for t in tensor_degrees(search, opts):
        for p in [problem.num_stages] if problem.num_stages else _divisors(cfg.num_layers):
            if n % (t * p) or (problem.data_parallel and problem.data_parallel * t * p != n):
                continue
            d = n // (t * p)
            if search.global_batch_size % d:
                continue
            for b in microbatch_sizes(search, opts, search.global_batch_size // d):
                m = search.global_batch_size // (b * d)
                if problem.num_microbatches is not None and m != problem.num_microbatches:
                    continue
                for v, vs in _chunk_counts(cfg.num_layers, p, m, schedules, problem.num_chunks):
                    for r in recompute:
                        yield model.Config(tensor=t, pipeline=p, data=d, virtual=v, microbatch_size=b,
                                           num_microbatches=m, recompute=r, v_schedule=vs)


def _chunk_counts(num_layers: int, p: int, m: int, schedules: tuple[str, ...], fixed: int) -> list[tuple[int, str]]:
    """(v, V schedule or ''): v = 1 for 1F1B; v >= 2 dividing l / p for interleaved, which needs p >= 2
    and m % p == 0; v = 2 for ZB-V and DualPipeV (l % 2p == 0; DualPipeV m >= 2p; p >= 2 unless asked for)."""
    out = [(1, "")] if "1f1b" in schedules and fixed == 1 else []
    if model.INTERLEAVED in schedules and p >= 2 and m % p == 0:
        out += [(v, "") for v in _divisors(num_layers // p) if v >= 2 and (fixed == 1 or v == fixed)]
    out += [(2, vs) for vs in V_SCHEDULES if vs in schedules and (p >= 2 or schedules == (vs,))
            and num_layers % (2 * p) == 0 and fixed in (1, 2) and (vs == "zb-v" or m >= 2 * p)]
    return out


# --------------------------------------------------------------------------------------
# Simulation of the best, plans and the candidate table
# --------------------------------------------------------------------------------------


def build_config_plan(search: Search, opts: Options, c: model.Config) -> Plan:
    """The Megatron-even plan of a configuration, on the full profile at (t, b)."""
    cluster, cfg = search.problem.cluster, search.cfg
    assert cluster.device is not None
    profile = transformer_profile(
        cfg, device=cluster.device, microbatch_size=c.microbatch_size, tensor_parallel=c.tensor,
        intra_node_bytes_per_s=model.tp_link_bytes_per_s(cluster, c.tensor),
        **model.profile_kwargs(_settings(search, c.microbatch_size), c.tensor),
    )
    problem = search.problem.model_copy(update={
        "model": profile, "schedule": c.schedule, "num_chunks": c.virtual, "num_stages": c.pipeline,
        "data_parallel": c.data})
    layout = Layout(num_stages=c.pipeline, num_chunks=c.virtual, data_parallel=c.data, tensor_parallel=c.tensor,
                    microbatch_size=c.microbatch_size, num_microbatches=c.num_microbatches)
    strategies = [c.recompute if layer.kind == "decoder" else "none" for layer in profile.layers]
    plan = build_plan(problem, layout, bounds=even_bounds(profile, c.pipeline * c.virtual), strategies=strategies,
                      solver="ptdp", options=_plan_options(opts))
    sp = c.tensor > 1 if opts.sequence_parallel is None else opts.sequence_parallel
    return plan.model_copy(update={"sequence_parallel": sp and c.tensor > 1})  # what the costs assumed


def _plan_options(opts: Options) -> dict[str, Any]:
    return {k: getattr(opts, k) for k in Options.__dataclass_fields__ if getattr(opts, k) is not None}


Simulated = dict[model.Config, tuple[Plan, SimResult]]


def _simulate_best(search: Search, opts: Options, scored: list[tuple[model.Config, model.Estimate]], *,
                   budget: Budget | None = None) -> tuple[tuple[Plan, SimResult], Simulated]:
    """Simulate the best ``num_simulated`` closed-form configurations that fit; go further down the
    list while none of them fits in simulation. Once ``budget`` is spent, stop at the first
    configuration that fits in simulation."""
    simulated: Simulated = {}
    best: tuple[Plan, SimResult] | None = None
    for c, est in scored:
        if not est.fits or (best is not None and (len(simulated) >= opts.num_simulated
                                                  or (budget is not None and budget.spent()))):
            break
        if best is not None and est.iteration_s > best[1].iteration_time_s * (1 + CLOSED_FORM_MARGIN):
            break  # sorted by closed form: no later configuration can beat the best simulated one
        plan, result = with_prediction(build_config_plan(search, opts, c))
        simulated[c] = (plan, result)
        if result.fits_memory and (best is None or result.iteration_time_s < best[1].iteration_time_s):
            best = (plan, result)
    if best is None:
        worst = min(max(s.peak_memory_bytes for s in r.stages) for _, r in simulated.values())
        raise InfeasibleError(memory_shortfall_message(
            search.problem, worst, f"every configuration of {search.cfg.name} that the closed form accepts"))
    return best, simulated


def candidate_rows(search: Search, scored: list[tuple[model.Config, model.Estimate]], simulated: Simulated,
                   limit: int) -> tuple[dict[str, Any], ...]:
    """The ranked table: simulated configurations by simulated time, then the others by closed form."""
    rows = []
    for c, est in scored:
        sim = simulated.get(c)
        iteration = sim[1].iteration_time_s if sim else est.iteration_s
        fits = sim[1].fits_memory if sim else est.fits
        peak = max(s.peak_memory_bytes for s in sim[1].stages) if sim else est.peak_memory_bytes
        row: dict[str, Any] = {
            "t": c.tensor, "p": c.pipeline, "d": c.data, "v": c.virtual, "b": c.microbatch_size,
            "m": c.num_microbatches, "recompute": c.recompute, "schedule": c.schedule,
            "iteration_s": iteration, "closed_form_s": est.iteration_s, "simulated": sim is not None,
        }
        row.update(model.throughput_row(search.cfg, search.problem.cluster, c, iteration))
        row.update({"peak_memory_gib": peak / _GIB, "fits": fits})
        rows.append(row)
    rows.sort(key=lambda r: (not r["fits"], not r["simulated"], r["iteration_s"]))
    return tuple(rows[:limit])


# --------------------------------------------------------------------------------------
# Messages
# --------------------------------------------------------------------------------------


def _notes(search: Search, opts: Options, scored: list[tuple[model.Config, model.Estimate]],
           simulated: Simulated) -> tuple[str, ...]:
    fitting = sum(1 for _, est in scored if est.fits)
    eff = (f"efficiency by microbatch {search.efficiencies}" if search.efficiencies
           else f"flat efficiency {search.efficiency:.3g} of peak" if search.efficiency
           else f"per-operation compute model ({search.settings.attention} attention)")
    return (
        f"searched {len(scored)} configurations (t, p, d, v, b, recompute), {fitting} fit memory by the closed "
        f"form; simulated the best {len(simulated)} and kept the fastest in simulation",
        f"{eff}; scatter/gather {'on' if opts.scatter_gather else 'off'}; uniform recompute, even layer split",
    )


def _no_layout_message(search: Search, opts: Options) -> str:
    """No (t, p, d, b) splits the batch: say which global batch sizes would."""
    problem, cfg, n = search.problem, search.cfg, search.problem.cluster.num_devices
    b_batch = search.global_batch_size
    degrees = sorted({n // (t * p) for t in tensor_degrees(search, opts) for p in _divisors(cfg.num_layers)
                      if n % (t * p) == 0 and (not problem.num_stages or p == problem.num_stages)
                      and (not problem.data_parallel or problem.data_parallel * t * p == n)})
    if not degrees:
        return (f"no tensor x pipeline degree fits {n} devices with {cfg.num_layers} layers and "
                f"{cfg.num_heads} heads under the fixed values (num_stages={problem.num_stages}, "
                f"data_parallel={problem.data_parallel}, tensor_parallel={opts.tensor_parallel}); use a cluster "
                f"size that is a multiple of a divisor of the layer count, or drop the fixed values")
    d = degrees[0]
    lo, hi = b_batch // d * d, (b_batch // d + 1) * d
    near = [x for x in (lo, hi) if x > 0]
    return (f"global_batch_size={b_batch} cannot be split: it must be a multiple of b x d with d in "
            f"{degrees} (and for interleaved 1F1B, m a multiple of p; for ZB-V and DualPipeV, layers divisible "
            f"by 2p, and for DualPipeV m >= 2p), and also match num_microbatches="
            f"{problem.num_microbatches} when given. Batch sizes that work: {near} (multiples of d={d})")


def _memory_message(search: Search, scored: list[tuple[model.Config, model.Estimate]]) -> str:
    problem, cfg = search.problem, search.cfg
    assert problem.cluster.device is not None
    least = min(scored, key=lambda item: item[1].peak_memory_bytes)
    static_total = ADAM_BYTES_PER_PARAM * num_parameters(cfg)
    devices = math.ceil(static_total / usable_memory_bytes(problem.cluster.device))
    c = least[0]
    what = (f"{cfg.name} (best try t={c.tensor} p={c.pipeline} v={c.virtual} b={c.microbatch_size} "
            f"recompute={c.recompute})")
    return (memory_shortfall_message(problem, least[1].peak_memory_bytes, what)
            + f". The weights and optimizer state alone are {format_bytes(static_total)}: at least {devices} "
            f"model-parallel devices of {format_bytes(usable_memory_bytes(problem.cluster.device))} usable "
            f"(t x p >= {devices})")
