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

Beyond the 2021 space the search also costs ZeRO stages (distributed optimizer, FSDP), context
parallelism (ring attention), expert parallelism with expert tensor parallelism, and Megatron's
uneven first/last stages (``solvers._ptdp_dims``; enumeration in ``solvers._ptdp_enum``); every
degree can be pinned by an option (docs/solver-ptdp.md, "Parallel dimensions").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from cost_models.compute import DEEPSPEED_BF16_ACCUM_BYTES_PER_PARAM, has_constants
from cost_models.memory import grad_bytes_per_param
from cost_models.recompute import applicable_modules
from planner.errors import InfeasibleError, InvalidProblemError
from planner.schema import (RECOMPUTE_MODULES, V_SCHEDULES, ModelProfile, PipelineProblem, Plan, SimResult,
                            TransformerConfig, module_strategy, recompute_modules_of)
from solvers import _ptdp_dims as dims_mod
from solvers import _ptdp_messages as messages
from solvers import _ptdp_model as model
from solvers._ptdp_enum import check_degree_options, divisors as _divisors, enumerate_configs
from solvers._ptdp_rank import rank_configs, sync_overlap
from solvers import _ptdp_v as v_model
from solvers.budget import Budget
from solvers.common import Layout, build_plan, memory_shortfall_message, profile_attention, with_prediction
from solvers.even import even_bounds
from solvers.options import parse_options

log = logging.getLogger(__name__)

