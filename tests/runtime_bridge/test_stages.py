"""Stages from plans: the chunks compose to the whole model, bit for bit, with any recompute."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from cost_models.models import model_preset  # noqa: E402
from planner.errors import InvalidProblemError  # noqa: E402
from planner.schema import TransformerConfig  # noqa: E402
from runtime_bridge import model as gpt  # noqa: E402
from runtime_bridge.stages import (  # noqa: E402
    LocalChunk,
    build_chunk_modules,
    default_init,
    full_model,
    local_chunks,
)
from tests.runtime_bridge.plans import tiny_plan  # noqa: E402

CPU = torch.device("cpu")
LLAMA_LIKE = TransformerConfig(name="llama-tiny", hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2,
                               seq_length=8, vocab_size=64, ffn_hidden_size=48, mlp="swiglu", norm="rmsnorm",
                               bias=False, position_embedding="rope", tied_embeddings=False, dtype="fp32")


def _grads(cfg: TransformerConfig, chunks: list[LocalChunk]) -> tuple[float, dict[str, torch.Tensor]]:
    mods = build_chunk_modules(chunks, lambda i: gpt.build_layer(cfg, i), device=CPU,
                               init=lambda layer, i: gpt.init_layer(layer, i, seed=3))
    x, y = gpt.sample_batch(cfg, batch_size=2, step=0, seed=3)
    for mod in mods:
        x = mod(x)
    loss = gpt.lm_loss(x, y)
    loss.backward()
    return float(loss.detach()), {n: q.grad for mod in mods for n, q in mod.named_parameters()}


@pytest.mark.parametrize("cfg", [model_preset("gpt-tiny"), LLAMA_LIKE], ids=["gpt", "llama-like"])
def test_chunks_with_recompute_equal_the_whole_model(cfg: TransformerConfig) -> None:
    n = gpt.num_model_layers(cfg)
    ref_loss, ref = _grads(cfg, [LocalChunk(0, 0, n, ("none",) * n)])
    strategies = ("none", "full", "selective") + ("none",) * (n - 4) + ("none",)
    split = [LocalChunk(0, 0, 2, strategies[:2]), LocalChunk(1, 2, n, strategies[2:])]
    loss, grads = _grads(cfg, split)
    assert loss == ref_loss
    assert grads.keys() == ref.keys()
    assert all(torch.equal(grads[k], ref[k]) for k in ref)


@pytest.mark.parametrize("cfg", [model_preset("gpt-tiny"), LLAMA_LIKE], ids=["gpt", "llama-like"])
def test_offloaded_layers_equal_the_whole_model_and_leave_nothing_on_the_graph(cfg: TransformerConfig) -> None:
    """``offload``: the blocks' saved tensors go to host memory (save_on_cpu) and come back for the
    backward: the same loss and gradients, bit for bit, and the blocks' tensors are packed by
    save_on_cpu, not by the hooks around the chunk."""
    n = gpt.num_model_layers(cfg)
    ref_loss, ref = _grads(cfg, [LocalChunk(0, 0, n, ("none",) * n)])
    strategies = ("none",) + ("offload",) * (n - 2) + ("none",)
    loss, grads = _grads(cfg, [LocalChunk(0, 0, n, strategies)])
    assert loss == ref_loss
    assert all(torch.equal(grads[k], ref[k]) for k in ref)

    def saved_outside_save_on_cpu(chosen: tuple[str, ...]) -> int:
        """Tensors packed by an outer hook: save_on_cpu's own hooks take the offloaded blocks' tensors."""
        packed: list[int] = []
        mods = build_chunk_modules([LocalChunk(0, 0, n, chosen)], lambda i: gpt.build_layer(cfg, i), device=CPU,
                                   init=lambda layer, i: gpt.init_layer(layer, i, seed=3))
        x, _ = gpt.sample_batch(cfg, batch_size=2, step=0, seed=3)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t.numel()) or t, lambda t: t):
            mods[0](x)
        return len(packed)

    assert 0 < saved_outside_save_on_cpu(strategies) < saved_outside_save_on_cpu(("none",) * n)


def test_meta_construction_materialises_only_the_ranks_layers() -> None:
    plan = tiny_plan("interleaved-1f1b", v=2, splits=[[(0, 1), (3, 5)], [(1, 3), (5, 6)]],
                     recompute={1: {"selective": 1}})
    chunks = local_chunks(plan, 1)
    assert [(c.virtual_stage, c.first_layer, c.last_layer) for c in chunks] == [(1, 1, 3), (3, 5, 6)]
    assert chunks[0].strategies == ("selective", "none")
    cfg = model_preset("gpt-tiny")
    mods = build_chunk_modules(chunks, lambda i: gpt.build_layer(cfg, i), device=CPU,
                               init=lambda layer, i: gpt.init_layer(layer, i, seed=0))
    names = {n.split(".")[1] for m in mods for n, _ in m.named_parameters()}
    assert names == {"1", "2", "5"}
    assert all(not q.is_meta for m in mods for q in m.parameters())
    assert mods[0].layers["1"].selective_recompute and not mods[0].layers["2"].selective_recompute


class _UserBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x))


def test_users_own_blocks_split_and_full_recompute() -> None:
    init = default_init(seed=5)
    ref = full_model(4, lambda i: _UserBlock(), device=CPU, init=init)
    mods = build_chunk_modules([LocalChunk(0, 0, 1, ("full",)), LocalChunk(1, 1, 4, ("none", "full", "none"))],
                               lambda i: _UserBlock(), device=CPU, init=init)
    x = torch.randn(3, 8)
    ref(x).square().sum().backward()
    mods[1](mods[0](x)).square().sum().backward()
    ref_grads = dict(ref.named_parameters())
    for mod in mods:
        for name, q in mod.named_parameters():
            assert torch.equal(q.grad, ref_grads[name].grad), name


def test_selective_recompute_needs_the_attribute() -> None:
    with pytest.raises(InvalidProblemError, match="has no 'selective_recompute' attribute"):
        build_chunk_modules([LocalChunk(0, 0, 1, ("selective",))], lambda i: _UserBlock(), device=CPU,
                            init=default_init(0))
