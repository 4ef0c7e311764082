"""Solver registry: every pipeline solver is a pure function ``solve(problem, *, options) -> Plan``.

One entry per solver (``REGISTRY``) carries its name, module, description, capabilities and
the schedules it plans; the CLI's ``paraplan solvers`` list and ``--solver`` help are generated
from it. Modules are imported on first use, so ``import solvers`` loads no solver, no numpy and
not the schema's types (pydantic): the registry is readable without them, and a solver's
``Options`` class loads with its module. The registry is an explicit tuple (house style: no
decorators with import side effects).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.errors import InvalidProblemError

if TYPE_CHECKING:  # annotations only: ``import solvers`` does not load the schema (pydantic)
    from planner.schema import PipelineProblem, Plan

SolveFn = Callable[..., "Plan"]

FLUSHED = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "flush")


@dataclass(frozen=True, slots=True, kw_only=True)
class SolverInfo:
    """One registered solver: what it is, what it searches, which schedules it plans."""

    name: str
    module: str
    """Module under ``solvers`` with ``solve`` and a frozen ``Options`` dataclass."""
    description: str
    searches: tuple[str, ...]
    """What the solver chooses itself, e.g. ``tensor parallelism``, ``pipeline depth``."""
    schedules: tuple[str, ...]
    offload: bool = False
    """Keeps model states in CPU memory (an offloaded pipeline)."""

    @property
    def searches_tensor_parallelism(self) -> bool:
        return "tensor parallelism" in self.searches

    def load(self) -> Any:
        return importlib.import_module(f"solvers.{self.module}")

    def solve(self, problem: PipelineProblem, *, options: Any = None) -> Plan:
        solve_fn: SolveFn = self.load().solve
        return solve_fn(problem, options=options)

    def options_type(self) -> type:
        """The solver's typed ``Options`` dataclass (accepted by ``solve`` and ``planner.api.plan``)."""
        options: type = self.load().Options
        return options

    def option_fields(self) -> dict[str, str]:
        """Option name -> type and default, e.g. ``{"recompute": "str | None = None"}`` (imports the solver)."""
        out = {}
        for f in dataclasses.fields(self.options_type()):
            default = "" if f.default is dataclasses.MISSING else f" = {f.default!r}"
            out[f.name] = f"{f.type}{default}"
        return out


REGISTRY: tuple[SolverInfo, ...] = (
    SolverInfo(
        name="even", module="even",
        description="Megatron-even baseline: equal layer counts per stage and chunk, cheapest uniform recompute "
        "that fits memory [megatron], [ptdp]",
        searches=("pipeline depth", "uniform recompute"), schedules=(*FLUSHED, "zb-v", "dualpipe-v", "custom")),
    SolverInfo(
        name="pipedream", module="pipedream_dp",
        description="PipeDream's partitioning DP: contiguous stages with per-stage replication over a "
        "hierarchical topology [pipedream], [narayanan-thesis] ch. 2",
        searches=("pipeline depth", "stage boundaries", "per-stage replication"), schedules=("1f1b",)),
    SolverInfo(
        name="pipedream-2bw", module="pipedream_2bw",
        description="PipeDream-2BW's planner: depth, width, microbatch size and recompute for the 2BW and "
        "Flush schedules [pipedream-2bw]",
        searches=("pipeline depth", "data parallelism", "microbatch size", "uniform recompute"),
        schedules=("2bw", "flush")),
    SolverInfo(
        name="ptdp", module="ptdp",
        description="PTD-P configuration search: tensor x pipeline x data degrees, interleaving, microbatch "
        "size and recompute for Megatron-LM [ptdp], and the V schedules ZB-V and DualPipeV for torch and "
        "torchtitan [zero-bubble-v], [deepseek-v3]",
        searches=("tensor parallelism", "pipeline depth", "data parallelism", "interleaving", "microbatch size",
                  "uniform recompute", "schedule (1F1B, interleaved, ZB-V, DualPipeV)"),
        schedules=("1f1b", "interleaved-1f1b", "zb-v", "dualpipe-v")),
    SolverInfo(
        name="stage-ilp", module="stage_ilp",
        description="holistic ILP over layer-to-stage/chunk assignment and per-layer recompute, minimizing "
        "recompute, imbalance and warm-up bubbles together [stage-ilp]",
        searches=("stage boundaries", "per-layer recompute", "pipeline depth"),
        schedules=("1f1b", "flush", "gpipe", "interleaved-1f1b", "zb-h1", "zb-h2")),
    SolverInfo(
        name="merak", module="merak",
        description="Merak baseline: even split with stage-aware recompute (more recompute on early stages) [merak]",
        searches=("per-stage recompute",), schedules=FLUSHED),
    SolverInfo(
        name="adapipe", module="adapipe",
        description="AdaPipe baseline: per-stage recompute by knapsack plus a partitioning DP [adapipe]",
        searches=("stage boundaries", "per-stage recompute"), schedules=FLUSHED),
    SolverInfo(
        name="spipe", module="spipe",
        description="SPipe: hybrid GPU/CPU pipeline for models whose states exceed GPU memory (parameters "
        "and optimizer on the CPU, forward and backward stages per GPU) [spipe]",
        searches=("stage boundaries",), schedules=("1f1b",), offload=True),
    SolverInfo(
        name="mobius", module="mobius",
        description="Mobius-style offloaded pipeline baseline (stages swapped in from CPU memory) [mobius]",
        searches=("stage boundaries",), schedules=("1f1b",), offload=True),
    SolverInfo(
        name="zero-offload", module="zero_offload",
        description="ZeRO-Offload-style data parallelism baseline (optimizer state and step on the CPU) [zero-offload]",
        searches=(), schedules=("1f1b",), offload=True),
)

_BY_NAME: dict[str, SolverInfo] = {info.name: info for info in REGISTRY}

SOLVERS: dict[str, SolveFn] = {info.name: info.solve for info in REGISTRY}
"""Name -> solve function (imports the solver's module on the first call)."""

DESCRIPTIONS: dict[str, str] = {info.name: info.description for info in REGISTRY}


def solver_info(name: str) -> SolverInfo:
    """The registry entry of a solver.

    Raises:
        InvalidProblemError: the name is not registered; the message lists the valid names.
    """
    try:
        return _BY_NAME[name]
    except KeyError:
        raise InvalidProblemError(f"unknown solver {name!r}; choose from {sorted(_BY_NAME)}") from None


def get_solver(name: str) -> SolveFn:
    """Look a solver up by name (``solver_info(name).solve``)."""
    return solver_info(name).solve


def solve(problem: PipelineProblem, *, solver: str = "even", options: Any = None) -> Plan:
    """Run a registered solver on a problem with string or typed options (its ``Options``)."""
    typed = dataclasses.is_dataclass(options) and not isinstance(options, type)
    return get_solver(solver)(problem, options=options if typed else dict(options or {}))


def describe(info: SolverInfo, *, options: bool = False) -> str:
    """One line for ``paraplan solvers``: description, what it searches, its schedules (and,
    with ``options``, its --option keys with types and defaults)."""
    searches = ", ".join(info.searches) or "nothing (fixed layout)"
    tp = "" if info.searches_tensor_parallelism else "; tensor parallelism fixed (t from --tensor-parallel)"
    line = f"{info.description}. Searches: {searches}{tp}. Schedules: {', '.join(info.schedules)}"
    if options:
        fields = info.option_fields()
        line += ". Options: " + ("; ".join(f"{k}: {v}" for k, v in fields.items()) if fields else "none")
    return line
