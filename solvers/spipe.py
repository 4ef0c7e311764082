"""SPipe planner: hybrid GPU/CPU pipelines for models whose states exceed GPU memory (seed 003).

SPipe (Ryu et al.; reading shared/design/stage-ilp-spipe-bpipe.md Part B) keeps parameters,
gradients and Adam states in CPU memory, streams each stage's parameters to the GPU that runs
it, runs forward and backward passes of a stage on different GPUs (decoupled pass assignment,
L168-174), cuts every forward stage into d backward stages (Eq. 1, L176-182) placed by the rule
forward i -> GPU i mod G, backward n = d i + k -> GPU (G - 1 - n) mod G (reading B.3), and steps
each stage's optimizer on the CPU as soon as its gradients arrive (L206-212). The paper picks
its configuration by hand (2 forward and 6 backward stages per GPU, L279); this solver sweeps
forward stages per GPU, backward stages per forward stage, microbatch size and count, simulates
every candidate with ``cost_models.sim.offload`` and keeps the fastest that fits GPU and CPU
memory. Recompute is full and per layer: the decoupled mode requires it (artifact arguments.py,
reading B.3), so it is not a sweep dimension.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cost_models import offload
from planner.errors import InvalidProblemError
from planner.schema import PipelineProblem, Plan
from solvers import _spipe_common as common
from solvers.options import parse_options


@dataclass(frozen=True, slots=True, kw_only=True)
class Options(common.HostOptions):
    forward_per_gpu: int | None = None
    """Forward stages per GPU; None sweeps 1..4."""
    backward_per_gpu: int | None = None
    """Backward stages per GPU (a multiple of forward_per_gpu); None sweeps d = 1..4 per forward stage."""
    microbatch_size: int | None = None
    """None sweeps 1, 2, 4, 8 (only the profile's own size for a measured profile)."""
    async_optimizer: bool = True
    prune: bool = True
    """Skip configurations whose iteration-time lower bound exceeds the best simulated (same plan);
    False simulates every one, for the full candidate table."""


def host_from(problem: PipelineProblem, opts: Any) -> offload.HostSpec:
    """The host spec: the cluster's link bandwidth and the defaults, overridden by the options."""
    keys = ("host_link_bytes_per_s", "gpus_per_host_link", "cpu_optimizer_params_per_s", "cpu_memory_bytes", "pinned",
            "peer_over_host_link")
    given = {k: getattr(opts, k) for k in keys if getattr(opts, k) is not None}
    return offload.host_spec(problem.cluster, {"host": given})


def _grid(problem: PipelineProblem, opts: Options) -> list[common.OffloadConfig]:
    fwd = (opts.forward_per_gpu,) if opts.forward_per_gpu else (1, 2, 3, 4)
    if opts.backward_per_gpu is not None:
        if any(opts.backward_per_gpu % v for v in fwd):
            raise InvalidProblemError(
                f"backward_per_gpu={opts.backward_per_gpu} must be a multiple of forward_per_gpu={fwd[0]} "
                "(each forward stage splits into d backward stages, [spipe] Eq. 1)"
            )
    sizes = (opts.microbatch_size,) if opts.microbatch_size else common.MICROBATCH_SIZES
    out = []
    for v, (b, m) in itertools.product(fwd, common.microbatch_choices(problem, sizes)):
        ds = (opts.backward_per_gpu // v,) if opts.backward_per_gpu else (1, 2, 3, 4)
        out.extend(common.OffloadConfig(forward_per_gpu=v, backward_per_forward=d, decoupled=True,
                                        microbatch_size=b, num_microbatches=m,
                                        async_optimizer=opts.async_optimizer) for d in ds)
    return out


def solve(problem: PipelineProblem, *, options: Mapping[str, Any] | Options | None = None) -> Plan:
    """Plan an SPipe pipeline: the fastest simulated configuration that fits GPU and CPU memory.

    Raises:
        InvalidProblemError: no host link bandwidth, or inconsistent options.
        InfeasibleError: CPU memory cannot hold the model states, or no configuration fits the GPUs.
    """
    opts = parse_options(Options, options, solver="spipe")
    common.check_problem(problem, solver="spipe")
    host = host_from(problem, opts)
    return common.sweep(problem, _grid(problem, opts), host, solver="spipe", prune=opts.prune)
