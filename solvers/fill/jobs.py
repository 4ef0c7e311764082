"""Fill-job input: ``--fill-jobs`` specs, configurations, and the paper-like job stream.

``--fill-jobs`` takes a job preset (``bert-large-inference``), a mix of presets with counts
(``bert-large-inference:4,resnet50-training:2``), a named mix (``paper-mix``), or a JSON file
(a ``paraplan.fill-jobs/v1`` document or a bare list of fill jobs). The stream of the scale
simulator follows the paper's recipe (seed 000 L209-211, reading Sec. 4.4): job sizes in
GPU-hours capped at 1 GPU-hour, samples = GPU-hours x the model's isolated throughput (the
paper's "divide" is read as multiply, reading Sec. 8 item 7), models drawn from the mix.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from planner.errors import InvalidProblemError
from planner.schema import Device, ModelProfile
from planner.schema_fill import FillJob, FillJobsFile
from planner.schema_io import MAX_JOBS, load_json
from solvers.fill.executor import Config, NodeChain, node_chain
from solvers.fill.models import FILL_JOB_PRESETS, MIXES, fill_model_profile

MAX_JOB_GPU_HOURS = 1.0
"""Jobs kept from the Alibaba trace for simulation: at most 1 GPU-hour (81.6% of jobs, L211)."""
MEDIAN_JOB_GPU_HOURS = 0.1
"""Median of the log-normal job-size stand-in for the trace (the trace itself is not bundled)."""


def preset_job(name: str, *, job_id: str, num_samples: float | None = None, arrival_time_s: float = 0.0) -> FillJob:
    """A fill job from a preset name such as ``bert-large-inference``.

    Raises:
        InvalidProblemError: unknown preset; the message lists the valid names.
    """
    preset = FILL_JOB_PRESETS.get(name)
    if preset is None:
        raise InvalidProblemError(
            f"unknown fill-job preset {name!r}; choose from {sorted(FILL_JOB_PRESETS)} or mixes {sorted(MIXES)}"
        )
    return FillJob(id=job_id, model=preset.model, mode=preset.mode, num_samples=num_samples or preset.num_samples,
                   arrival_time_s=arrival_time_s)


def parse_fill_jobs(spec: str) -> tuple[FillJob, ...]:
    """Fill jobs from a preset, ``name:count,...``, a named mix (one job per entry) or a JSON file.

    Raises:
        InvalidProblemError: unreadable file, malformed JSON, unknown preset or a bad count.
    """
    text = spec.strip()
    path = Path(text)
    if path.suffix == ".json" or path.is_file():
        if not path.is_file():
            raise InvalidProblemError(f"fill-jobs file {text!r} does not exist")
        data = load_json(path, what="fill-jobs")
        if isinstance(data, list):
            data = {"jobs": data}
        return FillJobsFile.from_dict(data).jobs
    if text in MIXES:
        return tuple(preset_job(name, job_id=f"{name}-0") for name in MIXES[text])
    jobs: list[FillJob] = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, _, count = item.partition(":")
        try:
            n = int(count) if count else 1
        except ValueError:
            n = 0
        if n < 1:
            raise InvalidProblemError(f"fill-jobs entry {item!r}: the count after ':' must be a positive integer")
        if len(jobs) + n > MAX_JOBS:
            raise InvalidProblemError(f"fill-jobs {spec!r} asks for more than {MAX_JOBS:,} jobs (ten times Gavel's "
                                      "largest simulated trace); use fewer")
        jobs.extend(preset_job(name, job_id=f"{name}-{i}") for i in range(n))
    if not jobs:
        raise InvalidProblemError("--fill-jobs is empty; give a preset such as 'bert-large-inference' or a JSON file")
    return tuple(jobs)


def job_profile(job: FillJob, device: Device, efficiency: float) -> ModelProfile:
    if job.profile is not None:
        return job.profile
    assert job.model is not None  # FillJob validation requires model or profile
    return fill_model_profile(job.model, device, efficiency)


def configurations(job: FillJob) -> tuple[Config, ...]:
    """Every (batch size, checkpointing, offload) the job allows, cheapest technique first."""
    batch = sorted(set(job.batch_sizes))
    if job.mode == "inference":
        return tuple(Config(b) for b in batch)
    ck = (False, True) if job.allow_checkpointing else (False,)
    off = (False, True) if job.allow_offload else (False,)
    return tuple(Config(b, c, o) for b in batch for o in off for c in ck)


def job_chains(job: FillJob, device: Device, efficiency: float) -> tuple[tuple[Config, NodeChain], ...]:
    profile = job_profile(job, device, efficiency)
    return tuple((c, node_chain(profile, job.mode, c, device)) for c in configurations(job))


def isolated_throughput(job: FillJob, device: Device, efficiency: float) -> float:
    """Samples/s with the whole device: the fastest configuration that fits its memory."""
    best = 0.0
    for _, chain in job_chains(job, device, efficiency):
        if chain.memory_bytes.max() <= device.memory_bytes:
            best = max(best, chain.samples / float(chain.duration_s.sum()))
    if best == 0.0:
        raise InvalidProblemError(f"fill job {job.id!r} does not fit a whole {device.name} ({device.memory_bytes:.3g} B)")
    return best


def job_stream(
    mix: dict[str, float], *, num_jobs: int, horizon_s: float, device: Device, efficiency: float, seed: int
) -> tuple[FillJob, ...]:
    """A seeded stream: Poisson arrivals over [0, horizon), presets drawn from ``mix``.

    Raises:
        InvalidProblemError: empty mix, non-positive weights or an unknown preset.
    """
    names: Sequence[str] = sorted(mix)
    weights = np.array([mix[n] for n in names], dtype=float)
    if not len(names) or (weights <= 0).any():
        raise InvalidProblemError(f"fill-job mix {mix} needs at least one preset with a positive weight")
    rng = np.random.default_rng(seed)
    arrivals = np.sort(rng.uniform(0.0, horizon_s, size=num_jobs))
    picks = rng.choice(len(names), size=num_jobs, p=weights / weights.sum())
    hours = np.clip(np.exp(rng.normal(math.log(MEDIAN_JOB_GPU_HOURS), 1.0, size=num_jobs)), 1e-3, MAX_JOB_GPU_HOURS)
    rates = {n: isolated_throughput(preset_job(n, job_id=n), device, efficiency) for n in names}
    return tuple(
        preset_job(names[p], job_id=f"j{i}-{names[p]}", num_samples=float(h * 3600.0 * rates[names[p]]),
                   arrival_time_s=float(t))
        for i, (p, h, t) in enumerate(zip(picks, hours, arrivals))
    )
