"""Blocks of identical layers for PipeDream's partitioning DP on very deep models.

The DP fills a table over every layer range, O(N^3) work for N layers, which 1,536 layers do
not finish. Runs of identical consecutive layers (same kind and costs) are merged into at most
``MAX_DP_LAYERS`` blocks of near-equal size; a block is one DP layer whose compute, weights,
static bytes and activation are the sums of its layers and whose output is its last layer's.
Stage boundaries then fall on block edges only, so the plan is feasible and the DP's optimum
over those boundaries, not necessarily over every boundary: the solver says so in its notes
and reports status ``feasible``. Models of at most ``MAX_DP_LAYERS`` layers are not grouped.
"""

from __future__ import annotations

import math

from planner.schema import LayerProfile, ModelProfile

MAX_DP_LAYERS = 192


def _signature(layer: LayerProfile) -> tuple[object, ...]:
    return (layer.kind, layer.forward_s, layer.backward_s, layer.param_bytes, layer.static_bytes,
            layer.output_bytes, layer.strategies()["none"].activation_bytes)


def _runs(model: ModelProfile) -> list[tuple[int, int]]:
    """(first, count) of every run of identical consecutive layers."""
    runs: list[tuple[int, int]] = []
    for i, layer in enumerate(model.layers):
        if runs and _signature(model.layers[runs[-1][0]]) == _signature(layer):
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


def block_starts(model: ModelProfile, max_layers: int | None = None) -> list[int] | None:
    """First layer of every block plus the layer count at the end; None when no grouping is needed
    (or none can bring the chain under ``max_layers``, default ``MAX_DP_LAYERS``, because its
    layers all differ)."""
    max_layers = MAX_DP_LAYERS if max_layers is None else max_layers
    if model.num_layers <= max_layers:
        return None
    runs = _runs(model)
    size = next((k for k in range(2, model.num_layers + 1)
                 if sum(math.ceil(n / k) for _, n in runs) <= max_layers), None)
    if size is None:
        return None
    starts: list[int] = []
    for first, count in runs:
        parts = math.ceil(count / size)
        base, extra = divmod(count, parts)
        offset = first
        for j in range(parts):
            starts.append(offset)
            offset += base + (1 if j < extra else 0)
    return starts + [model.num_layers]


def grouped_model(model: ModelProfile, starts: list[int]) -> ModelProfile:
    """The model with each block [starts[b], starts[b+1]) as one layer."""
    blocks = []
    for a, b in zip(starts, starts[1:]):
        own = model.layers[a:b]
        flops = [layer.flops for layer in own]
        blocks.append(LayerProfile(
            name=f"{own[0].name}..{own[-1].name}" if b - a > 1 else own[0].name, kind=own[0].kind,
            forward_s=math.fsum(x.forward_s for x in own), backward_s=math.fsum(x.backward_s for x in own),
            activation_bytes=math.fsum(x.strategies()["none"].activation_bytes for x in own),
            static_bytes=math.fsum(x.static_bytes for x in own), param_bytes=math.fsum(x.param_bytes for x in own),
            output_bytes=own[-1].output_bytes, flops=None if None in flops else math.fsum(flops),  # type: ignore[arg-type]
        ))
    return model.model_copy(update={"layers": tuple(blocks)})
