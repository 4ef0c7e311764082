"""Per-module recompute in the bundled model, as Megatron-Core's ``--recompute-modules`` does it.

Two kinds of checkpoint, as Megatron-Core uses them (``TransformerConfig.recompute_modules``):

- normal checkpointing (``core_attn``, ``mlp``, ``moe``, ``shared_experts``): torch's
  non-reentrant ``checkpoint`` around the module keeps its input and re-runs it in the backward;
- output discarding (``layernorm``, ``moe_act``): the module runs as usual, but the copy of its
  output that the next operation saves for its backward is dropped and re-made (without grad) from
  the module's kept input when that backward needs it (``discard_output``), so the memory the
  cost model frees is freed and the gradients are unchanged.

``mla_up_proj`` needs multi-latent attention, which the bundled model does not have; Megatron-Core
rejects it without MLA too.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from planner.errors import InvalidProblemError

__all__ = ["BLOCK_MODULES", "discard_output", "set_block_modules"]

BLOCK_MODULES = ("core_attn", "layernorm", "mlp", "moe", "moe_act", "shared_experts")
"""The Megatron-Core recompute modules the bundled decoder block runs."""


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def discard_output(make: Callable[[], torch.Tensor], consume: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``consume(make())``, where ``consume`` does not keep ``make()``'s output for its backward: each
    saved reference to it (the tensor or a view of it, such as the 2-D view a linear layer saves) is
    replaced by its view geometry and re-made from ``make()`` under ``no_grad`` when the backward
    unpacks it (Megatron-Core's output-discarding checkpoint). ``make`` must be deterministic, return
    a contiguous tensor, and read only tensors that stay alive anyway (the module's saved input)."""
    y = make()
    if not torch.is_grad_enabled() or not y.is_contiguous():
        return consume(y)
    marker = object()
    base = y.storage_offset()

    def pack(t: torch.Tensor) -> object:
        if _storage(t) == _storage(y) and t.dtype == y.dtype:
            return (marker, tuple(t.shape), t.stride(), t.storage_offset() - base)
        return t

    def unpack(saved: object) -> torch.Tensor:
        if isinstance(saved, tuple) and saved and saved[0] is marker:
            _, shape, stride, offset = saved
            with torch.no_grad():
                again = make().contiguous()
            return again.as_strided(shape, stride, again.storage_offset() + offset)
        return saved  # type: ignore[return-value]

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = consume(y)
    return out


def set_block_modules(block: torch.nn.Module, modules: tuple[str, ...], index: int) -> None:
    """Recompute ``modules`` in ``block`` (a ``runtime_bridge.model.Block``); a module the block does not
    have (``mlp`` in an MoE block, ``moe`` in a dense one) is a no-op, as in Megatron.

    Raises:
        InvalidProblemError: a module the bundled model does not implement, or a block without the
            ``recompute_modules`` attribute (a user's own model).
    """
    unknown = sorted(set(modules) - set(BLOCK_MODULES))
    if unknown:
        raise InvalidProblemError(
            f"layer {index} is planned to recompute {unknown}; the bundled model runs {list(BLOCK_MODULES)} "
            "(mla_up_proj needs multi-latent attention, which it does not have): plan without them")
    if not hasattr(block, "recompute_modules"):
        raise InvalidProblemError(
            f"layer {index} ({type(block).__name__}) is planned with recompute modules {list(modules)} but has "
            "no 'recompute_modules' attribute; see runtime_bridge.model.Block, or plan it with 'full' or 'none'")
    block.recompute_modules = frozenset(modules)