SCHEDULES = ("1f1b", model.INTERLEAVED, *V_SCHEDULES)
RECOMPUTE = ("none", "selective", "modules", "full", "offload")
"""``modules``: Megatron-Core's per-module selective recompute, the set of modules with the least
recompute time that fits memory for each configuration (``cost_models.recompute``); ``offload``:
every decoder layer's activations to host memory and back (``cost_models.activation_offload``;
searched only when listed). Besides these keywords the option takes pinned module sets, Megatron-Core's
``--recompute-modules`` joined with ``+`` (``layernorm+moe_act``; ``recompute_settings``)."""
_GIB = 2.0**30
CLOSED_FORM_MARGIN = 0.06
"""Configurations whose closed-form time exceeds the best simulated time by more than this are
not simulated: the closed form is within 3 % of the simulator (tested; ZB-V with fewer microbatches
than its warm-up, m < 2p - 1, within 7 %, optimistic), so they cannot win."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    tensor_parallel: int | None = None
    """Fix t (default: searched; a problem whose profile was derived at t > 1 fixes it too)."""
    microbatch_size: int | None = None
    """Fix b (default: searched; a problem whose profile was derived at b > 1 fixes it too)."""
    schedules: str = "1f1b,interleaved-1f1b,zb-v,dualpipe-v"
    """Comma-separated schedules to search; the problem's schedule 'interleaved-1f1b' restricts to it."""
    recompute: str = "none,selective,modules,full"
    """Comma-separated uniform recompute settings to search; ``modules`` picks, per configuration, the
    cheapest set of Megatron-Core recompute modules that fits (per-operation model only); a set joined
    with ``+`` (``layernorm+moe_act``, Megatron-Core's ``--recompute-modules``) is searched as given;
    ``offload`` (not searched unless listed) moves every decoder layer's activations to host memory."""
    efficiency: float | None = None
    """A flat achieved fraction of peak FLOP/s instead of the per-operation model (default: the
    per-operation model, or the flat efficiency the problem's profile was derived at)."""
    attention: str | None = None
    """Attention core: 'flash' (fused) or 'unfused' (softmax/dropout over the scores, Megatron-LM 2021);
    default: the kind the problem's profile was built with (``make_problem(attention=...)``), else flash."""
    sequence_parallel: bool | None = None
    """Split norms/dropouts over t (default: on when t > 1); off reproduces the 2021 runs."""
    overlap_tp_comm: bool = False
    """Hide the backward tensor-parallel collectives behind the weight-gradient GEMMs (Megatron-LM
    since 2022, Korthikanti et al. Sec. 6.2); off charges them in full (2021 runs)."""
    overlap_grad_reduce: bool = False
    """Overlap the data-parallel gradient all-reduce with the last backward in buckets
    (Megatron's --overlap-grad-reduce); off charges it in full after the backward (2021 runs)."""
    overlap_param_gather: bool = False
    """ZeRO-1/2: all-gather the updated weights under the next forward (Megatron's --overlap-param-gather)."""
    optimizer: str = "megatron"
    """Gradient handling of the mixed-precision optimizer: 'megatron' (fp32 main gradients accumulated
    inside the weight-gradient GEMMs, reduction as ``zero_stage`` says) or 'deepspeed-bf16' (DeepSpeed's
    BF16 optimizer under its pipeline engine, as BLOOM ran: a cast-and-add pass into fp32 gradients
    after every microbatch, an fp32 all-reduce after the last one, the updated weights all-gathered;
    ZeRO 0 or 1 only)."""
    overlap_moe_alltoall: bool = False
    """Hide one microbatch's expert all-to-alls under another's compute of the layer (Megatron's
    --overlap-moe-expert-parallel-comm, DualPipe's pairing)."""
    moe_dispatcher: str = "alltoall"
    """Expert token dispatcher: 'alltoall' sends every (token, expert) copy (Megatron's alltoall
    dispatcher); 'deepep' sends a token once per distinct remote node and forwards it over NVLink there
    (DeepEP; Megatron's flex dispatcher, --moe-flex-dispatcher-backend deepep or hybridep)."""
    efficiency_by_microbatch: str | None = None
    """Per-b efficiencies, e.g. '1:0.40,2:0.46,4:0.5' (Eq. 4.1 needs t_f(b), L3902-3932); only
    the listed b are searched."""
    scatter_gather: bool = True
    """Send bsh/t per tensor rank between stages (L4008-4039) instead of bsh."""
    allow_cross_node_tp: bool = False
    """Let t exceed the devices per node (TP all-reduces then run on the inter-node link)."""
    pipeline_parallel: int | None = None
    """Fix p (as the problem's num_stages); default: searched."""
    data_parallel: int | None = None
    """Fix d (as the problem's data_parallel); default: the devices left after t p c."""
    virtual_pipeline: int | None = None
    """Fix v, the interleaved chunks per stage (as the problem's num_chunks); default: searched."""
    context_parallel: int | None = None
    """Fix c (Megatron --context-parallel-size; seq_length must divide by 2c); default: searched."""
    expert_parallel: int | None = None
    """Fix e (MoE models; must divide num_experts and d x c); default: searched."""
    expert_tensor_parallel: int | None = None
    """Fix the experts' tensor-parallel degree (1 or t); default: both searched."""
    zero_stages: str = "0,1,3"
    """Comma-separated ZeRO stages to search: 0 DDP, 1 distributed optimizer, 2 + gradients (Megatron keeps
    a full gradient buffer, so not searched by default), 3 FSDP (p = 1 only)."""
    zero_stage: int | None = None
    """Fix the ZeRO stage (overrides zero_stages)."""
    uneven_stages: bool = True
    """Also search Megatron's uneven first/last stages (--decoder-first/last-pipeline-num-layers, 1F1B)."""
    first_stage_layers: int | None = None
    """Fix the decoder layers of the first stage (--decoder-first-pipeline-num-layers)."""
    last_stage_layers: int | None = None
    """Fix the decoder layers of the last stage (--decoder-last-pipeline-num-layers)."""
    min_tokens_per_context_rank: int = dims_mod.MIN_TOKENS_PER_CONTEXT_RANK
    """Context degrees are searched while each rank keeps at least this many tokens."""
    load_balance_factor: float = 1.0
    """Busiest expert's tokens over the mean (routing imbalance slows the routed experts by it)."""
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
    recompute: tuple[str, ...]
    """The ``recompute`` option's settings, module sets in Megatron-Core's order (``recompute_settings``)."""


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
    units = unit_cache(search, opts)
    ranking = rank_configs(search, opts, units, _tie_key, keep=opts.num_simulated + opts.num_candidates)
    scored = ranking.prefix
    if not scored:  # nothing whose model states fit: cost them all for the memory message
        scored = [(c, model.estimate(units(c), search.cfg, problem.cluster, c, **sync_overlap(opts)))
                  for c in enumerate_configs(search, opts, units, prune=False)]
    if not scored:
        raise InfeasibleError(messages.no_layout_message(search, opts))
    scored.sort(key=lambda item: (not item[1].fits, item[1].iteration_s, _tie_key(item[0])))
    if not scored[0][1].fits:
        raise InfeasibleError(messages.memory_message(search, scored))
    budget = Budget(None if problem.time_limit_s is None else start + problem.time_limit_s)
    best, simulated = _simulate_best(search, opts, scored, budget=budget)
    if len(simulated) + opts.num_candidates > len(scored) and not ranking.complete:
        # the simulation went past the entries the bound vouches for: rank every configuration
        ranking = rank_configs(search, opts, units, _tie_key, keep=None)
        scored = ranking.prefix
        best, simulated = _simulate_best(search, opts, scored, budget=budget)
    rows = candidate_rows(search, scored, simulated, opts.num_candidates)
    plan, _ = best
    notes = (*messages.notes(search, opts, ranking, simulated), *v_model.megatron_notes(plan.schedule, rows))
    wanted = min(opts.num_simulated, sum(1 for _, est in scored if est.fits))
    status = "feasible"
    if len(simulated) < wanted and budget.spent():  # not the closed-form margin's early stop
        status = "time_limit"
        notes = (*notes, f"time_limit_s={problem.time_limit_s} spent after simulating {len(simulated)} of the "
                         f"{wanted} best closed-form configurations; the fastest simulated one is returned")
    return plan.model_copy(update={"solve_time_s": time.perf_counter() - start, "notes": notes,
                                   "candidates": rows, "status": status})


