"""Ranking the PTD-P configurations: closed-form time for all, memory only where it can change the answer.

The solver simulates the best closed-form configurations that fit memory and lists the next ones in
``plan.candidates``: it reads at most the first K = ``num_simulated`` + ``num_candidates`` entries of
the ranking (fitting first, then by time, ties by ``ptdp._tie_key`` and the enumeration order). A
configuration's closed-form time (compute, bubble, point-to-point, data-parallel sync, optimizer step:
``_ptdp_model.time_parts``) does not depend on its memory, which costs most of the search (the peak over
every rank of an uneven layout, the heaviest interleaved state, and for ``modules`` the bisection of
the module sets). So every configuration's time is taken first, a lower bound for ``modules``: the
least time over its module sets, one of which it picks. Configurations are then costed in full in
increasing order of that bound until K of them fit and the next bound exceeds the K-th fitting
time: every configuration left takes longer than the K-th, so the first K entries are those of the
exhaustive ranking (branch and bound with an exact bound; ``tests/solvers/test_ptdp_rank.py``
compares the two). When the solver needs more than K entries (nothing fits in simulation among
them), ``rank_configs(..., keep=None)`` costs everything.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cost_models.memory import usable_memory_bytes
from solvers import _ptdp_model as model
from solvers._ptdp_enum import MODULES, cheapest_fitting_modules, enumerate_configs

if TYPE_CHECKING:
    from planner.schema import Cluster, TransformerConfig
    from solvers.ptdp import Options, Search

Scored = list[tuple[model.Config, model.Estimate]]
_FLOOR_MARGIN = 1e-9


@dataclass(frozen=True, slots=True)
class Ranking:
    """The costed configurations in the exhaustive ranking's order (``entries[:keep]`` is its prefix)."""

    entries: Scored
    searched: int
    """Configurations enumerated (those of ``modules`` before picking a set)."""
    complete: bool
    """Every configuration was costed: ``entries`` is the exhaustive ranking."""
    keep: int | None

    @property
    def prefix(self) -> Scored:
        """The entries known to be the exhaustive ranking's (all of them when complete)."""
        return self.entries if self.complete or self.keep is None else self.entries[:self.keep]


def sync_overlap(opts: Options) -> dict[str, bool]:
    """The closed form's data-parallel sync settings of the options (``_ptdp_model.time_parts``)."""
    return {"overlap_grad_reduce": opts.overlap_grad_reduce, "overlap_param_gather": opts.overlap_param_gather,
            "fp32_allreduce": opts.optimizer == "deepspeed-bf16"}


def rank_configs(search: Search, opts: Options, units: Callable[[model.Config], model.UnitCosts],
                 tie_key: Callable[[model.Config], tuple[int, ...]], *, keep: int | None) -> Ranking:
    """Cost configurations by increasing time bound; stop once ``keep`` fit and the rest cannot rank
    among them (``keep`` None: cost every one)."""
    cfg, cluster = search.cfg, search.problem.cluster
    overlap = sync_overlap(opts)
    capacity = usable_memory_bytes(cluster.device)  # type: ignore[arg-type]
    # (time bound, index, exact?, ...) in a heap: an entry holding only the cheap lower bound on the time
    # bound (``_time_bound_floor``) is replaced by its exact bound when it comes first, so entries leave
    # in the order of (time bound, index), and those past the stop never have their bound computed.
    pending = []
    for index, c in enumerate(enumerate_configs(search, opts, units, lazy_modules=True)):
        u = units(c)
        variants = [c.but(recompute=name) for name in u.module_sets] if c.recompute == MODULES else [c]
        if c.v_schedule:
            times = [model.pipeline_time_s(u, cfg, cluster, variant) for variant in variants]
            pending.append((min(times), index, True, c, u, variants, times))
        else:
            pending.append((min(_time_bound_floor(u, cfg, cluster, variant) for variant in variants),
                            index, False, c, u, variants, []))
    searched = len(pending)
    heapq.heapify(pending)
    costed: list[tuple[int, model.Config, model.Estimate]] = []
    fastest: list[float] = []  # max-heap (negated) of the ``keep`` least fitting times
    complete = True
    while pending:
        bound, index, exact, c, u, variants, times = heapq.heappop(pending)
        full = keep is not None and len(fastest) >= keep
        if full and bound > -fastest[0]:  # every entry left has a time bound at least this one
            complete = False
            break
        if not exact:
            times = [model.pipeline_time_s(u, cfg, cluster, variant) for variant in variants]
            heapq.heappush(pending, (min(times), index, True, c, u, variants, times))
            continue
        # the sync and optimizer times only add: the whole closed-form time, a tighter bound
        if full and min(model.iteration_s(u, cfg, cluster, variant, pipeline_s=time, **overlap)
                        for variant, time in zip(variants, times)) > -fastest[0]:
            complete = False
            continue
        # cannot fit (with the module set that keeps the fewest bytes, the frontier's last): not costed
        lightest = variants[-1]
        if keep is not None and model.peak_memory_lower_bound(u, cfg, lightest) > capacity:
            complete = False
            continue
        if c.recompute == MODULES:
            picked = cheapest_fitting_modules(u, cfg, c, capacity)
            if picked is None:
                continue  # the empty set fits: ``none`` is its own configuration
            times = [times[u.module_sets.index(picked)]]
            c = c.but(recompute=picked)
        est = model.estimate(u, cfg, cluster, c, pipeline_s=times[0], **overlap)
        costed.append((index, c, est))
        if est.fits and keep is not None:
            heapq.heappush(fastest, -est.iteration_s)
            if len(fastest) > keep:
                heapq.heappop(fastest)
    if not complete and len(fastest) < keep:  # type: ignore[operator]
        return rank_configs(search, opts, units, tie_key, keep=None)  # the ranking needs those that do not fit
    costed.sort(key=lambda item: (not item[2].fits, item[2].iteration_s, tie_key(item[1]), item[0]))
    return Ranking(entries=[(c, est) for _, c, est in costed], searched=searched, complete=complete, keep=keep)


def _time_bound_floor(u: model.UnitCosts, cfg: TransformerConfig, cluster: Cluster, c: model.Config) -> float:
    """At most ``model.pipeline_time_s`` of a configuration that is not a V schedule, without its per-rank
    sums: the slowest rank's work is at least the average, the whole model's work over p (less a relative
    1e-9 for the roundings of the two ways of summing it)."""
    p, v, m = c.pipeline, c.virtual, c.num_microbatches
    send_s = 0.0
    if p > 1:
        bandwidth, latency = model.p2p_link(cluster, c)
        send_s = latency + u.decoder.output_bytes / bandwidth
    dense, moe_count = u.counts(0, cfg.num_layers)
    total = (u.embedding.forward_s + u.embedding.backward_s + u.head.forward_s + u.head.backward_s
             + model.head_option(u, c.recompute).extra_s)
    for layer, count in ((u.decoder, dense), (u.moe_decoder, moe_count)):
        if layer is not None and count:
            total += count * (layer.forward_s + layer.backward_s + model.option(layer, c.recompute).extra_s)
    average = total / p
    return (m * (average + 2 * v * send_s) + (p - 1) / v * average + 2 * (p - 1) * send_s) * (1 - _FLOOR_MARGIN)
