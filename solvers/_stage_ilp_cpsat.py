"""OR-Tools CP-SAT engine for the stage-ILP formulation (``_stage_ilp_milp.Formulation``).

CP-SAT takes integer coefficients only (shared/design/ecosystem.md Sec. 1.4: scale float costs to
integers yourself). Times are counted in units of 1e-6 of the model's total time per
microbatch, bytes in units of 1e-6 of the device memory; memory coefficients are rounded up
and the capacity down, so a plan CP-SAT accepts fits in floating point too. The objective is
the formulation's, scaled by the number of stages so that the (m/P) coefficients are integral
before rounding. OR-Tools is imported here only, when ``engine=cpsat`` is asked for.
"""

from __future__ import annotations

import math

from solvers._stage_ilp_milp import Formulation
from solvers._stage_ilp_model import StageModel

_UNITS = 1e6


def solve_cpsat(model: StageModel, f: Formulation, *, time_limit_s: float | None, mip_gap: float,
                start: list[float] | None, offset: float = 0.0) -> tuple[str, list[float] | None, float, float]:
    """Solve with CP-SAT: (status, variable values in formulation units, objective, gap)."""
    from ortools.sat.python import cp_model

    time_unit = max(sum(t.num_layers * (t.forward_s + t.backward_s + max(t.extra_s)) for t in model.types), 1e-30) / _UNITS
    byte_unit = model.capacity_bytes / _UNITS
    cp = cp_model.CpModel()
    is_bytes = [name == "M" or name.startswith("act_") for name in f.names]  # BPipe's act_x are bytes too
    scale = [time_unit if f.is_time[i] else (byte_unit if is_bytes[i] else 1.0) for i in range(len(f.names))]
    big = int(_UNITS * model.num_microbatches * 4)
    xs = [cp.NewIntVar(int(lo), int(hi) if not math.isinf(hi) else big, name)
          for lo, hi, name in zip(f.lower, f.upper, f.names)]
    for row, lo, hi, kind in f.rows:
        unit = {"time": time_unit, "mem": byte_unit, "count": 1.0}[kind]
        round_up = math.ceil if kind == "mem" else round
        expr = sum(int(round_up(c * scale[i] / unit)) * xs[i] for i, c in row.items())
        if not math.isinf(hi):
            cp.Add(expr <= (math.floor(hi / unit) if kind == "mem" else int(round(hi / unit))))
        if not math.isinf(lo):
            cp.Add(expr >= int(round(lo / unit)))
    obj_unit = time_unit if "M" not in f.names else byte_unit
    p = model.num_stages
    cp.Minimize(sum(int(round(c * p * scale[i] / obj_unit)) * xs[i] for i, c in f.objective.items()))
    if start is not None:
        for i, value in enumerate(start):
            cp.AddHint(xs[i], int(round(value / scale[i])))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 2
    solver.parameters.absolute_gap_limit = max(mip_gap * offset * model.num_stages / (time_unit if "M" not in f.names else byte_unit), 0.0)
    solver.parameters.relative_gap_limit = mip_gap
    if time_limit_s is not None:
        solver.parameters.max_time_in_seconds = float(time_limit_s)
    status = solver.Solve(cp)
    if status == cp_model.INFEASIBLE:
        return "infeasible", None, math.inf, math.inf
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return "no_solution", None, math.inf, math.inf
    values = [solver.Value(x) * scale[i] for i, x in enumerate(xs)]
    obj = sum(c * values[i] for i, c in f.objective.items())
    best, bound = solver.ObjectiveValue(), solver.BestObjectiveBound()
    shift = offset * p / obj_unit  # the gap is relative to objective + offset (solve_milp)
    gap = abs(best - bound) / max(abs(best + shift), 1e-30)
    return ("optimal" if status == cp_model.OPTIMAL else "time_limit"), values, obj, gap
