"""Benchmark of the stage-ILP against its baselines (issue 4, part 5; the poster's table, seed 002 L93-101).

For every model x device x schedule x depth: the simulated iteration time of each solver, its
speedup over ``even``, the peak memory per device as a fraction of capacity, and the solve time.
Every plan is timed by the one simulator (``cost_models.simulate``). Profiles are analytic
(``transformer_profile``) with tensor parallelism t inside a node and one pipeline replica
(d = 1), m = microbatches-per-stage x p.

Usage (the defaults run the issue's full grid, as in docs/solver-stage-ilp.md; ``--bpipe`` adds ilp-tri with BPipe):

    PYTHONPATH=. python bench/stage_ilp.py --models llama-175b --depths 8 16 32 --out table.md
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from collections.abc import Callable

from _timing import warm_imports  # bench/ is on sys.path when run as a script
from cost_models.hardware import cluster_preset
from cost_models.models import model_preset
from cost_models.transformer import transformer_profile
from planner.errors import PlannerError
from planner.schema import PipelineProblem, Plan
from solvers import get_solver
from solvers._partition import pipedream_fixed

SOLVERS: dict[str, Callable[[PipelineProblem], Plan]] = {
    "even": lambda pr: get_solver("even")(pr),
    "pipedream": pipedream_fixed,
    "merak": lambda pr: get_solver("merak")(pr),
    "adapipe": lambda pr: get_solver("adapipe")(pr),
    "ilp-dual": lambda pr: get_solver("stage-ilp")(pr, options={"terms": "dual"}),
    "ilp-tri": lambda pr: get_solver("stage-ilp")(pr, options={"terms": "tri"}),
}
BPIPE_SOLVER = ("ilp-tri+bpipe", lambda pr: get_solver("stage-ilp")(pr.model_copy(update={"bpipe": True})))
"""With ``--bpipe``: the tri ILP planning with BPipe (its plan simulated with evictions and loads)."""


def problem(model: str, device: str, schedule: str, depth: int, *, tensor_parallel: int, per_stage: int,
            chunks: int) -> PipelineProblem:
    """One benchmark row's problem: t x p devices (t per node), m = per_stage x p, d = 1."""
    nodes = max(1, depth * tensor_parallel // 8)
    cluster = cluster_preset(f"{device}:{nodes}x{min(8, depth * tensor_parallel)}")
    assert cluster.device is not None
    prof = transformer_profile(model_preset(model), device=cluster.device, microbatch_size=1,
                               tensor_parallel=tensor_parallel, intra_node_bytes_per_s=cluster.intra_node_bytes_per_s)
    v = chunks if schedule == "interleaved-1f1b" else 1
    return PipelineProblem(model=prof, cluster=cluster, schedule=schedule, num_stages=depth, num_chunks=v,
                           num_microbatches=per_stage * depth, data_parallel=1)


def run_row(pr: PipelineProblem) -> dict[str, tuple[float, float, float] | str]:
    """Per solver (iteration time s, peak memory / capacity, solve time s), or the error kind.

    For the ILP solvers also ``<name>:own``: (simulated time of the ILP's own optimum, before
    re-ranking, nan, nan), read from ``Plan.candidates`` (source ``ilp``).
    """
    out: dict[str, tuple[float, float, float] | str] = {}
    assert pr.cluster.device is not None
    for name, fn in SOLVERS.items():
        began = time.perf_counter()
        try:
            plan = fn(pr)
        except PlannerError as e:
            out[name] = type(e).__name__.replace("Error", "").lower()
            continue
        assert plan.predicted is not None
        mem = max(plan.predicted.peak_memory_bytes) / pr.cluster.device.memory_bytes
        out[name] = (plan.predicted.iteration_time_s, mem, time.perf_counter() - began)
        own = [row["simulated_time_s"] for row in plan.candidates if row.get("source") == "ilp"]
        if own:
            out[f"{name}:own"] = (own[0], math.nan, math.nan)
    return out


BASELINES = ("even", "pipedream", "merak", "adapipe")


def own_verdict(row: dict[str, tuple[float, float, float] | str], name: str) -> str:
    """Whether the ILP's own plan (before re-ranking) is at least as fast as every baseline:
    ``yes``, ``no (<baseline> x<ratio>)`` or ``-`` when the ILP returned no plan of its own."""
    own = row.get(f"{name}:own")
    if not isinstance(own, tuple):
        return "-"
    times = {b: row[b][0] for b in BASELINES if isinstance(row.get(b), tuple)}  # type: ignore[index]
    if not times:
        return "yes"
    best = min(times, key=times.__getitem__)
    if own[0] <= times[best] * (1 + 1e-9):
        return "yes"
    return f"no ({best} {own[0] / times[best]:.4f}x)"


def format_row(label: str, row: dict[str, tuple[float, float, float] | str]) -> str:
    base = row.get("even")
    cells = []
    for name in SOLVERS:
        got = row[name]
        if isinstance(got, str):
            cells.append(got)
        elif isinstance(base, tuple):
            cells.append(f"{base[0] / got[0]:.3f}x / {got[1]:.0%} / {got[2]:.1f}s")
        else:
            cells.append(f"{got[0]:.2f}s / {got[1]:.0%} / {got[2]:.1f}s")
    cells += [own_verdict(row, "ilp-dual"), own_verdict(row, "ilp-tri")]
    return f"| {label} | " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["llama2-70b", "llama-175b", "gpt3-96b", "gpt3-134b"])
    parser.add_argument("--devices", nargs="+", default=["a100-80gb", "ascend-910"])
    parser.add_argument("--schedules", nargs="+", default=["1f1b", "interleaved-1f1b"])
    parser.add_argument("--depths", nargs="+", type=int, default=[8, 16, 32])
    parser.add_argument("--tensor-parallel", type=int, default=8)
    parser.add_argument("--microbatches-per-stage", type=int, default=4)
    parser.add_argument("--chunks", type=int, default=2)
    parser.add_argument("--out", default=None, help="also write the Markdown table to this file")
    parser.add_argument("--jsonl", default=None, help="also append one JSON object per row to this file")
    parser.add_argument("--bpipe", action="store_true", help="add a column: ilp-tri planning with BPipe")
    args = parser.parse_args()
    warm_imports("highspy", "pulp")  # the ILP's libraries, imported before the first solve is timed
    if args.bpipe:
        SOLVERS[BPIPE_SOLVER[0]] = BPIPE_SOLVER[1]
    lines = [f"machine: {platform.processor() or platform.machine()}, {platform.python_version()}; "
             f"t={args.tensor_parallel}, m={args.microbatches_per_stage}p, d=1, v={args.chunks} when interleaved",
             "", "cells: speedup over even / peak memory of capacity / solve time", "",
             "| model, device, schedule, p | " + " | ".join(SOLVERS) + " | dual own >= baselines | tri own >= baselines |",
             "|---|" + "---|" * (len(SOLVERS) + 2)]
    print("\n".join(lines), flush=True)  # noqa: T201 (a script, not library code)
    for model in args.models:
        for device in args.devices:
            for schedule in args.schedules:
                for depth in args.depths:
                    pr = problem(model, device, schedule, depth, tensor_parallel=args.tensor_parallel,
                                 per_stage=args.microbatches_per_stage, chunks=args.chunks)
                    label = f"{model}, {device}, {schedule}, {depth}"
                    row = run_row(pr)
                    line = format_row(label, row)
                    lines.append(line)
                    print(line, flush=True)  # noqa: T201
                    if args.jsonl:
                        with open(args.jsonl, "a", encoding="ascii") as fh:
                            fh.write(json.dumps({"row": label, **row}) + "\n")
    if args.out:
        with open(args.out, "w", encoding="ascii") as fh:
            fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
