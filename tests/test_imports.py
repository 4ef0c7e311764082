"""Only runtime_bridge may import torch: the planner must stay cheap inside autotuners."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_planner_solvers_cost_models_do_not_load_torch() -> None:
    code = (
        "import sys, planner, solvers, cost_models\n"
        "import planner.api, planner.cli, planner.export, planner.report, cost_models.simulate\n"
        "import cost_models.transformer, cost_models.hardware, cost_models.profiles, cost_models.schedules\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# What ``import planner.api`` and the CLI's cheap commands must not load (issue 16): the schema's
# types (pydantic) load on first use, numpy and the solvers with the first plan.
HEAVY = ("pydantic", "pydantic_core", "numpy", "scipy", "cost_models")
SCHEMA_TYPES = ("planner.schema", "planner.schema_types", "planner.schema_gavel", "planner.schema_cloud",
                "planner.schema_fill")


def _loaded_after(code: str) -> list[str]:
    """The project and heavy modules a fresh interpreter holds after running ``code``."""
    show = ("import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            f"{HEAVY + ('planner', 'solvers')!r}))")
    out = subprocess.run([sys.executable, "-c", f"{code}\n{show}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return eval(out.stdout.strip().splitlines()[-1])  # noqa: S307 (a list of names printed by the child)


def test_importing_the_api_loads_no_pydantic_numpy_schema_or_solver() -> None:
    loaded = _loaded_after("import planner.api")
    assert [m for m in loaded if m.split(".")[0] in HEAVY] == []
    assert [m for m in loaded if m.startswith("planner.schema")] == []
    assert [m for m in loaded if m.startswith("solvers.")] == []
    assert loaded == ["planner", "planner.api", "planner.errors"]
    registry = _loaded_after("import solvers; print([(i.name, i.description, i.schedules) for i in solvers.REGISTRY])")
    assert registry == ["planner", "planner.errors", "solvers"]


def test_cli_help_and_solvers_list_load_no_pydantic_numpy_or_solver() -> None:
    for argv in (["--help"], ["solvers"], ["plan", "--help"], ["cloud", "plan", "--help"]):
        code = ("import contextlib, io\nfrom planner import cli\nwith contextlib.redirect_stdout(io.StringIO()):\n"
                f"    assert cli.main({argv!r}) == 0")
        loaded = _loaded_after(code)
        assert [m for m in loaded if m.split(".")[0] in HEAVY or m in SCHEMA_TYPES or m.startswith("solvers.")] == [], argv


# Every name planner.api exported before its types were made lazy (issue 16), modules included.
API_NAMES = (
    "Any", "Cluster", "ClusterSpec", "InfeasibleError", "InvalidProblemError", "MAX_CSV_ACTIONS", "Mapping",
    "ModelProfile", "ModelSpec", "OFFLOAD_SOLVERS", "Path", "PipelineProblem", "Plan", "PlannerError", "SimResult",
    "TENSOR_SEARCHING_SOLVERS", "TYPE_CHECKING", "TransformerConfig", "_Frozen", "cloud_export", "cloud_plan",
    "cloud_problem", "cloud_replay", "cluster_simulate", "config_readers", "default_solver", "export", "fill",
    "fill_jobs", "fill_options", "fill_scale", "gavel_policies", "gavel_policy", "generate_cloud_trace", "importlib",
    "link_timelines", "load_cloud_catalogue", "load_cloud_trace", "load_cluster", "load_model", "load_plan", "log",
    "logging", "make_problem", "memory_timelines", "model_info", "plan", "resource_timelines", "save", "schedule",
    "schema_io", "simulate", "solvers", "time", "trace", "validate_plan",
)


def test_every_api_name_resolves_to_the_same_object() -> None:
    import importlib

    from planner import api, config_readers, schema, schema_io, validate

    missing = [name for name in (*API_NAMES, *api.__all__) if not hasattr(api, name)]
    assert missing == []
    assert set(api.__all__) <= set(API_NAMES) and set(API_NAMES) <= set(dir(api))
    for name in ("Cluster", "ModelProfile", "PipelineProblem", "Plan", "SimResult", "TransformerConfig", "_Frozen"):
        assert getattr(api, name) is getattr(schema, name)
    assert api.validate_plan is validate.validate_plan
    assert api.config_readers is config_readers and api.schema_io is schema_io
    assert api.ModelSpec == str | api.Path | schema.ModelProfile | schema.TransformerConfig
    assert api.ClusterSpec == str | api.Path | schema.Cluster and api.ClusterSpec is api.ClusterSpec
    namespace: dict[str, object] = {}
    exec("from planner.api import *", namespace)  # noqa: S102 (the star import sees __all__)
    assert {name for name in namespace if name != "__builtins__"} == set(api.__all__)
    with pytest.raises(AttributeError, match="no attribute 'Problem'"):
        importlib.import_module("planner.api").Problem  # noqa: B018


def test_cloud_markets_help_names_the_schema_markets() -> None:
    from planner import cli_cloud
    from planner.schema_cloud import MARKETS

    assert cli_cloud.MARKETS == MARKETS


def test_cli_reports_a_schema_validation_error_with_exit_2(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from planner import cli
    from planner.schema import Cluster

    monkeypatch.setattr(cli, "cmd_presets", lambda args: Cluster.model_validate({"name": "x", "num_devices": 0}))
    assert cli.main(["presets"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err and "internal error" not in err