def unit_cache(search: Search, opts: Options) -> Callable[[model.Config], model.UnitCosts]:
    """Unit costs per (t, b, c, e, etp, ZeRO stage, and d under ZeRO-3), derived once each."""
    cache: dict[tuple[int, ...], model.UnitCosts] = {}

    def units(c: model.Config) -> model.UnitCosts:
        key = (c.tensor, c.microbatch_size, c.context, c.expert, c.expert_tensor, c.zero_stage,
               c.data if c.zero_stage == 3 else 0)
        if key not in cache:
            cache[key] = model.unit_costs(search.cfg, search.problem.cluster, c.tensor, c.microbatch_size,
                                          _settings(search, c.microbatch_size), c.dims, opts.load_balance_factor,
                                          opts.overlap_moe_alltoall, opts.moe_dispatcher)
        return cache[key]

    return units


def _tie_key(c: model.Config) -> tuple[int, ...]:
    """Equal times: fewer model-parallel devices, then smaller t, c, e, v, b, even stages (deterministic)."""
    return (c.tensor * c.pipeline * c.context, c.tensor, c.context, c.expert, c.zero_stage, c.virtual,
            c.microbatch_size, int(c.ends != (0, 0)), RECOMPUTE.index(c.recompute) if c.recompute in RECOMPUTE else 2)


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
    recompute = _check_options(opts, cfg)
    stages = opts.pipeline_parallel or problem.num_stages
    if stages is not None and stages > cfg.num_layers:
        raise InfeasibleError(
            f"num_stages={stages} exceeds the {cfg.num_layers} decoder layers of {cfg.name!r}: "
            f"every stage needs at least one layer; use at most {cfg.num_layers} stages")
    devices = problem.cluster.num_devices
    if stages is not None and devices % stages:
        raise InfeasibleError(
            f"num_stages={stages} does not divide the cluster's {devices} devices; use num_stages in "
            f"{[p for p in _divisors(devices) if p <= cfg.num_layers]}")
    chunks = opts.virtual_pipeline or problem.num_chunks
    if stages is not None and cfg.num_layers % (stages * chunks) and not opts.uneven_stages:
        valid = [p for p in range(1, cfg.num_layers + 1) if cfg.num_layers % (p * chunks) == 0]
        raise InfeasibleError(
            f"num_stages={stages} x num_chunks={chunks} does not divide the "
            f"{cfg.num_layers} layers of {cfg.name!r} and option uneven_stages is false; use num_stages "
            f"in {valid}, or uneven_stages=true (lighter end stages)")
    efficiencies = _parse_efficiencies(opts.efficiency_by_microbatch)
    attention = opts.attention or profile_attention(problem)
    if attention not in ("flash", "unfused"):
        raise InvalidProblemError(f"option attention={opts.attention!r} of solver 'ptdp' must be 'flash' or 'unfused'")
    pinned = tuple(recompute_modules_of(r) or () for r in recompute if r not in RECOMPUTE)
    _check_pinned_modules(pinned, cfg, problem, opts)
    settings = model.ProfileSettings(scatter_gather=opts.scatter_gather, sequence_parallel=opts.sequence_parallel,
                                     attention=attention, overlap_tp_comm=opts.overlap_tp_comm,
                                     recompute_modules="modules" in recompute, module_sets=pinned,
                                     activation_offload="offload" in recompute,
                                     grad_accum_bytes_per_param=DEEPSPEED_BF16_ACCUM_BYTES_PER_PARAM
                                     if opts.optimizer == "deepspeed-bf16" else 0.0,
                                     grad_bytes_per_param=grad_bytes_per_param(opts.optimizer))
    search = Search(cfg=cfg, problem=problem, global_batch_size=problem.global_batch_size, efficiencies=efficiencies,
                    efficiency=opts.efficiency or _profile_efficiency(problem), settings=settings,
                    recompute=recompute)
    check_degree_options(opts, search)
    return search


