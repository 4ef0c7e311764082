"""Boundary types of PipeFill (Arfeen et al., [pipefill] in docs/references.md).

Fill jobs (``paraplan.fill-jobs/v1``), the bubbles a fill job may use (one cycle per pipeline
stage, Sec. 1.2 of the reading), the Executor's plan for one job on one device (Algorithm 1,
Sec. 2.2: pieces of the fill job's node chain, each inside one bubble), the scheduler's
assignments (Sec. 3) and the fill simulator's results: ``FillPlan`` for one main-job plan and
``ScaleResult`` for the paper's 1K-16K GPU sweep (Sec. 4.3). Immutable pydantic models on the
``_Frozen`` base of ``planner.schema`` (unknown keys rejected, JSON round trip).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from planner.schema import (
    ModelProfile,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    _Frozen,
    _Result,
    _at_most,
)
from planner.schema_io import MAX_JOBS

FILL_JOBS_FORMAT = "paraplan.fill-jobs/v1"
FILL_PLAN_FORMAT = "paraplan.fill/v1"
FillMode = Literal["training", "inference"]
BubbleKind = Literal["fill-drain", "fwd-bwd", "other"]
FillPolicy = Literal["sjf", "makespan", "fifo"]


class FillJob(_Frozen):
    """One fill job: training or batch inference of another model ([pipefill]).

    Give ``model`` (a fill-model preset such as ``bert-large`` or ``resnet50``, see
    ``paraplan fill --help``) or ``profile`` (a layer profile; its costs are per microbatch of
    ``profile.microbatch_size`` samples and are scaled linearly to other batch sizes).
    """

    id: str = Field(min_length=1)
    model: str | None = None
    profile: ModelProfile | None = None
    mode: FillMode = "inference"
    batch_sizes: tuple[Annotated[int, Field(ge=1), _at_most(2**24, "samples per fill batch")], ...] = Field(
        default=(1, 2, 4, 8, 16, 32), min_length=1, max_length=64)
    """Valid batch sizes; the Executor picks the one with the highest fill throughput ([pipefill])."""
    num_samples: Annotated[float, Field(ge=1), _at_most(1e15, "samples of one fill job")] = 1e5
    """Samples to process (inference) or to train on (training)."""
    arrival_time_s: Annotated[float, Field(ge=0), _at_most(3.2e9, "a century")] = 0.0
    allow_checkpointing: bool = True
    """Training only: the Executor may recompute activations in the backward ([pipefill])."""
    allow_offload: bool = True
    """Training only: the Executor may keep the optimizer state on the CPU (ZeRO-Offload, [pipefill])."""

    @model_validator(mode="after")
    def _check(self) -> FillJob:
        if (self.model is None) == (self.profile is None):
            raise ValueError(f"fill job {self.id!r} needs exactly one of 'model' (a preset) or 'profile'")
        return self


class FillJobsFile(_Frozen):
    """A list of fill jobs (``paraplan fill --fill-jobs F.json``)."""

    format: Literal["paraplan.fill-jobs/v1"] = FILL_JOBS_FORMAT
    jobs: tuple[FillJob, ...] = Field(min_length=1, max_length=MAX_JOBS)

    @model_validator(mode="after")
    def _unique_ids(self) -> FillJobsFile:
        seen: set[str] = set()
        for job in self.jobs:
            if job.id in seen:
                raise ValueError(f"fill-job id {job.id!r} appears twice; ids must be unique")
            seen.add(job.id)
        return self


class FillBubble(_Result):
    """One bubble of a stage's cycle (repeats every main-job iteration)."""

    kind: BubbleKind
    start_s: float
    """Start within the iteration; a fill-drain bubble wraps into the next iteration."""
    duration_s: NonNegativeFloat
    usable_s: NonNegativeFloat
    """``fill_fraction`` x duration: the time a piece may take (68% in the paper, [pipefill])."""
    free_memory_bytes: float
    """Memory a fill job may use during the bubble (after ``memory_fraction`` or the cap)."""


class StageBubbles(_Result):
    stage: NonNegativeInt
    bubbles: tuple[FillBubble, ...]


