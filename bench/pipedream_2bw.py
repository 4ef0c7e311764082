"""Solve time and sweep size of PipeDream-2BW's planner (solvers.pipedream_2bw).

For a few GPT presets on V100 and A100 clusters (and one measured PipeDream profile) prints the
wall time of ``solve`` (best of three; the sweep with the closed forms, plan assembly and one
simulation of the chosen plan), the number of configurations swept and how many fit, the chosen
configuration and its throughput by the closed form and by the simulator. Target: well under a
second per problem (the chapter: "a fraction of a second", L3219-3223). Run from the repository
root:

    PYTHONPATH=. .venv/bin/python bench/pipedream_2bw.py
"""

from __future__ import annotations

import platform

from planner import api
from planner.schema import PipelineProblem, Plan
from solvers.pipedream_2bw import solve
from _timing import best_of  # bench/ is on sys.path when run as a script

CASES = [
    # (model, cluster, global batch, tensor parallel)
    ("gpt-1.7b", "v100:1x8", 512, 1),
    ("gpt-3.6b", "v100:8x8", 512, 1),
    ("gpt-7.5b", "a100-80gb:4x8", 512, 1),
    ("gpt-18.4b", "a100-80gb:8x8", 1024, 2),
    ("gpt3-175b", "a100-80gb:128x8", 1536, 8),
    ("pipedream:vgg16", "v100:1x4", 512, 1),
]


def _timed(problem: PipelineProblem, repeats: int = 3) -> tuple[float, Plan]:
    return best_of(lambda: solve(problem), repeats)


def main() -> None:
    print(f"machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}")
    header = (f"{'model':<16}{'cluster':<17}{'B':>5}{'t':>3}{'swept':>7}{'fit':>5}{'solve s':>9}  "
              f"{'chosen (schedule p d b m recompute)':<36}{'closed samples/s':>17}{'sim samples/s':>14}")
    print(header)
    for model, cluster, batch, t in CASES:
        kwargs = {"tensor_parallel": t} if t > 1 else {}
        problem = api.make_problem(model, cluster, global_batch_size=batch, **kwargs)
        seconds, plan = _timed(problem)
        top = plan.candidates[0]
        chosen = f"{top['schedule']} {top['p']} {top['d']} {top['b']} {top['m']} {top['recompute']}"
        fitting = sum(1 for row in plan.candidates if row["fits"])
        assert plan.predicted is not None
        print(f"{model:<16}{cluster:<17}{batch:>5}{t:>3}{len(plan.candidates):>7}{fitting:>5}{seconds:>9.3f}  "
              f"{chosen:<36}{top['samples_per_s']:>17.4g}{plan.predicted.throughput_samples_per_s:>14.4g}")


if __name__ == "__main__":
    main()
