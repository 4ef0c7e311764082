"""Speed of the one simulator (cost_models.simulate) on large pipelines, old against new.

Prints schedule, p, v, m, number of actions and the best of five wall times of building the
schedule's action lists and running ``simulate_costs`` on them (as ``simulate(plan)`` runs a
built-in schedule, no structural validation; nothing is reused between calls), the best CPU
time of those five, and the wall time of the first call, plus ``simulate(plan)`` of the
README's plan (ptdp on gpt3-175b, 16 nodes of 8 A100, global batch 1536; its shape is the one
ptdp chooses today), which includes building the action lists. Both build the full SimResult (bubbles,
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
    ("flush", 64, 1, 512),
    ("zb-h1", 64, 1, 512),
    ("zb-h2", 64, 1, 512),
    ("interleaved-1f1b", 64, 2, 512),
    ("interleaved-1f1b", 32, 4, 256),
    ("2bw", 64, 1, 512),
    ("readme-plan", 0, 0, 0),
    ("ptdp-search-16k", 0, 0, 0),
]


def _best_of_5(run: Callable[[], object]) -> float:
    """Best of five wall times after a first call (``FIRST`` keeps the first call's wall time and
    ``CPU`` the best CPU time of the process, which a loaded machine disturbs less)."""
    start = time.perf_counter()
    run()
    FIRST.append(time.perf_counter() - start)
    best, cpu = float("inf"), float("inf")
    for _ in range(5):
        start, start_cpu = time.perf_counter(), time.process_time()
        run()
        best = min(best, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - start_cpu)
    CPU.append(cpu)
    return best


FIRST: list[float] = []
"""Wall time of the first call of each case (action lists and topology built cold)."""
CPU: list[float] = []


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
        shape = plan.degrees.pipeline * plan.degrees.virtual * plan.num_microbatches
        return 2 * shape, _best_of_5(lambda: simulate(plan, include_events=False))
    costs = PipelineCosts.uniform(
        num_stages=p, num_chunks=v, forward_s=1.0 / v, backward_s=2.0 / v, backward_weight_s=0.5 / v,
        recompute_s=0.1 / v, activation_bytes=1.0, send_s=0.01, static_bytes=1.0, allreduce_s=0.5,
    )
    if name == "2bw":
        return 3 * 2 * p * m, _best_of_5(lambda: simulate_2bw(costs, num_microbatches=m, include_events=False))

    def cold_then_warm() -> None:
        actions = build_actions(name, num_stages=p, num_chunks=v, num_microbatches=m)
        simulate_costs(costs, actions, num_microbatches=m, validate=False, include_events=False)

    return 2 * p * v * m * (3 if name.startswith("zb") else 2) // 2, _best_of_5(cold_then_warm)


def _readme_plan(path: Path) -> None:
    from planner import api

    problem = api.make_problem("gpt3-175b", "a100-80gb:128", global_batch_size=1536)
    plan = api.plan(problem, solver="ptdp")
    path.write_text(plan.model_dump_json(exclude={"offload"}))  # readable by revisions before Plan.offload


def _baseline(directory: str, case: tuple[str, int, int, int], plan_path: str) -> tuple[float, float]:
    env = dict(os.environ, PYTHONPATH=directory)
    out = subprocess.run(
        [sys.executable, __file__, "--one", json.dumps([*case, plan_path])],
        env=env, cwd=directory, capture_output=True, text=True, check=True,
    )
    _, wall, cpu = json.loads(out.stdout.strip().splitlines()[-1])
    return float(wall), float(cpu)


def main() -> None:
    """Print the benchmark table (Markdown)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", help="directory of an older checkout to time side by side")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        name, p, v, m, plan_path = json.loads(args.one)
        num_actions, wall = time_case(name, p, v, m, plan_path)
        print(json.dumps([num_actions, wall, CPU[-1] if CPU and name != "ptdp-search-16k" else wall]))
        return
    with tempfile.TemporaryDirectory() as tmp:
        plan_path = str(Path(tmp) / "readme-plan.json")
        _readme_plan(Path(plan_path))
        head = "| case | p | v | m | actions | seconds (best of 5) | CPU seconds | first call |" + (" seconds, baseline | speed-up | CPU seconds, baseline | CPU speed-up |" if args.baseline else "")
        print(head)
        print("|---" * (head.count("|") - 1) + "|")
        for case in CASES:
            old = _baseline(args.baseline, case, plan_path) if args.baseline else None
            num_actions, new = time_case(*case, plan_path)
            new_cpu = CPU[-1] if CPU and case[0] != "ptdp-search-16k" else new
            extra = (f" {old[0]:.3f} | {old[0] / new:.2f}x | {old[1]:.3f} | {old[1] / new_cpu:.2f}x |"
                     if old is not None else "")
            shape = " | ".join(str(x) if x else "-" for x in (*case[1:], num_actions))
            cold = case[0] != "ptdp-search-16k"
            first, cpu = (f"{FIRST[-1]:.3f}", f"{CPU[-1]:.3f}") if cold else ("-", "-")
            print(f"| {case[0]} | {shape} | {new:.3f} | {cpu} | {first} |{extra}")


if __name__ == "__main__":
    main()
