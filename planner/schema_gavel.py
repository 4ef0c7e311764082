"""Boundary types of Gavel cluster scheduling (dissertation ch. 5, [narayanan-thesis] ch. 5).

Formats (docs/input-formats.md): the jobs file ``paraplan.jobs/v1`` (one job
per training run: steps per second on each accelerator type, accelerators needed, weight,
steps to run), a ``ClusterProblem`` (jobs + accelerator counts by type) that every policy
takes, the ``Allocation`` every policy returns (time fraction per job and type, the matrix X
of [narayanan-thesis] ch. 5) and the cluster simulator's result. Immutable pydantic models on the
``_Frozen`` base of ``planner.schema`` (unknown keys rejected, JSON round trip).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from planner.schema import (
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    _Frozen,
    _Result,
    _at_most,
)
from planner.schema_io import MAX_DEVICES, MAX_JOBS, MAX_STEPS

JOBS_FORMAT = "paraplan.jobs/v1"
ALLOCATION_FORMAT = "paraplan.allocation/v1"
AllocationStatus = Literal["optimal", "feasible"]


class Job(_Frozen):
    """One training job (architecture.md, jobs JSON).

    Give either ``throughputs`` (steps/s on ``scale_factor`` accelerators of each type; 0 or a
    missing type = cannot run there) or ``model`` + ``batch_size``, from which paraplan's own
    pipeline planner derives the throughputs (``solvers.gavel.throughputs``).
    """

    id: str = Field(min_length=1)
    throughputs: dict[str, Annotated[float, Field(ge=0), _at_most(1e9, "steps per second, set far above any job")]] | None = None
    model: str | None = None
    """A paraplan model preset (or profile path); with ``batch_size``, throughputs are derived."""
    batch_size: PositiveInt | None = None
    scale_factor: Annotated[int, Field(ge=1), _at_most(MAX_DEVICES, "accelerators of one cluster")] = 1
    """Accelerators of one type the job holds at once (multi-GPU job, [narayanan-thesis] ch. 5)."""
    weight: Annotated[float, Field(gt=0), _at_most(1e6, "priority weights are relative; a million to one is plenty")] = 1.0
    """Priority weight w_m of the fairness policies ([narayanan-thesis] ch. 5)."""
    num_steps: Annotated[float, Field(gt=0), _at_most(float(MAX_STEPS), "a year at a million steps per second is 3.2e13")] = 1.0
    """Training steps (iterations) left to run."""
    arrival_time_s: Annotated[float, Field(ge=0), _at_most(3.2e9, "a century")] = 0.0
    """Submission time; orders FIFO and drives the cluster simulator."""
    elapsed_s: NonNegativeFloat = 0.0
    """Time since submission t_m, for finish-time fairness ([narayanan-thesis] ch. 5)."""
    slo_s: PositiveFloat | None = None
    """Deadline from now: the job must finish its num_steps within this many seconds."""
    entity: str | None = None
    """Entity (user, team) of hierarchical policies; see ``ClusterProblem.entities``."""
    job_type: str | None = None
    """Gavel job-type name (e.g. ``ResNet-50 (batch size 64)``) when the job came from a table."""

    @model_validator(mode="after")
    def _check(self) -> Job:
        if self.throughputs is None and (self.model is None or self.batch_size is None):
            raise ValueError(
                f"job {self.id!r} needs 'throughputs' (steps/s per accelerator type) or "
                "'model' and 'batch_size' (paraplan derives the throughputs)"
            )
        return self


class JobPair(_Frozen):
    """Two jobs space-sharing one accelerator set ([narayanan-thesis] ch. 5): each job's steps/s while co-located."""

    jobs: tuple[str, str]
    throughputs: dict[str, tuple[NonNegativeFloat, NonNegativeFloat]]
    """Type -> (first job's steps/s, second job's steps/s); (0, 0) or missing = not viable."""

    @model_validator(mode="after")
    def _check(self) -> JobPair:
        if self.jobs[0] == self.jobs[1]:
            raise ValueError(f"pair {list(self.jobs)} pairs a job with itself; name two different jobs")
        return self


class EntitySpec(_Frozen):
    """An entity of a hierarchical policy ([narayanan-thesis] ch. 5): its weight and how its jobs share it."""

    weight: PositiveFloat = 1.0
    policy: Literal["fairness", "fifo"] = "fairness"


