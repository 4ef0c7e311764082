"""Small catalogues and jobs shared by the cloud tests."""

from __future__ import annotations

from functools import lru_cache

from planner.schema_cloud import Catalogue, CloudJob, CloudProblem


def catalogue(*instances: tuple, egress: dict[str, float] | None = None, fixed: tuple[str, ...] = ()) -> Catalogue:
    """Instances as (name, cloud, accelerator, count, on-demand $/h, spot $/h or None, preemptions/h)."""
    egress = egress or {"aws": 0.09, "azure": 0.087}
    clouds = {c: {"egress_usd_per_gb": e, "spot_pricing": "fixed" if c in fixed else "dynamic"} for c, e in egress.items()}
    rows = []
    for name, cloud, acc, count, od, spot, *rate in instances:
        row = {"name": name, "cloud": cloud, "region": "r1", "zones": ["z1", "z2"], "accelerator": acc,
               "num_accelerators": count, "on_demand_usd_per_h": od, "preemption_rate_per_h": rate[0] if rate else 0.0}
        if spot is not None:
            row["spot_usd_per_h"] = spot
        rows.append(row)
    return Catalogue.from_dict({"name": "tiny", "prices_as_of": "2026-01", "clouds": clouds, "instances": rows})


def job(job_id: str, throughputs: dict[str, float], num_steps: float, **fields) -> CloudJob:
    return CloudJob.model_validate({"id": job_id, "throughputs": throughputs, "num_steps": num_steps, **fields})


def problem(*jobs: CloudJob, **fields) -> CloudProblem:
    return CloudProblem.model_validate({"jobs": [j.model_dump() for j in jobs], **fields})


@lru_cache(maxsize=4)
def generated_market(seed: int):
    """(trace, market) of the bundled ch6-2020 catalogue's generated trace for a seed (cached)."""
    from solvers.cloud.catalogue import load_catalogue
    from solvers.cloud.replay import market
    from solvers.cloud.traces import generate_trace

    cat = load_catalogue("ch6-2020")
    trace = generate_trace(cat, seed=seed)
    return trace, market(trace, cat)
