"""Stages from a plan: which chunks a rank holds, built on the meta device and materialised.

A plan's virtual stage k is chunk k // p of stage k % p (planner.schema.Plan.virtual_stages;
Megatron-LM's interleaved placement, dissertation Sec. 4.2.2), or, for the V schedules (ZB-V,
DualPipeV), virtual stage r and 2p - 1 - r on rank r (``Plan.chunk_of_virtual_stage``). Each rank constructs its chunks'
layers under ``torch.device("meta")`` (no memory), then ``to_empty`` on its device and an
initialisation that depends only on the layer index, so that no rank ever holds another rank's
weights and every rank agrees with the single-process reference (shared/design/ecosystem.md
Sec. 3.2, 5.2).

Parameter names keep the whole model's numbering: layer i of the model is ``layers.<i>`` in every
chunk, so gradients, checkpoints and the reference map one to one.

The same code runs a user's own model: give ``layer_factory(i) -> nn.Module`` for the ordered list
of blocks (``build_chunk_modules``); full recompute works on any block, selective recompute on
blocks with a boolean ``selective_recompute`` attribute.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from planner.errors import InvalidProblemError
from planner.schema import Plan, recompute_modules_of
from runtime_bridge.recompute import set_block_modules

__all__ = ["ChunkModule", "LocalChunk", "build_chunk_modules", "default_init", "local_chunks"]

LayerFactory = Callable[[int], nn.Module]
LayerInit = Callable[[nn.Module, int], None]


class ChunkModule(nn.Module):
    """A contiguous run of model layers applied in order, with per-layer recompute.

    Args:
        layers: model layer index -> module, in model order.
        strategies: model layer index -> ``none``, ``selective``, ``full``, ``offload`` (the layer's
            saved tensors in host memory: ``torch.autograd.graph.save_on_cpu``) or a module set
            (``layernorm+moe_act``: ``runtime_bridge.recompute``).
    """

    def __init__(self, layers: dict[int, nn.Module], strategies: dict[int, str] | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({str(i): layer for i, layer in sorted(layers.items())})
        self.full_recompute = frozenset(i for i, s in (strategies or {}).items() if s == "full")
        self.offloaded = frozenset(i for i, s in (strategies or {}).items() if s == "offload")
        for i, strategy in (strategies or {}).items():
            modules = recompute_modules_of(strategy)
            if strategy == "selective":
                _enable_selective(layers[i], i)
            elif modules:
                set_block_modules(layers[i], modules, i)
            elif strategy not in ("none", "full", "offload"):
                raise InvalidProblemError(
                    f"layer {i} asks for recompute strategy {strategy!r}; the runtime bridge runs "
                    "'none', 'selective', 'full', 'offload' and Megatron-Core module sets joined by '+'"
                )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for key, layer in self.layers.items():
            if int(key) in self.full_recompute and torch.is_grad_enabled():
                # Keep only the layer input; recompute the layer in the backward (Korthikanti Sec. 5).
                x = checkpoint(layer, x, use_reentrant=False)
            elif int(key) in self.offloaded and torch.is_grad_enabled():
                # What the layer saves for its backward goes to host memory (pinned on CUDA) and comes
                # back when the backward unpacks it (cost_models.activation_offload).
                with torch.autograd.graph.save_on_cpu(pin_memory=x.is_cuda):
                    x = layer(x)
            else:
                x = layer(x)
        return x


def _enable_selective(layer: nn.Module, index: int) -> None:
    if not hasattr(layer, "selective_recompute"):
        raise InvalidProblemError(
            f"layer {index} ({type(layer).__name__}) is planned with selective recompute but has no "
            "'selective_recompute' attribute; give the block one (see runtime_bridge.model.Attention) "
            "or plan it with 'full' or 'none'"
        )
    layer.selective_recompute = True


@dataclass(frozen=True, slots=True)
class LocalChunk:
    """A chunk this rank runs."""

    virtual_stage: int
    """Global (virtual) stage index, what torch calls stage_index."""
    first_layer: int
    last_layer: int
    """Exclusive."""
    strategies: tuple[str, ...]
    """Recompute strategy of each layer, in order."""


def local_chunks(plan: Plan, pipeline_rank: int) -> tuple[LocalChunk, ...]:
    """The chunks of one pipeline rank, ordered by virtual stage.

    Args:
        plan: the plan.
        pipeline_rank: the stage index x in [0, p).
    """
    p, v = plan.degrees.pipeline, plan.degrees.virtual
    out = []
    for k in range(p * v):
        rank, index = plan.chunk_of_virtual_stage(k)
        if rank == pipeline_rank:
            chunk = plan.stages[pipeline_rank].chunks[index]
            out.append(LocalChunk(k, chunk.layers[0], chunk.layers[1], chunk.layer_strategies()))
    return tuple(out)


def default_init(seed: int) -> LayerInit:
    """Initialiser for a user's blocks: each module's own ``reset_parameters`` under a CPU RNG
    seeded by (seed, layer index), so the result does not depend on the rank."""

    def init(layer: nn.Module, index: int) -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed * 1_000_003 + index)
            for module in layer.modules():
                reset = getattr(module, "reset_parameters", None)
                if callable(reset):
                    reset()

    return init


def build_chunk_modules(
    chunks: Sequence[LocalChunk],
    layer_factory: LayerFactory,
    *,
    device: torch.device,
    init: LayerInit,
    dtype: torch.dtype = torch.float32,
    parallelize: Callable[[nn.Module, int], nn.Module] | None = None,
) -> list[ChunkModule]:
    """Build this rank's chunk modules: meta construction, then materialise only its layers.

    Args:
        chunks: from ``local_chunks``.
        layer_factory: model layer index -> a new module (called under the meta device).
        device: where the layers live.
        init: ``init(module, index)`` fills a materialised layer's parameters deterministically.
        dtype: parameter dtype.
        parallelize: ``parallelize(module, index)`` applied to each initialised layer (tensor
            parallelism: ``runtime_bridge.parallel.tensor_parallel_layer``).

    Returns:
        One ``ChunkModule`` per chunk, in the order given.
    """
    modules = []
    for chunk in chunks:
        layers = {}
        for i in range(chunk.first_layer, chunk.last_layer):
            with torch.device("meta"):
                layer = layer_factory(i)
            layer = layer.to_empty(device=device).to(dtype)
            init(layer, i)
            layers[i] = parallelize(layer, i) if parallelize is not None else layer
        strategies = dict(zip(range(chunk.first_layer, chunk.last_layer), chunk.strategies))
        modules.append(ChunkModule(layers, strategies))
    return modules


def full_model(num_layers: int, layer_factory: LayerFactory, *, device: torch.device, init: LayerInit,
               dtype: torch.dtype = torch.float32) -> ChunkModule:
    """The whole model in one process (the ``--check`` reference), with the same names and weights."""
    chunk = LocalChunk(0, 0, num_layers, ("none",) * num_layers)
    return build_chunk_modules([chunk], layer_factory, device=device, init=init, dtype=dtype)[0]
