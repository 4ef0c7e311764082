"""The scale mode: PipeFill's main job on 1K-16K GPUs with a stream of fill jobs (seed 000
Sec. 6.1, L203-223; reading Sec. 4.3-4.5).

The main job is the paper's simulated one: 40B parameters (``pipefill-40b``: PTD-P's 39.1B
shape, a guess, the paper gives none), TP 8 x PP 16 = 128 GPUs per replica, microbatch 2, global
batch 1024, GPipe, sequence 2048, on 16 GB V100s (L197, L203-205). Scaling out with a fixed
global batch leaves m = 1024 / (2 d) = 65536 / N microbatches per replica (reading Sec. 4.3); as
in the paper only one replica is simulated. Every layer recomputes its activations (full
recompute) at every N, so only m changes between points. Bubbles: 68% filled, 4.5 GB free
(L229, L231). Fill jobs arrive as a seeded Poisson stream over the horizon with the paper-like
mix (``solvers.fill.models.PAPER_MIX``) and enough work (``load`` x the replica's fill capacity)
to keep every GPU's bubbles busy.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cost_models import hardware, models, transformer
from planner.errors import InvalidProblemError
from planner.schema import Cluster, PipelineProblem, Plan
from planner.schema_fill import ScalePoint, ScaleResult
from solvers.fill.bubbles import PAPER_FREE_MEMORY_BYTES, BubbleOptions, closed_form_bubble_fraction
from solvers.fill.jobs import isolated_throughput, job_stream, preset_job
from solvers.fill.models import MIXES, fill_model_profile
from solvers.fill.simulate import FillOptions, fill_plan

PAPER_GPUS = (1024, 2048, 4096, 8192, 16384)
PAPER_GLOBAL_BATCH = 1024
PAPER_MICROBATCH = 2
PAPER_TENSOR, PAPER_PIPELINE = 8, 16
V100_16GB_BYTES = 16 * 2**30
PAPER_RESULTS = {
    # utilization increase with the trace mix / BERT inference only, seed 000 L7, L27, L221-223
    # (1K-2K: +5-10% mix, +7.8-15.6% BERT; 8K: "over 45%" mix, 63% BERT).
    1024: (0.05, 0.078), 2048: (0.10, 0.156), 8192: (0.45, 0.63),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ScaleOptions:
    num_gpus: Sequence[int] = PAPER_GPUS
    jobs: str = "paper-mix"
    """A named mix (``paper-mix``, ``bert-inference``) or one job preset."""
    horizon_s: float = 12 * 3600.0
    load: float = 1.3
    """Offered fill work over the replica's fill capacity (> 1 keeps every GPU busy)."""
    seed: int = 0
    fill: FillOptions = field(default_factory=lambda: FillOptions(
        policy="sjf", bubbles=BubbleOptions(free_memory_bytes=PAPER_FREE_MEMORY_BYTES)))
    max_jobs: int = 12000


def paper_cluster() -> Cluster:
    """16 nodes x 8 V100 16 GB (the paper's p3.16xlarge cluster, L197)."""
    cluster = hardware.cluster_preset("v100:128")
    assert cluster.device is not None  # a pipeline preset always has a device
    return cluster.model_copy(update={"device": cluster.device.model_copy(update={"memory_bytes": V100_16GB_BYTES})})


def paper_microbatches(num_gpus: int) -> int:
    """m = 65536 / N (reading Sec. 4.3), rounded when N does not divide 65536 (6K gives 10.67).

    Raises:
        InvalidProblemError: N below one replica (128 GPUs) or above 32768 (m < 2... 1).
    """
    if num_gpus < PAPER_TENSOR * PAPER_PIPELINE or num_gpus > PAPER_GLOBAL_BATCH // PAPER_MICROBATCH * 128:
        raise InvalidProblemError(
            f"num_gpus={num_gpus} must be between 128 (one replica, TP 8 x PP 16) and 65536 (one microbatch each)"
        )
    return max(1, round(PAPER_GLOBAL_BATCH / PAPER_MICROBATCH * 128 / num_gpus))


def paper_main_plan(num_gpus: int) -> Plan:
    """One replica of the paper's 40B main job at cluster size ``num_gpus``."""
    from solvers import even  # solvers/__init__ imports this package's siblings; import late

    m = paper_microbatches(num_gpus)
    cluster = paper_cluster()
    assert cluster.device is not None
    config = models.model_preset("pipefill-40b")
    profile = transformer.transformer_profile(
        config, device=cluster.device, microbatch_size=PAPER_MICROBATCH, tensor_parallel=PAPER_TENSOR,
        intra_node_bytes_per_s=cluster.intra_node_bytes_per_s,
    )
    problem = PipelineProblem(
        model=profile, cluster=cluster, transformer=config, schedule="gpipe", num_stages=PAPER_PIPELINE,
        num_microbatches=m, global_batch_size=PAPER_MICROBATCH * m,
    )
    return even.solve(problem, options={"recompute": "full"})


