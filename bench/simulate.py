"""Speed of the one schedule simulator (cost_models.simulate) on large pipelines.

Prints schedule, p, v, m, number of actions and the best of three wall times of
``simulate_costs`` with the action lists built beforehand: as ``simulate(plan)`` runs a
built-in schedule (no structural validation), and as it runs a ``custom`` list (validated by
``schedules.validate_actions`` first). Both include the event loop and building the full
SimResult with its timeline and bubbles. The 2BW row is ``simulate_2bw`` (three batches of
1F1B, its action lists built inside). Run from the repository root:

    PYTHONPATH=. .venv/bin/python bench/simulate.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

from cost_models.schedules import build_actions
from cost_models.simulate import PipelineCosts, simulate_2bw, simulate_costs

CASES = [
    ("1f1b", 64, 1, 512),
    ("gpipe", 64, 1, 512),
    ("zb-h1", 64, 1, 512),
    ("interleaved-1f1b", 32, 4, 256),
    ("2bw", 64, 1, 512),
]


def _best_of_3(run: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def _time_one(schedule: str, p: int, v: int, m: int) -> tuple[int, float, float | None]:
    costs = PipelineCosts.uniform(
        num_stages=p, num_chunks=v, forward_s=1.0 / v, backward_s=2.0 / v, backward_weight_s=0.5 / v,
        recompute_s=0.1 / v, activation_bytes=1.0, send_s=0.01, static_bytes=1.0, allreduce_s=0.5,
    )
    if schedule == "2bw":
        return 3 * 2 * p * m, _best_of_3(lambda: simulate_2bw(costs, num_microbatches=m)), None
    actions = build_actions(schedule, num_stages=p, num_chunks=v, num_microbatches=m)
    num_actions = sum(len(rank) for rank in actions)
    trusted = _best_of_3(lambda: simulate_costs(costs, actions, num_microbatches=m, validate=False))
    validated = _best_of_3(lambda: simulate_costs(costs, actions, num_microbatches=m))
    return num_actions, trusted, validated


def main() -> None:
    """Print the benchmark table (Markdown)."""
    print("| schedule | p | v | m | actions | seconds, built-in | seconds, validated as custom |")
    print("|---|---|---|---|---|---|---|")
    for schedule, p, v, m in CASES:
        num_actions, trusted, validated = _time_one(schedule, p, v, m)
        shown = "-" if validated is None else f"{validated:.3f}"
        print(f"| {schedule} | {p} | {v} | {m} | {num_actions} | {trusted:.3f} | {shown} |")


if __name__ == "__main__":
    main()
