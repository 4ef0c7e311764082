"""Megatron-Core recompute modules in the bundled model: gradients bit-identical to no recompute,
and the discarded outputs really re-made in the backward."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from planner.errors import InvalidProblemError  # noqa: E402
from runtime_bridge.model import Block, init_layer  # noqa: E402
from runtime_bridge.recompute import discard_output, set_block_modules  # noqa: E402
from runtime_bridge.stages import ChunkModule  # noqa: E402
from tests.runtime_bridge.plans import LLAMA_TINY, MIXTRAL_TINY  # noqa: E402

SHARED = MIXTRAL_TINY.model_copy(update={"num_shared_experts": 1})


def _grads(block: Block, x: torch.Tensor) -> list[torch.Tensor]:
    block.zero_grad()
    x = x.clone().requires_grad_(True)
    block(x).square().sum().backward()
    return [x.grad.clone()] + [p.grad.clone() for p in block.parameters()]


@pytest.mark.parametrize(("cfg", "moe", "modules"), [
    (LLAMA_TINY, False, ("core_attn", "layernorm", "mlp")),
    (LLAMA_TINY, False, ("layernorm",)),
    (SHARED, True, ("moe_act", "layernorm", "shared_experts")),
    (SHARED, True, ("core_attn", "moe")),
])
def test_module_recompute_leaves_gradients_bit_identical(cfg, moe: bool, modules: tuple[str, ...]) -> None:
    torch.manual_seed(0)
    block = Block(cfg, moe=moe)
    init_layer(block, 1, seed=3)
    x = torch.randn(2, cfg.seq_length, cfg.hidden_size)
    plain = _grads(block, x)
    set_block_modules(block, modules, 1)
    assert block.recompute_modules == frozenset(modules)
    again = _grads(block, x)
    assert all(torch.equal(a, b) for a, b in zip(plain, again))


def test_discarded_output_is_remade_in_the_backward() -> None:
    norm, linear = torch.nn.RMSNorm(8), torch.nn.Linear(8, 4)
    x = torch.randn(3, 5, 8, requires_grad=True)
    calls = []

    def make() -> torch.Tensor:
        calls.append(torch.is_grad_enabled())
        return norm(x)

    out = discard_output(make, linear)
    assert calls == [True]  # the forward only
    out.sum().backward()
    assert calls[1:] == [False]  # the weight gradient needed the norm output: re-made once, without grad
    reference = torch.autograd.grad(linear(norm(x)).sum(), [x, linear.weight])
    assert torch.equal(x.grad, reference[0]) and torch.equal(linear.weight.grad, reference[1])


def test_chunk_runs_module_strategies_and_refuses_what_it_lacks() -> None:
    block = Block(MIXTRAL_TINY, moe=True)
    ChunkModule({1: block}, {1: "moe_act+layernorm"})
    assert block.recompute_modules == {"moe_act", "layernorm"}
    assert all(e.discard_activation for e in block.feed_forward.experts)
    with pytest.raises(InvalidProblemError, match="mla_up_proj"):
        ChunkModule({1: Block(MIXTRAL_TINY, moe=True)}, {1: "mla_up_proj"})
    with pytest.raises(InvalidProblemError, match="no 'recompute_modules' attribute"):
        ChunkModule({1: torch.nn.Linear(2, 2)}, {1: "layernorm"})


def _mm_count(module: torch.nn.Module, x: torch.Tensor, *, checkpointed: bool) -> tuple[int, int]:
    """(matrix products in the forward, in the backward) of one step of ``module``."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import checkpoint

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.mm = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN202
            self.mm += func.overloadpacket.__name__ in ("mm", "addmm", "bmm")
            return func(*args, **(kwargs or {}))

    x = x.clone().requires_grad_(True)
    forward, backward = Count(), Count()
    with forward:
        y = checkpoint(module, x, use_reentrant=False) if checkpointed else module(x)
    with backward:
        y.square().sum().backward()
    return forward.mm, backward.mm


def test_full_recompute_of_the_bridge_stops_before_the_ffn_output_projection() -> None:
    """What ``ComputeModel.full_recompute = 'early-stop'`` costs, on the bridge's own dense block: the
    non-reentrant checkpoint ``paraplan run`` uses (as torchtitan does) re-runs every matrix product
    of the forward but the last one, the FFN output projection (w2), whose input is the last tensor
    the backward saved; a reentrant re-run would repeat all of them."""
    torch.manual_seed(0)
    block = Block(LLAMA_TINY, moe=False)
    init_layer(block, 1, seed=3)
    x = torch.randn(2, LLAMA_TINY.seq_length, LLAMA_TINY.hidden_size)
    fwd, plain_bwd = _mm_count(block, x, checkpointed=False)
    fwd_ckpt, ckpt_bwd = _mm_count(block, x, checkpointed=True)
    assert fwd_ckpt == fwd
    assert ckpt_bwd - plain_bwd == fwd - 1
