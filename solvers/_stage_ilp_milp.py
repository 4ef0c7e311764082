"""The stage-ILP as a mixed-integer program, solved by HiGHS (through PuLP) or OR-Tools CP-SAT.

Formulation: shared/design/stage-ilp-spipe-bpipe.md Sec. A.6 (poster seed 002, Algorithm 1 L57-78).
Variables (A.6.2): ``l[k,t,j]`` integer layers of type t with strategy j on virtual stage k;
``b[t,k]`` binary, 1 iff type t starts on virtual stage k (the poster's ``b_{t-1,c,x}``: where
the boundary between types t-1 and t falls); ``tau`` (C = 1) or ``tau_dev``, ``tau_chunk``
(C > 1) epigraph variables of the largest stage time (C3); ``z`` the zero-bubble fill term.
Constraints:

- C1 assignment: sum_{k,j} l[k,t,j] = n_t; non-empty chunks: sum_{t,j} l[k,t,j] >= 1;
  one boundary per type pair: sum_k b[t,k] = 1; contiguity: sum_j l[k,t,j] <= n_t sum_{k'<=k}
  b[t,k'] and sum_j l[k,t-1,j] <= n_{t-1} (1 - sum_{k'<k} b[t,k']) (A.6.3). With non-empty chunks
  this places the embedding on virtual stage 0 and the head on the last one.
- C2 memory of rank x, for every in-flight vector q of its action order (``_stage_ilp_model``):
  sum_c sum_{t,j} l[cP+x,t,j] (static_t + q_c act_{t,j}) <= D (A.6.4).
- C3 tau >= T_x (C = 1); tau_dev >= sum_c T_{cP+x}, tau_chunk >= T_k (C > 1) (A.6.5).

The objective is ``_stage_ilp_model.objective`` written with these variables, so the MILP's
optimum equals the brute-force minimum of that function (tested). CP-SAT needs integers: times
are scaled to 1e6 units of the model's total time per microbatch and bytes to 1e6 units of the
device memory (activation and static bytes rounded up, the capacity down, so a CP-SAT plan
always fits); the returned plan is re-evaluated in floating point and by the simulator.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from solvers._stage_ilp_model import Counts, StageModel

log = logging.getLogger(__name__)

Row = tuple[dict[int, float], float, float, str]
"""(coefficients by variable index, lower bound, upper bound, kind: time, mem or count)."""


@dataclass(slots=True)
class Formulation:
    names: list[str] = field(default_factory=list)
    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    is_time: list[bool] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    objective: dict[int, float] = field(default_factory=dict)
    l_index: dict[tuple[int, int, int], int] = field(default_factory=dict)
    epigraph: list[tuple[int, int]] = field(default_factory=list)
    """(row, variable) of every C3 row ``expr - var <= 0``, in creation order."""

    def add_epigraph_row(self, row: dict[int, float], var: int) -> None:
        self.rows.append((row, -math.inf, 0.0, "time"))
        self.epigraph.append((len(self.rows) - 1, var))

    def add_var(self, name: str, lo: float, hi: float, *, integer: bool, is_time: bool = False) -> int:
        self.names.append(name)
        self.lower.append(lo)
        self.upper.append(hi)
        self.integer.append(integer)
        self.is_time.append(is_time)
        return len(self.names) - 1


@dataclass(frozen=True, slots=True)
class MilpResult:
    counts: Counts | None
    status: str
    """``optimal``, ``time_limit`` (a plan, not proven optimal), ``infeasible`` or ``no_solution``."""
    objective: float
    gap: float
    solve_time_s: float


def type_stage_range(model: StageModel, t: int) -> range:
    """Virtual stages that can hold layers of type t when every chunk is non-empty."""
    lt, num_k, num_layers = model.types[t], model.num_virtual, model.num_layers
    lo = max(0, num_k - num_layers + lt.first)
    hi = min(num_k - 1, lt.first + lt.num_layers - 1)
    return range(lo, hi + 1)


def _expr(model: StageModel, f: Formulation, k: int, value: str) -> dict[int, float]:
    """Linear expression of a per-virtual-stage quantity: F, B, W, R, T (= F + B + R)."""
    out: dict[int, float] = {}
    for (kk, t, j), idx in f.l_index.items():
        if kk != k:
            continue
        lt = model.types[t]
        coef = {"F": lt.forward_s, "B": lt.backward_s, "W": lt.weight_s, "R": lt.extra_s[j],
                "T": lt.forward_s + lt.backward_s + lt.extra_s[j]}[value]
        if coef:
            out[idx] = out.get(idx, 0.0) + coef
    return out


def _add(target: dict[int, float], expr: Mapping[int, float], scale: float) -> None:
    for idx, coef in expr.items():
        target[idx] = target.get(idx, 0.0) + scale * coef


def formulate(model: StageModel, terms: str, *, min_memory: bool = False) -> Formulation:
    """Variables, constraints C1-C3 and the objective (module docstring).

    With ``min_memory`` the capacity is replaced by a variable M and the objective is M: the
    smallest per-device memory any plan of this shape needs (for infeasibility messages).
    """
    f = Formulation()
    for t, lt in enumerate(model.types):
        for k in type_stage_range(model, t):
            for j in range(len(lt.strategies)):
                f.l_index[(k, t, j)] = f.add_var(f"l_{k}_{t}_{j}", 0, lt.num_layers, integer=True)
    _add_assignment(model, f)
    mem_var = f.add_var("M", 0, math.inf, integer=False) if min_memory else None
    _add_memory(model, f, mem_var)
    if min_memory:
        f.objective = {mem_var: 1.0}  # type: ignore[dict-item]
        return f
    _add_time(model, f, terms)
    return f


def _add_assignment(model: StageModel, f: Formulation) -> None:
    for t, lt in enumerate(model.types):
        row = {idx: 1.0 for (k, tt, j), idx in f.l_index.items() if tt == t}
        f.rows.append((row, lt.num_layers, lt.num_layers, "count"))
    for k in range(model.num_virtual):
        row = {idx: 1.0 for (kk, _, _), idx in f.l_index.items() if kk == k}
        f.rows.append((row, 1, math.inf, "count"))
    for t in range(1, len(model.types)):
        starts = list(type_stage_range(model, t))
        b = {k: f.add_var(f"b_{t}_{k}", 0, 1, integer=True) for k in starts}
        f.rows.append(({i: 1.0 for i in b.values()}, 1, 1, "count"))
        n_t, n_prev = model.types[t].num_layers, model.types[t - 1].num_layers
        for k in starts:
            row = {f.l_index[(k, t, j)]: 1.0 for j in range(len(model.types[t].strategies))}
            _add(row, {b[kk]: 1.0 for kk in starts if kk <= k}, -n_t)
            f.rows.append((row, -math.inf, 0, "count"))
        for k in type_stage_range(model, t - 1):
            row = {f.l_index[(k, t - 1, j)]: 1.0 for j in range(len(model.types[t - 1].strategies))}
            _add(row, {b[kk]: 1.0 for kk in starts if kk < k}, n_prev)
            f.rows.append((row, -math.inf, n_prev, "count"))


def _add_memory(model: StageModel, f: Formulation, mem_var: int | None) -> None:
    p = model.num_stages
    if model.bpipe_split is not None:
        _add_bpipe_memory(model, f, mem_var)
        return
    for x in range(p):
        for vec in model.inflight[x]:
            row: dict[int, float] = {}
            for (k, t, j), idx in f.l_index.items():
                if k % p == x:
                    lt = model.types[t]
                    row[idx] = lt.static_bytes + vec[k // p] * lt.activation_bytes[j]
            if mem_var is None:
                f.rows.append((row, -math.inf, model.capacity_bytes, "mem"))
            else:
                row[mem_var] = -1.0
                f.rows.append((row, -math.inf, 0.0, "mem"))


def _add_bpipe_memory(model: StageModel, f: Formulation, mem_var: int | None) -> None:
    """C2 with BPipe (seed 004 Eq. 1 with balanced counts, L94-98): ``act_x`` >= the activation
    set of every chunk of rank x, and static_x + own_x act_x + foreign_x act_{p-1-x} <= D."""
    p = model.num_stages
    assert model.bpipe_split is not None
    act = [f.add_var(f"act_{x}", 0, math.inf, integer=False) for x in range(p)]
    for x in range(p):
        for c in range(model.num_chunks):
            row = {idx: model.types[t].activation_bytes[j] for (k, t, j), idx in f.l_index.items()
                   if k == c * p + x and model.types[t].activation_bytes[j]}
            row[act[x]] = -1.0
            f.rows.append((row, -math.inf, 0.0, "mem"))
            f.epigraph.append((len(f.rows) - 1, act[x]))
    for k, bandwidth, latency in model.bpipe_links:  # App. B Eq. 7-9: latency + A_k / bw <= F_k
        row = {idx: model.types[t].activation_bytes[j] / bandwidth - model.types[t].forward_s
               for (kk, t, j), idx in f.l_index.items() if kk == k}
        f.rows.append((row, -math.inf, -latency, "time"))
    for x, (own, foreign) in enumerate(model.bpipe_split):
        row = {idx: model.types[t].static_bytes for (k, t, j), idx in f.l_index.items() if k % p == x}
        _add(row, {act[x]: float(own)}, 1.0)
        _add(row, {act[p - 1 - x]: float(foreign)}, 1.0)
        if mem_var is None:
            f.rows.append((row, -math.inf, model.capacity_bytes, "mem"))
        else:
            row[mem_var] = -1.0
            f.rows.append((row, -math.inf, 0.0, "mem"))


def _add_time(model: StageModel, f: Formulation, terms: str) -> None:
    p, v, m = model.num_stages, model.num_chunks, model.num_microbatches
    num_k = model.num_virtual
    t_expr = [_expr(model, f, k, "T") for k in range(num_k)]
    obj: dict[int, float] = {}
    for k in range(num_k):
        _add(obj, _expr(model, f, k, "R"), m / p)  # B_R
        _add(obj, t_expr[k], -m / p)  # B_I's mean term
    tau = f.add_var("tau", 0, math.inf, integer=False, is_time=True)
    obj[tau] = float(m)
    for x in range(p):
        row = {tau: -1.0}
        for c in range(v):
            _add(row, t_expr[c * p + x], 1.0)
        f.add_epigraph_row(row, tau)
    if terms == "tri":
        _add_fill(model, f, obj, t_expr, tau)
    f.objective = obj


def _add_fill(model: StageModel, f: Formulation, obj: dict[int, float], t_expr: list[dict[int, float]],
              tau: int) -> None:
    """B_P: sum_x T_x - tau (- kappa (P-1)/P sum W, at least (P-1)/P sum F) for C = 1;
    (P-1) tau_chunk for C > 1."""
    p, num_k = model.num_stages, model.num_virtual
    if model.num_chunks > 1:
        chunk = f.add_var("tau_chunk", 0, math.inf, integer=False, is_time=True)
        obj[chunk] = obj.get(chunk, 0.0) + (p - 1)
        for k in range(num_k):
            row = {chunk: -1.0}
            _add(row, t_expr[k], 1.0)
            f.add_epigraph_row(row, chunk)
        return
    if not model.kappa:
        for k in range(num_k):
            _add(obj, t_expr[k], 1.0)
        obj[tau] -= 1.0
        return
    z = f.add_var("z_fill", 0, math.inf, integer=False, is_time=True)
    obj[z] = 1.0
    row = {z: -1.0, tau: -1.0}
    for k in range(num_k):
        _add(row, t_expr[k], 1.0)
        _add(row, _expr(model, f, k, "W"), -model.kappa * (p - 1) / p)
    f.add_epigraph_row(row, z)
    row = {z: -1.0}
    for k in range(num_k):
        _add(row, _expr(model, f, k, "F"), (p - 1) / p)
    f.add_epigraph_row(row, z)


def start_values(model: StageModel, f: Formulation, counts: Counts) -> list[float]:
    """A full variable vector for a known plan (the warm start): l from the counts, b where
    each type starts, epigraph variables at their tight values."""
    values = [0.0] * len(f.names)
    for (k, t, j), idx in f.l_index.items():
        values[idx] = counts[k][t][j]
    for t in range(1, len(model.types)):
        first = next(k for k in range(model.num_virtual) if sum(counts[k][t]))
        values[f.names.index(f"b_{t}_{first}")] = 1.0
    # Epigraph variables take the largest value their rows (expr - var <= 0) ask for.
    for row_index, var in f.epigraph:
        row = f.rows[row_index][0]
        values[var] = max(values[var], sum(c * values[i] for i, c in row.items() if i != var))
    return values


def extract(model: StageModel, f: Formulation, values: list[float]) -> Counts:
    out = []
    for k in range(model.num_virtual):
        per_type = []
        for t, lt in enumerate(model.types):
            per_type.append(tuple(int(round(values[f.l_index[(k, t, j)]])) if (k, t, j) in f.l_index else 0
                                  for j in range(len(lt.strategies))))
        out.append(tuple(per_type))
    return tuple(out)


def solve_milp(model: StageModel, f: Formulation, *, engine: str, time_limit_s: float | None,
               mip_gap: float, start: list[float] | None, offset: float = 0.0) -> MilpResult:
    """Solve a formulation; the status is always checked (never a silent wrong answer).

    ``mip_gap`` is relative to the objective plus ``offset`` (the modelled iteration time when the
    offset is ``model_constant``): the solver stops once the absolute gap is below
    mip_gap x (objective + offset), and the reported gap is on that scale too.
    """
    began = time.perf_counter()
    if engine == "cpsat":
        from solvers._stage_ilp_cpsat import solve_cpsat  # imports ortools only when asked

        status, values, obj, gap = solve_cpsat(model, f, time_limit_s=time_limit_s, mip_gap=mip_gap, start=start,
                                               offset=offset)
    else:
        status, values, obj, gap = _solve_highs(f, time_limit_s=time_limit_s, mip_gap=mip_gap, start=start,
                                                offset=offset)
    counts = extract(model, f, values) if values is not None else None
    return MilpResult(counts=counts, status=status, objective=obj, gap=gap, solve_time_s=time.perf_counter() - began)


def _solve_highs(f: Formulation, *, time_limit_s: float | None, mip_gap: float,
                 start: list[float] | None, offset: float) -> tuple[str, list[float] | None, float, float]:
    import highspy
    import pulp

    class _WarmHiGHS(pulp.HiGHS):  # PuLP's HiGHS with a starting solution handed to highspy
        def callSolver(self, lp: pulp.LpProblem) -> None:
            if start is not None:
                sol = highspy.HighsSolution()
                col = [0.0] * len(lp.variables())
                for var in lp.variables():
                    col[var.index] = start[int(var.name[1:])]
                sol.col_value = col
                sol.value_valid = True
                lp.solverModel.setSolution(sol)
            lp.solverModel.run()

    prob = pulp.LpProblem("stage_ilp", pulp.LpMinimize)
    xs = [pulp.LpVariable(f"v{i}", lowBound=lo, upBound=None if math.isinf(hi) else hi,
                          cat=pulp.LpInteger if integer else pulp.LpContinuous)
          for i, (lo, hi, integer) in enumerate(zip(f.lower, f.upper, f.integer))]
    prob += pulp.LpAffineExpression([(xs[i], c) for i, c in f.objective.items()])
    for n, (row, lo, hi, _) in enumerate(f.rows):
        expr = pulp.LpAffineExpression([(xs[i], c) for i, c in row.items()])
        if lo == hi:
            prob += (expr == lo, f"r{n}")
            continue
        if not math.isinf(hi):
            prob += (expr <= hi, f"r{n}u")
        if not math.isinf(lo):
            prob += (expr >= lo, f"r{n}l")
    solver = _WarmHiGHS(msg=False, timeLimit=time_limit_s, gapRel=mip_gap, gapAbs=mip_gap * offset, threads=1)
    prob.solve(solver)
    h = prob.solverModel
    model_status = h.getModelStatus()
    info = h.getInfo()
    gap = abs(info.objective_function_value - info.mip_dual_bound) / max(abs(info.objective_function_value + offset), 1e-30)
    kind = highspy.HighsModelStatus
    if model_status == kind.kInfeasible:
        return "infeasible", None, math.inf, math.inf
    has_solution = prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    if model_status == kind.kOptimal and has_solution:
        return "optimal", [x.varValue or 0.0 for x in xs], float(pulp.value(prob.objective)), gap
    if model_status in (kind.kTimeLimit, kind.kInterrupt, kind.kIterationLimit) and has_solution:
        obj = float(pulp.value(prob.objective))
        return "time_limit", [x.varValue or 0.0 for x in xs], obj, gap
    if model_status == kind.kTimeLimit:
        return "no_solution", None, math.inf, math.inf
    raise RuntimeError(f"HiGHS ended with status {h.modelStatusToString(model_status)}")  # our bug, not the user's
