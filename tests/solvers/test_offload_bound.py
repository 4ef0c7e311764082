"""The offload sweep's lower bound: never above a simulated iteration time, and pruning by it
picks the same plan as simulating every configuration."""

from __future__ import annotations

import pytest

import solvers
from cost_models import models
from planner import api
from planner.errors import InfeasibleError
from solvers import _spipe_common as common
from solvers import spipe
from solvers._offload_bound import iteration_lower_bound

CASES = [  # (model, layers, cluster, global batch)
    ("spipe-19b", None, "v100:1x4", 16),
    ("gpt-1.7b", 48, "a100-80gb:1x4", 32),
    ("gpt-1.7b", 96, "a100-80gb:2x4", 16),
]


def _problem(name: str, layers: int | None, cluster: str, batch: int):
    config = models.model_preset(name)
    if layers is not None:
        config = config.model_copy(update={"num_layers": layers})
    return api.make_problem(config, cluster, global_batch_size=batch)


@pytest.mark.parametrize("case", CASES[:2])
def test_the_bound_is_below_every_simulated_iteration(case) -> None:
    problem = _problem(*case)
    host = spipe.host_from(problem, spipe.Options())
    for cfg in spipe._grid(problem, spipe.Options())[::3]:
        model = common.profile_for(problem, cfg.microbatch_size)
        try:
            plan, result = common.evaluate(common.build_plan(problem, model, cfg, host, solver="spipe"))
        except InfeasibleError:
            continue
        compute = iteration_lower_bound(model, cfg, problem.cluster.num_devices)
        bound = iteration_lower_bound(model, cfg, problem.cluster.num_devices, problem.cluster, host)
        assert 0 < compute <= bound <= result.sim.iteration_time_s, cfg
        # within the bubble: a bound far below the simulation would prune nothing
        assert compute >= 0.3 * result.sim.iteration_time_s, cfg


@pytest.mark.parametrize("solver", ["spipe", "mobius"])
@pytest.mark.parametrize("case", CASES)
def test_pruning_picks_the_plan_of_the_full_sweep(solver: str, case) -> None:
    problem = _problem(*case)
    try:
        full = solvers.solve(problem, solver=solver, options={"prune": False})
    except InfeasibleError as e:
        with pytest.raises(InfeasibleError) as pruned_error:
            solvers.solve(problem, solver=solver)
        assert str(pruned_error.value) == str(e)
        return
    pruned = solvers.solve(problem, solver=solver)
    keys = ("stages", "offload", "degrees", "microbatch_size", "num_microbatches", "predicted", "status")
    assert {k: getattr(pruned, k) for k in keys} == {k: getattr(full, k) for k in keys}
    # the simulated rows are rows of the full table, in its order
    assert [r for r in full.candidates if r in pruned.candidates] == list(pruned.candidates)
    assert len(pruned.candidates) <= len(full.candidates)
