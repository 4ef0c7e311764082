"""Solve time of the PipeDream partitioning DP (solvers.pipedream_dp) on the bundled profiles.

Prints, for every bundled PipeDream profile (msr-fiddle/pipedream), the wall time of
``solve`` (best of three, plan assembly and simulation included) on one V100 node of 4, 8 and
16 workers and on 2 nodes x 8 (a two-level topology), with the configuration chosen (replicas
per stage, input stage first); then one run of a 1,000-layer synthetic chain on 128 nodes x 8
(1,024 workers, two levels). Targets: each profile < 2 s, the synthetic chain < 30 s. Run from
the repository root:

    PYTHONPATH=. .venv/bin/python bench/pipedream.py [--quick]

``--quick`` skips the synthetic chain.
"""

from __future__ import annotations

import platform
import random
import sys

from cost_models.hardware import cluster_preset
from cost_models.profiles import list_pipedream_profiles, pipedream_profile
from planner.schema import Cluster, LayerProfile, ModelProfile, PipelineProblem, Plan
from solvers.pipedream_dp import solve
from _timing import best_of  # bench/ is on sys.path when run as a script

CLUSTERS = [("1x4", "v100:1x4"), ("1x8", "v100:1x8"), ("1x16", "v100:1x16"), ("8x2 levels", "v100:2x8")]


def _timed(problem: PipelineProblem, repeats: int) -> tuple[float, Plan]:
    return best_of(lambda: solve(problem), repeats)


def _shape(plan: Plan) -> str:
    replicas = [str(s.replicas) for s in plan.stages]
    return "-".join(replicas) if len(replicas) <= 6 else f"{len(replicas)} stages"


def synthetic_chain(num_layers: int, seed: int = 0) -> ModelProfile:
    """Random layers: 1-10 ms forward and backward, up to 40 MB of weights and 50 MB of output."""
    rng = random.Random(seed)
    layers = tuple(
        LayerProfile(name=f"l{i}", forward_s=rng.uniform(1e-3, 5e-3), backward_s=rng.uniform(2e-3, 1e-2),
                     param_bytes=rng.uniform(0, 4e7), output_bytes=rng.uniform(1e6, 5e7))
        for i in range(num_layers)
    )
    return ModelProfile(name=f"synthetic{num_layers}", layers=layers)


def main(quick: bool = False) -> None:
    print(f"machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}")
    clusters: list[tuple[str, Cluster]] = [(label, cluster_preset(spec)) for label, spec in CLUSTERS]
    header = f"{'profile':<14}{'layers':>7}" + "".join(f"{label:>24}" for label, _ in clusters)
    print(header)
    worst = 0.0
    for name in list_pipedream_profiles():
        model = pipedream_profile(name)
        cells = []
        for _, cluster in clusters:
            seconds, plan = _timed(PipelineProblem(model=model, cluster=cluster), repeats=3)
            worst = max(worst, seconds)
            cells.append(f"{seconds:8.3f} s {_shape(plan):>13}")
        print(f"{name:<14}{model.num_layers:>7}" + "".join(f"{c:>24}" for c in cells))
    print(f"slowest profile solve: {worst:.3f} s (target < 2 s)")
    if quick:
        return
    model = synthetic_chain(1000)
    seconds, plan = _timed(PipelineProblem(model=model, cluster=cluster_preset("v100:128x8")), repeats=1)
    print(f"synthetic 1000-layer chain, 128 nodes x 8 (levels 8x128): {seconds:.2f} s (target < 30 s), "
          f"{len(plan.stages)} stages")


if __name__ == "__main__":
    main(quick="--quick" in sys.argv[1:])
