"""PipeFill scale benchmark: the paper's 40B main job on 1K-16K GPUs (seed 000 Sec. 6.1).

Usage::

    PYTHONPATH=. python bench/pipefill.py [--efficiencies 0.5,0.2] [--jobs paper-mix,bert-inference]
                                          [--horizon-h 12] [--plot out.png]

Prints, per fill-kernel efficiency and job mix, the utilization recovered at each cluster size
beside the paper's numbers (L7, L27, L221-223), and the wall time of each sweep.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from planner.cli_fill import _scale_table, plot_scale
from solvers.fill.scale import PAPER_RESULTS, ScaleOptions, scale_sweep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--efficiencies", default="0.5,0.2")
    parser.add_argument("--jobs", default="paper-mix,bert-inference")
    parser.add_argument("--horizon-h", type=float, default=12.0)
    parser.add_argument("--plot", help="draw the first sweep to this file")
    args = parser.parse_args()
    base = ScaleOptions(horizon_s=args.horizon_h * 3600)
    for eff in (float(x) for x in args.efficiencies.split(",")):
        for jobs in args.jobs.split(","):
            options = dataclasses.replace(base, jobs=jobs, fill=dataclasses.replace(base.fill, efficiency=eff))
            start = time.perf_counter()
            result = scale_sweep(options)
            print(f"\n== fill efficiency {eff}, jobs {jobs} ({time.perf_counter() - start:.1f} s)")
            print(_scale_table(result))
            column = 0 if jobs == "paper-mix" else 1
            print("paper: " + ", ".join(f"{n}: +{100 * v[column]:.1f}%" for n, v in PAPER_RESULTS.items()))
            if args.plot:
                plot_scale(result, args.plot)
                args.plot = None


if __name__ == "__main__":
    main()
