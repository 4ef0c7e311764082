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
    from solvers.ptdp import Options, Search

Scored = list[tuple[model.Config, model.Estimate]]


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


def rank_configs(search: Search, opts: Options, units: Callable[[model.Config], model.UnitCosts],
                 tie_key: Callable[[model.Config], tuple[int, ...]], *, keep: int | None) -> Ranking:
    """Cost configurations by increasing time bound; stop once ``keep`` fit and the rest cannot rank
    among them (``keep`` None: cost every one)."""
    cfg, cluster = search.cfg, search.problem.cluster
    overlap = {"overlap_grad_reduce": opts.overlap_grad_reduce, "overlap_param_gather": opts.overlap_param_gather}
    capacity = usable_memory_bytes(cluster.device)  # type: ignore[arg-type]
    pending = []
    for index, c in enumerate(enumerate_configs(search, opts, units, lazy_modules=True)):
        u = units(c)
        variants = [c.but(recompute=name) for name in u.module_sets] if c.recompute == MODULES else [c]
        bound = min(model.pipeline_time_s(u, cfg, cluster, variant) for variant in variants)
        pending.append((bound, index, c, u, variants))
    pending.sort(key=lambda item: (item[0], item[1]))
    costed: list[tuple[int, model.Config, model.Estimate]] = []
    fastest: list[float] = []  # max-heap (negated) of the ``keep`` least fitting times
    complete = True
    for bound, index, c, u, variants in pending:
        full = keep is not None and len(fastest) >= keep
        if full and bound > -fastest[0]:
            complete = False
            break
        # the sync and optimizer times only add: the whole closed-form time, a tighter bound
        if full and min(model.iteration_s(u, cfg, cluster, variant, **overlap) for variant in variants) > -fastest[0]:
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
            c = c.but(recompute=picked)
        est = model.estimate(u, cfg, cluster, c, **overlap)
        costed.append((index, c, est))
        if est.fits and keep is not None:
            heapq.heappush(fastest, -est.iteration_s)
            if len(fastest) > keep:
                heapq.heappop(fastest)
    if not complete and len(fastest) < keep:  # type: ignore[operator]
        return rank_configs(search, opts, units, tie_key, keep=None)  # the ranking needs those that do not fit
    costed.sort(key=lambda item: (not item[2].fits, item[2].iteration_s, tie_key(item[1]), item[0]))
    return Ranking(entries=[(c, est) for _, c, est in costed], searched=len(pending), complete=complete, keep=keep)
