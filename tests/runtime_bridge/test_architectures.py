"""The bundled model's other decoder layouts: ALiBi (BLOOM, MPT), the parallel attention/MLP block
(GPT-J, GPT-NeoX, Falcon, Phi-2), GeGLU (Gemma) and ReLU (OPT) FFNs, each against its formula
written out by hand, and the parallel block under Megatron's layernorm recompute."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from runtime_bridge import model as gpt  # noqa: E402
from tests.runtime_bridge.plans import NEOX_TINY  # noqa: E402

GEMMA_TINY = NEOX_TINY.model_copy(update={"mlp": "geglu", "parallel_block": False, "position_embedding": "rope"})


def _block(cfg, index: int = 1):
    block = gpt.build_layer(cfg, index)
    gpt.init_layer(block, index, seed=7)
    return block


def _x(seed: int = 1) -> torch.Tensor:
    return torch.randn(2, NEOX_TINY.seq_length, NEOX_TINY.hidden_size, generator=torch.Generator().manual_seed(seed))


def test_alibi_slopes_follow_the_paper() -> None:
    """Press et al. (ICLR 2022) Sec. 3: 2^-1 ... 2^-8 for 8 heads; for 12 heads the 8 of the nearest
    power of two, then every other term of the 16-head sequence (2^-0.5, 2^-1.5, ...)."""
    assert gpt.alibi_slopes(8).tolist() == [2.0 ** -i for i in range(1, 9)]
    twelve = gpt.alibi_slopes(12).tolist()
    assert twelve[:8] == [2.0 ** -i for i in range(1, 9)]
    assert twelve[8:] == pytest.approx([2.0 ** -(i + 0.5) for i in range(4)])


def test_alibi_attention_by_hand() -> None:
    """softmax(q k^T / sqrt(d) - slope_h (i - j)) v over the causal keys, head by head."""
    attention = _block(NEOX_TINY).attention
    x = _x()
    batch, seq, d = x.shape[0], x.shape[1], attention.head_dim
    q, k, v = (w(x).view(batch, seq, -1, d).transpose(1, 2) for w in (attention.wq, attention.wk, attention.wv))
    slopes = gpt.alibi_slopes(q.shape[1])
    i, j = torch.arange(seq)[:, None], torch.arange(seq)[None, :]
    scores = q @ k.transpose(-1, -2) / math.sqrt(d) - slopes[:, None, None] * (i - j)
    scores = scores.masked_fill(j > i, float("-inf"))
    expected = attention.wo((scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, seq, -1))
    assert torch.allclose(attention(x), expected, atol=1e-5, rtol=0)


def test_parallel_block_by_hand_and_under_layernorm_recompute() -> None:
    """x + attention(norm1(x)) + mlp(norm2(x)); recomputing the norms changes neither the output
    nor a gradient."""
    block = _block(NEOX_TINY)
    x = _x(2).requires_grad_()
    expected = x + block.attention(block.attention_norm(x)) + block.feed_forward(block.ffn_norm(x))
    out = block(x)
    assert torch.allclose(out, expected, atol=1e-6, rtol=0)
    grads = torch.autograd.grad(out.square().sum(), [x, *block.parameters()])
    block.recompute_modules = frozenset({"layernorm"})
    again = block(x)
    assert torch.allclose(again, out, atol=1e-6, rtol=0)
    for a, b in zip(torch.autograd.grad(again.square().sum(), [x, *block.parameters()]), grads):
        assert torch.allclose(a, b, atol=1e-5, rtol=0)


def test_geglu_and_relu_ffns_by_hand() -> None:
    x = _x(3)
    ffn = _block(GEMMA_TINY).feed_forward
    assert torch.allclose(ffn(x), ffn.w2(F.gelu(ffn.w1(x), approximate="tanh") * ffn.w3(x)), atol=1e-6, rtol=0)
    relu = _block(NEOX_TINY).feed_forward
    assert relu.w3 is None
    assert torch.allclose(relu(x), relu.w2(F.relu(relu.w1(x))), atol=1e-6, rtol=0)
