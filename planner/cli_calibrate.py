"""CLI sub-command ``calibrate``: fit a device's compute constants on this machine.

Runs GEMM, copy and attention microbenchmarks with torch (``runtime_bridge.calibrate``; torch is
imported only in the handler), fits ``gemm_max_fraction``, ``gemm_k_overhead``,
``memory_bandwidth_fraction`` and the attention kernel's share of peak (family ``measured``;
``cost_models.calibration``) and writes a cluster file: the preset cluster with the calibrated
device, which every solver accepts (``--cluster FILE``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from planner import cli_types as T

__all__ = ["add_parsers"]

MAX_REPEATS = 100


def add_parsers(sub: Any) -> None:
    """Add ``calibrate`` to the ``paraplan`` sub-command parser."""
    c = sub.add_parser("calibrate", help="fit the compute model's device constants with GEMM/copy/attention microbenchmarks")
    c.add_argument("--cluster", required=True, help="cluster preset whose device this machine has (e.g. a100-80gb:1 for one GPU, cpu:2)")
    c.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="torch device to measure on")
    c.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], help="GEMM precision (default: bf16 on cuda, fp32 on cpu)")
    c.add_argument("--quick", action="store_true", help="small shapes only (seconds; for tests and smoke runs)")
    c.add_argument("--repeats", type=T.count(MAX_REPEATS, "timed runs per shape; 5 to 20 are plenty"), default=5,
                   help=f"timed runs per shape, 1 to {MAX_REPEATS} (default 5)")
    c.add_argument("-o", "--output", help="write the calibrated cluster JSON here (default: stdout)")
    c.set_defaults(handler=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from cost_models import calibration
    from planner import api
    from planner.errors import InvalidProblemError
    from planner.schema_io import check_output_path

    check_output_path(args.output, flag="-o")
    cluster = api.load_cluster(args.cluster)
    from planner.report import expansion_line

    print(expansion_line(args.cluster, cluster), file=sys.stderr)
    if cluster.device is None:
        raise InvalidProblemError(f"--cluster {args.cluster!r} has no device to calibrate")
    from runtime_bridge import calibrate as bench

    bench.check_device(args.device)

    dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    shapes = bench.QUICK_GEMM_SHAPES if args.quick else bench.DEFAULT_GEMM_SHAPES
    from planner.progress import progress

    with progress(f"measuring {len(shapes)} GEMM shapes and memory copies on {args.device}"):
        gemms = bench.measure_gemms(shapes, device=args.device, dtype=dtype, repeats=args.repeats)
        copies = bench.measure_copies((1 << 20, 1 << 22) if args.quick else (1 << 24, 1 << 26, 1 << 28),
                                      device=args.device, repeats=args.repeats)
        attention = bench.measure_attention(bench.QUICK_ATTENTION_SHAPES if args.quick
                                            else bench.DEFAULT_ATTENTION_SHAPES,
                                            device=args.device, dtype=dtype, repeats=args.repeats)
        host = bench.measure_host_copies((1 << 22,) if args.quick else (1 << 26, 1 << 28), device=args.device,
                                         repeats=args.repeats)
    device, error = calibration.fit_gemm_constants(gemms, cluster.device)
    device = calibration.fit_memory_fraction(copies, device)
    device = calibration.fit_attention_fraction(attention, device)
    device = calibration.fit_host_link(host, device)
    assert device.compute is not None
    print(f"GEMMs: {len(gemms)} shapes, fit RMS error {100 * error:.1f}% (log); gemm_max_fraction "
          f"{device.compute.gemm_max_fraction:.3f}, gemm_k_overhead {device.compute.gemm_k_overhead:g}, "
          f"peak {device.peak_flops / 1e12:.3g} TFLOP/s; memory_bandwidth_fraction "
          f"{device.compute.memory_bandwidth_fraction:.3f}; attention (causal SDPA forward + backward, "
          f"{len(attention)} shapes) at {device.compute.attention_fractions[calibration.MEASURED_ATTENTION]:.3f} "
          f"of peak, kernel family {calibration.MEASURED_ATTENTION!r}", file=sys.stderr)
    if host:
        print(f"host link: pinned copies at {sum(s.num_bytes for s in host) / sum(s.seconds for s in host) / 1e9:.1f} "
              f"GB/s, host_link_bytes_per_s {device.host_link_bytes_per_s / 1e9:.1f} GB/s (activation offloading "
              f"copies at 0.8 of it)", file=sys.stderr)
    for s, err in zip(gemms, calibration.prediction_errors(gemms, device)):
        print(f"  {s.m}x{s.n}x{s.k}: measured {s.seconds * 1e3:.3f} ms, predicted {100 * err:+.1f}%", file=sys.stderr)
    T.write_or_print(cluster.model_copy(update={"device": device}).model_dump_json(indent=2), args.output,
                     hint=f" (use it as --cluster {args.output})")
    return 0
