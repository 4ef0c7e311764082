"""Latency of the in-process API for autotuners: make_problem + plan(even) + simulate.

Prints a table: model, cluster, p, m, milliseconds per plan+simulate (median of repeats).
Run: ``python bench/api_latency.py``.
"""

from __future__ import annotations

import statistics
import time

from planner import api

CASES = [
    ("gpt-1.7b", "a100-80gb:1", 4, 16),
    ("gpt-7.5b", "a100-80gb:2", 8, 32),
    ("gpt3-175b", "a100-80gb:16", 16, 64),
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


if __name__ == "__main__":
    main()
