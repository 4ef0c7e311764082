"""Expert parallelism for the bridge's mixture-of-experts blocks: experts split over ranks, tokens
dispatched to them and combined back with all-to-all.

Layout (Megatron-LM's, as the planner assumes: the expert-parallel group is carved out of the
data x context ranks): with data-parallel degree d, context degree c and expert-parallel degree e
(e | d c), ranks g e .. g e + e - 1 of a stage's d c (numbered replica x c + context rank) form an
expert-parallel group; its rank j holds experts
[j E/e, (j + 1) E/e) of every MoE layer; with tensor parallelism t each of them is also split
over the tensor ranks (expert tensor parallelism, applied first by ``parallel``; the tensor ranks
route the same tokens and exchange with the same-numbered tensor ranks of the other replicas).
The router, the attention and the shared experts stay replicated. The ranks with the same j form the
expert-data-parallel group (d c / e ranks) that reduces those experts' gradients
(``runtime_bridge.grad_sync``).

Per MoE layer and microbatch, each rank (Lepikhin et al., *GShard*, ICLR 2021, Sec. 2.2;
Fedus et al., *Switch Transformers*, JMLR 2022, Sec. 2.2, without capacity: dropless):

1. routes its own tokens exactly as the single-process block does (router, top-k, softmax over
   the k logits), so the choice and the weights are bit-identical to the reference;
2. sorts its (token, slot) pairs by expert, exchanges the per-rank counts, and sends each pair's
   hidden vector to the rank holding its expert (``all_to_all_single`` with uneven splits; gloo
   and NCCL both implement it);
3. runs each local expert on the rows it received (possibly none: the expert still gets a zero
   gradient, as in the reference);
4. sends the outputs back with the inverse all-to-all and sums each token's k weighted outputs
   (plus the shared experts).

The all-to-all is differentiable (its backward is the inverse exchange), so the pipeline's
backward, full or split into I and W, moves the output gradients back to the expert owners. All
replicas of a stage run the same schedule, so their dispatches pair up in the same order.
Expert parameters keep the whole model's names (``feed_forward.experts.<global index>``), so
``--check`` compares them one to one with the reference.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from runtime_bridge import model as gpt

__all__ = ["ExpertParallelMoE", "expert_parallel_layer", "local_experts"]


def local_experts(num_experts: int, ep_size: int, ep_rank: int) -> range:
    """The global indices of the experts an expert-parallel rank holds (a contiguous block)."""
    per_rank = num_experts // ep_size
    return range(ep_rank * per_rank, (ep_rank + 1) * per_rank)


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with uneven splits whose backward is the inverse exchange."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any) -> torch.Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


def _exchange_counts(send_counts: torch.Tensor, group: Any) -> list[int]:
    recv = torch.empty_like(send_counts)
    dist.all_to_all_single(recv, send_counts, group=group)
    return recv.tolist()


class ExpertParallelMoE(nn.Module):
    """A ``model.MoE`` block with only this rank's experts; same routing, same names.

    Args:
        moe: the whole block (initialised); its router, shared experts and local experts are kept.
        ep_rank, ep_size: this rank's place in the expert-parallel group and the group's size.
        group: the expert-parallel process group.
    """

    def __init__(self, moe: gpt.MoE, *, ep_rank: int, ep_size: int, group: Any) -> None:
        super().__init__()
        self.top_k, self.num_experts = moe.top_k, len(moe.experts)
        self.ep_size, self.group = ep_size, group
        self.local = local_experts(self.num_experts, ep_size, ep_rank)
        self.router, self.shared = moe.router, moe.shared
        self.experts = nn.ModuleDict({str(e): moe.experts[e] for e in self.local})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        logits, chosen = torch.topk(self.router(flat), self.top_k, dim=-1)
        weights = torch.softmax(logits.float(), dim=-1).to(x.dtype)
        expert_of_pair = chosen.reshape(-1)
        order = torch.argsort(expert_of_pair, stable=True)  # pairs grouped by expert, then by token
        sorted_experts = expert_of_pair[order]
        per_rank = self.num_experts // self.ep_size
        send = torch.bincount(sorted_experts // per_rank, minlength=self.ep_size).tolist()
        recv = _exchange_counts(torch.tensor(send, dtype=torch.int64), self.group)
        tokens_in = _AllToAll.apply(flat[order // self.top_k], recv, send, self.group)
        experts_in = sorted_experts.new_empty(sum(recv))
        dist.all_to_all_single(experts_in, sorted_experts, recv, send, group=self.group)
        outputs = torch.zeros_like(tokens_in)
        for e in self.local:
            rows = torch.where(experts_in == e)[0]
            outputs = outputs.index_copy(0, rows, self.experts[str(e)](tokens_in[rows]))
        back = _AllToAll.apply(outputs, send, recv, self.group)
        pairs = torch.zeros_like(back).index_copy(0, order, back).view(flat.shape[0], self.top_k, -1)
        out = (pairs * weights[..., None]).sum(dim=1)
        if self.shared is not None:
            out = out + self.shared(flat)
        return out.view_as(x)


def expert_parallel_layer(layer: nn.Module, *, ep_rank: int, ep_size: int, group: Any) -> nn.Module:
    """Replace a block's ``MoE`` feed-forward by its expert-parallel form in place (other layers
    unchanged); returns the layer."""
    ffn = getattr(layer, "feed_forward", None)
    if isinstance(ffn, gpt.MoE):
        layer.feed_forward = ExpertParallelMoE(ffn, ep_rank=ep_rank, ep_size=ep_size, group=group)
    return layer
