"""The data of the ch. 6 formulations: per job and option, throughput, cost rate and share.

Dissertation ch. 6 sec. 6.4: T_mj is job m's throughput on instance type j and c_j the
type's price per hour. A job needing g accelerators runs on an instance with n >= g of its
type; floor(n/g) such jobs pack one instance (sec. 6.3.2, multi-GPU instances) and each pays
that share of the price. On spot markets the throughput is discounted by the time each
preemption costs: the restart, plus half a checkpoint interval of lost work when the
checkpoint does not fit in the provider's notice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from planner.errors import InvalidProblemError
from planner.schema_cloud import Catalogue, CloudJob, Option

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Matrix:
    """Arrays over jobs m (rows) and options j (columns)."""

    job_ids: tuple[str, ...]
    option_keys: tuple[str, ...]
    steps_per_h: np.ndarray
    """Effective steps per hour of job m on option j (0 = cannot run there)."""
    usd_per_h: np.ndarray
    """The job's share of the option's price per hour."""
    share: np.ndarray
    """Fraction of one instance the job occupies (1/jobs packed)."""
    num_steps: np.ndarray

    @property
    def runnable(self) -> np.ndarray:
        return self.steps_per_h > 0


def resolve_throughputs(jobs: tuple[CloudJob, ...], accelerators: set[str], *, solver: str = "even") -> tuple[CloudJob, ...]:
    """Jobs with throughputs on every accelerator type, derived by the pipeline planner where a
    job gives ``model`` + ``batch_size`` (as ``paraplan schedule`` does for Gavel jobs)."""
    from solvers.gavel.throughputs import derive_throughputs

    cache: dict[tuple[str, int, int], dict[str, float]] = {}
    out = []
    for job in jobs:
        if job.throughputs is None:
            key = (job.model or "", job.batch_size or 1, job.num_accelerators)
            if key not in cache:
                cache[key] = derive_throughputs(key[0], key[1], worker_types={a: key[2] for a in sorted(accelerators)},
                                                scale_factor=key[2], solver=solver)
            job = job.model_copy(update={"throughputs": cache[key]})
        out.append(job)
    return tuple(out)


def preemption_factor(job: CloudJob, option: Option, notice_s: float) -> float:
    """Share of spot time spent training: 1 - rate x (restart + lost work) per hour."""
    if option.preemption_rate_per_h == 0:
        return 1.0
    lost_work_s = 0.0 if job.checkpoint_s <= notice_s else job.checkpoint_interval_s / 2
    return max(0.0, 1.0 - option.preemption_rate_per_h * (job.restart_s + lost_work_s) / 3600.0)


def build_matrix(jobs: tuple[CloudJob, ...], options: dict[str, Option], catalogue: Catalogue, *,
                 preemption: bool = True) -> Matrix:
    """The arrays of the formulations.

    Raises:
        InvalidProblemError: a job names an accelerator type no option offers, or can run on no option.
    """
    keys = tuple(options)
    accelerators = {o.accelerator for o in options.values()}
    thr = np.zeros((len(jobs), len(keys)))
    cost = np.zeros_like(thr)
    share = np.zeros_like(thr)
    for m, job in enumerate(jobs):
        assert job.throughputs is not None, "resolve_throughputs first"
        unknown = sorted(set(job.throughputs) - accelerators - _catalogue_accelerators(catalogue))
        if unknown:
            raise InvalidProblemError(f"job {job.id!r}: accelerator types {unknown} are in no instance type; "
                                      f"valid ones: {sorted(_catalogue_accelerators(catalogue))}")
        for j, key in enumerate(keys):
            option = options[key]
            per_instance = option.num_accelerators // job.num_accelerators
            speed = job.throughputs.get(option.accelerator, 0.0)
            if per_instance < 1 or speed <= 0:
                continue
            notice_s = catalogue.clouds[option.cloud].preemption_notice_s
            factor = preemption_factor(job, option, notice_s) if preemption else 1.0
            thr[m, j] = speed * 3600.0 * factor
            share[m, j] = 1.0 / per_instance
            cost[m, j] = option.usd_per_h * share[m, j]
        if not thr[m].any():
            raise InvalidProblemError(
                f"job {job.id!r} ({job.num_accelerators} accelerators, throughputs on {sorted(job.throughputs)}) can run on "
                f"no offered instance type; offered accelerators: {sorted(accelerators)}")
    return Matrix(job_ids=tuple(j.id for j in jobs), option_keys=keys, steps_per_h=thr, usd_per_h=cost, share=share,
                  num_steps=np.array([j.num_steps for j in jobs], dtype=float))


def _catalogue_accelerators(catalogue: Catalogue) -> set[str]:
    return {i.accelerator for i in catalogue.instances}


def egress_usd(job: CloudJob, cloud: str, catalogue: Catalogue) -> float:
    """Dollars to bring the job's dataset to ``cloud`` (once; ingress is free, Table 6.2)."""
    if job.dataset_cloud is None or job.dataset_cloud == cloud or job.dataset_gb == 0:
        return 0.0
    if job.dataset_cloud not in catalogue.clouds:
        raise InvalidProblemError(f"job {job.id!r}: dataset_cloud={job.dataset_cloud!r} is not a cloud of the catalogue; "
                                  f"valid ones: {sorted(catalogue.clouds)}")
    return job.dataset_gb * catalogue.clouds[job.dataset_cloud].egress_usd_per_gb
