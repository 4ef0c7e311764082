"""The Python API's job-level planners: Gavel's cluster scheduling, PipeFill's bubble filling and
the cloud-pricing planner (dissertation ch. 6).

``planner.api`` exports every function here under the same name (loaded on first access); each
imports its solver when called, so importing this module loads no pydantic, numpy or solver.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from planner.errors import InvalidProblemError

if TYPE_CHECKING:
    from planner.schema import Plan
    from planner.schema_cloud import Catalogue, CloudJob, CloudPlan, CloudProblem, PriceTrace, ReplayResult


def gavel_policies() -> tuple[Any, ...]:
    """The Gavel policy registry (``solvers.gavel.REGISTRY``): name, description, capabilities."""
    from solvers import gavel

    return gavel.REGISTRY


def gavel_policy(name: str) -> Any:
    """One Gavel policy's registry entry.

    Raises:
        InvalidProblemError: unknown name; the message lists the valid names.
    """
    from solvers import gavel

    return gavel.get_policy(name)


def schedule(problem: Any, *, policy: str, options: Mapping[str, Any] | None = None) -> Any:
    """One Gavel allocation of a ``ClusterProblem`` under a registered policy (``solvers.gavel.solve``)."""
    from solvers import gavel

    return gavel.solve(problem, policy=policy, options=options)


def cluster_simulate(jobs: Any, **kwargs: Any) -> Any:
    """Gavel's round-based cluster simulation of a job trace (``solvers.gavel.simulator.simulate``)."""
    from solvers.gavel.simulator import simulate as simulate_cluster

    return simulate_cluster(jobs, **kwargs)


def fill_options(*, policy: str = "sjf", fill_fraction: float | None = None, free_memory_bytes: float | None = None,
                 efficiency: float | None = None, paper_memory: bool = False) -> Any:
    """PipeFill's options (``solvers.fill.simulate.FillOptions``); ``paper_memory`` uses the
    paper's fixed free memory per bubble when none is given."""
    from solvers.fill.bubbles import PAPER_FREE_MEMORY_BYTES, BubbleOptions
    from solvers.fill.simulate import FillOptions

    memory = free_memory_bytes or (PAPER_FREE_MEMORY_BYTES if paper_memory else None)
    bubbles = BubbleOptions(free_memory_bytes=memory, **({"fill_fraction": fill_fraction} if fill_fraction is not None else {}))
    return FillOptions(policy=policy, bubbles=bubbles, **({"efficiency": efficiency} if efficiency else {}))


def fill_jobs(spec: str) -> Any:
    """Fill jobs from a preset, ``name:count,...``, a mix or a JSON file (``solvers.fill.jobs``)."""
    from solvers.fill.jobs import parse_fill_jobs

    return parse_fill_jobs(spec)


def fill(plan: Plan, jobs: Any, options: Any) -> Any:
    """Fill a plan's pipeline bubbles with jobs (``fill_jobs`` or their spec; PipeFill,
    ``solvers.fill.simulate.fill_plan``)."""
    from solvers.fill.simulate import fill_plan

    return fill_plan(plan, fill_jobs(jobs) if isinstance(jobs, str) else jobs, options)


def fill_scale(*, num_gpus: tuple[int, ...], jobs: str, horizon_s: float, seed: int, options: Any,
               on_point: Any = None) -> Any:
    """PipeFill's scaling sweep (the paper's 40B job on growing clusters, ``solvers.fill.scale``);
    ``on_point`` is called after each cluster size."""
    from solvers.fill.scale import ScaleOptions, scale_sweep

    return scale_sweep(ScaleOptions(num_gpus=num_gpus, jobs=jobs, horizon_s=horizon_s, seed=seed, fill=options),
                       on_point=on_point)


# Cloud-pricing planner (dissertation ch. 6): the solver imports scipy only when called.


def load_cloud_catalogue(spec: str | Path | Catalogue = "ch6-2020") -> Catalogue:
    """An instance catalogue by bundled name (``ch6-2020``, ``public-2024``) or JSON path."""
    from solvers.cloud.catalogue import load_catalogue

    return load_catalogue(spec)


def load_cloud_trace(path: str | Path, *, catalogue: str | Path | Catalogue = "ch6-2020") -> PriceTrace:
    """A spot-price trace CSV, validated (time order, units, prices) against the catalogue."""
    from solvers.cloud.traces import check_trace, load_trace

    trace = load_trace(path)
    check_trace(trace, load_cloud_catalogue(catalogue))
    return trace


def generate_cloud_trace(catalogue: str | Path | Catalogue = "ch6-2020", *, seed: int = 0,
                         options: Any = None) -> PriceTrace:
    """A seeded synthetic spot-price trace with the chapter's stated statistics."""
    from solvers.cloud.traces import GeneratorOptions, generate_trace

    return generate_trace(load_cloud_catalogue(catalogue), seed=seed, options=options or GeneratorOptions())


def cloud_problem(jobs: Any, **fields: Any) -> CloudProblem:
    """A validated CloudProblem from jobs (CloudJob objects or mappings) and problem fields (None = default)."""
    from planner.schema_cloud import CloudJob, CloudProblem

    data = {k: v for k, v in fields.items() if v is not None and v != {}}
    return CloudProblem.from_dict({"jobs": [j.model_dump() if isinstance(j, CloudJob) else j for j in jobs], **data})


def cloud_plan(problem: CloudProblem, *, catalogue: str | Path | Catalogue = "ch6-2020",
               trace: str | Path | PriceTrace | None = None) -> CloudPlan:
    """Solve a CloudProblem (max-throughput, min-cost with SLOs, or min-makespan under a budget).

    With a trace, each instance type's spot price is its time-weighted mean there (cheapest zone).
    """
    import solvers.cloud as cloud
    from planner.schema_cloud import PriceTrace
    from solvers.cloud.chapter import mean_spot_prices

    cat = load_cloud_catalogue(catalogue)
    spot = None
    if trace is not None:
        spot = mean_spot_prices(trace if isinstance(trace, PriceTrace) else load_cloud_trace(trace, catalogue=cat))
    return cloud.solve(problem, catalogue=cat, spot_prices=spot)


def cloud_replay(job: CloudJob, *, strategy: str, catalogue: str | Path | Catalogue = "ch6-2020",
                 trace: str | Path | PriceTrace | None = None, seed: int = 0, **options: Any) -> ReplayResult:
    """Replay one job under one of the chapter's strategies over a trace (generated from ``seed`` if None)."""
    from planner.schema_cloud import PriceTrace
    from solvers.cloud.matrix import resolve_throughputs
    from solvers.cloud.replay import market, replay

    cat = load_cloud_catalogue(catalogue)
    if trace is None:
        trace = generate_cloud_trace(cat, seed=seed)
    elif not isinstance(trace, PriceTrace):
        trace = load_cloud_trace(trace, catalogue=cat)
    (job,) = resolve_throughputs((job,), {i.accelerator for i in cat.instances})
    return replay(job, market(trace, cat), cat, strategy=strategy, **options)


def cloud_export(plan: CloudPlan, job_id: str, *, fmt: Literal["skypilot"] = "skypilot", **kwargs: Any) -> str:
    """One job of a cloud plan as a SkyPilot task YAML."""
    from planner.export_skypilot import skypilot_yaml

    if fmt != "skypilot":
        raise InvalidProblemError(f"unknown cloud export format {fmt!r}; choose from ['skypilot']")
    return skypilot_yaml(plan, job_id, **kwargs)
