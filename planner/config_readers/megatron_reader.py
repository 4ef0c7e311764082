"""Megatron-LM command-line arguments -> TransformerConfig.

Megatron-LM's own parser (``megatron/training/arguments.py``) ships only with the Megatron-LM
repository, not with the ``megatron-core`` wheel, so this reader declares the model-shape flags
with Megatron's names, types and defaults (argparse, unknown flags skipped) and maps them the way
Megatron's ``core_transformer_config_from_args`` does (``--num-experts`` -> experts, ``--swiglu`` ->
gated SiLU, ``--norm-epsilon``, ``--rotary-base``...). The input is a file holding the arguments as
in a launch script: ``#`` comments and ``\\`` line continuations are allowed, other flags
(parallel sizes, data, optimizer) are ignored. ``paraplan export --format megatron`` writes such a
file, and reading it back gives the same model (tests/planner/test_config_readers.py).
"""

from __future__ import annotations

import argparse
import logging
import re
import shlex
from pathlib import Path
from typing import NoReturn

from planner.config_readers.common import build_config, training_seq_length
from planner.errors import InvalidProblemError
from planner.schema import TransformerConfig

logger = logging.getLogger(__name__)

_DENSE_PREFIX_RE = re.compile(r"^\(?\[0\]\*(\d+)\s*\+\s*\[1\]\*(\d+)\)?$")


