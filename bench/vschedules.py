"""The V schedules against Megatron's in the ptdp search: the best plan per schedule, simulated.

For a few models and clusters, runs ``ptdp`` once per schedule (option ``schedules`` set to that
one schedule) and prints a Markdown table: the chosen degrees, microbatches, the simulated
iteration time, its ratio to the best 1F1B-family plan, the bubble fraction and the peak memory
per device. The numbers are predictions of the one simulator (no GPU is run). Run from the
repository root:

    PYTHONPATH=. .venv/bin/python bench/vschedules.py
"""

from __future__ import annotations

import time

CASES = [
    ("gpt3-175b", "a100-80gb:96", 384),
    ("gpt3-175b", "a100-80gb:128", 1536),
    ("llama3-70b", "h100:8x8", 512),
    ("gpt-1t", "a100-80gb:16384", 16384),
]
SCHEDULES = ("1f1b", "interleaved-1f1b", "zb-v", "dualpipe-v")


def main() -> None:
    from planner import api
    from planner.errors import InfeasibleError
    from solvers import ptdp

    print("| model | cluster | batch | schedule | t x p x d, v | m | iteration (s) | vs best Megatron | bubble | "
          "peak GiB | search (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for model, cluster, batch in CASES:
        problem = api.make_problem(model, cluster, global_batch_size=batch)
        rows, megatron = [], None
        for schedule in SCHEDULES:
            start = time.perf_counter()
            try:
                plan = ptdp.solve(problem, options={"schedules": schedule, "zero_stages": "0,1"})
            except InfeasibleError:
                rows.append((schedule, None, time.perf_counter() - start))
                continue
            rows.append((schedule, plan, time.perf_counter() - start))
            assert plan.predicted is not None
            if schedule in ("1f1b", "interleaved-1f1b"):
                t = plan.predicted.iteration_time_s
                megatron = t if megatron is None else min(megatron, t)
        for schedule, plan, seconds in rows:
            if plan is None or plan.predicted is None:
                print(f"| {model} | {cluster} | {batch} | {schedule} | no plan fits | | | | | | {seconds:.1f} |")
                continue
            d, pred = plan.degrees, plan.predicted
            ratio = f"{pred.iteration_time_s / megatron:.3f}" if megatron else ""
            print(f"| {model} | {cluster} | {batch} | {schedule} | {d.tensor} x {d.pipeline} x {d.data}, {d.virtual} | "
                  f"{plan.num_microbatches} | {pred.iteration_time_s:.2f} | {ratio} | {pred.bubble_fraction:.3f} | "
                  f"{max(pred.peak_memory_bytes) / 2**30:.1f} | {seconds:.1f} |")


if __name__ == "__main__":
    main()
