"""The configurations the ``ptdp`` search costs: every (t, p, c, d, e, etp, ZeRO stage, b, v, end-stage
layout, recompute) the problem and the options allow (solvers/ptdp.py has the rules' sources).

Degrees are enumerated as divisors (of the devices, the layers, the experts, the batch), the unit costs
of a (t, b, c, e, etp, ZeRO) tuple are derived once, and a configuration whose model states alone
overflow the device is dropped before its microbatch loop (no b, v or recompute makes states smaller).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from cost_models.activation_offload import OFFLOAD
from cost_models.compute import host_memory_bytes
from cost_models.memory import usable_memory_bytes
from cost_models.parallelism import check_context_split
from planner.errors import InvalidProblemError
from planner.schema import V_SCHEDULES, TransformerConfig
from solvers import _ptdp_dims as dims_mod
from solvers import _ptdp_model as model

if TYPE_CHECKING:
    from solvers.ptdp import Options, Search

MAX_MICROBATCH_SIZE = 1 << 16
"""Largest microbatch size the search tries (a bound that keeps --global-batch 10^18 finite)."""

Units = Callable[[model.Config], model.UnitCosts]


def divisors(n: int, limit: int | None = None) -> list[int]:
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


def tensor_degrees(search: Search, opts: Options) -> list[int]:
    """t that divides the heads, KV heads and FFN size, within a node (t | devices per node) or,
    with allow_cross_node_tp, whole nodes; fixed by the option or a profile derived at t > 1."""
    cfg, cluster = search.cfg, search.problem.cluster
    fixed = opts.tensor_parallel or (search.problem.model.tensor_parallel
                                     if search.problem.model.tensor_parallel > 1 else None)
    out = []
    for t in divisors(cluster.num_devices):
        if cfg.num_heads % t or cfg.kv_heads % t or cfg.ffn_size % t:
            continue
        within = cluster.devices_per_node % t == 0
        across = opts.allow_cross_node_tp and t % cluster.devices_per_node == 0
        if (within or across or t == fixed) and (fixed is None or t == fixed):
            out.append(t)
    return out


def pipeline_degrees(search: Search, opts: Options, per_pipeline: int) -> list[int]:
    """p dividing the devices left after t, at most one layer per stage; an even split needs l % p == 0,
    uneven end stages (``uneven_stages``) any p >= 3 whose middle stages split the rest evenly."""
    fixed = opts.pipeline_parallel or search.problem.num_stages
    layers = search.cfg.num_layers
    out = []
    for p in [fixed] if fixed else divisors(per_pipeline, layers):
        if per_pipeline % p or p > layers:
            continue
        if layers % p == 0 or (opts.uneven_stages and p >= 2) or opts.first_stage_layers is not None:
            out.append(p)
    return out


def microbatch_sizes(search: Search, opts: Options, per_replica: int) -> list[int]:
    """b that divides B / d; fixed by the option, a profile derived at b > 1, or the efficiency table."""
    fixed = opts.microbatch_size or (search.problem.model.microbatch_size
                                     if search.problem.model.microbatch_size > 1 else None)
    sizes = [fixed] if fixed else (sorted(search.efficiencies) if search.efficiencies
                                   else divisors(per_replica, MAX_MICROBATCH_SIZE))
    return [b for b in sizes if per_replica % b == 0]


def zero_stage_list(opts: Options) -> tuple[int, ...]:
    """The ZeRO stages the options allow (``zero_stage`` pins one)."""
    if opts.zero_stage is not None:
        return (opts.zero_stage,)
    try:
        stages = tuple(sorted({int(x) for x in opts.zero_stages.split(",") if x.strip()}))
    except ValueError:
        stages = ()
    if not stages or any(z not in dims_mod.ZERO_STAGES for z in stages):
        raise InvalidProblemError(
            f"option zero_stages={opts.zero_stages!r} of solver 'ptdp' must be a comma-separated subset of 0,1,2,3 "
            "(0 DDP, 1 distributed optimizer, 2 + gradients, 3 FSDP), e.g. '0,1,3'")
    return stages


MODULES = "modules"
"""The recompute setting of a configuration whose module set is not picked yet (``lazy_modules``)."""


def enumerate_configs(search: Search, opts: Options, units: Units | None = None, *,
                      prune: bool = True, lazy_modules: bool = False) -> Iterator[model.Config]:
    """Every configuration the problem and options allow (see the module docstring); ``prune`` drops
    those whose model states alone overflow the device. ``lazy_modules``: yield recompute ``modules``
    as is (when the unit costs offer module sets): ``solvers._ptdp_rank`` picks the set later."""
    from solvers.ptdp import unit_cache  # the solver's cache of unit costs per (t, b, c, e, etp, ZeRO)

    units = units or unit_cache(search, opts)
    problem, cfg, n = search.problem, search.cfg, search.problem.cluster.num_devices
    stages = zero_stage_list(opts)
    capacity = usable_memory_bytes(problem.cluster.device) if prune else float("inf")  # type: ignore[arg-type]
    fixed_d = opts.data_parallel or problem.data_parallel
    for t in tensor_degrees(search, opts):
        for c in dims_mod.context_degrees(cfg, n // t if n % t == 0 else 1, opts.context_parallel,
                                          search.settings.attention,
                                          opts.min_tokens_per_context_rank):
            if n % (t * c):
                continue
            for p in pipeline_degrees(search, opts, n // (t * c)):
                d = n // (t * c * p)
                if search.global_batch_size % d or (fixed_d and fixed_d != d):
                    continue
                for etp in dims_mod.expert_tensor_degrees(cfg, t, opts.expert_tensor_parallel):
                    for e in dims_mod.expert_degrees(cfg, t * d * c // etp, opts.expert_parallel):
                        for z in dims_mod.zero_stages_for(stages, p, d * c,
                                                          overlap_grad_reduce=opts.overlap_grad_reduce):
                            base = model.Config(tensor=t, pipeline=p, data=d, virtual=1, microbatch_size=1,
                                                num_microbatches=1, recompute="none", context=c, expert=e,
                                                expert_tensor=etp, zero_stage=z)
                            yield from _batch_configs(search, opts, base, units, capacity, lazy_modules)


def _batch_configs(search: Search, opts: Options, base: model.Config, units: Units,
                   capacity: float, lazy_modules: bool = False) -> Iterator[model.Config]:
    """b, m, v, end layout and recompute for fixed degrees; nothing when the model states alone
    (at b = 1, full recompute aside) cannot fit."""
    problem, cfg = search.problem, search.cfg
    schedules = searched_schedules(search, opts)
    recompute = search.recompute
    per_replica = search.global_batch_size // base.data
    host = host_memory_bytes(problem.cluster.device) if OFFLOAD in recompute else None  # type: ignore[arg-type]
    pinned_ends = opts.first_stage_layers is not None or opts.last_stage_layers is not None
    for b in microbatch_sizes(search, opts, per_replica):
        m = per_replica // b
        if problem.num_microbatches is not None and m != problem.num_microbatches:
            continue
        probe = _replace(base, microbatch_size=b, num_microbatches=m)
        u = units(probe)
        for v, vs in chunk_counts(cfg.num_layers, base.pipeline, m, schedules, fixed_chunks(search, opts),
                                   uneven=opts.uneven_stages):
            if vs and pinned_ends:
                continue  # pinned 1F1B end stages: a V schedule would not keep them
            for ends in dims_mod.v_layouts(cfg.num_layers, base.pipeline) if vs else \
                    _layouts(search, opts, u, base.pipeline, v):
                c = _replace(probe, virtual=v, ends=ends, v_schedule=vs)
                if _states_overflow(u, cfg, c, capacity):
                    continue
                for r in recompute:
                    if r == MODULES and lazy_modules:
                        if u.module_sets:
                            yield _replace(c, recompute=MODULES)
                    elif r == MODULES:
                        picked = cheapest_fitting_modules(u, cfg, c, capacity)
                        if picked is not None:
                            yield _replace(c, recompute=picked)
                    elif r == OFFLOAD and host is not None and model.offload_host_bytes(u, cfg, c) > host:
                        continue  # the offloaded activations overflow the host's memory
                    else:
                        yield _replace(c, recompute=r)


def cheapest_fitting_modules(u: model.UnitCosts, cfg: TransformerConfig, c: model.Config,
                              capacity: float) -> str | None:
    """The per-module recompute set with the least recompute time whose closed-form peak fits the device
    (the one freeing the most when none fits, for the memory message); None when nothing needs
    recomputing or without module options (the flat-efficiency model)."""
    names = u.module_sets
    if not names:
        return None
    if c.v_schedule:
        def peak(name: str) -> float:
            return model.config_peak_memory_bytes(u, cfg, _replace(c, recompute=name))
    else:  # the model states and end layers do not change with the recompute set: cost them once
        ranges = c.rank_ranges(cfg.num_layers)
        fixed = model.rank_fixed_bytes(u, cfg, c, ranges)

        def peak(name: str) -> float:
            return model.ranks_peak_bytes(u, _replace(c, recompute=name), ranges, fixed)
    if peak("none") <= capacity:
        return None  # the empty set fits: nothing to recompute (``none`` is its own choice)
    # Along the frontier every layer kind keeps fewer bytes at each step, so the peak falls: bisect it.
    low, high = 0, len(names) - 1
    while low < high:
        mid = (low + high) // 2
        if peak(names[mid]) <= capacity:
            high = mid
        else:
            low = mid + 1
    return names[low]


def _states_overflow(u: model.UnitCosts, cfg: TransformerConfig, c: model.Config, capacity: float) -> bool:
    """Rank 0's model states alone exceed the device (no b, v or recompute can help)."""
    return model.rank_static_bytes(u, c.rank_ranges(cfg.num_layers)[0], c.dims) > capacity