class _Parser(argparse.ArgumentParser):
    """Megatron-LM's flags, whose parse errors become ``InvalidProblemError`` (exit 2, the flag named)."""

    def error(self, message: str) -> NoReturn:
        raise InvalidProblemError(f"Megatron-LM arguments: {message} (a negative value takes --flag=VALUE, "
                                  f"e.g. --window-size=-1,0)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(add_help=False, allow_abbrev=False)
    for flag in (
        "--num-layers",
        "--hidden-size",
        "--ffn-hidden-size",
        "--num-attention-heads",
        "--num-query-groups",
        "--kv-channels",
        "--seq-length",
        "--max-position-embeddings",
        "--vocab-size",
        "--num-experts",
        "--moe-router-topk",
        "--moe-ffn-hidden-size",
        "--moe-shared-expert-intermediate-size",
        "--q-lora-rank",
        "--kv-lora-rank",
        "--qk-head-dim",
        "--qk-pos-emb-head-dim",
        "--v-head-dim",
        "--moe-router-num-groups",
        "--moe-router-group-topk",
        "--mtp-num-layers",
    ):
        p.add_argument(flag, type=int)
    for flag in (
        "--rotary-base",
        "--norm-epsilon",
        "--moe-expert-capacity-factor",
        "--rope-scaling-factor",
        "--rotary-scaling-factor",
        "--mscale",
        "--mscale-all-dim",
        "--moe-router-topk-scaling-factor",
    ):
        p.add_argument(flag, type=float)
    for flag in (
        "--group-query-attention",
        "--swiglu",
        "--untie-embeddings-and-output-weights",
        "--disable-bias-linear",
        "--add-qkv-bias",
        "--qk-layernorm",
        "--multi-latent-attention",
        "--use-rope-scaling",
        "--bf16",
        "--fp16",
        "--moe-router-enable-expert-bias",
    ):
        p.add_argument(flag, action="store_true")
    p.add_argument("--normalization", default="LayerNorm")
    p.add_argument("--position-embedding-type", default="learned_absolute")
    p.add_argument("--moe-layer-freq", default="1")
    p.add_argument("--rope-type")
    p.add_argument("--moe-router-score-function", default="softmax")
    p.add_argument("--window-size")
    p.add_argument("--window-attn-skip-freq")
    return p


def read_megatron_args(
    path: str | Path, *, seq_length: int | None = None, name: str | None = None
) -> TransformerConfig:
    """The model a Megatron-LM argument file describes.

    Args:
        path: a text file of Megatron-LM arguments (a launch script's flags).
        seq_length: overrides ``--seq-length``.
        name: the model name; default: the file's stem.

    Raises:
        InvalidProblemError: a missing file, a missing required flag (named), or a
            ``--moe-layer-freq`` that is not a dense prefix.
    """
    file = Path(path)
    if not file.is_file():
        raise InvalidProblemError(f"Megatron-LM argument file {str(file)!r} does not exist")
    text = "\n".join(line.split("#", 1)[0] for line in file.read_text().splitlines()).replace("\\\n", " ")
    args, unknown = _parser().parse_known_args(shlex.split(text))
    missing = [
        f for f in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size") if getattr(args, f) is None
    ]
    if missing:
        raise InvalidProblemError(
            f"Megatron-LM arguments {str(file)!r} lack {['--' + m.replace('_', '-') for m in missing]}; "
            "add them (--vocab-size: the padded vocabulary the tokenizer gives)"
        )
    logger.info("Megatron-LM arguments: %d tokens not about the model shape ignored", len(unknown))
    fields = {
        "name": name or file.stem,
        "hidden_size": args.hidden_size,
        "num_layers": args.num_layers,
        "num_heads": args.num_attention_heads,
        "vocab_size": args.vocab_size,
        "ffn_hidden_size": args.ffn_hidden_size,
        "num_kv_heads": args.num_query_groups if args.group_query_attention else None,
        "head_dim": _head_dim(args),
        "mlp": "swiglu" if args.swiglu else "gelu",
        "norm": "rmsnorm" if args.normalization == "RMSNorm" else "layernorm",
        "bias": not args.disable_bias_linear,
        "qkv_bias": args.add_qkv_bias and args.disable_bias_linear,
        "qk_norm": args.qk_layernorm,
        "position_embedding": "rope" if args.position_embedding_type == "rope" else "learned",
        "tied_embeddings": not args.untie_embeddings_and_output_weights,
        "dtype": "bf16" if args.bf16 else ("fp16" if args.fp16 else "fp32"),
        "rope_theta": args.rotary_base,
        "norm_eps": args.norm_epsilon,
        "rope_scaling": _rope_scaling(args),
        "mtp_layers": args.mtp_num_layers or 0,
    }
    fields.update(_moe_fields(args))
    fields.update(_window_fields(args))
    if args.multi_latent_attention:
        fields.update(
            {
                "kv_lora_rank": args.kv_lora_rank,
                "q_lora_rank": args.q_lora_rank,
                "qk_nope_head_dim": args.qk_head_dim,
                "qk_rope_head_dim": args.qk_pos_emb_head_dim,
                "v_head_dim": args.v_head_dim,
            }
        )
    fields["seq_length"] = training_seq_length(
        asked=seq_length,
        stated=args.seq_length,
        maximum=args.max_position_embeddings,
        source=f"Megatron-LM arguments {str(file)!r}",
        stated_what="its --seq-length",
    )
    return build_config(fields)


def _rope_scaling(args: argparse.Namespace) -> dict[str, float | str] | None:
    if args.use_rope_scaling:
        return {"rope_type": "llama3", "factor": args.rope_scaling_factor or 8.0}
    if args.multi_latent_attention and args.rope_type == "yarn":
        out: dict[str, float | str] = {"rope_type": "yarn", "factor": args.rotary_scaling_factor or 1.0}
        out.update(
            {k: v for k, v in (("mscale", args.mscale), ("mscale_all_dim", args.mscale_all_dim)) if v is not None}
        )
        return out
    return None


def _window_fields(args: argparse.Namespace) -> dict[str, object]:
    """``--window-size LEFT,RIGHT`` (a causal window: RIGHT 0) -> ``sliding_window`` LEFT + 1;
    ``--window-attn-skip-freq N`` (one full-attention layer every N) -> ``global_attention_every``."""
    if args.window_size is None:
        if args.window_attn_skip_freq is not None:
            raise InvalidProblemError(f"--window-attn-skip-freq {args.window_attn_skip_freq} needs --window-size")
        return {}
    parts = str(args.window_size).strip("()[] ").split(",")
    try:
        left, right = (int(x) for x in parts)
    except ValueError:
        raise InvalidProblemError(f"--window-size {args.window_size!r}: write LEFT,RIGHT, e.g. 127,0") from None
    if left == -1 and right in (-1, 0):  # Megatron's "infinite" window: full (causal) attention
        return {}
    if right != 0 or left < 0:
        raise InvalidProblemError(f"--window-size {args.window_size!r}: paraplan models causal windows only "
                                  f"(RIGHT 0, LEFT >= 0; -1,0 is full attention)")
    fields: dict[str, object] = {"sliding_window": left + 1}
    if args.window_attn_skip_freq is not None:
        try:
            fields["global_attention_every"] = int(args.window_attn_skip_freq)
        except ValueError:
            raise InvalidProblemError(
                f"--window-attn-skip-freq {args.window_attn_skip_freq!r}: paraplan models one full-attention layer "
                f"every N layers; write an integer N") from None
    return fields


def _head_dim(args: argparse.Namespace) -> int | None:
    if args.kv_channels is None or args.multi_latent_attention:
        return None
    return None if args.kv_channels * args.num_attention_heads == args.hidden_size else args.kv_channels


def _moe_fields(args: argparse.Namespace) -> dict[str, object]:
    if not args.num_experts:
        return {}
    freq = str(args.moe_layer_freq).replace(" ", "")
    match = _DENSE_PREFIX_RE.match(freq)
    if freq == "1":
        dense = 0
    elif match and int(match.group(1)) + int(match.group(2)) == args.num_layers:
        dense = int(match.group(1))
    else:
        raise InvalidProblemError(
            f"--moe-layer-freq {args.moe_layer_freq!r}: paraplan models dense layers as a prefix only; "
            f"write 1 or '([0]*k+[1]*{args.num_layers}-k)'"
        )
    width = args.moe_ffn_hidden_size or args.ffn_hidden_size
    shared = args.moe_shared_expert_intermediate_size or 0
    if width and shared % width:
        raise InvalidProblemError(
            f"--moe-shared-expert-intermediate-size {shared} is not a multiple of the expert width {width}"
        )
    return {
        "num_experts": args.num_experts,
        "experts_per_token": args.moe_router_topk or 2,
        "moe_ffn_hidden_size": None if args.moe_ffn_hidden_size == args.ffn_hidden_size else args.moe_ffn_hidden_size,
        "first_dense_layers": dense,
        "num_shared_experts": shared // width if width else 0,
        "capacity_factor": args.moe_expert_capacity_factor,
        "router_score_function": args.moe_router_score_function,
        "router_expert_bias": args.moe_router_enable_expert_bias,
        "router_topk_scaling_factor": args.moe_router_topk_scaling_factor,
        "router_num_groups": args.moe_router_num_groups,
        "router_group_topk": args.moe_router_group_topk,
    }
