"""Megatron-LM flags for the parallel dimensions beyond t x p x v and for the model's settings.

Flag names from NVIDIA/Megatron-LM ``megatron/training/arguments.py`` (``--sequence-parallel``,
``--context-parallel-size``, ``--expert-model-parallel-size``, ``--expert-tensor-parallel-size``,
``--use-distributed-optimizer``, ``--use-megatron-fsdp`` with ``--data-parallel-sharding-strategy``,
``--rotary-base``, ``--norm-epsilon``, the MoE group ``--num-experts``/``--moe-*`` and the MLA group
``--multi-latent-attention``/``--q-lora-rank``/``--kv-lora-rank``/``--qk-head-dim``/
``--qk-pos-emb-head-dim``/``--v-head-dim``, sliding-window attention ``--window-size``/
``--window-attn-skip-freq``). tests/planner/test_export_megatron.py builds
megatron-core's own config classes from every exported flag set.
"""

from __future__ import annotations

from typing import Protocol

from planner.errors import InvalidProblemError
from planner.schema import Plan, TransformerConfig


class _Export(Protocol):
    warnings: list[str]

    def add(self, flag: str, value: object = None) -> None: ...


def parallel_flags(plan: Plan, export: _Export) -> None:
    """Sequence, context and expert parallelism, and the data-parallel sharding (ZeRO stage)."""
    d = plan.degrees
    if plan.sequence_parallel and d.tensor > 1:
        export.add("--sequence-parallel")
    if d.context > 1:
        export.add("--context-parallel-size", d.context)
    cfg = plan.transformer
    if cfg is not None and cfg.num_experts is not None:
        if d.expert > 1:
            export.add("--expert-model-parallel-size", d.expert)
        # The ptdp search records the experts' TP degree in the plan's options (1: experts whole, or t);
        # without it the experts are split like the dense layers (Megatron's default, stated so that a
        # later default change cannot alter the run).
        export.add("--expert-tensor-parallel-size", plan.options.get("expert_tensor_parallel", d.tensor))
    if plan.zero_stage >= 1:
        export.add("--use-distributed-optimizer")
    if plan.zero_stage == 2:
        export.warnings.append(
            "zero_stage=2: Megatron's distributed optimizer shards the optimizer states and reduce-scatters "
            "gradients, but keeps a full gradient buffer per rank (ZeRO-1 memory for gradients); use "
            "zero_stage 3 (Megatron FSDP) to shard gradients too"
        )
    if plan.zero_stage == 3:
        export.add("--use-megatron-fsdp")
        export.add("--data-parallel-sharding-strategy", "optim_grads_params")


def model_flags(cfg: TransformerConfig, export: _Export, dispatcher: str = "alltoall") -> None:
    """The model's shape and settings, nothing the config states left at Megatron's default;
    ``dispatcher``: the plan's expert token dispatcher (ptdp's ``moe_dispatcher``)."""
    _check_expressible(cfg)
    export.add("--num-layers", cfg.num_layers)
    export.add("--hidden-size", cfg.hidden_size)
    export.add("--ffn-hidden-size", cfg.ffn_size)
    export.add("--num-attention-heads", cfg.num_heads)
    if not cfg.is_mla and cfg.kv_heads != cfg.num_heads:
        export.add("--group-query-attention")
        export.add("--num-query-groups", cfg.kv_heads)
    if cfg.head_dim is not None and not cfg.is_mla:
        export.add("--kv-channels", cfg.head_dim)
    export.add("--seq-length", cfg.seq_length)
    export.add("--max-position-embeddings", cfg.seq_length)
    export.add("--vocab-size", cfg.vocab_size)
    if cfg.mlp == "swiglu":
        export.add("--swiglu")
    if cfg.norm == "rmsnorm":
        export.add("--normalization", "RMSNorm")
    if cfg.norm_eps is not None:
        export.add("--norm-epsilon", cfg.norm_eps)
    if cfg.position_embedding == "rope":
        export.add("--position-embedding-type", "rope")
        if cfg.rope_theta is not None:
            export.add("--rotary-base", _number(cfg.rope_theta))
        _rope_scaling_flags(cfg, export)
    if not cfg.tied_embeddings:
        export.add("--untie-embeddings-and-output-weights")
    if not cfg.bias:
        export.add("--disable-bias-linear")
        if cfg.qkv_bias:
            export.add("--add-qkv-bias")
    if cfg.qk_norm:
        export.add("--qk-layernorm")
    if cfg.sliding_window is not None:  # (left, right): itself and the window - 1 keys before it
        export.add("--window-size", f"{cfg.sliding_window - 1},0")
        if cfg.global_attention_every:
            export.add("--window-attn-skip-freq", cfg.global_attention_every)
    _moe_flags(cfg, export, dispatcher)
    _mla_flags(cfg, export)
    if cfg.mtp_layers:  # Megatron-Core places the modules on the last pipeline stage, as the plan costs them
        export.add("--mtp-num-layers", cfg.mtp_layers)
    if cfg.dtype in ("bf16", "fp16"):
        export.add(f"--{cfg.dtype}")


