"""Mobius-style baseline: an offloaded pipeline with coupled passes and a synchronous CPU optimizer.

Mobius (as described by SPipe, seed 003 L96-127, Fig. 2): stage S_i on GPU i mod G for both its
forward and backward passes, interleaved AFAB order, parameters prefetched from CPU memory while
the previous stage computes (L101), gradients offloaded per stage, and the CPU optimizer of every
stage started only after the flush and the global overflow check (Fig. 3, L115). The solver sweeps
stages per GPU and microbatch size in the same simulator as spipe (the paper runs 2 per GPU, L287).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from planner.schema import PipelineProblem, Plan
from solvers import _spipe_common as common
from solvers.options import parse_options
from solvers.spipe import host_from


@dataclass(frozen=True, slots=True, kw_only=True)
class Options(common.HostOptions):
    stages_per_gpu: int | None = None
    """None sweeps 1..4."""
    microbatch_size: int | None = None
    prune: bool = True
    """Skip configurations whose iteration-time lower bound exceeds the best simulated (same plan);
    False simulates every one, for the full candidate table."""


def solve(problem: PipelineProblem, *, options: Mapping[str, Any] | Options | None = None) -> Plan:
    """Plan the fastest Mobius-style pipeline that fits GPU and CPU memory.

    Raises:
        InvalidProblemError: no host link bandwidth, or bad options.
        InfeasibleError: CPU memory cannot hold the model states, or no configuration fits the GPUs.
    """
    opts = parse_options(Options, options, solver="mobius")
    common.check_problem(problem, solver="mobius")
    host = host_from(problem, opts)
    stages = (opts.stages_per_gpu,) if opts.stages_per_gpu else (1, 2, 3, 4)
    sizes = (opts.microbatch_size,) if opts.microbatch_size else common.MICROBATCH_SIZES
    configs = [common.OffloadConfig(forward_per_gpu=v, backward_per_forward=1, decoupled=False, microbatch_size=b,
                                    num_microbatches=m, async_optimizer=False)
               for v, (b, m) in itertools.product(stages, common.microbatch_choices(problem, sizes))]
    return common.sweep(problem, configs, host, solver="mobius", prune=opts.prune)
