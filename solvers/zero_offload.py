"""ZeRO-Offload-style baseline: data parallelism with parameters, gradients and optimizer on the CPU.

The DeepSpeed baseline of SPipe (seed 003 L279-299: "ZeRO-3 parallelism with offloading support")
as one data-parallel replica per GPU. For every microbatch each layer's fp16 parameters come
from the host (1/G per GPU) and are all-gathered; after the last microbatch each layer's gradients
are reduce-scattered and 1/G is offloaded; the CPU Adam step of each node's partition runs after
all gradients arrived (synchronous overflow check, Fig. 3). The collectives are charged to the host
link, which is what the paper blames for DeepSpeed's slowdown (PCIe congestion, L299).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from planner.schema import PipelineProblem, Plan
from solvers import _spipe_common as common
from solvers.options import parse_options
from solvers.spipe import host_from


@dataclass(frozen=True, slots=True, kw_only=True)
class Options(common.HostOptions):
    microbatch_size: int | None = None


def solve(problem: PipelineProblem, *, options: Mapping[str, Any] | Options | None = None) -> Plan:
    """Plan the fastest ZeRO-Offload-style data-parallel run that fits memory.

    Raises:
        InvalidProblemError: no host link bandwidth, or bad options.
        InfeasibleError: CPU memory too small, or the global batch cannot give every GPU a microbatch.
    """
    opts = parse_options(Options, options, solver="zero-offload")
    common.check_problem(problem, solver="zero-offload")
    host = host_from(problem, opts)
    sizes = (opts.microbatch_size,) if opts.microbatch_size else common.MICROBATCH_SIZES
    g = problem.cluster.num_devices
    configs = [common.OffloadConfig(forward_per_gpu=1, backward_per_forward=1, decoupled=False, microbatch_size=b,
                                    num_microbatches=m, async_optimizer=False, zero=True)
               for b, m in common.microbatch_choices(problem, sizes, replicas=g)]
    return common.sweep(problem, configs, host, solver="zero-offload")
