"""ptdp's ranking by a time bound (``solvers._ptdp_rank``): the same first entries, hence the same plan,
as costing every configuration; and the per-rank sums it relies on equal the plain ``math.fsum``."""

from __future__ import annotations

import math
import random

import pytest

from cost_models import models
from planner import api
from solvers import _ptdp_model as model
from solvers import ptdp
from solvers._ptdp_enum import enumerate_configs
from solvers._ptdp_rank import rank_configs

CASES = [  # (model, layers, cluster, global batch, options)
    ("gpt-1.7b", 30, "a100-80gb:1x8", 64, {}),  # uneven ends and interleaving (30 = 2 x 3 x 5)
    ("gpt-1.7b", 48, "a100-80gb:2x8", 128, {"schedules": "1f1b,interleaved-1f1b"}),
    ("gpt-1.7b", 96, "a100-40gb:1x8", 32, {"num_simulated": 2, "num_candidates": 3}),  # tight memory
    ("gpt-1.7b", 24, "a100-40gb:1x4", 16, {"num_simulated": 1, "num_candidates": 1, "zero_stages": "0"}),
]


def _search(name: str, layers: int, cluster: str, batch: int, options: dict):  # type: ignore[no-untyped-def]
    config = models.model_preset(name).model_copy(update={"num_layers": layers})
    problem = api.make_problem(config, cluster, global_batch_size=batch)
    opts = ptdp.Options(**options)
    search = ptdp._prepare(problem, opts)
    return problem, opts, search, ptdp.unit_cache(search, opts)


def _exhaustive(search, opts, units) -> list:  # type: ignore[no-untyped-def]
    """The ranking before the bound: every configuration (module sets picked) costed and sorted stably."""
    overlap = {"overlap_grad_reduce": opts.overlap_grad_reduce, "overlap_param_gather": opts.overlap_param_gather}
    scored = [(c, model.estimate(units(c), search.cfg, search.problem.cluster, c, **overlap))
              for c in enumerate_configs(search, opts, units)]
    scored.sort(key=lambda item: (not item[1].fits, item[1].iteration_s, ptdp._tie_key(item[0])))
    return scored


@pytest.mark.parametrize("case", CASES)
def test_bounded_ranking_starts_like_the_exhaustive_one(case) -> None:
    problem, opts, search, units = _search(*case)
    full = _exhaustive(search, opts, units)
    keep = opts.num_simulated + opts.num_candidates
    everything = rank_configs(search, opts, units, ptdp._tie_key, keep=None)
    assert everything.complete and everything.entries == full
    bounded = rank_configs(search, opts, units, ptdp._tie_key, keep=keep)
    assert bounded.prefix == full[:keep if not bounded.complete else len(full)]
    assert any(est.fits for _, est in full)


def test_the_bound_skips_most_configurations_and_the_plan_is_unchanged() -> None:
    problem, opts, search, units = _search(*CASES[0])
    bounded = rank_configs(search, opts, units, ptdp._tie_key, keep=opts.num_simulated + opts.num_candidates)
    assert not bounded.complete and len(bounded.entries) < bounded.searched / 2
    plan = ptdp.solve(problem)
    scored = _exhaustive(search, opts, units)
    best, simulated = ptdp._simulate_best(search, opts, scored)
    assert plan.predicted == best[0].predicted and plan.degrees == best[0].degrees
    assert plan.candidates == ptdp.candidate_rows(search, scored, simulated, opts.num_candidates)
    assert any("costed in full" in note for note in plan.notes)


