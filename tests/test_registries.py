"""The solver and Gavel policy registries: one entry per name with capabilities, lazy imports,
and the CLI's lists generated from them."""

from __future__ import annotations

import subprocess
import sys

import pytest

import solvers
from planner import api, cli
from planner.errors import InvalidProblemError
from solvers import gavel


def test_every_solver_entry_loads_a_solve_function_and_typed_options() -> None:
    names = [info.name for info in solvers.REGISTRY]
    assert len(names) == len(set(names)) and set(names) == set(solvers.SOLVERS) == set(solvers.DESCRIPTIONS)
    for info in solvers.REGISTRY:
        module = info.load()
        assert callable(module.solve) and info.options_type() is module.Options
        assert info.description and info.schedules
    assert [i.name for i in solvers.REGISTRY if i.searches_tensor_parallelism] == ["ptdp"]
    with pytest.raises(InvalidProblemError, match="choose from"):
        solvers.solver_info("evn")


def test_typed_options_go_through_the_registry() -> None:
    problem = api.make_problem("gpt-tiny", "cpu:2", num_stages=2, num_microbatches=4)
    options = solvers.solver_info("even").options_type()(recompute="full")
    plan = solvers.solve(problem, solver="even", options=options)
    assert plan.options == {"recompute": "full"}


def test_cli_lists_come_from_the_registries(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["solvers"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [info.name for info in solvers.REGISTRY]
    assert "Schedules: 1f1b, interleaved-1f1b" in lines[[i.name for i in solvers.REGISTRY].index("ptdp")]
    assert cli.main(["policies"]) == 0
    shown = {line.split()[0] for line in capsys.readouterr().out.splitlines()}
    assert shown == set(gavel.POLICIES)
    help_text = cli.build_parser()._subparsers._group_actions[0].choices["plan"].format_help()  # type: ignore[union-attr]
    assert "ptdp*" in help_text


def test_policy_registry_dispatches_by_entry_and_aggregates_pop_by_declared_rule() -> None:
    assert len(gavel.REGISTRY) == len(gavel.POLICIES)
    assert {info.aggregate for info in gavel.REGISTRY} == {"min", "max", "sum"}
    assert gavel.POLICIES["max_min_fairness_perf"].aggregate == "min"
    assert gavel.POLICIES["min_total_duration_perf"].aggregate == "max"
    assert gavel.POLICIES["fifo_perf"].aggregate == "sum"
    assert all(info.heterogeneity_aware == ("_perf" in info.name or "_packed" in info.name or info.name in (
        "hierarchical", "min_cost", "min_cost_slo")) for info in gavel.REGISTRY)


def test_importing_the_api_loads_no_solver_module_and_no_numpy() -> None:
    code = ("import sys, planner.api; print(sorted(m for m in sys.modules if m.startswith('solvers.') "
            "or m.startswith('cost_models.') or m == 'numpy'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_solver_options_listed_with_types(capsys: pytest.CaptureFixture[str]) -> None:
    assert solvers.solver_info("even").option_fields() == {"recompute": "str | None = None"}
    assert cli.main(["solvers", "--options"]) == 0
    assert "Options: recompute: str | None = None" in capsys.readouterr().out