def _csv(text: str, valid: tuple[str, ...], key: str) -> tuple[str, ...]:
    items = tuple(s.strip() for s in text.split(",") if s.strip())
    bad = [s for s in items if s not in valid]
    if bad or not items:
        raise InvalidProblemError(
            f"option {key}={text!r} of solver 'ptdp': {bad or 'empty'}; give a comma-separated subset of {list(valid)}")
    return items


def recompute_settings(text: str) -> tuple[str, ...]:
    """The ``recompute`` option's settings: its keywords (``RECOMPUTE``) and pinned module sets, each
    set in Megatron-Core's canonical order (``moe_act+layernorm`` -> ``layernorm+moe_act``).

    Raises:
        InvalidProblemError: an empty list, or an item that is neither a keyword nor a set of
            Megatron-Core's recompute modules.
    """
    items = tuple(s.strip() for s in text.split(",") if s.strip())
    out = []
    for item in items:
        modules = tuple(m.strip() for m in item.split("+")) if item not in RECOMPUTE else None
        if modules is not None and not all(m in RECOMPUTE_MODULES for m in modules):
            bad = [m for m in modules if m not in RECOMPUTE_MODULES]
            raise InvalidProblemError(
                f"option recompute={text!r} of solver 'ptdp': {item!r} is neither one of {list(RECOMPUTE)} nor a "
                f"'+'-joined set of Megatron-Core's recompute modules ({bad} are not among {list(RECOMPUTE_MODULES)}); "
                "e.g. recompute=none,layernorm+moe_act")
        out.append(item if modules is None else module_strategy(modules))
    if not out:
        raise InvalidProblemError(
            f"option recompute={text!r} of solver 'ptdp' is empty; give a comma-separated subset of {list(RECOMPUTE)} "
            "or module sets such as layernorm+moe_act")
    return tuple(dict.fromkeys(out))


