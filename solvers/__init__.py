"""Solver registry: every pipeline solver is a pure function ``solve(problem, *, options) -> Plan``.

The registry is an explicit dict (house style: no decorators with import side effects). The
CLI and the Python API look names up here; a typo lists the valid names.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from typing import Any

from planner.errors import InvalidProblemError
from planner.schema import PipelineProblem, Plan
from solvers import even, pipedream_dp

SolveFn = Callable[..., Plan]



def _lazy(module: str) -> SolveFn:
    """A solver imported on first use (keeps ``import solvers`` cheap)."""

    def call(problem: PipelineProblem, *, options: Mapping[str, Any] | None = None) -> Plan:
        solve_fn: SolveFn = importlib.import_module(f"solvers.{module}").solve
        return solve_fn(problem, options=options)

    call.__name__ = f"{module}.solve"
    return call


SOLVERS: dict[str, SolveFn] = {
    "even": even.solve,
    "pipedream": pipedream_dp.solve,
    "pipedream-2bw": _lazy("pipedream_2bw"),
    "ptdp": _lazy("ptdp"),
    "stage-ilp": _lazy("stage_ilp"),
    "merak": _lazy("merak"),
    "adapipe": _lazy("adapipe"),
    "spipe": _lazy("spipe"),
    "mobius": _lazy("mobius"),
    "zero-offload": _lazy("zero_offload"),
}

DESCRIPTIONS: dict[str, str] = {
    "even": "Megatron-even baseline: equal layer counts per stage and chunk, cheapest uniform "
    "recompute that fits memory",
    "pipedream": "PipeDream's partitioning DP: contiguous stages with per-stage replication over a "
    "hierarchical topology (dissertation ch. 2)",
    "pipedream-2bw": "PipeDream-2BW's planner: sweeps depth, width, microbatch size and recompute for the "
    "2BW and Flush schedules with the chapter's throughput and memory models (dissertation ch. 3)",
    "ptdp": "PTD-P configuration search: tensor x pipeline x data degrees, interleaving, microbatch size "
    "and recompute for Megatron-LM (dissertation ch. 4)",
    "stage-ilp": "holistic ILP over layer-to-stage/chunk assignment and per-layer recompute, minimizing "
    "recompute, imbalance and warm-up bubbles together (poster, [stage-ilp])",
    "merak": "Merak baseline: even split with stage-aware recompute (more recompute on early stages)",
    "adapipe": "AdaPipe baseline: per-stage recompute by knapsack plus a partitioning DP",
    "spipe": "SPipe: hybrid GPU/CPU pipeline for models whose states exceed GPU memory (parameters and "
    "optimizer on the CPU, forward and backward stages per GPU)",
    "mobius": "Mobius-style offloaded pipeline baseline (stages swapped in from CPU memory)",
    "zero-offload": "ZeRO-Offload-style data parallelism baseline (optimizer state and step on the CPU)",
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
    typed = dataclasses.is_dataclass(options) and not isinstance(options, type)
    return get_solver(solver)(problem, options=options if typed else dict(options or {}))
