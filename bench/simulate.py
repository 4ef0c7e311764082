"""Speed of the one simulator (cost_models.simulate) on large pipelines, old against new.

Prints schedule, p, v, m, number of actions and the best of five wall times of
``simulate_costs`` with the action lists built beforehand (as ``simulate(plan)`` runs a built-in
schedule, no structural validation), plus ``simulate(plan)`` of the README's plan (ptdp on
gpt3-175b, 16 nodes of 8 A100, global batch 1536: interleaved 1F1B, 768 microbatches x 6
chunks), which includes building the action lists. Both build the full SimResult (bubbles,
no timeline events). The 2BW row is ``simulate_2bw`` (three batches of 1F1B). The last row
is one whole ptdp search for GPT-1T on 16,384 A100s (its simulated candidates included; the
search budget is 60 s).

With ``--baseline DIR`` (a checkout of an older revision, e.g. made with
``git worktree add /tmp/paraplan-old <commit>``) every case is also timed in a subprocess
that imports the code in DIR, alternating old and new runs so that both see the same load.
Run from the repository root:

    PYTHONPATH=. .venv/bin/python bench/simulate.py [--baseline /tmp/paraplan-old]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

CASES = [
    ("1f1b", 64, 1, 512),
    ("gpipe", 64, 1, 512),
    ("zb-h1", 64, 1, 512),
    ("interleaved-1f1b", 32, 4, 256),
    ("2bw", 64, 1, 512),
    ("readme-plan", 8, 6, 768),
    ("ptdp-search-16k", 0, 0, 0),
]


def _best_of_5(run: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def time_case(name: str, p: int, v: int, m: int, plan_path: str | None) -> tuple[int, float]:
    """(actions, best-of-3 seconds) of one case with the code on sys.path."""
    from cost_models.schedules import build_actions
    from cost_models.simulate import PipelineCosts, simulate, simulate_2bw, simulate_costs
    from planner.schema import Plan

    if name == "ptdp-search-16k":
        # The whole ptdp search for GPT-1T on 16,384 A100s (it simulates its best candidates); once.
        from planner import api
        from solvers import ptdp

        problem = api.make_problem("gpt-1t", "a100-80gb:16384", global_batch_size=16384)
        start = time.perf_counter()
        ptdp.solve(problem)
        return 0, time.perf_counter() - start
    if name == "readme-plan":
        assert plan_path is not None
        plan = Plan.from_json(Path(plan_path).read_text())
        return 2 * p * v * m, _best_of_5(lambda: simulate(plan, include_events=False))
    costs = PipelineCosts.uniform(
        num_stages=p, num_chunks=v, forward_s=1.0 / v, backward_s=2.0 / v, backward_weight_s=0.5 / v,
        recompute_s=0.1 / v, activation_bytes=1.0, send_s=0.01, static_bytes=1.0, allreduce_s=0.5,
    )
    if name == "2bw":
        return 3 * 2 * p * m, _best_of_5(lambda: simulate_2bw(costs, num_microbatches=m, include_events=False))
    actions = build_actions(name, num_stages=p, num_chunks=v, num_microbatches=m)
    return sum(len(rank) for rank in actions), _best_of_5(
        lambda: simulate_costs(costs, actions, num_microbatches=m, validate=False, include_events=False))


def _readme_plan(path: Path) -> None:
    from planner import api

    problem = api.make_problem("gpt3-175b", "a100-80gb:128", global_batch_size=1536)
    plan = api.plan(problem, solver="ptdp")
    path.write_text(plan.model_dump_json(exclude={"offload"}))  # readable by revisions before Plan.offload


def _baseline(directory: str, case: tuple[str, int, int, int], plan_path: str) -> float:
    env = dict(os.environ, PYTHONPATH=directory)
    out = subprocess.run(
        [sys.executable, __file__, "--one", json.dumps([*case, plan_path])],
        env=env, cwd=directory, capture_output=True, text=True, check=True,
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])[1])


def main() -> None:
    """Print the benchmark table (Markdown)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", help="directory of an older checkout to time side by side")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        name, p, v, m, plan_path = json.loads(args.one)
        print(json.dumps(time_case(name, p, v, m, plan_path)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        plan_path = str(Path(tmp) / "readme-plan.json")
        _readme_plan(Path(plan_path))
        head = "| case | p | v | m | actions | seconds |" + (" seconds, baseline | speed-up |" if args.baseline else "")
        print(head)
        print("|---" * (head.count("|") - 1) + "|")
        for case in CASES:
            old = _baseline(args.baseline, case, plan_path) if args.baseline else None
            num_actions, new = time_case(*case, plan_path)
            extra = f" {old:.3f} | {old / new:.2f}x |" if old is not None else ""
            shape = " | ".join(str(x) if x else "-" for x in (*case[1:], num_actions))
            print(f"| {case[0]} | {shape} | {new:.3f} |{extra}")


if __name__ == "__main__":
    main()
