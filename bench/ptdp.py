"""Search time and choices of the PTD-P configuration search (solvers.ptdp) on Table 4.1's settings.

For every row of the weak-scaling table (PTD-P arXiv:2104.04473 Table 1 / dissertation Table 4.1,
restated in shared/design/ptdp-gavel-cloud.md Sec. 1.12: model, A100 count, global batch) it runs
the full search (default options) on Selene-like nodes (``a100-80gb:<GPUs / 8>``) and prints the
wall time (best of ``--repeats``), the configuration chosen beside the published (t, p), the
predicted hardware TFLOP/s per GPU (HFU accounting: recompute FLOPs counted only when the
configuration recomputes; the published figures are Eq. 4.2 = hardware FLOPs under full
recompute) beside the published one, and the model FLOPs utilization (MFU, no recompute). Target: the gpt-1t row
(3,072 GPUs) under 10 s. Run from the repository root:

    PYTHONPATH=. .venv/bin/python bench/ptdp.py [--repeats N]
"""

from __future__ import annotations

import argparse
import platform

from planner import api
from planner.schema import Plan
from solvers.ptdp import solve
from _timing import best_of  # bench/ is on sys.path when run as a script

ROWS = [  # model, GPUs, batch, published t, p, TFLOP/s per GPU
    ("gpt-1.7b", 32, 512, 1, 1, 137), ("gpt-3.6b", 64, 512, 2, 1, 138), ("gpt-7.5b", 128, 512, 4, 1, 142),
    ("gpt-18.4b", 256, 1024, 8, 1, 135), ("gpt-39.1b", 512, 1536, 8, 2, 138),
    ("gpt-76.1b", 1024, 1792, 8, 4, 140), ("gpt-145.6b", 1536, 2304, 8, 8, 148),
    ("gpt-310.1b", 1920, 2160, 8, 16, 155), ("gpt-529.6b", 2520, 2520, 8, 35, 163),
    ("gpt-1t", 3072, 3072, 8, 64, 163),
]


def _timed(name: str, gpus: int, batch: int, repeats: int) -> tuple[float, Plan]:
    problem = api.make_problem(name, f"a100-80gb:{gpus}", global_batch_size=batch)
    return best_of(lambda: solve(problem), repeats)


def main(repeats: int = 1) -> None:
    print(f"machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}")
    print(f"{'model':<12}{'GPUs':>6}{'B':>6}{'search s':>10}{'configs':>9}  {'chosen t,p,d,v,b,recompute':<30}"
          f"{'published t,p,d':>16}{'HW TF/s':>8}{'pub.':>6}{'MFU':>6}")
    for name, gpus, batch, t, p, published in ROWS:
        seconds, plan = _timed(name, gpus, batch, repeats)
        row = plan.candidates[0]
        searched = plan.notes[0].split()[1]
        chosen = f"{row['t']},{row['p']},{row['d']},{row['v']},{row['b']},{row['recompute']}"
        pub = f"{t},{p},{gpus // (t * p)}"
        print(f"{name:<12}{gpus:>6}{batch:>6}{seconds:>10.2f}{searched:>9}  {chosen:<30}{pub:>16}"
              f"{row['hardware_tflops_per_gpu']:>8.1f}{published:>6}{100 * row['mfu']:>5.0f}%")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    main(parser.parse_args().repeats)
