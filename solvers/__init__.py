"""Solver registry: every pipeline solver is a pure function ``solve(problem, *, options) -> Plan``.

The registry is an explicit dict (house style: no decorators with import side effects). The
CLI and the Python API look names up here; a typo lists the valid names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from planner.errors import InvalidProblemError
from planner.schema import PipelineProblem, Plan
from solvers import even, pipedream_dp

SolveFn = Callable[..., Plan]

SOLVERS: dict[str, SolveFn] = {
    "even": even.solve,
    "pipedream": pipedream_dp.solve,
}

DESCRIPTIONS: dict[str, str] = {
    "even": "Megatron-even baseline: equal layer counts per stage and chunk, cheapest uniform "
    "recompute that fits memory",
    "pipedream": "PipeDream's partitioning DP: contiguous stages with per-stage replication over a "
    "hierarchical topology (dissertation ch. 2)",
}


def get_solver(name: str) -> SolveFn:
    """Look a solver up by name.

    Raises:
        InvalidProblemError: the name is not registered; the message lists the valid names.
    """
    try:
        return SOLVERS[name]
    except KeyError:
        raise InvalidProblemError(f"unknown solver {name!r}; choose from {sorted(SOLVERS)}") from None


def solve(problem: PipelineProblem, *, solver: str = "even", options: Mapping[str, Any] | None = None) -> Plan:
    """Run a registered solver on a problem with string or typed options."""
    return get_solver(solver)(problem, options=dict(options or {}))
