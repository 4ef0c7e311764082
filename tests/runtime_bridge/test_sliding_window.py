"""Sliding-window attention in the bundled model (``sliding_window``, ``global_attention_every``): the
windowed blocks are the ones the cost model and Megatron's ``--window-attn-skip-freq`` window, a query
sees exactly its window, a window as long as the sequence is plain causal attention, and context
parallelism keeps the window."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from runtime_bridge import model as gpt  # noqa: E402
from runtime_bridge.context_parallel import ContextShard, context_parallel_layer  # noqa: E402
from tests.runtime_bridge.plans import LLAMA_TINY  # noqa: E402

WINDOWED = LLAMA_TINY.model_copy(update={"sliding_window": 4, "global_attention_every": 2})


def _block(cfg, index: int):
    block = gpt.build_layer(cfg, index)
    gpt.init_layer(block, index, seed=5)
    return block


def _x(seed: int = 1) -> torch.Tensor:
    return torch.randn(2, 16, LLAMA_TINY.hidden_size, generator=torch.Generator().manual_seed(seed))


def test_every_second_block_is_global() -> None:
    """Blocks 1..4 with global_attention_every 2: 1 and 3 windowed, 2 and 4 global (0-based layers
    1 and 3, Megatron's (N-1):1 pattern); the count matches the cost model's windowed_layers."""
    assert [gpt.layer_window(WINDOWED, i) for i in range(1, 5)] == [4, None, 4, None]
    assert WINDOWED.windowed_layers == 2
    assert [gpt.layer_window(LLAMA_TINY, i) for i in range(1, 5)] == [None] * 4


def test_a_query_sees_exactly_its_window() -> None:
    """Changing token 0 changes a windowed block's outputs at positions 0-3 only (itself and the
    3 keys before it), and a global block's at every position."""
    x = _x()
    y = x.clone()
    y[:, 0] += 1.0
    changed = lambda block: (block(x) - block(y)).abs().amax(dim=(0, 2)) > 1e-6  # noqa: E731
    windowed = changed(_block(WINDOWED, 1))
    assert windowed[:4].all() and not windowed[4:].any()
    assert changed(_block(WINDOWED, 2)).all()


def test_a_window_as_long_as_the_sequence_is_causal_attention() -> None:
    wide = LLAMA_TINY.model_copy(update={"sliding_window": 16})
    x = _x(2)
    assert torch.allclose(_block(wide, 1)(x), _block(LLAMA_TINY, 1)(x), atol=1e-6, rtol=0)


def test_context_parallel_keeps_the_window(one_rank_group) -> None:
    block = _block(WINDOWED, 1)
    x = _x(3)
    reference = block(x)
    context_parallel_layer(block, ContextShard(16, size=1, rank=0, group=one_rank_group, device=torch.device("cpu")))
    assert torch.allclose(block(x), reference, atol=1e-6, rtol=0)