class Piece(_Result):
    """A run of consecutive fill-job nodes executed inside one bubble (Algorithm 1's P[i])."""

    cycle: NonNegativeInt
    """Main-job iteration (bubble cycle) of this piece within the Executor plan's period."""
    bubble: NonNegativeInt
    """Index of the bubble in the stage's cycle."""
    first_node: NonNegativeInt
    """Position in the replicated node chain (iteration x nodes per iteration + node)."""
    num_nodes: PositiveInt
    duration_s: NonNegativeFloat
    peak_memory_bytes: NonNegativeFloat


class ExecutorPlan(_Result):
    """The Executor's plan for one fill job on one stage's bubbles (Algorithm 1 + config choice)."""

    job_id: str
    stage: NonNegativeInt
    batch_size: PositiveInt
    checkpointing: bool
    offload: bool
    num_iterations: PositiveInt
    """k: fill-job iterations (batches) per period (Algorithm 1 lines 3-7)."""
    num_cycles: PositiveInt
    """n: main-job iterations one period takes, ceil(len(P) / len(B))."""
    nodes_per_iteration: PositiveInt
    throughput_samples_per_s: NonNegativeFloat
    flops_per_s: NonNegativeFloat
    pieces: tuple[Piece, ...]


class FillAssignment(_Result):
    """One fill job run on one device (GPU) by the scheduler."""

    job_id: str
    device: NonNegativeInt
    stage: NonNegativeInt
    start_s: NonNegativeFloat
    end_s: NonNegativeFloat
    """Completion time (may lie beyond the horizon of a scale run)."""
    samples: NonNegativeFloat
    flops: NonNegativeFloat


class FillPlan(_Result):
    """``paraplan fill PLAN.json --fill-jobs F --json``: bubbles, Executor plans, schedule, totals."""

    format: Literal["paraplan.fill/v1"] = FILL_PLAN_FORMAT
    policy: FillPolicy
    fill_fraction: float
    num_devices: PositiveInt
    iteration_time_s: PositiveFloat
    bubble_fraction: NonNegativeFloat
    stages: tuple[StageBubbles, ...]
    executor_plans: tuple[ExecutorPlan, ...]
    """The plan of every (job, stage) pair that was scheduled: the pieces placed in each bubble."""
    assignments: tuple[FillAssignment, ...]
    makespan_s: NonNegativeFloat
    mean_completion_time_s: NonNegativeFloat
    main_flops_per_device_s: NonNegativeFloat
    fill_flops_per_device_s: NonNegativeFloat
    recovered_utilization: NonNegativeFloat
    """Fill FLOP/s over main-job FLOP/s per device during the makespan (the paper's increase)."""
    main_job_slowdown: NonNegativeFloat
    """Fractional iteration-time increase from the fill work: the engine's filled iteration
    (``filled_iteration_time_s``) over the unfilled one, weighted by the GPUs' fill occupancy."""
    filled_iteration_time_s: PositiveFloat | None = None
    """The main job's iteration with every GPU running its longest piece (and switch) in each
    bubble, simulated on the engine (docs/pipefill.md, Sec. 5)."""
    notes: tuple[str, ...] = ()


class ScalePoint(_Result):
    """One cluster size of the scale sweep ([pipefill] Sec. 6.1, reading Sec. 4.3)."""

    num_gpus: PositiveInt
    num_microbatches: PositiveInt
    bubble_fraction: NonNegativeFloat
    closed_form_bubble_fraction: NonNegativeFloat
    iteration_time_s: PositiveFloat
    main_tflops_per_gpu: NonNegativeFloat
    fill_tflops_per_gpu: NonNegativeFloat
    recovered_utilization: NonNegativeFloat
    main_job_slowdown: NonNegativeFloat
    num_jobs_completed: NonNegativeInt
    gpus_worth_of_fill: NonNegativeFloat
    """Fill work in GPUs running it exclusively (the paper's C x B x P, [pipefill])."""


class ScaleResult(_Result):
    policy: FillPolicy
    fill_fraction: float
    free_memory_bytes: float
    horizon_s: PositiveFloat
    jobs: str
    points: tuple[ScalePoint, ...]
