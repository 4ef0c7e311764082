"""Latency of the in-process API for autotuners, and the start-up cost of ``planner.api`` and the CLI.

Prints a table: model, cluster, p, m, milliseconds per plan+simulate (median of repeats);
then start-up figures, each the best of N fresh interpreters:

- ``import X``: ``python -X importtime``'s cumulative figure for ``planner.api``, ``pydantic``,
  ``pydantic.main`` (its BaseModel) and ``planner.cli`` (interpreter start excluded);
- the wall time of ``python -c pass`` (the interpreter alone), ``paraplan --help``,
  ``paraplan solvers`` and ``paraplan plan`` on PipeDream's VGG-16 profile (one V100 node of 4),
  each a fresh ``python -m planner.cli`` process, interpreter start included.

The load average is printed with them (the figures move with it on a shared machine).
Run: ``python bench/api_latency.py`` (``--startup`` skips the in-process table; ``--repeats N``).
Against another checkout: ``PYTHONPATH=/other/checkout python bench/api_latency.py --startup``.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

CASES = [
    ("gpt-1.7b", "a100-80gb:8", 4, 16),
    ("gpt-7.5b", "a100-80gb:16", 8, 32),
    ("gpt3-175b", "a100-80gb:128", 16, 64),
]

CLI_COMMANDS = {
    "python -c pass (interpreter start)": ["-c", "pass"],
    "paraplan --help": ["-m", "planner.cli", "--help"],
    "paraplan solvers": ["-m", "planner.cli", "solvers"],
    "paraplan plan --model pipedream:vgg16 --cluster v100:1x4 --solver pipedream --json": [
        "-m", "planner.cli", "plan", "--model", "pipedream:vgg16", "--cluster", "v100:1x4", "--solver", "pipedream",
        "--json"],
}


def api_table() -> None:
    from planner import api

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


def process_s(args: list[str], repeats: int = 5) -> float:
    """Wall time of ``python ARGS`` in a fresh process (interpreter start included), best of ``repeats``."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, *args], capture_output=True, check=True, env=os.environ)
        best = min(best, time.perf_counter() - start)
    return best


def startup_table(repeats: int) -> None:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"start-up, best of {repeats} fresh interpreters (load average {load}, {os.cpu_count()} CPUs)")
    for module in ("planner.api", "pydantic", "pydantic.main", "planner.cli"):
        print(f"  import {module:<13} {import_time_s(module, repeats):.3f} s")
    for name, args in CLI_COMMANDS.items():
        print(f"  {name}: {process_s(args, repeats):.3f} s")
    print(f"  load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--startup", action="store_true", help="only the start-up figures")
    parser.add_argument("--repeats", type=int, default=5, help="fresh interpreters per start-up figure")
    args = parser.parse_args()
    if not args.startup:
        api_table()
    startup_table(args.repeats)


if __name__ == "__main__":
    main()
