"""Latency of the in-process API for autotuners: make_problem + plan(even) + simulate.

Prints a table: model, cluster, p, m, milliseconds per plan+simulate (median of repeats);
then the cost of ``import planner.api`` in a fresh interpreter (``python -X importtime``'s
cumulative figure, best of 5) and the wall time of ``paraplan plan`` on PipeDream's VGG-16
profile (one V100 node of 4; best of 5, interpreter start included).
Run: ``python bench/api_latency.py``.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import time

from planner import api

CASES = [
    ("gpt-1.7b", "a100-80gb:8", 4, 16),
    ("gpt-7.5b", "a100-80gb:16", 8, 32),
    ("gpt3-175b", "a100-80gb:128", 16, 64),
]


def main() -> None:
    print(f"{'model':<12} {'cluster':<14} {'p':>3} {'m':>4} {'problem ms':>11} {'plan+sim ms':>12}")
    for model, cluster, p, m in CASES:
        build, solve = [], []
        for _ in range(7):
            t0 = time.perf_counter()
            problem = api.make_problem(model, cluster, num_stages=p, num_microbatches=m, tensor_parallel=8 if p >= 16 else 1)
            t1 = time.perf_counter()
            plan = api.plan(problem, solver="even")
            api.simulate(plan)
            t2 = time.perf_counter()
            build.append(t1 - t0)
            solve.append(t2 - t1)
        print(f"{model:<12} {cluster:<14} {p:>3} {m:>4} {1e3 * statistics.median(build):>11.2f} "
              f"{1e3 * statistics.median(solve):>12.2f}")


def import_time_s(module: str = "planner.api", repeats: int = 5) -> float:
    """Cumulative import time of ``module`` in a fresh interpreter (best of ``repeats``)."""
    best = float("inf")
    for _ in range(repeats):
        err = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"],
                             capture_output=True, text=True, check=True, env=os.environ).stderr
        line = next(x for x in err.splitlines()[::-1] if x.rstrip().endswith(f"| {module}"))
        best = min(best, int(re.split(r"\s*\|\s*", line)[1]) / 1e6)
    return best


def cli_plan_s(repeats: int = 5) -> float:
    """Wall time of ``paraplan plan`` on PipeDream's VGG-16 profile (interpreter start included)."""
    args = [sys.executable, "-m", "planner.cli", "plan", "--model", "pipedream:vgg16", "--cluster", "v100:1x4",
            "--solver", "pipedream", "--json"]
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(args, capture_output=True, check=True, env=os.environ)
        best = min(best, time.perf_counter() - start)
    return best


if __name__ == "__main__":
    main()
    print(f"import planner.api: {import_time_s():.3f} s")
    print(f"paraplan plan --model pipedream:vgg16 --cluster v100:1x4 --solver pipedream: {cli_plan_s():.3f} s")
