"""Hugging Face ``config.json`` -> TransformerConfig, read with transformers' own ``AutoConfig``.

``AutoConfig.from_pretrained`` on a local file works offline: it validates the file against the
architecture's configuration class (defaults included, e.g. Mixtral's ``rope_theta``) and applies
the renames between transformers versions (``rope_theta`` inside ``rope_parameters`` in v5). Loading
it imports torch (transformers does), so this module is imported only when an ``hf:`` model is read.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from planner.config_readers.common import build_config, training_seq_length
from planner.config_readers.hf_families import GPT2_STYLE_TYPES, gpt2_style_fields
from planner.errors import InvalidProblemError
from planner.schema import TransformerConfig

logger = logging.getLogger(__name__)

LLAMA_STYLE_TYPES = (
    "cohere", "deepseek_v2", "deepseek_v3", "dots1", "ernie4_5", "ernie4_5_moe", "gemma", "gemma2", "gemma3_text",
    "glm4", "glm4_moe", "gpt_oss", "granite", "granitemoe", "granitemoeshared", "llama", "minimax_m2", "mistral",
    "mixtral", "olmo", "olmo2", "olmo3", "olmoe", "phi3", "phimoe", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
    "seed_oss", "smollm3", "stablelm", "starcoder2",
)
"""Decoders with Llama's attribute names (``hidden_size``, ``intermediate_size``, ``num_key_value_heads``)."""
SUPPORTED_MODEL_TYPES = tuple(sorted(LLAMA_STYLE_TYPES + GPT2_STYLE_TYPES))
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
_SILU = ("silu", "swish", "swiglu")
_UNGATED = ("starcoder2",)
"""Llama-style configs whose FFN is two matrices (c_fc, c_proj), not gate/up/down."""
_LAYERNORM = ("cohere", "olmo", "phimoe", "stablelm", "starcoder2")
_QK_NORM = ("dots1", "gemma3_text", "minimax_m2", "olmo2", "olmo3", "olmoe", "qwen3", "qwen3_moe")
_MLA = ("deepseek_v2", "deepseek_v3")
_MTP = ("deepseek_v3", "glm4_moe")
"""Families whose configs state their multi-token-prediction modules (``num_nextn_predict_layers``)."""


def read_hf_config(path: str | Path, *, seq_length: int | None = None, name: str | None = None) -> TransformerConfig:
    """A Hugging Face model's ``config.json`` (or a directory holding one) as a TransformerConfig.

    Args:
        path: the ``config.json`` file or its directory.
        seq_length: the training sequence length; default: the pre-training length the config
            states (``rope_scaling.original_max_position_embeddings``), else its maximum.
        name: the model name; default: the directory name.

    Returns:
        The config, with rope_theta, the norm epsilon, MoE and MLA fields as the file states them.

    Raises:
        InvalidProblemError: a missing or unreadable file, or an architecture outside
            ``SUPPORTED_MODEL_TYPES`` (the message lists them).
    """
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    if not file.is_file():
        raise InvalidProblemError(f"Hugging Face config {str(file)!r} does not exist; give the path of a config.json")
    try:
        raw = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InvalidProblemError(f"cannot read Hugging Face config {str(file)!r}: {e}") from None
    model_type = raw.get("model_type") if isinstance(raw, dict) else None
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise InvalidProblemError(
            f"Hugging Face config {str(file)!r}: model_type={model_type!r} "
            f"(architectures {raw.get('architectures') if isinstance(raw, dict) else None}) is not supported; "
            f"supported model_type values: {list(SUPPORTED_MODEL_TYPES)}; write a paraplan.transformer/v1 "
            "JSON for other decoders (docs/models-and-configs.md)"
        )
    try:
        from transformers import AutoConfig  # heavy (imports torch): only on this path
    except ImportError as e:
        raise InvalidProblemError(
            f"reading Hugging Face configs needs transformers ({e}); install it: pip install 'paraplan[hf]'"
        ) from None

    try:
        hf = AutoConfig.from_pretrained(str(file))
    except Exception as e:  # noqa: BLE001 - any failure to read the file is the file's (e.g. huggingface_hub's
        # StrictDataclassFieldValidationError for a field of the wrong type)
        raise InvalidProblemError(f"transformers rejected {str(file)!r}: {e}") from None
    _check_shape(hf, file)
    try:
        if model_type in GPT2_STYLE_TYPES:
            fields, stated, maximum = gpt2_style_fields(hf, model_type)
            fields["dtype"] = _dtype(hf)
        else:
            fields, stated, maximum = _fields(hf, model_type), _pretraining_length(hf), getattr(
                hf, "max_position_embeddings", None)
    except (TypeError, ValueError, ZeroDivisionError, AttributeError, KeyError) as e:
        raise InvalidProblemError(
            f"Hugging Face config {str(file)!r}: a field has a value of the wrong type or range ({type(e).__name__}: "
            f"{e}); fix the file, or write a paraplan.transformer/v1 JSON") from None
    fields["name"] = name or file.parent.name or model_type
    fields["seq_length"] = training_seq_length(
        asked=seq_length, stated=stated, maximum=maximum, source=f"Hugging Face config {str(file)!r}")
    _warn_unmodelled(hf, model_type)
    return build_config(fields)


