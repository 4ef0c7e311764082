"""Validate Megatron-LM arguments with megatron-core's own classes (CPU, no CUDA extensions).

Megatron-LM's ``parse_args``/``validate_args`` live in the Megatron-LM repository
(``megatron/training/arguments.py``), which is not on PyPI; the ``megatron-core`` wheel holds the
classes those arguments end in. This helper maps each flag the exporter writes to its
megatron-core field the way Megatron-LM's ``core_transformer_config_from_args`` does (a flag with
no mapping fails the check: it is not a flag Megatron-LM has), then builds, with megatron-core:

- ``TransformerConfig`` or ``MLATransformerConfig`` (its ``__post_init__`` checks heads vs TP, GQA
  groups, MoE with TP needing sequence parallelism (a megatron-core warning, an assertion in
  Megatron-LM's ``validate_args``: raised here), expert sizes, the pipeline split incl.
  ``num_layers_in_first/last_pipeline_stage`` and the layout string, recompute combinations);
- ``DistributedDataParallelConfig`` (distributed optimizer, Megatron FSDP sharding strategy);
- ``RankGenerator`` for the dense and the expert groups exactly as ``initialize_model_parallel``
  builds them (world size divisible by t x p x c and by expert-TP x EP x p);
- ``ConstantNumMicroBatchesCalculator`` (global batch divisible by micro batch x data);
- ``RotaryEmbedding`` with the exported ``--rotary-base`` and RoPE scaling.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

_INT = {
    "--num-layers",
    "--hidden-size",
    "--ffn-hidden-size",
    "--num-attention-heads",
    "--num-query-groups",
    "--kv-channels",
    "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size",
    "--context-parallel-size",
    "--expert-model-parallel-size",
    "--expert-tensor-parallel-size",
    "--num-experts",
    "--moe-router-topk",
    "--moe-ffn-hidden-size",
    "--moe-shared-expert-intermediate-size",
    "--recompute-num-layers",
    "--q-lora-rank",
    "--kv-lora-rank",
    "--qk-head-dim",
    "--qk-pos-emb-head-dim",
    "--v-head-dim",
    "--moe-router-num-groups",
    "--moe-router-group-topk",
    "--cpu-offloading-num-layers",
    "--mtp-num-layers",
}
# Flags that are GPT-model or training arguments, not core-config fields: checked by type here.
_OTHER_INT = {
    "--seq-length",
    "--max-position-embeddings",
    "--vocab-size",
    "--micro-batch-size",
    "--global-batch-size",
    "--num-layers-per-virtual-pipeline-stage",
    "--num-virtual-stages-per-pipeline-rank",
    "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers",
}
_FLOAT = {
    "--norm-epsilon": "layernorm_epsilon",
    "--rotary-base": None,
    "--rope-scaling-factor": None,
    "--moe-expert-capacity-factor": "moe_expert_capacity_factor",
    "--rotary-scaling-factor": "rotary_scaling_factor",
    "--mscale": "mscale",
    "--mscale-all-dim": "mscale_all_dim",
    "--moe-router-topk-scaling-factor": "moe_router_topk_scaling_factor",
}
_STR = {
    "--normalization": "normalization",
    "--position-embedding-type": None,
    "--recompute-granularity": "recompute_granularity",
    "--recompute-method": "recompute_method",
    "--pipeline-model-parallel-layout": "pipeline_model_parallel_layout",
    "--moe-layer-freq": "moe_layer_freq",
    "--moe-token-dispatcher-type": "moe_token_dispatcher_type",
    "--moe-flex-dispatcher-backend": "moe_flex_dispatcher_backend",
    "--data-parallel-sharding-strategy": None,
    "--rope-type": "rope_type",
    "--moe-router-score-function": "moe_router_score_function",
}
_LIST = {"--recompute-modules": "recompute_modules"}
_BOOL = {
    "--moe-grouped-gemm",
    "--sequence-parallel",
    "--group-query-attention",
    "--swiglu",
    "--untie-embeddings-and-output-weights",
    "--disable-bias-linear",
    "--add-qkv-bias",
    "--qk-layernorm",
    "--multi-latent-attention",
    "--use-rope-scaling",
    "--use-distributed-optimizer",
    "--use-megatron-fsdp",
    "--bf16",
    "--fp16",
    "--moe-router-enable-expert-bias",
    "--cpu-offloading",
}


_WINDOW = {"--window-size": "window_size", "--window-attn-skip-freq": "window_attn_skip_freq"}
"""Megatron-LM's ``tuple_type`` (LEFT,RIGHT) and ``moe_freq_type`` (an integer here) arguments."""


