"""ptdp's per-module recompute: the cheapest module set that fits, by brute force over every set, and
what the plan carries."""

from __future__ import annotations

import math
from dataclasses import replace

from cost_models.memory import usable_memory_bytes
from cost_models.simulate import simulate
from planner import api
from planner.export import to_megatron_args
from planner.schema import KNOWN_RECOMPUTE, recompute_modules_of
from solvers import _ptdp_model as model
from solvers import ptdp
from solvers._ptdp_enum import enumerate_configs

# Qwen3-30B-A3B on 8 H100, EP 8, ZeRO-1, b = 1: no recompute needs 84 GiB, full recompute fits
OPTIONS = {"tensor_parallel": 1, "pipeline_parallel": 1, "expert_parallel": 8, "zero_stage": 1,
           "microbatch_size": 1, "recompute": "none,modules,full"}


def _problem():  # type: ignore[no-untyped-def]
    return api.make_problem("qwen3-30b-a3b", "h100:1x8", global_batch_size=64, seq_length=4096)


def test_search_picks_the_cheapest_module_set_that_fits() -> None:
    problem = _problem()
    plan = ptdp.solve(problem, options=OPTIONS)
    chosen = plan.stages[0].chunks[0].layer_strategies()[1]
    assert plan.recompute_modules == recompute_modules_of(chosen) and chosen not in KNOWN_RECOMPUTE
    sim = simulate(plan, include_events=False)
    capacity = usable_memory_bytes(problem.cluster.device)
    assert sim.fits_memory and max(s.peak_memory_bytes for s in sim.stages) <= capacity
    # brute force: every module set with less recompute time than the chosen one is over memory
    opts = ptdp.Options(**OPTIONS)  # type: ignore[arg-type]
    search = ptdp._prepare(problem, opts)
    units = ptdp.unit_cache(search, opts)
    config = next(c for c in enumerate_configs(search, opts, units) if c.recompute == chosen)
    u = units(config)
    cfg = search.cfg
    sets = {n: o for n, o in (u.moe_decoder or u.decoder).strategies().items()
            if n not in KNOWN_RECOMPUTE and recompute_modules_of(n)}
    assert len(sets) == 2**4 - 1 - 4  # core_attn, moe_act, layernorm, moe (no shared experts, no dense layer)
    peak = {n: model.config_peak_memory_bytes(u, cfg, replace(config, recompute=n)) for n in sets}
    assert peak[chosen] <= capacity < model.config_peak_memory_bytes(u, cfg, replace(config, recompute="none"))
    cheaper = [n for n in sets if sets[n].extra_s < sets[chosen].extra_s and not math.isclose(
        sets[n].extra_s, sets[chosen].extra_s)]
    assert cheaper and all(peak[n] > capacity for n in cheaper)
    # and it beats full recompute on time (what a set is for)
    assert sets[chosen].extra_s < u.moe_decoder.strategies()["full"].extra_s  # type: ignore[union-attr]


def test_module_plan_carries_only_its_set_and_exports_it() -> None:
    plan = ptdp.solve(_problem(), options=OPTIONS)
    kept = set(plan.model.layers[1].strategies())
    modules = plan.recompute_modules or ()
    assert kept == {"none", "selective", "full", "+".join(modules)}
    argv = to_megatron_args(plan)
    i = argv.index("--recompute-modules")
    assert argv[i - 2:i] == ["--recompute-granularity", "selective"] and tuple(argv[i + 1:i + 1 + len(modules)]) == modules


def test_flat_efficiency_searches_no_module_sets() -> None:
    plan = ptdp.solve(_problem(), options={**OPTIONS, "efficiency": 0.5})
    assert plan.recompute_modules is None  # the flat model has no per-module times: full recompute instead


def test_a_pinned_module_set_is_the_set_the_search_would_cost() -> None:
    """``recompute=<set>`` (a recipe's ``--recompute-modules``) searches that set only: the plan carries
    it, at the time and peak the ``modules`` search costs for the same set, and a set given out of
    Megatron-Core's order is the same set."""
    problem = _problem()
    searched = ptdp.solve(problem, options=OPTIONS)
    chosen = "+".join(searched.recompute_modules or ())
    reordered = "+".join(reversed(searched.recompute_modules or ()))
    pinned = ptdp.solve(problem, options={**OPTIONS, "recompute": reordered})
    assert pinned.recompute_modules == searched.recompute_modules
    assert {row["recompute"] for row in pinned.candidates} == {chosen}
    assert pinned.predicted.iteration_time_s == searched.predicted.iteration_time_s  # type: ignore[union-attr]
    # a set that frees more than the cheapest fitting one: slower, still that set
    assert "core_attn" not in (searched.recompute_modules or ())
    wider = ptdp.solve(problem, options={**OPTIONS, "recompute": f"core_attn+{chosen}"})
    assert wider.recompute_modules == ("core_attn", *(searched.recompute_modules or ()))
    assert wider.predicted.iteration_time_s > searched.predicted.iteration_time_s  # type: ignore[union-attr]


