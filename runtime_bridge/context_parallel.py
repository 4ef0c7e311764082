"""Context parallelism for the bridge's decoder: the sequence split over c ranks, causal attention
over all-gathered keys and values, with the load-balanced split.

Split (the one the cost model assumes): the sequence of s tokens is cut into 2c chunks and
context rank i holds chunks i and 2c - 1 - i, so every rank has the same share of the causal
mask's work (Liu et al., *Ring Attention with Blockwise Transformers*, ICLR 2024, and the
Llama 3 paper's context parallelism, Dubey et al., *The Llama 3 Herd of Models*, 2024, Sec. 3.3.2;
Megatron-LM's context-parallel load balancing). Each rank runs the embedding, the norms, the
projections, the FFN and the head on its s / c tokens only (tensor-split as usual when t > 1:
each tensor rank gathers the keys and values of its own heads).

Attention: the all-gather-KV form (Llama 3 Sec. 3.3.2): each rank all-gathers the keys and
values of the whole sequence (after RoPE at the tokens' true positions), puts them back in
sequence order, and attends its own queries to them under the causal mask of their true
positions. The all-gather is differentiable: its backward reduce-scatters the gradients of the
gathered keys and values, so each rank receives the sum over ranks of its own slice's gradient. Torch's experimental ``context_parallel`` (ring attention over SDPA) is
not used: it dispatches the CUDA attention kernels only, and the bridge's checks run on CPU.

Each rank's loss is the mean over its tokens; the microbatch loss is the mean over the c ranks
(equal token counts), so gradients are summed over the data x context ranks of a stage and divided
by d c (``runtime_bridge.grad_sync``; Megatron-LM reduces over the same group), and the losses
reported are averaged over the context group.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from runtime_bridge import model as gpt

__all__ = ["ContextShard", "context_parallel_layer", "held_positions"]


def held_positions(seq_length: int, size: int, rank: int) -> torch.Tensor:
    """The sequence positions context rank ``rank`` of ``size`` holds: chunks rank and
    2 size - 1 - rank of 2 size equal chunks (int64, ascending)."""
    chunk = seq_length // (2 * size)
    first = torch.arange(rank * chunk, (rank + 1) * chunk)
    second = torch.arange((2 * size - 1 - rank) * chunk, (2 * size - rank) * chunk)
    return torch.cat([first, second])


class _GatherSequence(torch.autograd.Function):
    """All-gather along the sequence dimension (dim 2 of (batch, heads, seq, head_dim)) in rank
    order; backward: reduce-scatter (every rank's gradient of this rank's slice, summed)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, size: int, rank: int) -> torch.Tensor:
        ctx.group, ctx.rank, ctx.local = group, rank, x.shape[2]
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        parts = [part.contiguous() for part in grad.split(ctx.local, dim=2)]
        out = torch.empty_like(parts[ctx.rank])
        dist.reduce_scatter(out, parts, group=ctx.group)
        return out, None, None, None


class ContextShard:
    """One context rank's view of the sequence.

    Args:
        seq_length: s (divisible by 2 c).
        size, rank: c and this rank's index in the context group.
        group: the context-parallel process group.
        device: where the positions and the mask live.
    """

    def __init__(self, seq_length: int, *, size: int, rank: int, group: Any, device: torch.device) -> None:
        self.size, self.rank, self.group = size, rank, group
        self.index = held_positions(seq_length, size, rank)
        """Positions held, for slicing the tokens and targets (CPU)."""
        gathered = torch.cat([held_positions(seq_length, size, r) for r in range(size)])
        self.positions = self.index.to(device)
        self.order = torch.argsort(gathered).to(device)
        """Gathered keys in rank order -> sequence order."""
        self.mask = (self.index[:, None] >= torch.arange(seq_length)[None, :]).to(device)
        """Causal mask of the held queries against the whole sequence (True: attend)."""

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, heads, s / c, d) of the held positions -> (batch, heads, s, d) in sequence order."""
        return _GatherSequence.apply(x, self.group, self.size, self.rank).index_select(2, self.order)


def context_parallel_layer(layer: nn.Module, shard: ContextShard) -> nn.Module:
    """Give a layer's embedding and attention modules the context shard (in place); returns it."""
    for module in layer.modules():
        if isinstance(module, (gpt.Embedding, gpt.Attention)):
            module.context = shard
    return layer


def average_losses(losses: list[torch.Tensor], group: Any, size: int) -> list[torch.Tensor]:
    """The microbatch losses of the whole sequence: each context rank's token-mean, averaged."""
    if not losses:
        return losses
    stacked = torch.stack([x.detach() for x in losses]).clone()
    dist.all_reduce(stacked, group=group)
    return list(stacked / size)