def parse(argv: list[str]) -> dict[str, Any]:
    """Flag -> typed value; raises AssertionError on a flag Megatron-LM does not have."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        flag = argv[i]
        assert flag.startswith("--"), f"stray value {flag!r}"
        if flag in _BOOL:
            out[flag], i = True, i + 1
            continue
        if flag in _LIST:  # nargs="*": the values up to the next flag
            j = i + 1
            while j < len(argv) and not argv[j].startswith("--"):
                j += 1
            out[flag], i = argv[i + 1:j], j
            continue
        if flag in _WINDOW:
            value = argv[i + 1]
            out[flag] = tuple(int(x) for x in value.strip("()").split(",")) if flag == "--window-size" else int(value)
            i += 2
            continue
        assert flag in _INT | _OTHER_INT or flag in _FLOAT or flag in _STR, f"{flag} is not a Megatron-LM flag"
        value = argv[i + 1]
        out[flag] = int(value) if flag in _INT | _OTHER_INT else float(value) if flag in _FLOAT else value
        i += 2
    return out


def _moe_layer_freq(text: str) -> int | list[int]:
    assert not re.search(r"[^,\d\[\]\(\)\+\*]", text), text  # Megatron's own character check
    return eval(text)  # noqa: S307 - Megatron-LM evaluates the same restricted pattern


def transformer_kwargs(a: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    kw: dict[str, Any] = {
        "num_layers": a["--num-layers"],
        "hidden_size": a["--hidden-size"],
        "num_attention_heads": a["--num-attention-heads"],
        "use_cpu_initialization": True,
    }
    for flag in _INT - {"--num-layers", "--hidden-size", "--num-attention-heads", "--num-experts"}:
        if flag in a and not flag.startswith("--recompute"):
            kw[flag[2:].replace("-", "_")] = a[flag]
    kw.pop("num_query_groups", None)
    if a.get("--group-query-attention"):
        kw["num_query_groups"] = a["--num-query-groups"]
    if "--recompute-num-layers" in a:
        kw["recompute_num_layers"] = a["--recompute-num-layers"]
    kw["num_moe_experts"] = a.get("--num-experts")
    for flag, field in {**_FLOAT, **_STR}.items():
        if field and flag in a:
            kw[field] = a[flag]
    if "moe_layer_freq" in kw:
        kw["moe_layer_freq"] = _moe_layer_freq(kw["moe_layer_freq"])
    if a.get("--swiglu"):
        kw.update(gated_linear_unit=True, activation_func=F.silu, bias_activation_fusion=False)
    kw["add_bias_linear"] = not a.get("--disable-bias-linear", False)
    kw["add_qkv_bias"] = a.get("--add-qkv-bias", False)
    kw["qk_layernorm"] = a.get("--qk-layernorm", False)
    kw["moe_router_enable_expert_bias"] = a.get("--moe-router-enable-expert-bias", False)
    kw["sequence_parallel"] = a.get("--sequence-parallel", False)
    kw["moe_grouped_gemm"] = a.get("--moe-grouped-gemm", False)
    kw["cpu_offloading"] = a.get("--cpu-offloading", False)
    for flag, field in _WINDOW.items():
        if flag in a:
            kw[field] = a[flag]
    if "--recompute-modules" in a:
        kw["recompute_modules"] = a["--recompute-modules"]
    kw["num_layers_in_first_pipeline_stage"] = a.get("--decoder-first-pipeline-num-layers")
    kw["num_layers_in_last_pipeline_stage"] = a.get("--decoder-last-pipeline-num-layers")
    kw["virtual_pipeline_model_parallel_size"] = _virtual_size(a)
    if a.get("--bf16"):
        kw.update(bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16)
    if a.get("--fp16"):
        kw.update(fp16=True, params_dtype=torch.float16, pipeline_dtype=torch.float16)
    if a.get("--multi-latent-attention") and "--rotary-base" in a:
        kw["rotary_base"] = a["--rotary-base"]
    return kw


def _virtual_size(a: dict[str, Any]) -> int | None:
    p = a["--pipeline-model-parallel-size"]
    if "--num-layers-per-virtual-pipeline-stage" in a:
        per = a["--num-layers-per-virtual-pipeline-stage"]
        assert a["--num-layers"] % (p * per) == 0, "num layers not divisible by p x layers per virtual stage"
        return a["--num-layers"] // (p * per)
    if "--num-virtual-stages-per-pipeline-rank" in a:
        return a["--num-virtual-stages-per-pipeline-rank"]
    layout = a.get("--pipeline-model-parallel-layout")
    if layout is not None and layout.count("|") + 1 > p:
        return (layout.count("|") + 1) // p
    return None


def validate(argv: list[str], *, world_size: int) -> dict[str, Any]:
    """Build every megatron-core object the arguments configure; return them by name."""
    warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex are not installed.*")
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.core.parallel_state import RankGenerator
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    a = parse(argv)
    t, p = a["--tensor-model-parallel-size"], a["--pipeline-model-parallel-size"]
    c, e = a.get("--context-parallel-size", 1), a.get("--expert-model-parallel-size", 1)
    etp = a.get("--expert-tensor-parallel-size", t)
    assert world_size % (t * p * c) == 0, f"world size {world_size} not divisible by t x p x c = {t * p * c}"
    d = world_size // (t * p * c)
    dense = RankGenerator(tp=t, ep=1, dp=d, pp=p, cp=c, order="tp-cp-ep-dp-pp")
    assert world_size % (etp * e * p) == 0, f"world size {world_size} not divisible by etp x ep x pp = {etp * e * p}"
    expert = RankGenerator(tp=etp, ep=e, dp=world_size // (etp * e * p), pp=p, cp=1, order="tp-cp-ep-dp-pp")
    assert dense.get_ranks("pp") == expert.get_ranks("pp")
    out: dict[str, Any] = {"data_parallel_size": d}
    if "--micro-batch-size" in a:
        out["microbatches"] = ConstantNumMicroBatchesCalculator(
            a["--global-batch-size"], a["--micro-batch-size"], d, decrease_batch_size_if_needed=False, rank=0
        )
    if "--num-layers" in a:
        cls = MLATransformerConfig if a.get("--multi-latent-attention") else TransformerConfig
        with warnings.catch_warnings():
            # megatron-core only warns here; Megatron-LM's validate_args asserts it for MoE + TP
            warnings.filterwarnings("error", message=".*sequence parallelism must be used.*")
            out["transformer"] = cls(**transformer_kwargs(a))
        out["rope"] = _rotary(a, out["transformer"])
    out["ddp"] = DistributedDataParallelConfig(
        use_distributed_optimizer=a.get("--use-distributed-optimizer", False),
        use_megatron_fsdp=a.get("--use-megatron-fsdp", False),
        data_parallel_sharding_strategy=a.get("--data-parallel-sharding-strategy", "no_shard"),
    )
    return out


def _rotary(a: dict[str, Any], config: Any) -> Any:
    if a.get("--position-embedding-type") != "rope" or a.get("--multi-latent-attention"):
        return None
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    return RotaryEmbedding(
        kv_channels=config.kv_channels,
        rotary_percent=1.0,
        rotary_base=int(a.get("--rotary-base", 10000)),
        use_cpu_initialization=True,
        rope_scaling=a.get("--use-rope-scaling", False),
        rope_scaling_factor=a.get("--rope-scaling-factor", 8.0),
    )
