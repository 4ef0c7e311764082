"""Explicit data-parallel gradient reduction, after the pipeline step has produced every gradient.

torch's pipeline stage drives DDP and FSDP2 itself: it lets DDP's reducer all-reduce (and FSDP
reduce-scatter) at the last backward of each microbatch series. Zero-bubble orders (ZB-H1/H2,
ZB-V, DualPipeV, custom lists with I/W actions) split each backward into I (input gradients) and
W (weight gradients), and ``stage_backward_weight`` writes the W gradients into ``param.grad`` by
hand, outside autograd's accumulation hooks: DDP never sees them and would average incomplete
gradients. (FSDP2 instead defers its reduce-scatter to torch's ``REDUCE_GRAD`` action after the
last W, which is right for ZeRO-2; ZeRO-3 also needs ``torch_pp.unshard_before_backward``.) Expert
parallelism needs two groups (dense parameters over all replicas, experts over
the replicas that hold the same experts), which DDP's one group cannot express.

For those plans the bridge does not wrap chunks in DDP. After ``schedule.step`` (every F, I, W
and torch's ``scale_grads`` by 1/m done) ``GradSync.reduce`` sums each gradient over its group with
one flat all-reduce per group and divides by the data-parallel degree d, which is what DDP
computes (Li et al., *PyTorch Distributed: Experiences on Accelerating Data Parallel Training*,
VLDB 2020, Sec. 3: bucketed all-reduce of the averaged gradients). With ZeRO-1,
``ZeroRedundancyOptimizer`` then updates each replica's share and broadcasts it, as under DDP.

Expert parameters on an expert-parallel rank already hold the contributions of every token that
was routed to them from the ``e`` replicas of its expert-parallel group (the all-to-all's
backward brings them); they are summed over the expert-data-parallel group (the d / e replicas
holding the same experts) and divided by d as well: every token's loss carries weight 1 / (d m)
(Megatron-LM's expert-data-parallel gradient reduction; Lepikhin et al., *GShard*, ICLR 2021).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from planner.schema import Plan
from runtime_bridge.validate import splits_backward

__all__ = ["ExpertGradScale", "GradSync", "needs_explicit_sync", "splits_backward"]


def needs_explicit_sync(plan: Plan) -> bool:
    """Data parallelism whose gradients the bridge reduces itself instead of DDP (replicated
    parameters, ZeRO 0 and 1): zero-bubble orders, expert or context parallelism (whose ranks
    reduce over the d c ranks of a stage, dividing by d c)."""
    d = plan.degrees
    if d.data * d.context == 1 or plan.zero_stage not in (0, 1):
        return False
    return d.expert > 1 or d.context > 1 or splits_backward(plan)


def _is_expert(name: str) -> bool:
    return ".experts." in f".{name}"


class GradSync:
    """Sum-and-average of the chunks' gradients over the data-parallel group (and the
    expert-data-parallel group for expert-parallel experts).

    Args:
        dp_group: the data (x context) ranks of this rank's stage and tensor rank.
        num_replicas: their number, d (d c with context parallelism): the divisor.
        expert_parallel: experts are split over ranks (else they are dense parameters, reduced
            over ``dp_group``).
        expert_group: the replicas that hold this rank's experts (None when there is one: d = e).
    """

    def __init__(self, dp_group: Any, num_replicas: int, *, expert_parallel: bool = False, expert_group: Any = None
                 ) -> None:
        self.dp_group, self.num_replicas = dp_group, num_replicas
        self.expert_parallel, self.expert_group = expert_parallel, expert_group

    def reduce(self, modules: Sequence[nn.Module]) -> None:
        """All-reduce (sum) then divide by d every gradient of ``modules``; collective over the groups."""
        dense, experts = [], []
        for module in modules:
            for name, param in module.named_parameters():
                if param.grad is None:
                    continue
                local = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
                (experts if self.expert_parallel and _is_expert(name) else dense).append(local)
        _flat_all_reduce(dense, self.dp_group, 1.0 / self.num_replicas)
        _flat_all_reduce(experts, self.expert_group, 1.0 / self.num_replicas)


class ExpertGradScale:
    """Expert parallelism under FSDP2 (ZeRO 2, 3): FSDP2 averaged the experts' gradients over the
    d c / e ranks holding them; multiply by 1 / e so they carry 1 / (d c) like the dense ones."""

    def __init__(self, num_expert_parallel: int) -> None:
        self.scale = 1.0 / num_expert_parallel

    def reduce(self, modules: Sequence[nn.Module]) -> None:
        for module in modules:
            for name, param in module.named_parameters():
                if param.grad is not None and _is_expert(name):
                    (param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad).mul_(self.scale)


def _flat_all_reduce(grads: Iterable[torch.Tensor], group: Any, scale: float) -> None:
    """One all-reduce of the concatenated gradients (a single bucket), scaled, copied back in place."""
    grads = list(grads)
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    if group is not None:
        dist.all_reduce(flat, group=group)
    flat.mul_(scale)
    offset = 0
    for g in grads:
        g.copy_(flat[offset: offset + g.numel()].view_as(g))
        offset += g.numel()
