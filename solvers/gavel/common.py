"""Shared formulation of the Gavel policies (dissertation ch. 5, seed 001 L5059-5216).

A ``Formulation`` holds the data every policy reads: the throughput matrix T (L5088-5092),
the combination rows of space sharing (single jobs first, then pairs; L5139-5196), each
job's steps/s inside each combination and type, the scale factors and capacities of the
validity constraints (5.1)-(5.3) (L5113-5137), and the per-job normalizers:

- ``thr_equal``: throughput under X^equal, an equal time share of every accelerator,
  X^equal_mj = num_workers_j / sum_k num_workers_k (L5320-5344; reading sec. 2.9 item 1).
- ``thr_fastest``: throughput on the job's fastest type (FIFO, L5479-5500).
- ``thr_isolated``: throughput with 1/n of the cluster, X^iso_mj = (num_workers_j / n) /
  scale_factor_m with rows scaled to sum <= 1 (Themis, L5443-5477; reading sec. 2.9 item 2).
- ``thr_fair``: the max-min (LAS) normalizer: ``thr_equal`` as the text (default), or
  ``thr_isolated`` as Gavel's code (option ``las_normalizer="isolated"``, ``with_las_normalizer``).

The allocation variable is X[k, j] over combinations k and types j; effective throughput is
``A @ vec(X)`` with vec column-major (cvxpy's default), so thr_m = sum_j sum_{k in C_m}
T_kjm X_kj. Policies hold only their objective and extra constraints.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from planner.errors import InfeasibleError
from planner.schema_gavel import Allocation, ClusterProblem, PairShare

# Values the solvers return within this of a bound are treated as on it.
FEASIBILITY_TOL = 1e-6
ZERO_TOL = 1e-8


@dataclass(frozen=True, kw_only=True)
class Formulation:
    """Arrays of one (sub-)problem; ``jobs`` index rows, ``types`` columns."""

    job_ids: tuple[str, ...]
    types: tuple[str, ...]
    capacity: np.ndarray  # (J,) accelerators per type (fractional in POP sub-problems)
    throughput: np.ndarray  # (n, J) T_mj steps/s alone; 0 where the job cannot run
    scale: np.ndarray  # (n,) scale_factor_m
    weight: np.ndarray  # (n,) w_m
    num_steps: np.ndarray  # (n,)
    arrival_s: np.ndarray  # (n,)
    elapsed_s: np.ndarray  # (n,)
    slo_s: np.ndarray  # (n,) inf where none
    combos: tuple[tuple[int, ...], ...]  # K rows: (m,) or (a, b)
    combo_throughput: np.ndarray  # (K, J, 2) steps/s of each member inside the combination
    thr_equal: np.ndarray
    thr_fastest: np.ndarray
    thr_isolated: np.ndarray
    thr_fair: np.ndarray
    prices_per_hour: np.ndarray  # (J,)
    entity_of: tuple[str, ...] = ()  # each job's entity (hierarchical policies)
    entity_specs: tuple[tuple[str, float, str], ...] = ()  # (name, weight, "fairness" | "fifo")

    @property
    def num_jobs(self) -> int:
        return len(self.job_ids)

    @property
    def num_combos(self) -> int:
        return len(self.combos)

    @property
    def combo_scale(self) -> np.ndarray:
        return self.scale[[c[0] for c in self.combos]]

    @property
    def mask(self) -> np.ndarray:
        """(K, J) 1 where the combination may run on the type (a member has throughput)."""
        return (self.combo_throughput.sum(axis=2) > 0).astype(float)

    @functools.cached_property
    def _members(self) -> tuple[np.ndarray, np.ndarray]:
        """Per combination: its first job and its second (-1 for a single job)."""
        first = np.fromiter((c[0] for c in self.combos), dtype=np.intp, count=len(self.combos))
        second = np.fromiter((c[1] if len(c) > 1 else -1 for c in self.combos), dtype=np.intp,
                             count=len(self.combos))
        return first, second

    def throughput_matrix(self) -> sp.csr_matrix:
        """A (n, K*J): thr = A @ vec(X), vec column-major (index k + j*K)."""
        num_k, num_j = self.num_combos, len(self.types)
        rows, cols, vals = [], [], []
        for slot, members in enumerate(self._members):
            k, j = np.nonzero((self.combo_throughput[:, :, slot] > 0) & (members[:, None] >= 0))
            rows.append(members[k])
            cols.append(k + j * num_k)
            vals.append(self.combo_throughput[k, j, slot])
        return sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                             shape=(self.num_jobs, num_k * num_j))

    def membership(self) -> sp.csr_matrix:
        """(n, K) 1 where job m is a member of combination k (the sets C_m)."""
        first, second = self._members
        pair = np.nonzero(second >= 0)[0]
        rows = np.concatenate([first, second[pair]])
        cols = np.concatenate([np.arange(len(first)), pair])
        return sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(self.num_jobs, self.num_combos))

    def subset(self, jobs: Sequence[int], *, capacity: np.ndarray) -> Formulation:
        """The sub-problem of some jobs on a share of the capacity (POP); normalizers kept."""
        index = {m: i for i, m in enumerate(jobs)}
        keep = [k for k, c in enumerate(self.combos) if all(m in index for m in c)]
        row = np.asarray(jobs, dtype=int)
        return dataclasses.replace(
            self,
            job_ids=tuple(self.job_ids[m] for m in jobs),
            capacity=capacity,
            throughput=self.throughput[row],
            scale=self.scale[row],
            weight=self.weight[row],
            num_steps=self.num_steps[row],
            arrival_s=self.arrival_s[row],
            elapsed_s=self.elapsed_s[row],
            slo_s=self.slo_s[row],
            combos=tuple(tuple(index[m] for m in self.combos[k]) for k in keep),
            combo_throughput=self.combo_throughput[keep],
            thr_equal=self.thr_equal[row],
            thr_fastest=self.thr_fastest[row],
            thr_isolated=self.thr_isolated[row],
            thr_fair=self.thr_fair[row],
            entity_of=tuple(self.entity_of[m] for m in jobs) if self.entity_of else (),
        )

    def with_las_normalizer(self, name: str) -> Formulation:
        """``thr_fair`` set to "equal" (the text's X^equal) or "isolated" (Gavel's code: X^iso)."""
        return dataclasses.replace(self, thr_fair=self.thr_isolated if name == "isolated" else self.thr_equal)

    def with_throughput(self, throughput: np.ndarray) -> Formulation:
        """The same problem seen through other single-job throughputs (no pairs)."""
        combo = np.zeros((self.num_jobs, len(self.types), 2))
        combo[:, :, 0] = throughput
        return dataclasses.replace(
            self,
            throughput=throughput,
            combos=tuple((m,) for m in range(self.num_jobs)),
            combo_throughput=combo,
        )


# GCP on-demand dollars per GPU-hour, the prices the chapter's cost figures use (L4826,
# L6633-6667); the same list appears in SkyPilot's GCP catalog.
DEFAULT_PRICES_PER_HOUR = {"v100": 2.48, "p100": 1.46, "k80": 0.45}


def build(problem: ClusterProblem, *, packed: bool = False) -> Formulation:
    """The formulation of a problem; ``packed`` adds the pair rows of space sharing.

    Raises:
        InfeasibleError: a job cannot run on any accelerator type (see ``check_feasible``).
    """
    types = tuple(problem.worker_types)
    capacity = np.array([problem.worker_types[t] for t in types], dtype=float)
    jobs = problem.jobs
    # one pass over the jobs: scale factor, weight, steps, arrival, elapsed, SLO (inf where none)
    per_job = np.array([(j.scale_factor, j.weight, j.num_steps, j.arrival_time_s, j.elapsed_s,
                         np.inf if j.slo_s is None else j.slo_s) for j in jobs], dtype=float).reshape(-1, 6)
    scale, weight, num_steps, arrival_s, elapsed_s, slo_s = (np.ascontiguousarray(c) for c in per_job.T)
    raw = np.array([[(j.throughputs or {}).get(t, 0.0) for t in types] for j in jobs], dtype=float).reshape(-1, len(types))
    fits = scale[:, None] <= capacity[None, :]
    if not np.all(((raw > 0) & fits).any(axis=1)):  # some job runs nowhere: find it and say why
        check_feasible(problem)
    throughput = np.where(fits, raw, 0.0)
    combos: list[tuple[int, ...]] = [(m,) for m in range(len(jobs))]
    combo_rows = [np.stack([throughput, np.zeros_like(throughput)], axis=2)]  # single jobs, (n, J, 2)
    if packed:
        index = {j.id: m for m, j in enumerate(jobs)}
        for pair in problem.pairs:
            a, b = index[pair.jobs[0]], index[pair.jobs[1]]
            values = np.array([pair.throughputs.get(t, (0.0, 0.0)) for t in types], dtype=float)
            values[~fits[a]] = 0.0
            if values.sum() > 0:
                combos.append((a, b))
                combo_rows.append(values[None])
    share = capacity / capacity.sum()
    n = len(jobs)
    iso = np.minimum(capacity[None, :] / n / scale[:, None], 1.0) * (throughput > 0)
    iso = iso / np.maximum(iso.sum(axis=1, keepdims=True), 1.0)
    prices = {**DEFAULT_PRICES_PER_HOUR, **problem.prices_per_hour}
    return Formulation(
        job_ids=tuple(j.id for j in jobs),
        types=types,
        capacity=capacity,
        throughput=throughput,
        scale=scale,
        weight=weight,
        num_steps=num_steps,
        arrival_s=arrival_s,
        elapsed_s=elapsed_s,
        slo_s=slo_s,
        combos=tuple(combos),
        combo_throughput=np.concatenate(combo_rows),
        thr_equal=throughput @ share,
        thr_fastest=throughput.max(axis=1),
        thr_isolated=(throughput * iso).sum(axis=1),
        thr_fair=throughput @ share,
        prices_per_hour=np.array([prices.get(t, np.nan) for t in types], dtype=float),
        entity_of=tuple(j.entity if j.entity is not None else f"job:{j.id}" for j in jobs),
        entity_specs=tuple((name, e.weight, e.policy) for name, e in problem.entities.items()),
    )


def check_feasible(problem: ClusterProblem) -> None:
    """Every job must be able to run somewhere: a type with throughput and enough accelerators.

    Raises:
        InfeasibleError: naming the job, what it asks and what the cluster has.
    """
    caps = problem.worker_types
    for job in problem.jobs:
        thr = job.throughputs or {}
        if not any(v > 0 for t, v in thr.items() if t in caps):
            raise InfeasibleError(
                f"job {job.id!r} has zero throughput on every accelerator type of the cluster "
                f"({sorted(caps)}); give it a positive throughput on at least one type"
            )
        usable = [t for t, v in thr.items() if v > 0 and caps.get(t, 0) >= job.scale_factor]
        if not usable:
            have = {t: caps[t] for t, v in thr.items() if v > 0 and t in caps}
            raise InfeasibleError(
                f"job {job.id!r} asks scale_factor={job.scale_factor} accelerators of one type but the "
                f"types it can run on have only {have}; lower its scale_factor or add accelerators"
            )


def spread_by_capacity(f: Formulation, shares: np.ndarray) -> np.ndarray:
    """Heterogeneity-agnostic placement: job m's time share x_m split over the types it can
    use in proportion to their capacity, X_mj = x_m cap_j / sum_{j' usable} cap_j'.

    Returns None-free (n, J); callers check capacity (it holds when every job can use every type).
    """
    usable = (f.throughput > 0) * f.capacity[None, :]
    return shares[:, None] * usable / usable.sum(axis=1, keepdims=True)


def repair(f: Formulation, x: np.ndarray) -> np.ndarray:
    """Remove the solver's round-off so that (5.1)-(5.3) hold exactly.

    Violations above ``FEASIBILITY_TOL`` are a bug (the solver reported success), so they are
    asserted, not hidden; smaller ones are scaled away.
    """
    # Interior-point round-off below ZERO_TOL is zeroed (lowering X never breaks a constraint).
    x = np.where((f.mask > 0) & (x > ZERO_TOL), np.clip(x, 0.0, 1.0), 0.0)
    job_time = f.membership() @ x.sum(axis=1)
    assert job_time.max(initial=0.0) <= 1 + FEASIBILITY_TOL, f"job time {job_time.max()} > 1"
    over = np.maximum(job_time, 1.0)
    first, second = f._members
    per_combo = np.where(second >= 0, np.maximum(over[first], over[second]), over[first])
    x = x / per_combo[:, None]
    used = f.combo_scale @ x
    assert np.all(used <= f.capacity * (1 + FEASIBILITY_TOL) + FEASIBILITY_TOL), (used, f.capacity)
    return x * np.minimum(1.0, f.capacity / np.maximum(used, 1e-300))[None, :]


def effective_throughput(f: Formulation, x: np.ndarray) -> np.ndarray:
    """thr_m(X) = sum_j sum_{k in C_m} T_kjm X_kj (L5094-5106, L5168-5196)."""
    return f.throughput_matrix() @ x.reshape(-1, order="F")


def to_allocation(
    f: Formulation,
    x: np.ndarray,
    *,
    policy: str,
    start_s: float,
    objective: float | None,
    notes: Sequence[str] = (),
    num_partitions: int = 1,
) -> Allocation:
    """The Allocation of a (repaired) solution: per-job time by type, pairs split out."""
    first, second = f._members
    per_job = np.zeros((f.num_jobs, len(f.types)))
    np.add.at(per_job, first, x)
    in_pair = np.nonzero(second >= 0)[0]
    np.add.at(per_job, second[in_pair], x[in_pair])
    pairs = [
        PairShare(jobs=(f.job_ids[first[k]], f.job_ids[second[k]]), fractions=dict(zip(f.types, x[k].tolist())))
        for k in in_pair if x[k].sum() > ZERO_TOL
    ]
    thr = effective_throughput(f, x)
    # model_construct: every field is built here from a repaired X (fractions in [0, 1], throughputs
    # >= 0, plain floats and strings); validating a few thousand nested numbers again cost more than
    # the rest of this function (tests/solvers/gavel check that the result validates).
    return Allocation.model_construct(
        policy=policy,
        solve_time_s=time.perf_counter() - start_s,
        objective=objective,
        allocation={job: dict(zip(f.types, row)) for job, row in zip(f.job_ids, per_job.tolist())},
        pairs=tuple(pairs),
        effective_throughputs=dict(zip(f.job_ids, thr.tolist())),
        num_partitions=num_partitions,
        notes=tuple(notes),
    )


GAVEL_MIN_T_S, GAVEL_MAX_T_S, GAVEL_BRACKET = 100.0, 1e6, 1.05
"""Gavel's makespan bisection: T in [100 s, 1e6 s] (x10 while none is feasible), halved until the
bracket is within 5 %."""


def gavel_bisection(feasible: Callable[[float], Any], *, limit_s: float | None = None) -> tuple[float, Any] | None:
    """Gavel's makespan bisection: (the smallest T found feasible, what ``feasible(T)`` returned for it),
    ``feasible`` answering None where T is infeasible. Each time the bracket closes with nothing feasible
    it moves to [last upper end, 10 x it]; with ``limit_s``, None once that upper end passes it."""
    lo, hi, last_hi = GAVEL_MIN_T_S, GAVEL_MAX_T_S, GAVEL_MAX_T_S
    found: tuple[float, Any] | None = None
    while found is None:
        while GAVEL_BRACKET * lo < hi:
            mid = (lo + hi) / 2.0
            result = feasible(mid)
            if result is not None:
                found, hi = (mid, result), mid
            else:
                lo = mid
        if limit_s is not None and last_hi > limit_s:
            return None
        lo, hi, last_hi = last_hi, last_hi * 10.0, last_hi * 10.0
    return found
