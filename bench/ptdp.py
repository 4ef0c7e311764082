"""Search time and choices of the PTD-P configuration search (solvers.ptdp) on Table 4.1's settings.

For every row of the weak-scaling table (PTD-P arXiv:2104.04473 Table 1 / dissertation Table 4.1,
restated in shared/design/ptdp-gavel-cloud.md Sec. 1.12: model, A100 count, global batch) it runs
the full search (default options) on Selene-like nodes (``a100-80gb:<GPUs / 8>``) and prints the
wall time (best of ``--repeats``), the configuration chosen beside the published (t, p), the
predicted hardware TFLOP/s per GPU (HFU accounting: recompute FLOPs counted only when the
configuration recomputes; the published figures are Eq. 4.2 = hardware FLOPs under full
recompute) beside the published one, and the model FLOPs utilization (MFU, no recompute). Target: the gpt-1t row
(3,072 GPUs) under 10 s.

A second table runs today's models (``MODERN``: the issue's plans and clusters of published size, up to
16,384 H100) through the full search over ZeRO stages, context and expert parallelism and uneven end
stages, and prints the search time (target: under 60 s at 16,384 GPUs), the chosen degrees, the
predicted iteration time, MFU and peak memory. Run from the repository root:

    PYTHONPATH=. .venv/bin/python bench/ptdp.py [--repeats N] [--modern-only]
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


MODERN = [  # label, model, cluster, global batch (sequences), sequence length or None, options
    ("llama2-7b", "llama2-7b", "h100:8", 1024, None, {}),  # 4M tokens (Llama 2 Sec. 2.2)
    ("llama3-8b 128K", "llama3-8b", "h100:64", 16, 131072, {}),
    ("mixtral-8x7b", "mixtral-8x7b", "h100:64", 256, None, {}),
    ("mixtral-8x7b ZeRO<=1", "mixtral-8x7b", "h100:64", 256, None, {"zero_stages": "0,1"}),
    ("llama3-405b p=16", "llama3-405b", "h100:16384", 2048, None, {"pipeline_parallel": 16}),  # 16M tokens
    ("llama3-405b", "llama3-405b", "h100:16384", 2048, None, {}),
    ("deepseek-v3", "deepseek-v3", "h100:2048", 15360, None, {}),  # DeepSeek-V3 Sec. 3.2: 2048 GPUs
    ("deepseek-v3 16K GPUs", "deepseek-v3", "h100:16384", 15360, None, {}),
]


def _modern(repeats: int) -> None:
    print(f"{'row':<22}{'GPUs':>6}{'search s':>9}{'configs':>8}  {'chosen t,p,c,d,e,etp,zero,v,b,recompute,schedule':<56}"
          f"{'ends':>7}{'iter s':>8}{'MFU':>6}{'GiB':>6}")
    for label, name, cluster, batch, seq, options in MODERN:
        problem = api.make_problem(name, cluster, global_batch_size=batch)
        if seq is not None:
            assert problem.transformer is not None
            cfg = problem.transformer.model_copy(update={"seq_length": seq})
            problem = api.make_problem(cfg, cluster, global_batch_size=batch)
        seconds, plan = best_of(lambda: solve(problem, options=options), repeats)  # noqa: B023
        r = plan.candidates[0]
        chosen = ",".join(str(r[k]) for k in ("t", "p", "c", "d", "e", "etp", "zero_stage", "v", "b", "recompute",
                                              "schedule"))
        ends = f"{r['first_stage_layers']}/{r['last_stage_layers']}" if r["p"] > 1 else "-"
        print(f"{label:<22}{problem.cluster.num_devices:>6}{seconds:>9.2f}{plan.notes[0].split()[1]:>8}  {chosen:<56}"
              f"{ends:>7}{r['iteration_s']:>8.2f}{100 * r['mfu']:>5.0f}%{r['peak_memory_gib']:>6.1f}")


def main(repeats: int = 1, modern_only: bool = False) -> None:
    print(f"machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}")
    if modern_only:
        _modern(repeats)
        return
    print(f"{'model':<12}{'GPUs':>6}{'B':>6}{'search s':>10}{'configs':>9}  {'chosen t,p,d,v,b,recompute,ZeRO':<33}"
          f"{'published t,p,d':>16}{'HW TF/s':>8}{'pub.':>6}{'MFU':>6}")
    for name, gpus, batch, t, p, published in ROWS:
        seconds, plan = _timed(name, gpus, batch, repeats)
        row = plan.candidates[0]
        searched = plan.notes[0].split()[1]
        chosen = f"{row['t']},{row['p']},{row['d']},{row['v']},{row['b']},{row['recompute']},z{row['zero_stage']}"
        pub = f"{t},{p},{gpus // (t * p)}"
        print(f"{name:<12}{gpus:>6}{batch:>6}{seconds:>10.2f}{searched:>9}  {chosen:<33}{pub:>16}"
              f"{row['hardware_tflops_per_gpu']:>8.1f}{published:>6}{100 * row['mfu']:>5.0f}%")
    print()
    _modern(repeats)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--modern-only", action="store_true")
    args = parser.parse_args()
    main(args.repeats, args.modern_only)