_SHAPE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


def _check_shape(hf: Any, file: Path) -> None:
    """The shape every reader computes with: positive integers, named with the fix when not."""
    for name in _SHAPE_FIELDS:
        value = getattr(hf, name, None)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidProblemError(
                f"Hugging Face config {str(file)!r}: {name}={value!r} (or the family's own name for it, e.g. "
                f"n_embd, n_layer, n_head, d_model) must be a positive integer")


def _rope(hf: Any) -> tuple[float | None, dict[str, float | str] | None]:
    params = dict(getattr(hf, "rope_parameters", None) or {})
    theta = params.pop("rope_theta", None) or getattr(hf, "rope_theta", None)
    scaling = getattr(hf, "rope_scaling", None) if not params else params
    if scaling and scaling.get("rope_type", scaling.get("type")) in (None, "default"):
        scaling = None
    if scaling:
        scaling = {k: v for k, v in scaling.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
    return (float(theta) if theta is not None else None), (scaling or None)


def _pretraining_length(hf: Any) -> int | None:
    _, scaling = _rope(hf)
    value = (scaling or {}).get("original_max_position_embeddings")
    return int(value) if value is not None else None


def _experts(hf: Any) -> int | None:
    for key in ("n_routed_experts", "num_local_experts", "num_experts"):
        value = getattr(hf, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _dtype(hf: Any) -> str:
    dtype = getattr(hf, "dtype", None) or getattr(hf, "torch_dtype", None)
    return _DTYPES.get(str(dtype).removeprefix("torch."), "bf16")


def _mlp(hf: Any, model_type: str) -> str:
    """SwiGLU for SiLU-gated FFNs, GeGLU for GELU-gated ones (Gemma's ``hidden_activation``), a
    two-matrix GELU FFN for StarCoder 2."""
    act = str(getattr(hf, "hidden_activation", None) or getattr(hf, "hidden_act", "silu"))
    if model_type in _UNGATED:
        return "relu" if act == "relu" else "gelu"
    return "swiglu" if act in _SILU else "geglu"


def _fields(hf: Any, model_type: str) -> dict[str, Any]:
    h, heads = hf.hidden_size, hf.num_attention_heads
    theta, scaling = _rope(hf)
    attention_bias = bool(getattr(hf, "attention_bias", False))
    fields: dict[str, Any] = {
        "hidden_size": h,
        "num_layers": hf.num_hidden_layers,
        "num_heads": heads,
        "num_kv_heads": getattr(hf, "num_key_value_heads", None) or heads,
        "vocab_size": hf.vocab_size,
        "ffn_hidden_size": hf.intermediate_size,
        "mlp": _mlp(hf, model_type),
        "norm": "layernorm" if model_type in _LAYERNORM else "rmsnorm",
        "bias": (attention_bias and model_type == "gpt_oss") or bool(getattr(hf, "use_bias", False)),
        "qkv_bias": model_type in ("qwen2", "qwen2_moe") or bool(getattr(hf, "use_qkv_bias", False))
        or (attention_bias and model_type != "gpt_oss"),
        "qk_norm": model_type in _QK_NORM or bool(getattr(hf, "use_qk_norm", False)),
        "position_embedding": "rope",
        "parallel_block": model_type == "cohere" or bool(getattr(hf, "use_parallel_residual", False)),
        "tied_embeddings": bool(getattr(hf, "tie_word_embeddings", False)),
        "dtype": _dtype(hf),
        "rope_theta": theta,
        "rope_scaling": scaling,
        "norm_eps": getattr(hf, "rms_norm_eps", None) or getattr(hf, "layer_norm_eps", None)
        or getattr(hf, "norm_epsilon", None),
    }
    # transformers' attention modules take head_dim, else hidden_size // heads (floor) when it does not divide
    head_dim = getattr(hf, "head_dim", None) or h // heads
    if model_type not in _MLA and head_dim and head_dim * heads != h:
        fields["head_dim"] = head_dim
    fields.update(_window_fields(hf))
    experts = _experts(hf)
    if experts is not None:
        fields.update(_moe_fields(hf, model_type, experts))
    if model_type in _MLA:
        for key in ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            fields[key] = getattr(hf, key, None)
        fields["num_kv_heads"] = None
    if model_type in _MTP:  # DeepSeek-V3's and GLM-4.5's multi-token-prediction modules
        fields["mtp_layers"] = getattr(hf, "num_nextn_predict_layers", None) or 0
    return fields


def _window_fields(hf: Any) -> dict[str, Any]:
    """``sliding_window`` and ``global_attention_every`` from ``sliding_window`` and ``layer_types``
    (``sliding_attention`` / ``full_attention`` per layer; none: every layer windowed, Mistral).
    Qwen2/Qwen3 state a window they use only with ``use_sliding_window``."""
    window = getattr(hf, "sliding_window", None)
    if not window or not getattr(hf, "use_sliding_window", True):
        return {}
    types = list(getattr(hf, "layer_types", None) or [])
    windowed = [kind == "sliding_attention" for kind in types]
    if not any(windowed):
        return {} if types else {"sliding_window": int(window)}
    if all(windowed):
        return {"sliding_window": int(window)}
    every = windowed.index(False) + 1
    if any(w != ((i + 1) % every != 0) for i, w in enumerate(windowed)):
        raise InvalidProblemError(
            f"layer_types={types}: paraplan models one full-attention layer every k layers (layers k-1, 2k-1, ...; "
            f"Megatron --window-attn-skip-freq); this pattern is not periodic. Write a paraplan.transformer/v1 "
            f"config with sliding_window and global_attention_every closest to it"
        )
    return {"sliding_window": int(window), "global_attention_every": every}


def _moe_fields(hf: Any, model_type: str, experts: int) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "num_experts": experts,
        "experts_per_token": getattr(hf, "num_experts_per_tok", None) or getattr(hf, "experts_per_token", None),
        "moe_ffn_hidden_size": getattr(hf, "moe_intermediate_size", None),
        "num_shared_experts": getattr(hf, "n_shared_experts", None) or 0,
        "first_dense_layers": getattr(hf, "first_k_dense_replace", None) or 0,
    }
    if model_type == "qwen2_moe":
        fields["num_shared_experts"] = _shared_experts(hf, fields["moe_ffn_hidden_size"])
    if model_type == "granitemoeshared":  # experts as wide as intermediate_size, one shared MLP of its own width
        fields["num_shared_experts"] = _shared_experts(hf, hf.intermediate_size, "shared_intermediate_size")
    if model_type == "ernie4_5_moe":
        fields.update(_ernie_moe_fields(hf))
    if model_type == "glm4_moe":  # GLM-4.5: sigmoid scores with a selection bias, DeepSeek-V3's router
        fields.update({"router_score_function": "sigmoid", "router_expert_bias": True,
                       "router_topk_scaling_factor": getattr(hf, "routed_scaling_factor", None),
                       "router_num_groups": getattr(hf, "n_group", None),
                       "router_group_topk": getattr(hf, "topk_group", None)})
    if model_type in _MLA:
        fields.update(
            {
                "router_score_function": "sigmoid"
                if getattr(hf, "scoring_func", "softmax") == "sigmoid"
                else "softmax",
                "router_expert_bias": getattr(hf, "topk_method", None) == "noaux_tc",
                "router_topk_scaling_factor": getattr(hf, "routed_scaling_factor", None),
                "router_num_groups": getattr(hf, "n_group", None),
                "router_group_topk": getattr(hf, "topk_group", None),
            }
        )
    if model_type in ("qwen2_moe", "qwen3_moe"):
        dense = sorted(getattr(hf, "mlp_only_layers", None) or [])
        if getattr(hf, "decoder_sparse_step", 1) != 1 or dense != list(range(len(dense))):
            raise InvalidProblemError(
                f"Qwen MoE decoder_sparse_step={getattr(hf, 'decoder_sparse_step', 1)} / mlp_only_layers={dense}: "
                "paraplan models dense layers only as a prefix (first_dense_layers); use decoder_sparse_step 1 "
                "and mlp_only_layers [0, ..., k-1]"
            )
        fields["first_dense_layers"] = len(dense)
    return fields


def _ernie_moe_fields(hf: Any) -> dict[str, Any]:
    """ERNIE 4.5's MoE names: ``moe_num_experts``, ``moe_k``, ``moe_num_shared_experts``, and MoE layers
    from ``moe_layer_start_index`` to the last (dense layers only as a prefix, as paraplan models them)."""
    start, end = getattr(hf, "moe_layer_start_index", 0) or 0, getattr(hf, "moe_layer_end_index", None)
    interval = getattr(hf, "moe_layer_interval", 1) or 1
    if isinstance(start, (list, tuple)) or isinstance(end, (list, tuple)) or interval != 1 or \
            end not in (None, -1, hf.num_hidden_layers - 1):
        raise InvalidProblemError(
            f"ERNIE MoE moe_layer_start_index={start!r} / moe_layer_end_index={end!r} / moe_layer_interval={interval!r}: "
            "paraplan models dense layers only as a prefix (first_dense_layers); use interval 1 and MoE layers up to "
            f"the last ({hf.num_hidden_layers - 1})")
    return {"num_experts": getattr(hf, "moe_num_experts", None), "experts_per_token": getattr(hf, "moe_k", None),
            "num_shared_experts": getattr(hf, "moe_num_shared_experts", None) or 0, "first_dense_layers": int(start)}


def _shared_experts(hf: Any, expert_width: int | None, key: str = "shared_expert_intermediate_size") -> int:
    """A shared MLP of width ``key`` (Qwen2-MoE's ``shared_expert_intermediate_size``, Granite-MoE-shared's
    ``shared_intermediate_size``) as that many routed-expert widths (5,632 = 4 x 1,408: the same
    parameters and FLOPs); Qwen2-MoE's sigmoid gate on it (hidden_size parameters) is not counted."""
    width = getattr(hf, key, None) or 0
    if not width or not expert_width:
        return 0
    if width % expert_width:
        logger.warning("%s=%d is not a multiple of the expert width %d: costed as %d expert widths", key, width,
                       expert_width, -(-width // expert_width))
    return -(-width // expert_width)


def _warn_unmodelled(hf: Any, model_type: str) -> None:
    if model_type in ("gemma2", "gemma3_text"):
        logger.warning("%s: the post-attention and post-FFN norms (2 x hidden_size parameters per layer) and the "
                       "logit soft-capping are not modelled (memory-bound kernels of note only at small widths)",
                       model_type)
    if model_type == "gpt_oss":
        logger.warning("gpt-oss attention sinks are not modelled (one learned logit per head: no FLOP or memory of note)")
    if model_type == "glm4":
        logger.warning("glm4: the post-attention and post-FFN norms (2 x hidden_size parameters per layer) are not "
                       "modelled")
    if model_type == "llama" and getattr(hf, "attention_bias", False):
        logger.warning("Llama attention_bias=true: the Q/K/V biases are counted, the output-projection bias is not")