def _mix(jobs: str) -> dict[str, float]:
    if jobs in MIXES:
        return MIXES[jobs]
    preset_job(jobs, job_id="check")  # raises on an unknown name
    return {jobs: 1.0}


def scale_point(num_gpus: int, options: ScaleOptions = ScaleOptions()) -> ScalePoint:
    """Simulate the fill of one cluster size.

    Raises:
        InvalidProblemError: bad cluster size, mix or options.
        InfeasibleError: a fill job fits no bubble.
    """
    plan = paper_main_plan(num_gpus)
    device, eff = plan.cluster.device, options.fill.efficiency
    assert device is not None
    mix = _mix(options.jobs)
    # size the stream: offered GPU-seconds in bubbles ~ load x GPUs x horizon
    probe = fill_plan(plan, [preset_job(n, job_id=n) for n in mix], options.fill)
    rate = {e.job_id: e.throughput_samples_per_s for e in probe.executor_plans}  # on some stage: an estimate
    weights = sum(mix.values())
    mean_job_s = sum(
        w / weights * _mean_samples(n, device, eff) / max(rate.get(n, 0.0), 1e-9) for n, w in mix.items()
    )
    count = min(options.max_jobs, max(1, math.ceil(options.load * probe.num_devices * options.horizon_s / mean_job_s)))
    jobs = job_stream(mix, num_jobs=count, horizon_s=options.horizon_s, device=device, efficiency=eff,
                      seed=options.seed)
    filled = fill_plan(plan, jobs, dataclasses.replace(options.fill, horizon_s=options.horizon_s))
    main_tf = filled.main_flops_per_device_s / 1e12
    fill_tf = filled.fill_flops_per_device_s / 1e12
    exclusive = sum(w / weights * isolated_throughput(preset_job(n, job_id=n), device, eff) *
                    _flops_per_sample(n, device, eff) for n, w in mix.items())
    return ScalePoint(
        num_gpus=num_gpus, num_microbatches=plan.num_microbatches, bubble_fraction=filled.bubble_fraction,
        closed_form_bubble_fraction=closed_form_bubble_fraction(PAPER_PIPELINE, plan.num_microbatches),
        iteration_time_s=filled.iteration_time_s, main_tflops_per_gpu=main_tf, fill_tflops_per_gpu=fill_tf,
        recovered_utilization=filled.recovered_utilization, main_job_slowdown=filled.main_job_slowdown,
        num_jobs_completed=sum(1 for a in filled.assignments if a.end_s <= options.horizon_s),
        gpus_worth_of_fill=num_gpus * filled.fill_flops_per_device_s / exclusive if exclusive > 0 else 0.0,
    )


def _mean_samples(name: str, device, eff: float) -> float:  # noqa: ANN001 - Device
    from solvers.fill.jobs import MEDIAN_JOB_GPU_HOURS

    # mean of the clipped log-normal ~ median x e^(sigma^2 / 2) with sigma = 1
    return MEDIAN_JOB_GPU_HOURS * math.exp(0.5) * 3600.0 * isolated_throughput(preset_job(name, job_id=name), device, eff)


def _flops_per_sample(name: str, device, eff: float) -> float:  # noqa: ANN001 - Device
    job = preset_job(name, job_id=name)
    profile = fill_model_profile(job.model or "", device, eff)
    total = sum(layer.flops or 0.0 for layer in profile.layers) / profile.microbatch_size
    return total if job.mode == "training" else total / 3


def scale_sweep(options: ScaleOptions = ScaleOptions(), *, on_point: Callable[[], None] | None = None) -> ScaleResult:
    """The sweep over ``options.num_gpus`` (default the paper's 1K-16K); ``on_point`` is called
    after each cluster size (progress)."""
    if not options.num_gpus:
        raise InvalidProblemError("the scale sweep needs at least one cluster size (num_gpus)")
    points = []
    for n in options.num_gpus:
        points.append(scale_point(n, options))
        if on_point is not None:
            on_point()
    return ScaleResult(
        policy=options.fill.policy,  # type: ignore[arg-type]
        fill_fraction=options.fill.bubbles.fill_fraction,
        free_memory_bytes=options.fill.bubbles.free_memory_bytes or 0.0, horizon_s=options.horizon_s,
        jobs=options.jobs, points=tuple(points),
    )
