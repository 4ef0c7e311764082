"""Expert- and context-parallel building blocks in one process: the load-balanced split by hand,
the expert blocks of each rank, and the rewritten forward paths against the single-process
modules on a one-rank gloo group (the multi-rank runs are in test_multirank.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


from runtime_bridge import model as gpt  # noqa: E402
from runtime_bridge.context_parallel import ContextShard, context_parallel_layer, held_positions  # noqa: E402
from runtime_bridge.expert_parallel import ExpertParallelMoE, local_experts  # noqa: E402
from tests.runtime_bridge.plans import LLAMA_TINY, MIXTRAL_TINY  # noqa: E402


def test_load_balanced_split_by_hand() -> None:
    # s = 16, c = 2: four chunks of 4; rank 0 holds the first and the last, rank 1 the middle two
    assert held_positions(16, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert held_positions(16, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    # c = 4: every rank the same causal work (sum of positions + 1 = attended keys)
    work = [int((held_positions(16, 4, r) + 1).sum()) for r in range(4)]
    assert work == [34, 34, 34, 34]
    assert sorted(torch.cat([held_positions(16, 4, r) for r in range(4)]).tolist()) == list(range(16))


def test_expert_blocks() -> None:
    assert [list(local_experts(8, 4, r)) for r in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert list(local_experts(4, 1, 0)) == [0, 1, 2, 3]


def _grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: q.grad.clone() for n, q in module.named_parameters() if q.grad is not None}


def test_expert_parallel_block_equals_the_moe_block(one_rank_group) -> None:
    layer = gpt.build_layer(MIXTRAL_TINY, 1)
    gpt.init_layer(layer, 1, seed=3)
    moe = layer.feed_forward
    x = torch.randn(2, 16, MIXTRAL_TINY.hidden_size, generator=torch.Generator().manual_seed(0))
    reference = moe(x)
    reference.square().sum().backward()
    expected = _grads(moe)
    moe.zero_grad(set_to_none=True)
    ep = ExpertParallelMoE(moe, ep_rank=0, ep_size=1, group=one_rank_group)
    out = ep(x)
    out.square().sum().backward()
    assert torch.allclose(out, reference, atol=1e-7, rtol=0)
    got = _grads(ep)
    assert set(got) == set(expected)  # the same parameter names (experts.<global index>)
    assert max(float((got[n] - expected[n]).abs().max()) for n in got) < 1e-7


def test_context_shard_of_one_rank_is_causal_attention(one_rank_group) -> None:
    block = gpt.build_layer(LLAMA_TINY, 1)
    gpt.init_layer(block, 1, seed=5)
    x = torch.randn(2, 16, LLAMA_TINY.hidden_size, generator=torch.Generator().manual_seed(1))
    reference = block(x)
    context_parallel_layer(block, ContextShard(16, size=1, rank=0, group=one_rank_group, device=torch.device("cpu")))
    assert block.attention.context is not None
    assert torch.allclose(block(x), reference, atol=1e-6, rtol=0)
