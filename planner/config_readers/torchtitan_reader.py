"""torchtitan model arguments -> TransformerConfig, read from torchtitan's own model registry.

Recent torchtitan (0.3) describes a model as a nested ``<Model>.Config`` built in Python by
``torchtitan.models.<module>.model_registry(flavor)``; there is no file to parse. This reader calls
that registry and walks the config: the embedding and head, each layer's attention (GQA with a
fused or separate QKV, or DeepSeek's MLA with ``wq_a``/``wkv_a``/``wkv_b``), its dense
``feed_forward`` or ``moe`` (router, grouped experts, shared experts), norms and RoPE. torchtitan's
model package imports torch and triton, so it is imported only when a ``torchtitan:`` model is read.
"""

from __future__ import annotations

import importlib
from typing import Any

from planner.config_readers.common import build_config, training_seq_length
from planner.errors import InvalidProblemError
from planner.schema import TransformerConfig

SUPPORTED_MODULES = ("deepseek_v3", "gpt_oss", "llama3", "qwen3")
TORCHTITAN_DEFAULT_SEQ_LEN = 2048
"""torchtitan's ``training.seq_len`` default (torchtitan/config/configs.py TrainingConfig)."""


def read_torchtitan_model(spec: str, *, seq_length: int | None = None) -> TransformerConfig:
    """A torchtitan model flavor as a TransformerConfig.

    Args:
        spec: ``<module>:<flavor>``, e.g. ``llama3:8B``, ``qwen3:30B-A3B``, ``deepseek_v3:671B``, ``gpt_oss:20b``
            (the names of ``torchtitan.models.<module>.<module>_configs``).
        seq_length: the training sequence length (default: torchtitan's ``training.seq_len`` 2048).

    Raises:
        InvalidProblemError: a malformed spec, a module outside ``SUPPORTED_MODULES``, an unknown
            flavor (the message lists the flavors), or torchtitan not installed.
    """
    module_name, sep, flavor = spec.partition(":")
    if not sep or not flavor:
        raise InvalidProblemError(
            f"torchtitan model {spec!r}: write torchtitan:<module>:<flavor>, e.g. torchtitan:llama3:8B"
        )
    if module_name not in SUPPORTED_MODULES:
        raise InvalidProblemError(
            f"torchtitan module {module_name!r} is not supported; choose from {list(SUPPORTED_MODULES)}"
        )
    try:
        module = importlib.import_module(f"torchtitan.models.{module_name}")
    except ImportError as e:
        raise InvalidProblemError(
            f"cannot import torchtitan.models.{module_name} ({e}); "
            "install the torchtitan extra: pip install 'paraplan[torchtitan]'"
        ) from None
    flavors = _flavors(module)
    if flavor not in flavors:
        raise InvalidProblemError(f"torchtitan {module_name} has no flavor {flavor!r}; choose from {sorted(flavors)}")
    model = module.model_registry(flavor).model
    fields = _model_fields(model)
    fields["name"] = f"torchtitan-{module_name}-{flavor}".lower()
    fields["seq_length"] = training_seq_length(
        asked=seq_length,
        stated=TORCHTITAN_DEFAULT_SEQ_LEN,
        maximum=None,
        source=f"torchtitan {spec}",
        stated_what="torchtitan's training.seq_len default",
    )
    return build_config(fields)


def _flavors(module: Any) -> dict[str, Any]:
    for name, value in vars(module).items():
        if name.endswith("_configs") and isinstance(value, dict):
            return value
    return {}


def _model_fields(model: Any) -> dict[str, Any]:
    layers = model.layers
    last = layers[-1]
    fields: dict[str, Any] = {
        "hidden_size": model.dim,
        "num_layers": len(layers),
        "vocab_size": model.vocab_size,
        "mlp": "swiglu",
        "norm": "rmsnorm",
        "position_embedding": "rope",
        "tied_embeddings": bool(getattr(model, "enable_weight_tying", False)),
        "norm_eps": model.norm.eps,
    }
    fields.update(_attention_fields(last.attention, model.dim))
    dense = [layer for layer in layers if getattr(layer, "moe", None) is None]
    if dense:
        fields["ffn_hidden_size"] = dense[0].feed_forward.w1.out_features
    moe = getattr(last, "moe", None)
    if moe is not None:
        if any(getattr(layer, "moe", None) is None for layer in layers[len(dense) :]):
            raise InvalidProblemError(
                "torchtitan model interleaves dense and MoE layers; paraplan models a dense prefix only"
            )
        experts = moe.routed_experts.inner_experts
        fields.update(
            {
                "num_experts": moe.num_experts,
                "experts_per_token": moe.router.top_k,
                "moe_ffn_hidden_size": experts.hidden_dim,
                "first_dense_layers": len(dense),
                "num_shared_experts": _shared_experts(moe, experts.hidden_dim),
                "router_score_function": "sigmoid" if moe.router.score_func == "sigmoid" else "softmax",
                "router_topk_scaling_factor": moe.router.route_scale if moe.router.route_scale != 1.0 else None,
                "router_num_groups": moe.router.num_expert_groups,
                "router_group_topk": moe.router.num_limited_groups,
                # torchtitan balances with a per-expert bias when load_balance_coeff is set (aux-loss-free)
                "router_expert_bias": moe.router.score_func == "sigmoid" and moe.load_balance_coeff is not None,
            }
        )
        fields.setdefault("ffn_hidden_size", experts.hidden_dim)
    return fields


def _shared_experts(moe: Any, expert_width: int) -> int:
    shared = getattr(moe, "shared_experts", None)
    if shared is None:
        return 0
    width = shared.w1.out_features
    if width % expert_width:
        raise InvalidProblemError(f"shared-expert width {width} is not a multiple of the expert width {expert_width}")
    return width // expert_width


def _attention_fields(att: Any, dim: int) -> dict[str, Any]:
    rope = att.rope
    fields: dict[str, Any] = {"num_heads": att.n_heads, "rope_theta": float(rope.theta)}
    scaling = str(getattr(rope, "scaling", "none"))
    if scaling not in ("none", "None"):
        factor = rope.rope_factor if scaling == "yarn" else rope.scaling_factor
        fields["rope_scaling"] = {"rope_type": "llama3" if scaling == "llama" else scaling, "factor": float(factor)}
    fields["bias"] = bool(att.wo.bias)
    if getattr(att, "wkv_a", None) is not None:  # multi-latent attention
        c = att.wkv_b.in_features
        rope_dim = att.wkv_a.out_features - c
        query_out = (att.wq_b if att.wq_a is not None else att.wq).out_features
        nope = query_out // att.n_heads - rope_dim
        fields.update(
            {
                "kv_lora_rank": c,
                "q_lora_rank": att.wq_a.out_features if att.wq_a is not None else None,
                "qk_rope_head_dim": rope_dim,
                "qk_nope_head_dim": nope,
                "v_head_dim": att.wkv_b.out_features // att.n_heads - nope,
            }
        )
        return fields
    qkv = att.qkv_linear
    qkv_bias, out_bias = bool(getattr(qkv.wqkv, "bias", False)), bool(att.wo.bias)
    fields["bias"] = qkv_bias and out_bias  # gpt-oss: every projection, router and expert has biases
    fields["qkv_bias"] = qkv_bias and not out_bias
    head_dim = att.head_dim or qkv.head_dim
    fields["num_kv_heads"] = att.n_kv_heads or att.n_heads
    if head_dim * att.n_heads != dim:
        fields["head_dim"] = head_dim
    fields["qk_norm"] = getattr(att, "qk_norm", None) is not None
    return fields