def test_per_rank_sums_equal_fsum_of_every_chunk() -> None:
    problem, opts, search, units = _search(*CASES[0])
    cfg = search.cfg
    for c in list(enumerate_configs(search, opts, units))[::7]:
        u = units(c)
        ranges = c.rank_ranges(cfg.num_layers)
        value = lambda lay: lay.forward_s + lay.backward_s + model.option(lay, c.recompute).extra_s  # noqa: E731
        reference = [math.fsum(model._block_sum(u, first, num, value) for first, num in r) for r in ranges]
        reference[0] += u.embedding.forward_s + u.embedding.backward_s
        reference[-1] += u.head.forward_s + u.head.backward_s
        assert model.rank_work_s(u, cfg, c) == reference
        static = [model.rank_static_bytes(u, r, c.dims) for r in ranges]
        assert model.ranks_static_bytes(u, ranges, c.dims) == static
        peak = max(f + model.chunk_activations(u, c, ranges[r], r) for r, f in model.rank_fixed_bytes(u, cfg, c))
        assert model.config_peak_memory_bytes(u, cfg, c) == peak if not c.v_schedule else True
        assert model.peak_memory_lower_bound(u, cfg, c) <= model.config_peak_memory_bytes(u, cfg, c)


def test_exact_sum_of_repeated_values_is_fsum() -> None:
    rng = random.Random(3)
    for _ in range(2000):
        blocks = tuple(((rng.randint(0, 9), rng.randint(0, 3)), rng.randint(1, 40)) for _ in range(rng.randint(1, 3)))
        vd, vm = rng.uniform(0, 1e9) * rng.choice([1, 1e-12]), rng.uniform(0, 1e3)
        chunks = [(d * vd if d else 0.0) + (e * vm if e else 0.0) for (d, e), k in blocks for _ in range(k)]
        assert model._exact_sum(blocks, vd, vm) == math.fsum(chunks)


def test_config_copies_and_layouts_equal_their_plain_forms() -> None:
    """``Config.but`` is ``dataclasses.replace``; a ``Layout`` hashes and compares as its plain tuple."""
    import dataclasses

    from solvers._ptdp_states import Layout, _rank_ranges

    rng = random.Random(5)
    base = model.Config(tensor=2, pipeline=4, data=8, virtual=3, microbatch_size=2, num_microbatches=16,
                        recompute="selective", ends=(3, 5), v_schedule="")
    fields = {"tensor": [1, 4], "virtual": [1, 2], "recompute": ["none", "full"], "ends": [(0, 0), (2, 1)],
              "v_schedule": ["zb-v"], "zero_stage": [1, 3]}
    for _ in range(30):
        changes = {k: rng.choice(v) for k, v in fields.items() if rng.random() < 0.5}
        assert base.but(**changes) == dataclasses.replace(base, **changes)  # type: ignore[arg-type]
    for args in [(30, 4, 2, (0, 0), False), (48, 8, 3, (4, 2), False), (24, 4, 2, (0, 0), True)]:
        layout = _rank_ranges(*args)
        plain = tuple(tuple(r) for r in layout)
        assert isinstance(layout, Layout) and layout == plain and hash(layout) == hash(plain) == hash(layout)


def test_the_time_bound_floor_is_below_every_time_bound() -> None:
    """``_time_bound_floor`` (the ranking's cheap first key) never exceeds ``pipeline_time_s``: every
    non-V configuration of the dense cases and of a toy MoE (dense first layer, expert layers after)."""
    from solvers._ptdp_rank import _time_bound_floor
    from tests.solvers.test_ptdp_dims import _toy_moe_problem

    moe = _toy_moe_problem(1e9)
    moe_opts = ptdp.Options(min_tokens_per_context_rank=1)
    moe_search = ptdp._prepare(moe, moe_opts)
    searches = [_search(*case)[1:] for case in CASES[:2]] + [(moe_opts, moe_search, ptdp.unit_cache(moe_search, moe_opts))]
    checked = 0
    for opts, search, units in searches:
        cluster = search.problem.cluster
        for c in enumerate_configs(search, opts, units, prune=False):
            if c.v_schedule:
                continue
            u = units(c)
            exact = model.pipeline_time_s(u, search.cfg, cluster, c)
            floor = _time_bound_floor(u, search.cfg, cluster, c)
            assert floor <= exact, c
            if c.pipeline == 1:  # one rank: its work is the average, the floor is the bound less the margin
                assert floor == pytest.approx(exact, rel=1e-8), c
            checked += 1
    assert checked > 500
