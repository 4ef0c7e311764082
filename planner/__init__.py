"""paraplan's planner package: schema, Python API, CLI, exporters.

``planner.plan``, ``planner.simulate``... are the functions of ``planner.api`` (loaded on
first use, so that ``import planner`` stays cheap and never loads torch).
"""

from __future__ import annotations

from typing import Any

from planner.errors import InfeasibleError, InvalidProblemError, PlannerError

__all__ = ["InfeasibleError", "InvalidProblemError", "PlannerError"]

_API = ("load_model", "load_cluster", "load_plan", "make_problem", "plan", "simulate", "export", "model_info", "save")


def __getattr__(name: str) -> Any:
    if name in _API:
        from planner import api

        return getattr(api, name)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")