def _check_pinned_modules(pinned: tuple[tuple[str, ...], ...], cfg: TransformerConfig, problem: PipelineProblem,
                          opts: Options) -> None:
    """Pinned module sets need the per-operation model and modules the model has."""
    if not pinned:
        return
    have = applicable_modules(cfg)
    for modules in pinned:
        missing = [m for m in modules if m not in have]
        if missing:
            raise InvalidProblemError(
                f"option recompute: modules {missing} of set {module_strategy(modules)!r} do not exist in "
                f"{cfg.name!r}; its recompute modules are {list(have)}")
    device = problem.cluster.device
    if opts.efficiency is not None or _profile_efficiency(problem) is not None or not has_constants(device):
        raise InvalidProblemError(
            f"option recompute: module sets ({', '.join(module_strategy(m) for m in pinned)}) are costed by the "
            "per-operation model only; drop option efficiency (or the profile's flat efficiency), or use a device "
            "with compute constants, or recompute=none,selective,full")


def _check_options(opts: Options, cfg: TransformerConfig) -> tuple[str, ...]:
    """Options checked before the layout is: their errors come first. Returns the recompute settings."""
    _csv(opts.schedules, SCHEDULES, "schedules")
    if opts.optimizer not in ("megatron", "deepspeed-bf16"):
        raise InvalidProblemError(f"option optimizer={opts.optimizer!r} of solver 'ptdp' must be 'megatron' or "
                                  f"'deepspeed-bf16' (DeepSpeed's BF16 optimizer under its pipeline engine)")
    if opts.optimizer == "deepspeed-bf16" and opts.zero_stage not in (0, 1):
        raise InvalidProblemError(f"option optimizer='deepspeed-bf16' needs zero_stage=0 or 1 (got "
                                  f"{opts.zero_stage!r}): DeepSpeed's pipeline engine runs BF16 only up to ZeRO-1")
    recompute = recompute_settings(opts.recompute)
    if opts.moe_dispatcher not in dims_mod.MOE_DISPATCHERS:
        raise InvalidProblemError(
            f"option moe_dispatcher={opts.moe_dispatcher!r} of solver 'ptdp' must be one of "
            f"{list(dims_mod.MOE_DISPATCHERS)} ('deepep': Megatron's flex dispatcher with DeepEP or HybridEP)")
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
    return recompute


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
# Simulation of the best, plans and the candidate table
# --------------------------------------------------------------------------------------


