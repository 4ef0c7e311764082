"""A lower bound on an offloaded pipeline's simulated iteration time, to skip configurations.

In ``cost_models.sim.offload`` every forward op F(i, j) and backward op B(n, j) of a GPU runs on
that GPU's compute stream, which executes them one at a time in program order (forward stages
ascending, then backward stages descending, microbatches ascending). F(i, 0) waits for
F(i - 1, 0) and B(n, m - 1) for B(n + 1, m - 1). So GPU g cannot start before microbatch 0 has
crossed the forward stages before its first one (``head``), then runs all its ops (``busy``), and
its last op B(n_g, m - 1) is followed by the chain B(n_g - 1, m - 1) .. B(0, m - 1) (``tail``):

    iteration >= max_g head_g + busy_g + tail_g.

Transfers, prefetch gates and optimizer steps only add to it. The sweep simulates candidates in
increasing order of this bound and stops simulating one whose bound exceeds the best simulated
time: the chosen plan is the one the full sweep picks (tests/solvers/test_offload_bound.py).
"""

from __future__ import annotations

import itertools

from cost_models import offload
from planner.errors import InfeasibleError
from planner.schema import ModelProfile

SAFETY = 1e-9
"""Relative slack for the bound's own rounding (its sums run in another order than the engine's)."""


def iteration_lower_bound(model: ModelProfile, cfg: object, num_gpus: int) -> float:
    """Lower bound on the simulated iteration time of ``cfg`` (an ``OffloadConfig``); 0 when none applies."""
    if getattr(cfg, "zero"):
        return 0.0
    g, m = num_gpus, cfg.num_microbatches  # type: ignore[attr-defined]
    try:
        forward = offload.split_layers(model, g * cfg.forward_per_gpu)  # type: ignore[attr-defined]
        backward = offload.split_backward(forward, cfg.backward_per_forward, model)  # type: ignore[attr-defined]
    except InfeasibleError:
        return 0.0  # the sweep reports the shape error
    fwd = [0.0, *itertools.accumulate(x.forward_s for x in model.layers)]
    bwd = [0.0, *itertools.accumulate(x.backward_s + offload.recompute_extra_s(x, cfg.recompute)  # type: ignore[attr-defined]
                                      for x in model.layers)]
    f = [fwd[b] - fwd[a] for a, b in forward]
    bk = [bwd[b] - bwd[a] for a, b in backward]
    rule = offload.spipe_backward_gpu if cfg.decoupled else offload.forward_gpu  # type: ignore[attr-defined]
    busy, first_f, last_b = [0.0] * g, [-1] * g, [-1] * g
    for i, t in enumerate(f):
        gpu = offload.forward_gpu(i, g)
        busy[gpu] += m * t
        first_f[gpu] = i if first_f[gpu] < 0 else first_f[gpu]
    for n, t in enumerate(bk):
        gpu = rule(n, g)
        busy[gpu] += m * t
        last_b[gpu] = n if last_b[gpu] < 0 else last_b[gpu]
    head = [0.0, *itertools.accumulate(f)]
    tail = [0.0, *itertools.accumulate(bk)]
    bound = max(head[max(first_f[x], 0)] + busy[x] + tail[max(last_b[x], 0)] for x in range(g))
    return bound * (1 - SAFETY)
