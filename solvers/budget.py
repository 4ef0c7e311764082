"""The command's time budget shared by every phase of a solve (issue 14 item 5).

``--time-limit`` (``PipelineProblem.time_limit_s``) is the whole command's budget: every depth
a solver tries, its warm starts, its MILP, its re-ranking and the infeasibility explanation
draw on one deadline. A solver that runs out returns the best plan found with status
``time_limit`` (and the MILP's gap in its notes).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from planner.schema import PipelineProblem, Plan


@dataclass(frozen=True, slots=True)
class Budget:
    """The command's time budget (``problem.time_limit_s``) as a deadline every phase shares:
    the depths, each depth's baselines, MILP and re-ranking, and the infeasibility explanation."""

    deadline: float | None
    """``time.perf_counter()`` value at which the budget ends; None without a time limit."""
    share_s: float | None = None
    """This phase's part of what is left (a depth's even share), None for all of it."""

    @classmethod
    def of(cls, problem: PipelineProblem) -> Budget:
        limit = problem.time_limit_s
        return cls(None if limit is None else time.perf_counter() + limit)

    def left_s(self) -> float | None:
        if self.deadline is None:
            return None
        left = max(self.deadline - time.perf_counter(), 0.0)
        return left if self.share_s is None else min(left, self.share_s)

    def spent(self) -> bool:
        left = self.left_s()
        return left is not None and left <= 0.0

    def share(self, num_phases: int) -> Budget:
        """An even share of what is left among ``num_phases`` phases (this one first)."""
        if self.deadline is None:
            return self
        return Budget(self.deadline, max(self.deadline - time.perf_counter(), 0.0) / max(num_phases, 1))

    def limit_s(self, default_s: float) -> float:
        """A solve's time limit: ``default_s`` without a budget, else what is left (at least 0.05 s)."""
        left = self.left_s()
        return default_s if left is None else max(min(left, default_s), 0.05)

    def stop_before(self, num_done: int) -> bool:
        """Whether a loop should stop before its next item: the budget is spent and at least
        one item was tried (the first always runs, so a tiny limit still gives an answer)."""
        return num_done > 0 and self.spent()


def out_of_time(plan: Plan, problem: PipelineProblem, *, tried: int, total: int, what: str) -> Plan:
    """``plan`` (the best of the ``tried`` first of ``total`` ``what``) with status
    ``time_limit`` and a note naming what was left untried."""
    note = (f"time_limit_s={problem.time_limit_s:g} spent after {tried} of {total} {what}; the best of those is "
            "returned (raise --time-limit to search the rest)")
    return plan.model_copy(update={"status": "time_limit", "notes": (*plan.notes, note)})


def untried_note(problem: PipelineProblem, *, tried: int, total: int, what: str) -> str:
    """The clause an infeasibility message adds when the budget ended the search early."""
    return (f"; time_limit_s={problem.time_limit_s:g} was spent after {tried} of {total} {what}, the rest were not "
            "tried: raise --time-limit")


Listener = Callable[[str, "int | None", "int | None"], None]
_listeners: list[Listener] = []


def report_phase(phase: str, done: int | None = None, total: int | None = None) -> None:
    """Tell whoever listens (the CLI's progress line) which phase a solve is in and, where
    known, how many of its units are done: ``report_phase("depth 2 of 5: MILP", 1, 5)``."""
    for listener in _listeners:
        listener(phase, done, total)


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Route ``report_phase`` calls to ``listener`` while the block runs (solvers stay free of
    the CLI: they only call ``report_phase``)."""
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)


@contextmanager
def quiet() -> Iterator[None]:
    """No phase reports while the block runs: a solver running another as a sub-step (stage-ilp's
    baselines) keeps its own phases on the progress line."""
    saved = _listeners[:]
    _listeners.clear()
    try:
        yield
    finally:
        _listeners[:] = saved
