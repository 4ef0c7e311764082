"""Synthetic Gavel workloads: Poisson arrivals and the chapter's job mix (L5938-6062).

- Job types: drawn uniformly from the throughput table's 26 (model, batch size) types
  (Table 5.2, L5938-5987).
- Scale factors: all 1 (continuous-single), or, with ``multi_gpu``, 1/2/4/8 with
  probabilities 0.70/0.10/0.15/0.05 (the text says 70% one GPU, 25% two to four, 5% eight,
  L6056-6062; the split of the 25% is Gavel's code), the type drawn among those the table
  has at that scale.
- Duration on a V100: 10^x minutes with x ~ U[1.5, 3] with probability 0.8, else U[3, 4]
  (L6048-6052; the text's "exponential" is read as this formula, as Gavel's code does);
  num_steps = V100 throughput x duration (L6052-6056).
- Arrivals: Poisson with ``rate_per_hour`` (exponential gaps), the first job at time 0.
"""

from __future__ import annotations

import numpy as np

from planner.errors import InvalidProblemError
from planner.schema_gavel import Job, JobsFile
from solvers.gavel.throughputs import ThroughputTable, load_table, table_job, table_pairs

MULTI_GPU_SCALES = (1, 2, 4, 8)
MULTI_GPU_PROBS = (0.70, 0.10, 0.15, 0.05)


def duration_s(rng: np.random.Generator) -> float:
    """One job's duration on a V100 (L6048-6052)."""
    exponent = rng.uniform(1.5, 3.0) if rng.random() < 0.8 else rng.uniform(3.0, 4.0)
    return 60.0 * 10.0**exponent


def generate_jobs(
    num_jobs: int,
    *,
    rate_per_hour: float,
    seed: int,
    worker_types: dict[str, int],
    multi_gpu: bool = False,
    with_pairs: bool = False,
    table: ThroughputTable | None = None,
) -> JobsFile:
    """A reproducible Poisson trace of ``num_jobs`` jobs from Gavel's table.

    Raises:
        InvalidProblemError: non-positive job count or rate.
    """
    if num_jobs < 1 or rate_per_hour <= 0:
        raise InvalidProblemError(
            f"a Poisson workload needs --jobs >= 1 and --rate > 0 jobs/hour; got {num_jobs} and {rate_per_hour}"
        )
    table = table or load_table()
    rng = np.random.default_rng(seed)
    by_scale = {s: sorted(name for name, sc in table.isolated if sc == s) for s in MULTI_GPU_SCALES}
    fastest_ref = "v100" if "v100" in next(iter(table.isolated.values())) else None
    arrival = 0.0
    jobs: list[Job] = []
    for index in range(num_jobs):
        scale = int(rng.choice(MULTI_GPU_SCALES, p=MULTI_GPU_PROBS)) if multi_gpu else 1
        names = by_scale[scale] or by_scale[1]
        name = names[int(rng.integers(len(names)))]
        row = table.isolated[(name, scale)]
        reference = row.get(fastest_ref, 0.0) if fastest_ref else 0.0
        reference = reference if reference > 0 else max(row.values())
        steps = max(1.0, round(reference * duration_s(rng)))
        jobs.append(table_job(table, str(index), name, scale_factor=scale, worker_types=worker_types,
                              num_steps=steps, arrival_time_s=arrival))
        arrival += float(rng.exponential(3600.0 / rate_per_hour))
    pairs = table_pairs(table, tuple(jobs), worker_types) if with_pairs else ()
    return JobsFile(jobs=tuple(jobs), pairs=pairs)
