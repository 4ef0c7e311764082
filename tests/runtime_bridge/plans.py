"""Plans of small models for the bridge tests: ``gpt-tiny`` (6 layers: embedding, 4 blocks, head),
and Llama-, Mixtral- and NeoX-style configs of the same size (``LLAMA_TINY``, ``MIXTRAL_TINY``,
``NEOX_TINY``)."""

from __future__ import annotations

from typing import Any

from planner import api
from planner.export import parse_torch_csv
from planner.schema import V_SCHEDULES, Plan, TransformerConfig

LLAMA_TINY = TransformerConfig(
    name="llama-tiny", hidden_size=32, num_layers=4, num_heads=4, num_kv_heads=2, seq_length=16, vocab_size=128,
    ffn_hidden_size=64, mlp="swiglu", norm="rmsnorm", bias=False, position_embedding="rope", tied_embeddings=False,
    rope_theta=500000.0, norm_eps=1e-5, dtype="fp32",
)
"""Llama-3 style at toy size: GQA (4 query, 2 key/value heads), RoPE with Llama-3's theta, SwiGLU,
RMSNorm, no biases, untied embeddings."""
MIXTRAL_TINY = LLAMA_TINY.model_copy(update={
    "name": "mixtral-tiny", "num_experts": 4, "experts_per_token": 2, "moe_ffn_hidden_size": 32,
})
"""Mixtral style: every block a top-2-of-4 MoE."""
NEOX_TINY = TransformerConfig(
    name="neox-tiny", hidden_size=32, num_layers=4, num_heads=4, seq_length=16, vocab_size=128, ffn_hidden_size=64,
    mlp="relu", norm="layernorm", bias=True, position_embedding="alibi", parallel_block=True, tied_embeddings=False,
    dtype="fp32",
)
"""GPT-NeoX / Falcon style at toy size: attention and MLP in parallel, ALiBi, LayerNorm with biases,
and OPT's ReLU FFN."""

# torchtitan tests/assets/custom_schedule.csv: 2 ranks, virtual stages {0, 2} and {1, 3}, m = 8,
# every backward split into I and W, in an order no built-in schedule has.
TORCHTITAN_CSV = (
    "0F0,0F1,0F2,0F3,0F4,0F5,0F6,0F7,2F0,2F1,2F2,2F3,2F4,2F5,2F6,2F7,"
    "2I0,2W0,2I1,2W1,0I0,0W0,0I1,0W1,2I2,2W2,2I3,2W3,0I2,0W2,0I3,0W3,"
    "2I4,2W4,2I5,2W5,0I4,0W4,0I5,0W5,2I6,2W6,2I7,2W7,0I6,0W6,0I7,0W7\n"
    "1F0,1F1,1F2,1F3,1F4,1F5,1F6,1F7,3F0,3F1,3F2,3F3,3F4,3F5,3F6,3F7,"
    "3I0,3W0,3I1,3W1,1I0,1W0,1I1,1W1,3I2,3W2,3I3,3W3,1I2,1W2,1I3,1W3,"
    "3I4,3W4,3I5,3W5,1I4,1W4,1I5,1W5,3I6,3W6,3I7,3W7,1I6,1W6,1I7,1W7\n"
)


def tiny_plan(
    schedule: str = "1f1b",
    *,
    p: int = 2,
    v: int = 1,
    m: int = 4,
    d: int = 1,
    splits: list[list[tuple[int, int]]] | None = None,
    recompute: dict[int, dict[str, Any]] | None = None,
    actions: list[list[str]] | None = None,
    t: int = 1,
    sequence_parallel: bool = False,
    zero_stage: int = 0,
    model: Any = "gpt-tiny",
    expert: int = 1,
    context: int = 1,
    module_strategy: str | None = None,
) -> Plan:
    """A gpt-tiny plan from the even solver, then edited.

    Args:
        schedule: the plan's schedule (``custom`` needs ``actions``).
        p, v, m, d: pipeline stages, chunks per stage, microbatches per replica, replicas.
        splits: per stage, per chunk, [first, last) layers (uneven splits).
        recompute: stage index -> the recompute dict of its first chunk.
        actions: per-rank action strings for ``custom``.
        t, sequence_parallel, zero_stage: tensor-parallel degree, Megatron sequence parallelism,
            data-parallel sharding (0 DDP, 1/2 FSDP2 without resharding, 3 FSDP2).
        model: a preset name or a ``TransformerConfig``.
        expert: expert-parallel degree (carved out of the d replicas).
        context: context-parallel degree (c ranks per replica: the cluster and the stages' ranks
            grow c times, in Megatron order).
        module_strategy: a Megatron-Core module set (``layernorm+moe_act``) or ``offload`` every decoder
            layer's profile offers (the ``none`` option's costs: these plans compare numbers, not costs).
    """
    base = "interleaved-1f1b" if v > 1 else ("1f1b" if schedule == "custom" else schedule)
    if schedule in V_SCHEDULES:  # two chunks per rank in a V (rank r: virtual stages r and 2p - 1 - r)
        base, v = schedule, 2
    problem = api.make_problem(model, f"cpu:{p * d * t}", num_stages=p, num_chunks=v, schedule=base,
                               global_batch_size=d * m, data_parallel=d, tensor_parallel=t)
    data = api.plan(problem).model_dump(mode="json")
    data["sequence_parallel"], data["zero_stage"] = sequence_parallel, zero_stage
    data["schedule"] = schedule
    data["degrees"]["expert"] = expert
    if context > 1:
        data["degrees"]["context"] = context
        data["cluster"]["devices_per_node"] *= context
        data["cluster"]["name"] = f"cpu:{data['cluster']['num_nodes'] * data['cluster']['devices_per_node']}"
        for x, stage in enumerate(data["stages"]):
            size = d * t * context
            stage["ranks"] = list(range(x * size, (x + 1) * size))
    data["actions"] = actions
    for layer in data["model"]["layers"] if module_strategy else ():
        if layer["kind"] == "decoder":
            layer["recompute"][module_strategy] = layer["recompute"]["none"]
    for x, stage in enumerate(data["stages"]):
        if splits is not None:
            stage["chunks"] = [{"layers": list(layers), "recompute": {}} for layers in splits[x]]
        if recompute and x in recompute:
            stage["chunks"][0]["recompute"] = recompute[x]
    data["predicted"] = None  # the edits change the costs; these tests compare numbers, not times
    return Plan.from_dict(data)


def torchtitan_custom_plan() -> Plan:
    """torchtitan's custom schedule as a paraplan 'custom' plan with uneven chunks."""
    rows = [[str(a) for a in rank] for rank in parse_torch_csv(TORCHTITAN_CSV)]
    return tiny_plan("custom", p=2, v=2, m=8, splits=[[(0, 2), (3, 5)], [(2, 3), (5, 6)]], actions=rows)
