"""User-facing errors of paraplan.

Every mistake a user can make (bad input, an infeasible problem) raises a subclass of
``PlannerError`` whose message names the field, the value and the fix. The CLI maps
``InvalidProblemError`` to exit code 2 and ``InfeasibleError`` to exit code 3.
``assert`` is reserved for internal invariants.
"""

from __future__ import annotations


class PlannerError(Exception):
    """Base class of every error paraplan reports to a user."""

    exit_code = 1


class InvalidProblemError(PlannerError, ValueError):
    """The input is malformed or inconsistent (CLI exit code 2)."""

    exit_code = 2


class InfeasibleError(PlannerError):
    """The input is well formed but no plan satisfies it (CLI exit code 3).

    The message says what would make the problem feasible.
    """

    exit_code = 3
