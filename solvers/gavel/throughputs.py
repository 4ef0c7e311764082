"""Job throughputs: Gavel's published tables and traces, or paraplan's own pipeline planners.

- Tables (dissertation ch. 5 sec. 5.5 and Fig. 5.1; data from stanford-futuredata/gavel
  ``scheduler/simulation_throughputs.json``, MIT license in ``data/LICENSE-gavel.txt``; format
  in shared/data/README.md sec. 3): steps/s of each (model, scale factor) alone on each worker
  type, and of each co-located pair.
- Traces (same README sec. 4): Gavel's 10-column tab-separated job lines.
- Derived: a job given as ``model`` + ``batch_size`` gets, on each accelerator type, the
  throughput of the best plan paraplan's pipeline planner finds for it on ``scale_factor``
  devices of that type (one node), in steps (global batches) per second. A job that does
  not fit a type's memory gets 0 there. This plans the parallelization and the allocation
  together, which Gavel leaves to future work (L7420-7430).
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from planner.errors import InfeasibleError, InvalidProblemError
from planner.schema_gavel import ClusterProblem, EntitySpec, Job, JobPair, JobsFile
from planner.schema_io import MAX_JOBS, MAX_STEPS, load_json, read_text

log = logging.getLogger(__name__)

_KEY_RE = re.compile(r"^\('(.*)', (\d+)\)$")
TRACE_COLUMNS = 10


@dataclass(frozen=True)
class ThroughputTable:
    """Gavel's table: (job type, scale) -> type -> steps/s, and co-located pairs."""

    isolated: dict[tuple[str, int], dict[str, float]]
    pairs: dict[tuple[str, str, int], dict[str, tuple[float, float]]]

    @property
    def job_types(self) -> tuple[str, ...]:
        return tuple(sorted({name for name, _ in self.isolated}))


def load_table(path: str | Path | None = None) -> ThroughputTable:
    """Gavel's throughput table (the bundled simulation table by default).

    Raises:
        InvalidProblemError: unreadable file or a structure other than Gavel's.
    """
    if path is None:
        return _default_table()
    data = load_json(path, what="Gavel throughput table")
    try:
        return _parse_table(data)
    except (AttributeError, TypeError, KeyError, ValueError, IndexError) as e:
        raise InvalidProblemError(f"cannot read Gavel throughput table {str(path)!r}: {e}") from None


@lru_cache(maxsize=1)
def _default_table() -> ThroughputTable:
    text = resources.files("solvers.gavel").joinpath("data/simulation_throughputs.json").read_text()
    return _parse_table(json.loads(text))


def _parse_table(data: dict) -> ThroughputTable:
    isolated: dict[tuple[str, int], dict[str, float]] = {}
    pairs: dict[tuple[str, str, int], dict[str, tuple[float, float]]] = {}
    for worker, entries in data.items():
        if worker.endswith("_unconsolidated"):
            continue  # spread-placement variants; the scheduler uses the consolidated tables
        for key, row in entries.items():
            match = _KEY_RE.match(key)
            if match is None:
                raise KeyError(f"job-type key {key!r}")
            name, scale = match.group(1), int(match.group(2))
            isolated.setdefault((name, scale), {})[worker] = float(row["null"])
            for other, values in row.items():
                other_match = _KEY_RE.match(other)
                if other == "null" or other_match is None or name >= other_match.group(1):
                    continue
                pairs.setdefault((name, other_match.group(1), scale), {})[worker] = (float(values[0]), float(values[1]))
    return ThroughputTable(isolated=isolated, pairs=pairs)


def table_job(
    table: ThroughputTable, job_id: str, job_type: str, *, scale_factor: int, worker_types: dict[str, int], **fields: float
) -> Job:
    """A Job with the table's throughputs on the cluster's types.

    Raises:
        InvalidProblemError: the (job type, scale factor) is not in the table.
    """
    row = table.isolated.get((job_type, scale_factor))
    if row is None:
        raise InvalidProblemError(
            f"job {job_id!r}: job type {job_type!r} at scale_factor={scale_factor} is not in the throughput "
            f"table; known types: {list(table.job_types)}"
        )
    throughputs = {t: row.get(t, 0.0) for t in worker_types}
    return Job.model_validate({"id": job_id, "job_type": job_type, "scale_factor": scale_factor,
                               "throughputs": throughputs, **fields})


def table_pairs(table: ThroughputTable, jobs: tuple[Job, ...], worker_types: dict[str, int]) -> tuple[JobPair, ...]:
    """Pairs of jobs worth co-locating: on some type their normalized throughputs sum above 1
    (better than time slicing, L5164-5167)."""
    out: list[JobPair] = []
    for i, a in enumerate(jobs):
        for b in jobs[i + 1:]:
            if a.scale_factor != b.scale_factor or a.job_type is None or b.job_type is None:
                continue
            first, second = sorted((a, b), key=lambda j: j.job_type or "")
            entry = table.pairs.get((first.job_type or "", second.job_type or "", a.scale_factor))
            if not entry:
                continue
            kept = {t: v for t, v in entry.items() if t in worker_types and _helps(first, second, t, v)}
            if kept:
                out.append(JobPair(jobs=(first.id, second.id), throughputs=kept))
    return tuple(out)


