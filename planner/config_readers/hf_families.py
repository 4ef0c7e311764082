"""Hugging Face decoders outside the Llama layout: GPT-2, StarCoder 1 (``gpt_bigcode``), OPT, BLOOM,
MPT, GPT-NeoX / Pythia, GPT-J, Falcon and Phi-2, read from transformers' configuration classes.

Each reader maps the family's own attribute names (``n_embd``, ``ffn_dim``, ``expansion_ratio``,
``use_parallel_residual``, ``parallel_attn``, ``alibi``, ...) onto a TransformerConfig's fields. What
the schema does not carry, and costs nothing of note, is logged once (docs/models-and-configs.md,
"Hugging Face configs": partial rotary dimensions, OPT's projection of the embeddings, BLOOM's
embedding LayerNorm).
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

GPT2_STYLE_TYPES = ("bloom", "falcon", "gpt2", "gpt_bigcode", "gpt_neox", "gptj", "mpt", "opt", "phi")
"""The model_type values this module reads."""
_RELU = ("relu",)


def _mlp(act: object) -> str:
    return "relu" if str(act) in _RELU else "gelu"


def _common(hf: Any) -> dict[str, Any]:
    heads = hf.num_attention_heads
    return {
        "hidden_size": hf.hidden_size,
        "num_layers": hf.num_hidden_layers,
        "num_heads": heads,
        "num_kv_heads": heads,
        "vocab_size": hf.vocab_size,
        "norm": "layernorm",
        "bias": True,
        "tied_embeddings": bool(getattr(hf, "tie_word_embeddings", True)),
    }


def gpt2_style_fields(hf: Any, model_type: str) -> tuple[dict[str, Any], int | None, int | None]:
    """(fields, stated training length, maximum context) of a GPT-2-style config."""
    fields = _common(hf)
    reader = _READERS[model_type]
    stated, maximum = reader(hf, fields)
    return fields, stated, maximum


def _gpt2(hf: Any, fields: dict[str, Any]) -> tuple[int | None, int | None]:
    """GPT-2 (Radford et al. 2019) and StarCoder 1: learned positions, GELU, LayerNorm, biases, tied
    embeddings; ``n_inner`` None means 4 x hidden. ``multi_query`` (gpt_bigcode): one K/V head."""
    fields.update({"ffn_hidden_size": getattr(hf, "n_inner", None) or 4 * hf.hidden_size, "mlp": "gelu",
                   "position_embedding": "learned", "norm_eps": getattr(hf, "layer_norm_epsilon", None)})
    if getattr(hf, "multi_query", False):
        fields["num_kv_heads"] = 1
    return None, getattr(hf, "n_positions", None)


def _opt(hf: Any, fields: dict[str, Any]) -> tuple[int | None, int | None]:
    """OPT (Zhang et al. 2022): ReLU FFN of ``ffn_dim``, learned positions, biases (``enable_bias``)."""
    fields.update({"ffn_hidden_size": hf.ffn_dim, "mlp": _mlp(getattr(hf, "activation_function", "relu")),
                   "position_embedding": "learned", "bias": bool(getattr(hf, "enable_bias", True))})
    if getattr(hf, "word_embed_proj_dim", hf.hidden_size) != hf.hidden_size:
        logger.warning("OPT word_embed_proj_dim=%s: the projections in and out of the embedding width are not "
                       "modelled (the embedding is costed at hidden_size)", hf.word_embed_proj_dim)
    if not getattr(hf, "do_layer_norm_before", True):
        logger.warning("OPT do_layer_norm_before=false (post-norm): costed as the pre-norm block (same kernels)")
    return None, getattr(hf, "max_position_embeddings", None)


def _bloom(hf: Any, fields: dict[str, Any]) -> tuple[int | None, int | None]:
    """BLOOM (BigScience 2022): ALiBi, GELU FFN of 4 x hidden, LayerNorm, biases, tied embeddings."""
    fields.update({"ffn_hidden_size": 4 * hf.hidden_size, "mlp": "gelu", "position_embedding": "alibi",
                   "norm_eps": getattr(hf, "layer_norm_epsilon", None)})
    logger.warning("BLOOM's LayerNorm after the word embedding is not modelled (2 x hidden_size parameters)")
    return getattr(hf, "seq_length", None), None


def _mpt(hf: Any, fields: dict[str, Any]) -> tuple[int | None, int | None]:
    """MPT (MosaicML 2023): ``expansion_ratio`` x d_model GELU FFN, ALiBi (``attn_config.alibi``) or
    learned positions, ``no_bias`` for every linear and LayerNorm, tied embeddings."""
    attn = getattr(hf, "attn_config", None)
    attn = attn if isinstance(attn, dict) else (attn.to_dict() if hasattr(attn, "to_dict") else {})
    alibi = bool(attn.get("alibi", False))
    fields.update({"ffn_hidden_size": int(getattr(hf, "expansion_ratio", 4) * hf.hidden_size), "mlp": "gelu",
                   "position_embedding": "alibi" if alibi else "learned",
                   "bias": not bool(getattr(hf, "no_bias", False)),
                   "num_kv_heads": attn.get("kv_n_heads") or hf.num_attention_heads})
    return None, getattr(hf, "max_seq_len", None)


def _neox(hf: Any, fields: dict[str, Any]) -> tuple[int | None, int | None]:
    """GPT-NeoX-20B and Pythia (Black et al. 2022): parallel residual (``use_parallel_residual``),
    rotary on ``rotary_pct`` of each head, GELU, LayerNorm, biases, untied embeddings."""
    fields.update({"ffn_hidden_size": hf.intermediate_size, "mlp": _mlp(getattr(hf, "hidden_act", "gelu")),
                   "position_embedding": "rope", "parallel_block": bool(getattr(hf, "use_parallel_residual", True)),
                   "rope_theta": _rope_base(hf, "rotary_emb_base"), "norm_eps": getattr(hf, "layer_norm_eps", None),
                   "bias": bool(getattr(hf, "attention_bias", True))})
    _partial_rotary(getattr(hf, "rotary_pct", 1.0))
    return None, getattr(hf, "max_position_embeddings", None)


def _gptj(hf: Any, fields: dict[str, Any]) -> tuple[int | None, int | None]:
    """GPT-J (Wang and Komatsuzaki 2021): parallel block, rotary on ``rotary_dim`` of each head,
    GELU FFN of 4 x hidden, LayerNorm, untied embeddings (its Q/K/V and output projections have
    no biases; counted with them, 4 x hidden_size per layer)."""
    fields.update({"ffn_hidden_size": getattr(hf, "n_inner", None) or 4 * hf.hidden_size, "mlp": "gelu",
                   "position_embedding": "rope", "parallel_block": True,
                   "norm_eps": getattr(hf, "layer_norm_epsilon", None)})
    rotary = getattr(hf, "rotary_dim", None)
    _partial_rotary(rotary / (hf.hidden_size // hf.num_attention_heads) if rotary else 1.0)
    return None, getattr(hf, "n_positions", None)


def _falcon(hf: Any, fields: dict[str, Any]) -> tuple[int | None, int | None]:
    """Falcon (Almazrouei et al. 2023): parallel attention and MLP (``parallel_attn``), multi-query
    (``multi_query``: one K/V head) or grouped K/V (``new_decoder_architecture``: ``num_kv_heads``),
    rotary or ALiBi, GELU FFN (``ffn_hidden_size``, default 4 x hidden), LayerNorm, no linear biases."""
    if getattr(hf, "new_decoder_architecture", False):
        kv = getattr(hf, "num_kv_heads", None) or hf.num_attention_heads
    else:
        kv = 1 if getattr(hf, "multi_query", True) else hf.num_attention_heads
    fields.update({"ffn_hidden_size": getattr(hf, "ffn_hidden_size", None) or 4 * hf.hidden_size,
                   "mlp": _mlp(getattr(hf, "activation", "gelu")), "num_kv_heads": kv,
                   "position_embedding": "alibi" if getattr(hf, "alibi", False) else "rope",
                   "parallel_block": bool(getattr(hf, "parallel_attn", True)) or bool(
                       getattr(hf, "new_decoder_architecture", False)),
                   "bias": bool(getattr(hf, "bias", False)), "rope_theta": _rope_base(hf, "rope_theta"),
                   "norm_eps": getattr(hf, "layer_norm_epsilon", None)})
    return None, getattr(hf, "max_position_embeddings", None)


def _phi(hf: Any, fields: dict[str, Any]) -> tuple[int | None, int | None]:
    """Phi-1.5 / Phi-2 (Microsoft 2023): parallel block, partial rotary, GELU, LayerNorm, biases."""
    fields.update({"ffn_hidden_size": hf.intermediate_size, "mlp": _mlp(getattr(hf, "hidden_act", "gelu")),
                   "num_kv_heads": getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads,
                   "position_embedding": "rope", "parallel_block": True, "rope_theta": _rope_base(hf, "rope_theta"),
                   "norm_eps": getattr(hf, "layer_norm_eps", None)})
    _partial_rotary(getattr(hf, "partial_rotary_factor", 1.0))
    return None, getattr(hf, "max_position_embeddings", None)


def _rope_base(hf: Any, key: str) -> float | None:
    params = getattr(hf, "rope_parameters", None) or {}
    value = params.get("rope_theta") if isinstance(params, dict) else None
    value = value if value is not None else getattr(hf, key, None)
    return float(value) if value is not None else None


def _partial_rotary(fraction: float) -> None:
    if fraction and fraction < 1.0:
        logger.warning("rotary embedding on %.0f %% of each head's dimensions: costed on all of them "
                       "(an elementwise kernel; no parameters)", 100 * fraction)


_READERS = {"gpt2": _gpt2, "gpt_bigcode": _gpt2, "opt": _opt, "bloom": _bloom, "mpt": _mpt, "gpt_neox": _neox,
            "gptj": _gptj, "falcon": _falcon, "phi": _phi}