def _replace(c: model.Config, **changes: object) -> model.Config:
    return c.but(**changes)


def searched_schedules(search: Search, opts: Options) -> tuple[str, ...]:
    """The schedules the search enumerates: option schedules, or the problem's fixed one."""
    from solvers.ptdp import SCHEDULES, _csv

    schedules = _csv(opts.schedules, SCHEDULES, "schedules")
    if search.problem.schedule in V_SCHEDULES:
        schedules = (search.problem.schedule,)
    elif search.problem.schedule == model.INTERLEAVED or search.problem.num_chunks > 1:
        schedules = (model.INTERLEAVED,)
    return schedules


def fixed_chunks(search: Search, opts: Options) -> int:
    """The pinned interleaving depth: option virtual_pipeline, else the problem's num_chunks (1: free)."""
    return opts.virtual_pipeline or search.problem.num_chunks


def _layouts(search: Search, opts: Options, u: model.UnitCosts, p: int, v: int) -> list[tuple[int, int]]:
    """End-stage layouts of p stages x v chunks: even, and Megatron's uneven ends balancing the
    embedding and the head (in decoder-layer units of the per-microbatch time)."""
    fixed = None
    first, last, layers = opts.first_stage_layers, opts.last_stage_layers, search.cfg.num_layers
    if (first is not None or last is not None) and p >= 2:
        # Megatron: one end given, the other p - 1 stages split the rest evenly
        fixed = (first if first is not None else (layers - (last or 0)) // (p - 1),
                 last if last is not None else (layers - (first or 0)) // (p - 1))
    layer = u.moe_decoder or u.decoder
    per_layer = layer.forward_s + layer.backward_s
    return dims_mod.stage_layouts(
        search.cfg.num_layers, p, v, uneven=opts.uneven_stages, fixed=fixed, near_even=fixed_chunks(search, opts) > 1,
        embedding_layers=(u.embedding.forward_s + u.embedding.backward_s) / per_layer,
        head_layers=(u.head.forward_s + u.head.backward_s) / per_layer)


def chunk_counts(num_layers: int, p: int, m: int, schedules: tuple[str, ...], fixed: int, *,
                  uneven: bool = False) -> list[tuple[int, str]]:
    """(v, V schedule or ''): v = 1 for 1F1B; v >= 2 for interleaved, which needs p >= 2 and m % p == 0: v
    dividing l / p (even chunks), or with ``uneven`` any v up to ``MAX_UNEVEN_CHUNKS`` (and l / p) whose p v
    does not divide l (lighter end chunks, Megatron's layout string); v = 2 for ZB-V and DualPipeV
    (l % 2p == 0, or with ``uneven`` near-even chunks of any l >= 2p; DualPipeV m >= 2p; p >= 2 unless
    asked for)."""
    out = [(1, "")] if "1f1b" in schedules and fixed == 1 else []
    if model.INTERLEAVED in schedules and p >= 2 and m % p == 0:
        even = [v for v in divisors(num_layers // p) if v >= 2] if num_layers % p == 0 else []
        odd = [v for v in range(2, min(dims_mod.MAX_UNEVEN_CHUNKS, num_layers // p) + 1)
               if num_layers % (p * v)] if uneven else []
        out += [(v, "") for v in sorted(set(even + odd)) if fixed == 1 or v == fixed]
    out += [(2, vs) for vs in V_SCHEDULES if vs in schedules and (p >= 2 or schedules == (vs,))
            and (num_layers % (2 * p) == 0 or (uneven and num_layers >= 2 * p)) and fixed in (1, 2)
            and (vs == "zb-v" or m >= 2 * p)]
    return out


def check_degree_options(opts: Options, search: Search) -> None:
    """Pinned degrees the model and the cluster can take; exit 2 naming the option and the fix.

    Raises:
        InvalidProblemError: a pinned degree that does not divide the devices, an expert degree that
            does not divide the experts or a dense model's, a context degree the sequence cannot take.
    """
    cfg, n = search.cfg, search.problem.cluster.num_devices
    for key in ("pipeline_parallel", "data_parallel", "virtual_pipeline", "context_parallel", "expert_parallel",
                "expert_tensor_parallel", "first_stage_layers", "last_stage_layers"):
        value = getattr(opts, key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise InvalidProblemError(f"option {key}={value!r} of solver 'ptdp' must be a positive integer")
    for key in ("pipeline_parallel", "data_parallel", "context_parallel"):
        value = getattr(opts, key)
        if value is not None and n % value:
            raise InvalidProblemError(
                f"option {key}={value} does not divide the cluster's {n} devices; use one of {divisors(n)}")
    pinned_ends = [k for k in ("first_stage_layers", "last_stage_layers") if getattr(opts, k) is not None]
    v = opts.virtual_pipeline or search.problem.num_chunks
    schedules = searched_schedules(search, opts) if pinned_ends else ()
    if pinned_ends and (v > 1 or "1f1b" not in schedules):
        raise InvalidProblemError(
            f"option {pinned_ends[0]}={getattr(opts, pinned_ends[0])} pins the end stages of 1F1B (Megatron's "
            f"--decoder-first/last-pipeline-num-layers, v = 1), but the search is pinned to "
            f"{'virtual_pipeline=' + str(v) if v > 1 else 'schedules ' + ','.join(schedules)}: drop "
            f"{' and '.join(pinned_ends)} (uneven_stages searches interleaved and V layouts itself), or pin "
            "virtual_pipeline=1 and schedules=1f1b")
    c = opts.context_parallel
    if c is not None:
        check_context_split(cfg.seq_length, c)
    e = opts.expert_parallel
    if e is not None and e > 1:
        if not cfg.is_moe:
            raise InvalidProblemError(
                f"option expert_parallel={e}: {cfg.name!r} is a dense model (no num_experts); drop the option or use 1")
        if cfg.num_experts % e or n % e:  # type: ignore[operator]
            good = [k for k in divisors(int(cfg.num_experts or 1)) if n % k == 0]
            raise InvalidProblemError(
                f"option expert_parallel={e} must divide num_experts={cfg.num_experts} of {cfg.name!r} and the "
                f"{n} devices; use one of {good}")
    if opts.zero_stage is not None and opts.zero_stage not in dims_mod.ZERO_STAGES:
        raise InvalidProblemError(
            f"option zero_stage={opts.zero_stage} of solver 'ptdp' must be 0, 1, 2 or 3 (0 DDP, 1 distributed "
            "optimizer, 2 + gradients, 3 FSDP)")
    if opts.load_balance_factor < 1:
        raise InvalidProblemError(
            f"option load_balance_factor={opts.load_balance_factor} must be at least 1 (busiest expert's tokens "
            "over the mean)")
    zero_stage_list(opts)