def _refuse_duplicate_ids(ids: Any) -> None:
    seen: set[str] = set()
    for job_id in ids:
        if job_id in seen:
            raise ValueError(f"job id {job_id!r} appears twice; job ids must be unique")
        seen.add(job_id)


class JobsFile(_Frozen):
    """The ``paraplan.jobs/v1`` document."""

    format: Literal["paraplan.jobs/v1"] = JOBS_FORMAT
    jobs: tuple[Job, ...] = Field(min_length=1, max_length=MAX_JOBS)
    pairs: tuple[JobPair, ...] = ()
    entities: dict[str, EntitySpec] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _unique_ids(self) -> JobsFile:
        _refuse_duplicate_ids(job.id for job in self.jobs)
        return self


class ClusterProblem(_Frozen):
    """What every Gavel policy takes: jobs with resolved throughputs and the accelerator counts.

    Well-formedness (unique ids, known types, pairs naming known jobs with equal scale factors,
    entities that exist) is checked here (exit 2); whether the jobs fit the cluster is the
    policies' infeasibility (exit 3, ``solvers.gavel.common.check_feasible``).
    """

    jobs: tuple[Job, ...] = Field(min_length=1)
    worker_types: dict[str, PositiveInt] = Field(min_length=1)
    """Accelerator counts by type (Cluster.worker_types)."""
    pairs: tuple[JobPair, ...] = ()
    entities: dict[str, EntitySpec] = Field(default_factory=dict)
    prices_per_hour: dict[str, NonNegativeFloat] = Field(default_factory=dict)
    """Dollars per accelerator-hour by type, for the cost policies (defaults: GCP on-demand)."""

    @model_validator(mode="after")
    def _check(self) -> ClusterProblem:
        ids = [job.id for job in self.jobs]
        seen: set[str] = set()
        for job_id in ids:
            if job_id in seen:
                raise ValueError(f"job id {job_id!r} appears twice; job ids must be unique")
            seen.add(job_id)
        types = set(self.worker_types)
        for job in self.jobs:
            if job.throughputs is None:
                raise ValueError(f"job {job.id!r} has no throughputs; derive them first (solvers.gavel.throughputs)")
            unknown = sorted(set(job.throughputs) - types)
            if unknown:
                raise ValueError(
                    f"job {job.id!r} gives throughputs for unknown accelerator type(s) {unknown}; "
                    f"the cluster has {sorted(types)} (fix the type name or add it to worker_types)"
                )
            if job.entity is not None and self.entities and job.entity not in self.entities:
                raise ValueError(f"job {job.id!r} names entity {job.entity!r}, not in entities {sorted(self.entities)}")
        by_id = {job.id: job for job in self.jobs}
        for pair in self.pairs:
            a, b = (by_id.get(i) for i in pair.jobs)
            if a is None or b is None:
                missing = [i for i in pair.jobs if i not in by_id]
                raise ValueError(f"pair {list(pair.jobs)} names unknown job(s) {missing}")
            if a.scale_factor != b.scale_factor:
                raise ValueError(
                    f"pair {list(pair.jobs)} has scale factors {a.scale_factor} and {b.scale_factor}; "
                    "only jobs with equal scale factors can share accelerators"
                )
            unknown = sorted(set(pair.throughputs) - types)
            if unknown:
                raise ValueError(f"pair {list(pair.jobs)} names unknown accelerator type(s) {unknown}")
        for name in self.prices_per_hour:
            if name not in types:
                raise ValueError(f"prices_per_hour names {name!r}, not an accelerator type of the cluster")
        return self

    @property
    def num_jobs(self) -> int:
        return len(self.jobs)


class PairShare(_Result):
    """Time fractions of one space-sharing pair by accelerator type."""

    jobs: tuple[str, str]
    fractions: dict[str, NonNegativeFloat]


