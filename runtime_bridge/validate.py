"""Checks a plan against the model and the launch before any process starts (no torch here).

A plan that cannot run as asked is refused with ``InvalidProblemError`` (CLI exit 2) naming the
field, the value and the fix: layer counts, devices, microbatches dividing the batch, the
constraints torch.distributed.pipelining puts on its schedules (shared/design/ecosystem.md
Sec. 2.3 and the pitfalls of Sec. 3.5), and the placement of custom actions.
"""

from __future__ import annotations

from planner.errors import InvalidProblemError
from planner.schema import Action, ModelProfile, Plan, TransformerConfig

__all__ = ["RUNNABLE_SCHEDULES", "check_buildable", "check_plan", "layer_param_counts", "num_ranks", "resolve_config"]

RUNNABLE_SCHEDULES = ("gpipe", "1f1b", "flush", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v", "dualpipe-v", "custom")
"""Schedules the bridge executes; ``2bw`` updates weights asynchronously, which torch's
synchronous schedules cannot reproduce."""


def num_ranks(plan: Plan) -> int:
    """Processes a plan needs: pipeline x data x context x tensor degrees."""
    d = plan.degrees
    return d.pipeline * d.data * d.context * d.tensor


def resolve_config(plan: Plan, model: TransformerConfig | None = None) -> TransformerConfig:
    """The transformer to build: the one given, else the plan's, else the preset named like the
    plan's profile (a profile written by ``paraplan profile --model gpt-tiny`` is named gpt-tiny).

    Raises:
        InvalidProblemError: none of the three is available.
    """
    if model is not None:
        return model
    if plan.transformer is not None:
        return plan.transformer
    from cost_models import models

    try:
        return models.model_preset(plan.model.name)
    except InvalidProblemError:
        raise InvalidProblemError(
            f"the plan's model {plan.model.name!r} is a layer profile without a transformer config and "
            "not a model preset; pass the model to build with --model (a preset name or a transformer JSON)"
        ) from None


def check_plan(plan: Plan, cfg: TransformerConfig, *, world_size: int | None = None) -> None:
    """Refuse a plan that does not match the bundled model built from ``cfg`` or the launch.

    Args:
        plan: the plan to execute.
        cfg: the transformer the ranks will build (embedding + ``cfg.num_layers`` blocks + head).
        world_size: processes the launch starts (``nproc_per_node x nnodes``), when known.

    Raises:
        InvalidProblemError: the first mismatch found, with the numbers and the fix.
    """
    check_buildable(cfg)
    _check_layers(plan.model, cfg)
    _check_config(plan, cfg)
    _check_profiled_params(plan.model, cfg)
    _check_degrees(plan, world_size)
    _check_tensor(plan, cfg)
    _check_batch(plan, cfg)
    _check_schedule(plan)


def _check_layers(profile: ModelProfile, cfg: TransformerConfig) -> None:
    expected = cfg.num_layers + 2
    if profile.num_layers != expected:
        raise InvalidProblemError(
            f"the plan has {profile.num_layers} layers but model {cfg.name!r} has {expected} "
            f"(embedding + {cfg.num_layers} blocks + head); plan again with --model {cfg.name}"
        )
    kinds = [layer.kind for layer in profile.layers]
    ends = {0: "embedding", expected - 1: "head"}
    wrong = [  # a block may be any kind but the two ends' ("decoder", "moe"...)
        (i, kind) for i, kind in enumerate(kinds)
        if kind != "layer" and (kind != ends[i] if i in ends else kind in ("embedding", "head"))
    ]
    if wrong:
        i, kind = wrong[0]
        raise InvalidProblemError(
            f"plan layer {i} is a {kind!r} layer but layer {i} of model {cfg.name!r} is "
            f"{'the embedding' if i == 0 else 'the head' if i == expected - 1 else 'a decoder block'}; "
            f"plan again with --model {cfg.name}"
        )
    if profile.tokens_per_sample is not None and profile.tokens_per_sample != cfg.seq_length:
        raise InvalidProblemError(
            f"the plan's profile has tokens_per_sample={profile.tokens_per_sample} but model {cfg.name!r} "
            f"has seq_length={cfg.seq_length}; plan again with --model {cfg.name}"
        )


_CONFIG_FIELDS = (
    "hidden_size", "num_layers", "num_heads", "kv_heads", "seq_length", "vocab_size", "ffn_size", "mlp", "norm",
    "bias", "position_embedding", "num_experts", "experts_per_token", "moe_ffn_hidden_size", "num_shared_experts",
    "first_dense_layers", "head_dim", "qk_norm", "qkv_bias", "kv_lora_rank", "sliding_window", "global_attention_every",
    "parallel_block",
)
"""What makes two transformers the same network for a plan (names, dtype and numerics aside)."""


def _check_config(plan: Plan, cfg: TransformerConfig) -> None:
    """The plan was made for this network: every shape field of its transformer equals the model's."""
    if plan.transformer is None:
        return
    differ = [(f, getattr(plan.transformer, f, None), getattr(cfg, f, None)) for f in _CONFIG_FIELDS
              if getattr(plan.transformer, f, None) != getattr(cfg, f, None)]
    if differ:
        text = ", ".join(f"{f} {a} vs {b}" for f, a, b in differ)
        raise InvalidProblemError(
            f"the plan was made for transformer {plan.transformer.name!r} but the model to run, {cfg.name!r}, "
            f"differs ({text}; plan vs model); plan again with --model {cfg.name}"
        )


def layer_param_counts(cfg: TransformerConfig) -> list[int]:
    """Parameters of each layer of the bundled model (``runtime_bridge.model``), without torch."""
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_heads
    h, q, kv, v = cfg.hidden_size, cfg.num_heads * hd, cfg.kv_heads * hd, cfg.vocab_size
    bias = int(cfg.bias)
    qkv_bias = int(cfg.bias or bool(getattr(cfg, "qkv_bias", False)))
    norm = h * (2 if cfg.norm == "layernorm" and cfg.bias else 1)

    def ffn(size: int) -> int:
        mats = 3 if cfg.gated_mlp else 2
        return mats * h * size + bias * ((mats - 1) * size + h)

    attention = 2 * h * q + 2 * h * kv + qkv_bias * (q + 2 * kv) + bias * h
    attention += 2 * hd if getattr(cfg, "qk_norm", False) else 0
    dense = attention + 2 * norm + ffn(cfg.ffn_size)
    moe = dense
    if cfg.num_experts is not None:
        expert = cfg.moe_ffn_hidden_size or cfg.ffn_size
        shared = ffn(expert * cfg.num_shared_experts) if cfg.num_shared_experts else 0
        moe = attention + 2 * norm + h * cfg.num_experts + cfg.num_experts * ffn(expert) + shared
    embedding = v * h + (cfg.seq_length * h if cfg.position_embedding == "learned" else 0)
    blocks = [moe if cfg.num_experts is not None and i >= cfg.first_dense_layers else dense
              for i in range(cfg.num_layers)]
    return [embedding, *blocks, v * h + norm]


def _check_profiled_params(profile: ModelProfile, cfg: TransformerConfig) -> None:
    """A measured profile (``paraplan profile``) records each layer's parameter bytes: they must be
    the model's parameter counts times one element size, or the profile is another network's."""
    if profile.source != "profiler" or any(layer.param_bytes <= 0 for layer in profile.layers):
        return
    counts = layer_param_counts(cfg)
    sizes = {layer.param_bytes / n for layer, n in zip(profile.layers, counts)}
    if len(sizes) != 1 or sizes.pop() not in (2.0, 4.0):
        i, (layer, n) = next((i, x) for i, x in enumerate(zip(profile.layers, counts))
                             if x[0].param_bytes not in (2.0 * x[1], 4.0 * x[1]))
        raise InvalidProblemError(
            f"the plan's profile {profile.name!r} measured {layer.param_bytes:.0f} parameter bytes for layer {i} "
            f"({layer.name}) but that layer of model {cfg.name!r} has {n} parameters; the profile is of another "
            f"network: pass the profiled model with --model, or profile {cfg.name!r} and plan again"
        )


def check_buildable(cfg: TransformerConfig) -> None:
    """Refuse configs whose network the bundled model does not build (rather than build another)."""
    if getattr(cfg, "kv_lora_rank", None) is not None:
        raise InvalidProblemError(
            f"model {cfg.name!r} uses multi-latent attention (kv_lora_rank={getattr(cfg, 'kv_lora_rank', None)}); the runtime bridge "
            "builds multi-head and grouped-query attention only: plan and export it (Megatron, torchtitan) instead"
        )
    if getattr(cfg, "mtp_layers", 0):
        raise InvalidProblemError(
            f"model {cfg.name!r} has mtp_layers={cfg.mtp_layers} multi-token-prediction module(s); the runtime bridge "
            "builds the main model only: set mtp_layers to 0 in the config to run it without them (the plan then "
            "costs them no longer), or export the plan to Megatron-LM, which trains them (--mtp-num-layers)"
        )
    scaling = getattr(cfg, "rope_scaling", None)
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind not in ("default", "llama3"):
        raise InvalidProblemError(
            f"model {cfg.name!r} has rope_scaling type {kind!r}; the runtime bridge builds plain RoPE and Llama 3.1's "
            "'llama3' scaling: drop rope_scaling from the config to run it without"
        )


def _check_tensor(plan: Plan, cfg: TransformerConfig) -> None:
    """Degrees the bridge cannot run yet, and the divisibility tensor parallelism needs."""
    d = plan.degrees
    _check_context(plan, cfg)
    _check_expert(plan, cfg)
    t = d.tensor
    if t == 1:
        return
    if getattr(cfg, "qk_norm", False):
        raise InvalidProblemError(
            f"degrees.tensor={t} with qk_norm: the per-head query/key norms would see only each rank's heads; the "
            "bridge runs qk_norm models with pipeline and data parallelism only: plan with --tensor-parallel 1"
        )
    if getattr(cfg, "position_embedding", None) == "alibi":
        raise InvalidProblemError(
            f"degrees.tensor={t} with ALiBi: each head's bias slope depends on its index in the whole model, which "
            "a rank's share of the heads does not carry; the bridge runs ALiBi models with pipeline and data "
            "parallelism only: plan with --tensor-parallel 1"
        )
    sizes = {"num_heads": cfg.num_heads, "num_kv_heads": cfg.kv_heads, "ffn_hidden_size": cfg.ffn_size,
             "vocab_size": cfg.vocab_size}
    if cfg.num_experts is not None:
        sizes["moe_ffn_hidden_size"] = cfg.moe_ffn_hidden_size or cfg.ffn_size  # each expert's FFN is split
    if plan.sequence_parallel:
        sizes["seq_length"] = cfg.seq_length
    bad = {k: v for k, v in sizes.items() if v % t}
    if bad:
        raise InvalidProblemError(
            f"degrees.tensor={t} must divide {', '.join(f'{k}={v}' for k, v in bad.items())} of model "
            f"{cfg.name!r} (tensor parallelism splits heads, FFN columns, vocabulary"
            f"{' and, with sequence parallelism, the sequence' if plan.sequence_parallel else ''}); "
            "use a tensor-parallel degree that divides them"
        )


def _check_context(plan: Plan, cfg: TransformerConfig) -> None:
    """Context parallelism as the bridge runs it: the load-balanced split (2 c chunks), keys and
    values all-gathered, any ZeRO stage over the data x context ranks."""
    d = plan.degrees
    if d.context == 1:
        return
    problems = []
    if cfg.seq_length % (2 * d.context):
        problems.append(f"seq_length={cfg.seq_length} is not divisible by 2 x degrees.context = {2 * d.context} "
                        "(the load-balanced split); use a context degree c with seq_length divisible by 2c")
    if plan.sequence_parallel and (cfg.seq_length // d.context) % d.tensor:
        problems.append(f"sequence parallelism splits each context rank's {cfg.seq_length // d.context} tokens over "
                        f"degrees.tensor={d.tensor}; use a tensor degree that divides them")
    if problems:
        raise InvalidProblemError(f"degrees.context={d.context}: " + "; ".join(problems))


def _check_expert(plan: Plan, cfg: TransformerConfig) -> None:
    """Expert parallelism as the bridge runs it: experts split over e of the d replicas (each
    expert tensor-split over t, as without expert parallelism), gradients reduced explicitly
    (replicated dense parameters)."""
    d = plan.degrees
    if d.expert == 1:
        return
    problems = []
    if cfg.num_experts is None:
        problems.append(f"model {cfg.name!r} has no experts (num_experts unset): use degrees.expert=1")
    elif cfg.num_experts % d.expert:
        problems.append(f"num_experts={cfg.num_experts} is not divisible by degrees.expert={d.expert}: use an "
                        "expert-parallel degree that divides it")
    if (d.data * d.context) % d.expert:
        problems.append(f"degrees.expert={d.expert} must divide degrees.data x degrees.context = "
                        f"{d.data * d.context} (the expert-parallel group is carved out of those ranks)")
    if plan.zero_stage > 1 and d.tensor > 1:
        problems.append(f"zero_stage={plan.zero_stage} with degrees.tensor={d.tensor}: the bridge shards experts "
                        "with FSDP2 over whole experts only; use zero_stage 0 or 1, or degrees.tensor=1")
    if problems:
        raise InvalidProblemError(f"degrees.expert={d.expert}: " + "; ".join(problems))


def _check_degrees(plan: Plan, world_size: int | None) -> None:
    d = plan.degrees
    replicas = [stage.replicas for stage in plan.stages]
    if any(r != d.data for r in replicas):
        raise InvalidProblemError(
            f"stage replicas {replicas} differ from degrees.data={d.data} (PipeDream 1F1B-RR); the bridge "
            "runs one data-parallel degree for all stages: plan with solver 'even' or 'ptdp'"
        )
    for stage in plan.stages:
        size = d.data * d.context * d.tensor
        megatron = tuple(range(stage.index * size, (stage.index + 1) * size))
        if stage.ranks and tuple(stage.ranks) != megatron:
            raise InvalidProblemError(
                f"stage {stage.index} has ranks {list(stage.ranks)}; the bridge places ranks in Megatron "
                f"order (rank = stage x data x context x tensor + replica x context x tensor + context rank x "
                f"tensor + tensor rank), i.e. {list(megatron)}"
            )
    needed = num_ranks(plan)
    if world_size is not None and world_size != needed:
        raise InvalidProblemError(
            f"the plan needs {needed} processes (pipeline {d.pipeline} x data {d.data}"
            f"{f' x context {d.context}' if d.context > 1 else ''} x tensor {d.tensor}) but "
            f"the launch starts {world_size}; set --nproc-per-node x --nnodes = {needed}"
        )


def _check_batch(plan: Plan, cfg: TransformerConfig) -> None:
    d, b, m = plan.degrees.data, plan.microbatch_size, plan.num_microbatches
    if plan.global_batch_size != d * m * b:
        raise InvalidProblemError(
            f"global_batch_size={plan.global_batch_size} is not data {d} x microbatches {m} x microbatch "
            f"size {b} = {d * m * b}; torch splits each replica's batch into equal microbatches "
            "(uneven ones crash its receive buffers), so fix the plan's batch fields"
        )
    if plan.model.microbatch_size != b:
        raise InvalidProblemError(
            f"microbatch_size={b} but the plan's layer costs are for microbatch size "
            f"{plan.model.microbatch_size}; plan again with --microbatch-size {b}"
        )


def _check_schedule(plan: Plan) -> None:
    p, v, m = plan.degrees.pipeline, plan.degrees.virtual, plan.num_microbatches
    if plan.schedule not in RUNNABLE_SCHEDULES:
        raise InvalidProblemError(
            f"schedule {plan.schedule!r} cannot run: PipeDream-2BW updates weights asynchronously and "
            f"torch.distributed.pipelining runs synchronous schedules; use one of {list(RUNNABLE_SCHEDULES)}"
        )
    if plan.schedule in ("1f1b", "flush") and m < p:
        raise InvalidProblemError(
            f"schedule {plan.schedule!r} in torch needs num_microbatches >= pipeline stages; got {m} "
            f"microbatches for {p} stages: use at least {p} microbatches or schedule 'gpipe'"
        )
    if plan.schedule == "dualpipe-v" and m < 2 * p:
        raise InvalidProblemError(
            f"torch's ScheduleDualPipeV needs num_microbatches >= its {2 * p} stages (2 per rank); got m={m}: "
            f"use at least {2 * p} microbatches or schedule 'zb-v'"
        )
    if plan.schedule == "interleaved-1f1b":
        rounds = max(1, m // p)
        if m % rounds:
            raise InvalidProblemError(
                f"torch's interleaved 1F1B needs num_microbatches divisible by max(1, m // p) = {rounds}; "
                f"got m={m} for p={p}: use a multiple of {p}"
            )
    if plan.schedule == "custom":
        assert plan.actions is not None  # Plan validation requires actions for 'custom'
        for rank, actions in enumerate(plan.actions):
            for text in actions:
                stage = Action.parse(text).stage
                if stage % p != rank or stage >= p * v:
                    raise InvalidProblemError(
                        f"actions[{rank}] has {text!r}, but virtual stage {stage} lives on pipeline rank "
                        f"{stage % p} (virtual stage k is chunk k // p of stage k % p); move the action"
                    )


def splits_backward(plan: Plan) -> bool:
    """Whether the plan's order splits some backward into I and W actions."""
    if plan.schedule not in ("zb-h1", "zb-h2", "zb-v", "dualpipe-v", "custom"):
        return False
    from cost_models.simulate import plan_actions

    return any(a.kind in ("I", "W") for rank in plan_actions(plan) for a in rank)