def _check_expressible(cfg: TransformerConfig) -> None:
    """Megatron-LM's arguments state a gelu or SwiGLU MLP, learned or rotary positions and the
    sequential pre-norm block; a model outside them would train as another network."""
    unsupported = []
    if cfg.mlp in ("geglu", "relu"):
        unsupported.append(f"mlp={cfg.mlp!r} (Megatron-LM's flags give gelu, --swiglu or --squared-relu)")
    if cfg.position_embedding == "alibi":
        unsupported.append("position_embedding='alibi' (Megatron-Core's position embeddings are "
                           "learned_absolute, rope, mrope, yarn and none)")
    if cfg.parallel_block:
        unsupported.append("parallel_block=true (Megatron-LM runs attention and MLP one after the other)")
    if unsupported:
        raise InvalidProblemError(
            f"model {cfg.name!r} cannot be exported as Megatron-LM arguments: {'; '.join(unsupported)}. "
            "The plan itself stands; export it with --format torch-csv (the schedule) or configure the "
            "model in a framework that has these layers (GPT-NeoX, Megatron-DeepSpeed, Hugging Face)")


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def _rope_scaling_flags(cfg: TransformerConfig, export: _Export) -> None:
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if not scaling:
        return
    if cfg.is_mla and kind == "yarn":  # Megatron's MLA group: YaRN factor and attention scales
        export.add("--rope-type", "yarn")
        export.add("--rotary-scaling-factor", _number(float(scaling.get("factor", 1.0))))
        for key in ("mscale", "mscale_all_dim"):
            if key in scaling:
                export.add("--" + key.replace("_", "-"), _number(float(scaling[key])))
        return
    if kind == "llama3" and not cfg.is_mla:
        export.add("--use-rope-scaling")
        export.add("--rope-scaling-factor", _number(float(scaling.get("factor", 8.0))))
        return
    export.warnings.append(
        f"rope_scaling {dict(scaling)} has no Megatron-LM GPT flag; the run uses unscaled RoPE "
        "(harmless when training at the pre-extension length)"
    )


def _moe_flags(cfg: TransformerConfig, export: _Export, dispatcher: str = "alltoall") -> None:
    if cfg.num_experts is None:
        return
    export.add("--num-experts", cfg.num_experts)
    export.add("--moe-router-topk", cfg.experts_per_token)
    width = cfg.moe_ffn_hidden_size or cfg.ffn_size
    export.add("--moe-ffn-hidden-size", width)
    if cfg.num_shared_experts:
        export.add("--moe-shared-expert-intermediate-size", cfg.num_shared_experts * width)
    if cfg.first_dense_layers:
        k = cfg.first_dense_layers
        export.add("--moe-layer-freq", f"([0]*{k}+[1]*{cfg.num_layers - k})")
    if cfg.router_score_function != "softmax":
        export.add("--moe-router-score-function", cfg.router_score_function)
    if cfg.router_expert_bias:
        export.add("--moe-router-enable-expert-bias")
    if cfg.router_topk_scaling_factor is not None:
        export.add("--moe-router-topk-scaling-factor", _number(cfg.router_topk_scaling_factor))
    if cfg.router_num_groups is not None:
        export.add("--moe-router-num-groups", cfg.router_num_groups)
        export.add("--moe-router-group-topk", cfg.router_group_topk)
    if dispatcher == "deepep":  # Megatron's flex dispatcher on DeepEP (node-deduplicated dispatch)
        export.add("--moe-token-dispatcher-type", "flex")
        export.add("--moe-flex-dispatcher-backend", "deepep")
    else:
        export.add("--moe-token-dispatcher-type", "alltoall")
    if cfg.capacity_factor is not None:
        export.add("--moe-expert-capacity-factor", cfg.capacity_factor)


def _mla_flags(cfg: TransformerConfig, export: _Export) -> None:
    if not cfg.is_mla:
        return
    export.add("--multi-latent-attention")
    if cfg.q_lora_rank is not None:
        export.add("--q-lora-rank", cfg.q_lora_rank)
    export.add("--kv-lora-rank", cfg.kv_lora_rank)
    export.add("--qk-head-dim", cfg.qk_nope_head_dim)
    export.add("--qk-pos-emb-head-dim", cfg.qk_rope_head_dim)
    export.add("--v-head-dim", cfg.v_head_dim)