def _helps(a: Job, b: Job, worker: str, values: tuple[float, float]) -> bool:
    ta, tb = (a.throughputs or {}).get(worker, 0.0), (b.throughputs or {}).get(worker, 0.0)
    return ta > 0 and tb > 0 and values[0] / ta + values[1] / tb > 1.0


def read_trace(
    path: str | Path, *, worker_types: dict[str, int], table: ThroughputTable | None = None, with_pairs: bool = False
) -> JobsFile:
    """Jobs of a Gavel trace file (10 tab-separated columns; ids 0, 1, 2... in line order).

    The SLO column is a multiple of the job's duration on its fastest type; -1 means none.

    Raises:
        InvalidProblemError: unreadable file, a line without 10 columns, or unparsable numbers.
    """
    table = table or load_table()
    lines = read_text(path, what="Gavel trace").splitlines()
    jobs: list[Job] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) != TRACE_COLUMNS:
            raise InvalidProblemError(
                f"trace {str(path)!r} line {number} has {len(cols)} tab-separated columns, Gavel traces have "
                f"{TRACE_COLUMNS} (job_type, command, directory, steps flag, needs_data_dir, total_steps, "
                "scale_factor, priority_weight, SLO, arrival_time)"
            )
        try:
            steps, scale, weight, slo, arrival = int(cols[5]), int(cols[6]), float(cols[7]), float(cols[8]), float(cols[9])
        except ValueError as e:
            raise InvalidProblemError(f"trace {str(path)!r} line {number}: {e}") from None
        if not all(math.isfinite(v) for v in (weight, slo, arrival)) or steps < 1 or steps > MAX_STEPS:
            raise InvalidProblemError(
                f"trace {str(path)!r} line {number}: total_steps={cols[5]}, priority_weight={cols[7]}, SLO={cols[8]} "
                f"and arrival_time={cols[9]} must be finite, with 1 <= total_steps <= {MAX_STEPS:.0e}"
            )
        if len(jobs) >= MAX_JOBS:
            raise InvalidProblemError(f"trace {str(path)!r} has more than {MAX_JOBS:,} jobs (the limit of one "
                                      "cluster-scheduling problem); split the trace")
        job = table_job(table, str(len(jobs)), cols[0], scale_factor=scale, worker_types=worker_types,
                        num_steps=steps, weight=weight, arrival_time_s=arrival)
        if slo > 0:
            fastest = max((job.throughputs or {}).values(), default=0.0)
            job = job.model_copy(update={"slo_s": slo * steps / fastest if fastest > 0 else None})
        jobs.append(job)
    if not jobs:
        raise InvalidProblemError(f"trace {str(path)!r} has no jobs")
    pairs = table_pairs(table, tuple(jobs), worker_types) if with_pairs else ()
    return JobsFile(jobs=tuple(jobs), pairs=pairs)


def derive_throughputs(model: str, batch_size: int, *, worker_types: dict[str, int], scale_factor: int = 1,
                       solver: str = "even") -> dict[str, float]:
    """Steps/s of a model at a global batch size on ``scale_factor`` devices of each type.

    Raises:
        InvalidProblemError: an accelerator type that is not a hardware preset, or an unknown model.
    """
    from cost_models import hardware, models, transformer
    from planner.schema import PipelineProblem
    from solvers import solve as plan_solve

    config = models.model_preset(model)
    out: dict[str, float] = {}
    for worker in worker_types:
        try:
            cluster = hardware.cluster_preset(f"{worker}:1x{scale_factor}")
        except InvalidProblemError:
            raise InvalidProblemError(
                f"cannot derive throughputs of {model!r} on accelerator type {worker!r}: it is not a hardware "
                "preset (see `paraplan presets`); give the job's 'throughputs' instead"
            ) from None
        assert cluster.device is not None
        profile = transformer.transformer_profile(config, device=cluster.device, microbatch_size=1,
                                                  intra_node_bytes_per_s=cluster.intra_node_bytes_per_s)
        problem = PipelineProblem(model=profile, cluster=cluster, transformer=config, global_batch_size=batch_size)
        try:
            plan = plan_solve(problem, solver=solver)
        except InfeasibleError as e:
            log.info("%s batch %d does not fit %d x %s: %s", model, batch_size, scale_factor, worker, e)
            out[worker] = 0.0
            continue
        assert plan.predicted is not None
        out[worker] = plan.predicted.throughput_samples_per_s / plan.global_batch_size
    return out


def resolve_problem(jobs: JobsFile, *, worker_types: dict[str, int], prices_per_hour: dict[str, float] | None = None,
                    entities: dict[str, EntitySpec] | None = None) -> ClusterProblem:
    """The ClusterProblem of a jobs file: derives missing throughputs (cached per model, batch, scale)."""
    cache: dict[tuple[str, int, int], dict[str, float]] = {}
    resolved: list[Job] = []
    for job in jobs.jobs:
        if job.throughputs is None:
            key = (job.model or "", job.batch_size or 1, job.scale_factor)
            if key not in cache:
                cache[key] = derive_throughputs(key[0], key[1], worker_types=worker_types, scale_factor=key[2])
            job = job.model_copy(update={"throughputs": cache[key]})
        resolved.append(job)
    return ClusterProblem.from_dict({
        "jobs": [j.model_dump() for j in resolved],
        "worker_types": worker_types,
        "pairs": [p.model_dump() for p in jobs.pairs],
        "entities": {k: v.model_dump() for k, v in (entities or jobs.entities).items()},
        "prices_per_hour": prices_per_hour or {},
    })
