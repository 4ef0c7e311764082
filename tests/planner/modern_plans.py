"""Plans of today's models (presets) with every parallel dimension, for the export tests."""

from __future__ import annotations

from collections.abc import Sequence

from cost_models.models import model_preset
from planner.schema import (
    Chunk,
    Cluster,
    Degrees,
    Device,
    LayerProfile,
    ModelProfile,
    Plan,
    RecomputeOption,
    Stage,
    TransformerConfig,
    virtual_stage_home,
)

_RECOMPUTE = {
    "none": RecomputeOption(activation_bytes=8.0),
    "selective": RecomputeOption(activation_bytes=4.0, extra_s=0.1),
    "full": RecomputeOption(activation_bytes=1.0, extra_s=1.0),
}


def _profile(cfg: TransformerConfig, strategy: str = "none") -> ModelProfile:
    options = _RECOMPUTE if strategy in _RECOMPUTE else {**_RECOMPUTE, strategy: _RECOMPUTE["selective"]}
    layers = [LayerProfile(name="embedding", kind="embedding", forward_s=0.1, backward_s=0.2)]
    layers += [
        LayerProfile(
            name=f"decoder{i}",
            kind="decoder",
            forward_s=1.0,
            backward_s=2.0,
            backward_weight_s=1.0,
            recompute=options,
        )
        for i in range(cfg.num_layers)
    ]
    layers.append(LayerProfile(name="head", kind="head", forward_s=0.5, backward_s=1.0))
    return ModelProfile(name=cfg.name, layers=tuple(layers))


def preset_plan(
    model: str | TransformerConfig,
    decoders: Sequence[int] | None = None,
    *,
    p: int = 1,
    v: int = 1,
    tensor: int = 1,
    data: int = 1,
    context: int = 1,
    expert: int = 1,
    zero_stage: int = 0,
    sequence_parallel: bool | None = None,
    m: int = 8,
    b: int = 1,
    schedule: str | None = None,
    recompute: str = "none",
) -> Plan:
    """A plan of ``model`` with ``decoders[k]`` decoder layers in virtual stage k (default: even).

    The embedding joins the first virtual stage and the head the last, as Megatron places them.
    ``recompute``: a strategy for every decoder layer, also a Megatron-Core module set
    (``layernorm+moe_act``), which the profile then offers.
    """
    cfg = model_preset(model) if isinstance(model, str) else model
    k_total = p * v
    if decoders is None:
        assert cfg.num_layers % k_total == 0
        decoders = [cfg.num_layers // k_total] * k_total
    assert len(decoders) == k_total and sum(decoders) == cfg.num_layers
    bounds = [0]
    for k, n in enumerate(decoders):
        bounds.append(bounds[-1] + n + (1 if k == 0 else 0) + (1 if k == k_total - 1 else 0))
    schedule = schedule or ("interleaved-1f1b" if v > 1 else "1f1b")
    chunks: list[list[Chunk]] = [[] for _ in range(p)]
    homes = sorted(range(k_total), key=lambda k: virtual_stage_home(k, p, schedule)[1])  # chunk 0 first
    for k in homes:
        first, last = bounds[k], bounds[k + 1]
        spec = (
            {} if recompute == "none" else {recompute: tuple(i for i in range(first, last) if 0 < i <= cfg.num_layers)}
        )
        chunks[virtual_stage_home(k, p, schedule)[0]].append(Chunk(layers=(first, last), recompute=spec))
    devices = data * tensor * p * context
    cluster = Cluster(
        name="h100",
        device=Device(name="h100", memory_bytes=80e9, peak_flops=989e12),
        num_nodes=max(1, devices // 8),
        devices_per_node=min(8, devices),
        intra_node_bytes_per_s=450e9,
        inter_node_bytes_per_s=50e9,
    )
    return Plan(
        solver="test",
        model=_profile(cfg, recompute),
        cluster=cluster,
        transformer=cfg,
        degrees=Degrees(data=data, tensor=tensor, pipeline=p, virtual=v, context=context, expert=expert),
        schedule=schedule,  # type: ignore[arg-type]
        microbatch_size=b,
        num_microbatches=m,
        global_batch_size=b * m * data,
        stages=tuple(Stage(index=x, chunks=tuple(chunks[x])) for x in range(p)),
        zero_stage=zero_stage,  # type: ignore[arg-type]
        sequence_parallel=tensor > 1 if sequence_parallel is None else sequence_parallel,
    )
