"""A lower bound on an offloaded pipeline's simulated iteration time, to skip configurations.

In ``cost_models.sim.offload`` every forward op F(i, j) and backward op B(n, j) of a GPU runs on
that GPU's compute stream, which executes them one at a time in program order (forward stages
ascending, then backward stages descending, microbatches ascending). F(i, 0) waits for
F(i - 1, 0) and B(n, m - 1) for B(n + 1, m - 1). So GPU g cannot start before microbatch 0 has
crossed the forward stages before its first one (``head``), then runs all its ops (``busy``), and
its last op B(n_g, m - 1) is followed by the chain B(n_g - 1, m - 1) .. B(0, m - 1) (``tail``):

    iteration >= max_g head_g + busy_g + tail_g.

Given the cluster and host, the chains carry their transfers too: F(i, 0) also waits for the
activation copy from F(i - 1, 0)'s GPU and B(n, m - 1) for the gradient copy from B(n + 1, m - 1)'s
(latency + bytes / bandwidth when the GPUs differ, each a chain link of its own), and the iteration
ends no earlier than B(0, m - 1), then the copy of backward stage 0's fp16 gradients to the host,
then its CPU optimizer step (``tail``'s last two terms). Link and CPU contention only add to it.
The sweep simulates candidates in increasing order of this bound and stops simulating one whose
bound exceeds the best simulated time: the chosen plan is the one the full sweep picks
(tests/solvers/test_offload_bound.py).
"""

from __future__ import annotations

import itertools

from cost_models import offload
from planner.errors import InfeasibleError
from planner.schema import Cluster, ModelProfile

SAFETY = 1e-9
"""Relative slack for the bound's own rounding (its sums run in another order than the engine's)."""


def iteration_lower_bound(model: ModelProfile, cfg: object, num_gpus: int, cluster: Cluster | None = None,
                          host: offload.HostSpec | None = None) -> float:
    """Lower bound on the simulated iteration time of ``cfg`` (an ``OffloadConfig``); 0 when none applies.
    Without ``cluster`` and ``host``: compute only (no transfers, no optimizer step)."""
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
    hop_f, hop_b, end = [0.0] * len(f), [0.0] * len(bk), 0.0
    if cluster is not None and host is not None:
        hop_f = [_copy_s(cluster, offload.forward_gpu(i - 1, g), offload.forward_gpu(i, g),
                         model.layers[forward[i][0] - 1].output_bytes) if i else 0.0 for i in range(len(f))]
        hop_b = [_copy_s(cluster, rule(n + 1, g), rule(n, g), model.layers[backward[n][1] - 1].output_bytes)
                 if n + 1 < len(bk) else 0.0 for n in range(len(bk))]
        params = offload.range_num_params(model, backward[0])
        end = (offload.transfer_time_s(offload.GPU_PARAM_BYTES_PER_PARAM * params, host)
               + offload.optimizer_step_time_s(params, host))
    head = [0.0, *itertools.accumulate(a + h for a, h in zip(f, hop_f))]  # F(i, 0) starts after head[i] + hop_f[i]
    tail = [0.0, *itertools.accumulate(b + h for b, h in zip(bk, hop_b))]  # B(n, m-1) ends tail[n] before B(0) ends
    bound = max(head[max(first_f[x], 0)] + hop_f[max(first_f[x], 0)] + busy[x] + tail[max(last_b[x], 0)]
                for x in range(g))
    return (bound + end) * (1 - SAFETY)


def _copy_s(cluster: Cluster, src: int, dst: int, num_bytes: float) -> float:
    """A GPU-to-GPU copy on an idle link (none within a GPU)."""
    if src == dst:
        return 0.0
    bandwidth, latency = cluster.link(src, dst)
    return latency + num_bytes / bandwidth