def test_pinned_module_sets_that_cannot_apply_are_errors() -> None:
    import pytest

    from planner.errors import InvalidProblemError

    assert ptdp.recompute_settings("none, layernorm+moe_act,full,none") == ("none", "moe_act+layernorm", "full")
    with pytest.raises(InvalidProblemError, match="'attn' is neither"):
        ptdp.recompute_settings("none,attn")
    with pytest.raises(InvalidProblemError, match="empty"):
        ptdp.recompute_settings(" , ")
    dense = api.make_problem("llama3-8b", "h100:8", global_batch_size=64)
    with pytest.raises(InvalidProblemError, match=r"\['moe_act'\] of set .* do not exist in 'llama3-8b'"):
        ptdp.solve(dense, options={"recompute": "layernorm+moe_act"})
    with pytest.raises(InvalidProblemError, match="per-operation model only"):
        ptdp.solve(_problem(), options={**OPTIONS, "recompute": "moe_act", "efficiency": 0.5})


def test_one_module_set_offered_to_the_per_stage_solvers() -> None:
    """``make_problem(recompute_modules=...)`` puts one Megatron-Core module set on every decoder layer
    beside none / selective / full; the stage ILP, which picks per stage, uses it where it beats full
    recompute (Llama 3 8B at b = 2 on four H100 stages: not worse than without it, and the set is in
    the plan); more than one set, a flat model or a measured profile are refused (exit 2)."""
    import pytest

    from planner.errors import InvalidProblemError

    kw = {"num_stages": 4, "global_batch_size": 64, "microbatch_size": 2}
    plain = api.plan(api.make_problem("llama3-8b", "h100:4", **kw), solver="stage-ilp")
    problem = api.make_problem("llama3-8b", "h100:4", **kw, recompute_modules="mlp+layernorm")
    assert set(problem.model.layers[1].strategies()) == {"none", "selective", "full", "layernorm+mlp"}
    with_set = api.plan(problem, solver="stage-ilp")
    used = {s for stage in with_set.stages for chunk in stage.chunks for s in chunk.layer_strategies()}
    assert "layernorm+mlp" in used
    assert with_set.predicted.iteration_time_s <= plain.predicted.iteration_time_s  # type: ignore[union-attr]
    with pytest.raises(InvalidProblemError, match="gives 2 sets; a plan carries one"):
        api.make_problem("llama3-8b", "h100:4", **kw, recompute_modules="layernorm,mlp")
    with pytest.raises(InvalidProblemError, match="per-operation cost model"):
        api.make_problem("llama3-8b", "h100:4", **kw, recompute_modules="mlp", efficiency=0.5)
    with pytest.raises(InvalidProblemError, match=r"\['moe_act'\] in 'moe_act' do not exist"):
        api.make_problem("llama3-8b", "h100:4", **kw, recompute_modules="moe_act")
    with pytest.raises(InvalidProblemError, match="transformer configs only"):
        api.make_problem("pipedream:vgg16", "v100:4", num_stages=2, recompute_modules="mlp")


def test_recompute_modules_flag(capsys) -> None:  # type: ignore[no-untyped-def]
    """``--recompute-modules SETS`` reaches ptdp as its own recompute option, one set reaches the other
    solvers' profiles; without sets a per-stage solver exits 2 naming the fix."""
    from planner.cli import main

    base = ["plan", "--model", "llama3-8b", "--cluster", "h100:4", "--pipeline", "4", "--global-batch", "32"]
    assert main([*base, "--solver", "ptdp", "--recompute-modules", "layernorm+mlp", "--json"]) == 0
    assert main([*base, "--solver", "stage-ilp", "--recompute-modules"]) == 2
    assert "--recompute-modules layernorm+mlp (or --solver ptdp)" in capsys.readouterr().err
    assert main([*base, "--solver", "even", "--recompute-modules", "layernorm", "--option", "recompute=layernorm"]) == 0
