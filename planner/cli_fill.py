"""CLI sub-command ``fill`` (architecture.md CLI contract): PipeFill over ``solvers.fill``.

``paraplan fill PLAN.json --fill-jobs F [--policy P] [-o fill.json] [--json]`` fills one plan's
bubbles; ``paraplan fill --scale [--gpus 1024,2048,...] [--plot out.png]`` runs the paper's
40B main job on 1K-16K GPUs with a stream of fill jobs (docs/pipefill.md).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from planner import cli_types as T

__all__ = ["add_parsers"]


def add_parsers(sub: Any) -> None:
    """Add ``fill`` to the ``paraplan`` sub-command parser."""
    f = sub.add_parser("fill", help="fill a plan's pipeline bubbles with other jobs (PipeFill)")
    f.add_argument("plan", nargs="?", help="plan JSON (not with --scale)")
    f.add_argument("--fill-jobs", help="preset (bert-large-inference), name:count,..., a mix (paper-mix) or JSON")
    f.add_argument("--policy", default="sjf", choices=["sjf", "makespan", "fifo"], help="scheduler score (default sjf)")
    f.add_argument("--fill-fraction", type=T.fraction, default=0.68, help="share of each bubble to fill (paper 0.68)")
    f.add_argument("--free-memory-gb", type=T.positive_float(), help="fixed free memory per bubble (paper 4.5); default: simulated")
    f.add_argument("--fill-efficiency", type=T.fraction, help="fraction of peak FLOP/s fill kernels reach (default 0.5)")
    f.add_argument("--scale", action="store_true", help="the paper's 40B job on 1K-16K GPUs with a job stream")
    f.add_argument("--gpus", help="cluster sizes of --scale (default 1024,2048,4096,8192,16384)")
    f.add_argument("--horizon-h", type=T.positive_float(8760.0, "one year of simulated time"),
                   help="simulated hours of --scale (default 12)")
    f.add_argument("--seed", type=T.SEED, default=0, help="random seed, 0 to 2^32-1")
    f.add_argument("--plot", help="--scale: draw utilization against cluster size to a .png/.svg")
    f.add_argument("-o", "--output", help="write the JSON result here")
    f.add_argument("--json", action="store_true")
    f.set_defaults(handler=cmd_fill)


def _fill_options(args: argparse.Namespace, *, scale: bool) -> Any:
    from planner import api

    return api.fill_options(policy=args.policy, fill_fraction=args.fill_fraction,
                            free_memory_bytes=args.free_memory_gb * 1e9 if args.free_memory_gb else None,
                            efficiency=args.fill_efficiency, paper_memory=scale)


def cmd_fill(args: argparse.Namespace) -> int:
    from planner import api
    from planner.errors import InvalidProblemError
    from planner.schema_io import check_output_path

    check_output_path(args.output, flag="-o")
    check_output_path(args.plot, flag="--plot")
    if args.scale:
        if args.plan:
            raise InvalidProblemError(f"--scale runs the paper's own main job; drop the plan {args.plan!r} (or --scale)")
        return _cmd_scale(args)
    given = [flag for flag, value in (("--gpus", args.gpus), ("--horizon-h", args.horizon_h), ("--plot", args.plot))
             if value is not None]
    if given:
        raise InvalidProblemError(f"{', '.join(given)} apply to --scale only; add --scale or drop them")
    if not args.plan or not args.fill_jobs:
        raise InvalidProblemError("paraplan fill needs PLAN.json and --fill-jobs F (or --scale)")
    from planner.progress import progress

    from planner.report import plan_devices

    plan, jobs = api.load_plan(args.plan), api.fill_jobs(args.fill_jobs)
    with progress(f"filling the bubbles of {plan_devices(plan)} GPUs with {len(jobs)} jobs"):
        result = api.fill(plan, jobs, _fill_options(args, scale=False))
    _emit(args, result, _fill_table(result, plan_devices(plan)))
    return 0


def _cmd_scale(args: argparse.Namespace) -> int:
    from planner import api
    from planner.errors import InvalidProblemError

    args.gpus = args.gpus or "1024,2048,4096,8192,16384"
    args.horizon_h = args.horizon_h or 12.0
    try:
        gpus = tuple(int(x) for x in args.gpus.split(",") if x.strip())
    except ValueError:
        raise InvalidProblemError(f"--gpus {args.gpus!r} must be comma-separated integers, e.g. 1024,8192") from None
    from planner.schema_io import MAX_DEVICES, bounded

    if not gpus or min(gpus) < 1:
        raise InvalidProblemError(f"--gpus {args.gpus!r} must list positive GPU counts, e.g. 1024,8192")
    bounded("--gpus", max(gpus), MAX_DEVICES, "set above the largest published training clusters")
    if args.horizon_h <= 0:
        raise InvalidProblemError(f"--horizon-h={args.horizon_h} must be positive")
    from planner.progress import progress

    with progress(f"PipeFill scale sweep over {len(gpus)} cluster sizes", total=len(gpus)) as ticker:
        result = api.fill_scale(num_gpus=gpus, jobs=args.fill_jobs or "paper-mix", horizon_s=args.horizon_h * 3600,
                                seed=args.seed, options=_fill_options(args, scale=True), on_point=ticker.advance)
    if args.plot:
        plot_scale(result, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    _emit(args, result, _scale_table(result))
    return 0


def _emit(args: argparse.Namespace, result: Any, table: str) -> None:
    if args.output:
        from planner import api

        api.save(result, args.output)
        print(f"wrote {args.output}", file=sys.stderr)
    print(result.model_dump_json(indent=2) if args.json else table)


def _fill_table(r: Any, plan_gpus: int) -> str:
    gpus = (f"{plan_gpus} GPUs" if plan_gpus == r.num_devices else
            f"{plan_gpus} GPUs (one pipeline replica of {r.num_devices} simulated; the other replicas fill alike)")
    lines = [f"iteration {r.iteration_time_s:.4g} s, bubble fraction {r.bubble_fraction:.3f}, {gpus}",
             f"{len(r.assignments)} fill jobs, makespan {r.makespan_s:.4g} s, mean JCT {r.mean_completion_time_s:.4g} s",
             f"main {r.main_flops_per_device_s / 1e12:.3g} TFLOP/s/GPU, fill {r.fill_flops_per_device_s / 1e12:.3g} "
             f"TFLOP/s/GPU: recovered utilization {100 * r.recovered_utilization:.1f}%, "
             f"main-job slowdown {100 * r.main_job_slowdown:.2f}% (filled iteration on the engine "
             f"{r.filled_iteration_time_s or r.iteration_time_s:.4g} s)",
             "job                          stage  batch ckpt offload  k   n  samples/s"]
    for e in r.executor_plans:
        lines.append(f"{e.job_id:28s} {e.stage:5d} {e.batch_size:6d} {e.checkpointing!s:5s} {e.offload!s:7s}"
                     f"{e.num_iterations:4d} {e.num_cycles:3d} {e.throughput_samples_per_s:10.4g}")
    return "\n".join(lines)


def _scale_table(r: Any) -> str:
    lines = [" GPUs   m  bubble (closed)  main TF/GPU  fill TF/GPU  recovered  slowdown  GPUs' worth"]
    for p in r.points:
        lines.append(f"{p.num_gpus:5d} {p.num_microbatches:3d}  {p.bubble_fraction:.3f} ({p.closed_form_bubble_fraction:.3f})"
                     f"  {p.main_tflops_per_gpu:11.3g}  {p.fill_tflops_per_gpu:11.3g}  {100 * p.recovered_utilization:8.1f}%"
                     f"  {100 * p.main_job_slowdown:7.2f}%  {p.gpus_worth_of_fill:11.0f}")
    return "\n".join(lines)


def plot_scale(result: Any, path: str) -> None:
    """Utilization (main, main + fill) per GPU against cluster size, beside the paper's numbers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from solvers.fill.scale import PAPER_RESULTS

    gpus = [p.num_gpus for p in result.points]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(gpus, [p.main_tflops_per_gpu for p in result.points], "o-", label="main job")
    ax.plot(gpus, [p.main_tflops_per_gpu + p.fill_tflops_per_gpu for p in result.points], "s-", label="main + fill")
    ax2 = ax.twinx()
    ax2.plot(gpus, [100 * p.recovered_utilization for p in result.points], "^--", color="tab:green",
             label="recovered (%)")
    ax2.plot(list(PAPER_RESULTS), [100 * v[0] for v in PAPER_RESULTS.values()], "x", color="tab:red",
             label="paper, mix (%)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("TFLOP/s per GPU")
    ax2.set_ylabel("utilization increase (%)")
    ax.set_title(f"PipeFill, 40B main job, {result.jobs}")
    fig.legend(loc="upper center", fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