def build_config_plan(search: Search, opts: Options, c: model.Config) -> Plan:
    """The plan of a configuration: its layer profile at (t, b) and the degrees beyond (the unit costs
    the closed form used, one copy per decoder layer), Megatron's even or uneven-end layer split."""
    cluster, cfg = search.problem.cluster, search.cfg
    assert cluster.device is not None
    u = unit_cache(search, opts)(c)
    kept = {"none", "selective", "full", c.recompute}  # the plan carries the chosen module set only
    blocks = [lay.model_copy(update={"recompute": {k: o for k, o in (lay.recompute or {}).items() if k in kept}})
              if lay is not None else None for lay in (u.decoder, u.moe_decoder)]
    decoders = [(blocks[0] if u.counts(i, 1)[0] else blocks[1] or blocks[0]).model_copy(  # type: ignore[union-attr]
        update={"name": f"decoder{i}"}) for i in range(cfg.num_layers)]
    head = u.head if not u.head.recompute else u.head.model_copy(update={  # MTP blocks: the chosen setting
        "recompute": {k: o for k, o in u.head.recompute.items() if k in kept}})
    baked = {"degrees_included": True}  # ring, all-to-alls, FSDP gathers and expert shares are in the layers
    profile = ModelProfile(name=cfg.name, layers=(u.embedding, *decoders, head), microbatch_size=c.microbatch_size,
                           tensor_parallel=c.tensor, tokens_per_sample=cfg.seq_length, device=cluster.device.name,
                           source=u.decoder_source,
                           **{k: v for k, v in baked.items() if k in ModelProfile.model_fields})
    problem = search.problem.model_copy(update={
        "model": profile, "schedule": c.schedule, "num_chunks": c.virtual, "num_stages": c.pipeline,
        "data_parallel": c.data})
    layout = Layout(num_stages=c.pipeline, num_chunks=c.virtual, data_parallel=c.data, tensor_parallel=c.tensor,
                    microbatch_size=c.microbatch_size, num_microbatches=c.num_microbatches)
    strategies = [c.recompute if layer.kind == "decoder" or c.recompute in (layer.recompute or {}) else "none"
                  for layer in profile.layers]
    bounds = even_bounds(profile, c.pipeline * c.virtual)
    if c.ends != (0, 0):  # virtual stage k: the embedding joins the first, the head the last
        counts = c.chunk_layers(cfg.num_layers)
        bounds = [0, *[1 + sum(counts[:k + 1]) for k in range(len(counts) - 1)], cfg.num_layers + 2]
    plan = build_plan(problem, layout, bounds=bounds, strategies=strategies, solver="ptdp",
                      options=_plan_options(opts, c, cfg))
    sp = c.tensor > 1 if opts.sequence_parallel is None else opts.sequence_parallel
    width = c.tensor * c.context * c.data  # Megatron's order: t fastest, then c, then d, then p
    stages = tuple(s.model_copy(update={"ranks": tuple(range(s.index * width, (s.index + 1) * width))})
                   for s in plan.stages) if c.context > 1 else plan.stages
    return plan.model_copy(update={  # what the costs assumed
        "sequence_parallel": sp and c.tensor > 1, "zero_stage": c.zero_stage, "stages": stages,
        "degrees": plan.degrees.model_copy(update={"context": c.context, "expert": c.expert})})


def _plan_options(opts: Options, c: model.Config, cfg: TransformerConfig) -> dict[str, Any]:
    out = {k: getattr(opts, k) for k in Options.__dataclass_fields__ if getattr(opts, k) is not None}
    if cfg.is_moe:
        out["expert_tensor_parallel"] = c.expert_tensor  # the plan's expert TP (read by the Megatron export)
    return out


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
    shown = [item for item in scored if item[0] in simulated]
    shown += [item for item in scored if item[0] not in simulated][:limit]  # ``scored`` is sorted
    for c, est in shown:
        sim = simulated.get(c)
        iteration = sim[1].iteration_time_s if sim else est.iteration_s
        fits = sim[1].fits_memory if sim else est.fits
        peak = max(s.peak_memory_bytes for s in sim[1].stages) if sim else est.peak_memory_bytes
        row: dict[str, Any] = {
            "t": c.tensor, "p": c.pipeline, "d": c.data, "v": c.virtual, "b": c.microbatch_size,
            "m": c.num_microbatches, "recompute": c.recompute, "schedule": c.schedule, "c": c.context,
            "e": c.expert, "etp": c.expert_tensor, "zero_stage": c.zero_stage,
            "first_stage_layers": c.stage_layers(search.cfg.num_layers)[0],
            "last_stage_layers": c.stage_layers(search.cfg.num_layers)[-1],
            "iteration_s": iteration, "closed_form_s": est.iteration_s, "simulated": sim is not None,
        }
        row.update(model.throughput_row(search.cfg, search.problem.cluster, c, iteration))
        row.update({"peak_memory_gib": peak / _GIB, "fits": fits})
        rows.append(row)
    rows.sort(key=lambda r: (not r["fits"], not r["simulated"], r["iteration_s"]))
    return tuple(rows[:limit])