class Allocation(_Result):
    """A policy's answer: the allocation matrix X ([narayanan-thesis] ch. 5) by job id and accelerator type.

    ``allocation[job][type]`` is the fraction of wall-clock time the job holds ``scale_factor``
    accelerators of that type, alone or inside a pair; ``pairs`` splits out the co-located part.
    """

    format: Literal["paraplan.allocation/v1"] = ALLOCATION_FORMAT
    policy: str
    status: AllocationStatus = "optimal"
    solve_time_s: NonNegativeFloat = 0.0
    objective: float | None = None
    """The policy's objective value at the optimum (its meaning is in the policy's docs)."""
    allocation: dict[str, dict[str, NonNegativeFloat]]
    pairs: tuple[PairShare, ...] = ()
    effective_throughputs: dict[str, NonNegativeFloat] = Field(default_factory=dict)
    """Steps/s each job gets on average under the allocation ([narayanan-thesis] ch. 5)."""
    num_partitions: PositiveInt = 1
    notes: tuple[str, ...] = ()


class JobResult(_Result):
    """One job of a cluster simulation."""

    id: str
    arrival_s: NonNegativeFloat
    completion_s: NonNegativeFloat
    num_steps: PositiveFloat
    steps_done: NonNegativeFloat
    scale_factor: PositiveInt
    jct_s: NonNegativeFloat
    ftf: NonNegativeFloat
    """Finish-time fairness rho: JCT over the JCT with a 1/n share of the cluster (Themis)."""
    num_rounds: NonNegativeInt
    cost_usd: NonNegativeFloat = 0.0


class ClusterSimResult(_Result):
    """Output of ``paraplan cluster-sim``: completion times, makespan, utilization, fairness, cost."""

    policy: str
    seed: int | None = None
    round_s: PositiveFloat
    num_jobs: NonNegativeInt
    num_rounds: NonNegativeInt
    num_allocations: NonNegativeInt
    """How many times the policy was solved (reset events: arrivals and completions)."""
    avg_jct_s: NonNegativeFloat
    p50_jct_s: NonNegativeFloat
    p95_jct_s: NonNegativeFloat
    p99_jct_s: NonNegativeFloat
    makespan_s: NonNegativeFloat
    avg_ftf: NonNegativeFloat
    max_ftf: NonNegativeFloat
    utilization: dict[str, NonNegativeFloat]
    """Busy accelerator-seconds over capacity x makespan, by type."""
    total_cost_usd: NonNegativeFloat
    num_preemptions: NonNegativeInt
    measured_jobs: tuple[str, ...] = ()
    """Jobs the averages are over (all, or the steady-state window asked for)."""
    jobs: tuple[JobResult, ...] = ()


class RunJobResult(_Frozen):
    """One job of a real run (``paraplan cluster-run``) beside the simulator's prediction."""

    id: str
    arrival_s: NonNegativeFloat
    completion_s: NonNegativeFloat
    jct_s: NonNegativeFloat
    """Measured: wall-clock from arrival to the end of its last lease (checkpoint saved)."""
    sim_jct_s: NonNegativeFloat
    """The cluster simulator's JCT for the same job, trace, policy and round length."""
    num_steps: PositiveFloat
    steps_done: NonNegativeFloat
    num_leases: NonNegativeInt
    """Rounds the job ran in; each ends with a checkpoint, and the next resumes from it."""
    sim_num_leases: NonNegativeInt
    """Rounds the simulator ran the job in (equal to num_leases under the accelerator clock)."""
    num_processes: NonNegativeInt
    """Distinct worker processes that ran its leases."""
    final_loss: float
    """Training loss of its last step (the model is real; the loss falls)."""


class ClusterRunResult(_Frozen):
    """Output of ``paraplan cluster-run``: measured completion times and the simulator's."""

    engine: str
    mechanism: str
    """The round mechanism, ``gavel`` or ``paper`` (as ``cluster-sim --mechanism``)."""
    decision_clock: str
    """``accelerator``: decisions on the leases' accelerator time (the simulator's decisions);
    ``wall``: on measured wall-clock time."""
    policy: str
    round_s: PositiveFloat
    num_jobs: NonNegativeInt
    num_rounds: NonNegativeInt
    sim_num_rounds: NonNegativeInt
    num_preemptions: NonNegativeInt
    sim_num_preemptions: NonNegativeInt
    avg_jct_s: NonNegativeFloat
    sim_avg_jct_s: NonNegativeFloat
    makespan_s: NonNegativeFloat
    sim_makespan_s: NonNegativeFloat
    jobs: tuple[RunJobResult, ...] = ()
