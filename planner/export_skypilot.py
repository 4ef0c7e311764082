"""A cloud plan as SkyPilot task YAML (one task per job).

SkyPilot's task format (``resources``: ``cloud``, ``region``, ``instance_type``, ``accelerators``,
``use_spot``, and candidate lists ``any_of`` / ``ordered``) is documented in SkyPilot's YAML
specification. A job the plan keeps on one option becomes a plain ``resources`` block. A job
whose allocation spreads its time over several options becomes ``ordered`` candidates, the
option with the largest share first (SkyPilot launches the first that is available; it cannot
split time, so the shares are written in a comment). Options that are interchangeable (same
accelerator, count, market and price) become ``any_of``. Reserved capacity has no SkyPilot
market: it is exported as on-demand with a comment.
"""

from __future__ import annotations

import json
from typing import Any

from planner.errors import InvalidProblemError
from planner.schema_cloud import CloudPlan, Option

# paraplan accelerator names -> SkyPilot's
_ACCELERATORS = {"a100-40gb": "A100", "a100-80gb": "A100-80GB", "h100": "H100", "h200": "H200", "v100": "V100",
                 "p100": "P100", "k80": "K80"}
DEFAULT_RUN = "echo 'replace with the training command'"


def skypilot_task(plan: CloudPlan, job_id: str, *, run: str = DEFAULT_RUN, workdir: str | None = None) -> dict[str, Any]:
    """The task of one job as a mapping (what the YAML holds).

    Raises:
        InvalidProblemError: the job is not in the plan, or the plan gives it no instance.
    """
    if job_id not in plan.jobs:
        raise InvalidProblemError(f"job {job_id!r} is not in the plan; its jobs: {sorted(plan.jobs)}")
    shares = sorted(((k, x) for k, x in plan.jobs[job_id].fractions.items() if x > 0), key=lambda kv: (-kv[1], kv[0]))
    if not shares:
        raise InvalidProblemError(f"job {job_id!r} has no instance in the plan (every fraction is 0): nothing to "
                                  "export; re-plan with a larger budget or more instance types")
    candidates = [_resources(plan.options[key]) for key, _ in shares]
    task: dict[str, Any] = {"name": job_id}
    if workdir:
        task["workdir"] = workdir
    if len(candidates) == 1:
        task["resources"] = candidates[0]
    else:
        common = {k: v for k, v in candidates[0].items() if all(c.get(k) == v for c in candidates)}
        rest = [{k: v for k, v in c.items() if k not in common} for c in candidates]
        same = len({(o.accelerator, o.num_accelerators, o.market, round(o.usd_per_h, 6))
                    for o in (plan.options[k] for k, _ in shares)}) == 1
        task["resources"] = {**common, ("any_of" if same else "ordered"): rest}
    task["run"] = run
    return task


def skypilot_yaml(plan: CloudPlan, job_id: str, *, run: str = DEFAULT_RUN, workdir: str | None = None) -> str:
    """The task of one job as YAML text, with the plan's shares and prices as comments."""
    job = plan.jobs[job_id] if job_id in plan.jobs else None
    task = skypilot_task(plan, job_id, run=run, workdir=workdir)
    assert job is not None
    lines = [f"# paraplan cloud plan ({plan.objective}, catalogue {plan.catalogue}), job {job_id}"]
    for key, share in sorted(job.fractions.items(), key=lambda kv: -kv[1]):
        option = plan.options[key]
        market = option.market + (" (exported as on-demand: SkyPilot has no reserved market)" if option.market == "reserved" else "")
        lines.append(f"#   {100 * share:5.1f}% of its time on {option.instance} {market} at ${option.usd_per_h:.4f}/h")
    if job.duration_h is not None:
        lines.append(f"#   predicted: {job.duration_h:.2f} h, ${(job.compute_usd or 0) + job.egress_usd:,.2f}")
    return "\n".join(lines + [_emit(task, 0)]) + "\n"


def _resources(option: Option) -> dict[str, Any]:
    accelerator = _ACCELERATORS.get(option.accelerator, option.accelerator.upper())
    return {"cloud": option.cloud, "region": option.region, "instance_type": option.name,
            "accelerators": f"{accelerator}:{option.num_accelerators}", "use_spot": option.market == "spot"}


def _emit(value: Any, indent: int) -> str:
    """Block-style YAML of mappings, lists and scalars (scalars quoted as JSON where needed)."""
    pad = "  " * indent
    if isinstance(value, dict):
        out = []
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                out.append(f"{pad}{key}:\n{_emit(item, indent + 1)}")
            elif isinstance(item, str) and "\n" in item:
                body = "\n".join(f"{pad}  {line}" for line in item.splitlines())
                out.append(f"{pad}{key}: |\n{body}")
            else:
                out.append(f"{pad}{key}: {_scalar(item)}")
        return "\n".join(out)
    assert isinstance(value, list)
    out = []
    for item in value:
        text = _emit(item, indent + 1) if isinstance(item, dict) else f"{pad}  {_scalar(item)}"
        out.append(f"{pad}- {text.lstrip()}")
    return "\n".join(out)


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    plain = text and all(c.isalnum() or c in "-_./:@" for c in text) and text.lower() not in ("true", "false", "null", "yes", "no")
    return text if plain else json.dumps(text)
