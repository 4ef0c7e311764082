"""A plan as torchtitan command-line arguments (torchtitan 0.3: ``--module``/``--config`` pick a
``config_registry`` function building a ``Trainer.Config``; ``--parallelism.*``, ``--training.*``
and the ``activation-checkpoint:*`` subcommand override it; ``torchtitan/config/manager.py``).

What is written: the registry function of the plan's model (matched by shape against the presets
that torchtitan ships), data-parallel replicate/shard degrees from ``zero_stage``, tensor (with
sequence parallelism), context, expert and pipeline degrees, the schedule name (a built-in torch
schedule, or the plan's own order as a compute_only CSV through ``pipeline_parallel_schedule_csv``),
the pipeline microbatch size, the local and global batch sizes and the sequence length, the
modules of every virtual stage (``module_fqns_per_model_part``), and activation checkpointing as
far as torchtitan expresses it. What it cannot express is kept as a warning.
tests/planner/test_export_torchtitan.py loads every export with torchtitan's ``ConfigManager``.
"""

from __future__ import annotations

import logging
import shlex
from dataclasses import dataclass, field

from cost_models.compute import compute_constants
from planner.errors import InvalidProblemError
from planner.schema import Plan, TransformerConfig, recompute_modules_of

logger = logging.getLogger(__name__)
_OP_LEVEL = {"layernorm", "moe_act"}
"""Megatron-Core modules whose recompute torchtitan's op-level selective checkpointing also does
(it recomputes the non-matmul ops: norms and activation functions)."""

# paraplan preset -> (torchtitan module, config_registry function, model flavor); the shapes are
# checked against torchtitan's model registry in tests/planner/test_export_torchtitan.py.
TORCHTITAN_CONFIGS = {
    "llama3-8b": ("llama3", "llama3_8b", "8B"),
    "llama3-70b": ("llama3", "llama3_70b", "70B"),
    "llama3-405b": ("llama3", "llama3_405b", "405B"),
    "qwen3-32b": ("qwen3", "qwen3_32b", "32B"),
    "qwen3-30b-a3b": ("qwen3", "qwen3_30b_a3b", "30B-A3B"),
    "deepseek-v3": ("deepseek_v3", "deepseek_v3_671b", "671B"),
    "gpt-oss-20b": ("gpt_oss", "gpt_oss_20b", "20b"),
    "gpt-oss-120b": ("gpt_oss", "gpt_oss_120b", "120b"),
}
_BUILTIN_SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved-1f1b": "Interleaved1F1B",
                      "zb-v": "ZBVZeroBubble", "dualpipe-v": "DualPipeV"}
"""torch schedule classes torchtitan builds by name (``get_schedule_class``); for the two V schedules
it places stage r and 2p - 1 - r on pipeline rank r, the plan's placement, and takes
``module_fqns_per_model_part`` in stage (model) order."""
_SHAPE_FIELDS = (
    "hidden_size",
    "num_layers",
    "num_heads",
    "kv_heads",
    "ffn_size",
    "vocab_size",
    "num_experts",
    "experts_per_token",
    "moe_ffn_hidden_size",
    "num_shared_experts",
    "kv_lora_rank",
    "head_size",
)


@dataclass
class _Export:
    flags: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def add(self, flag: str, *values: object) -> None:
        self.flags += [flag, *(str(v) for v in values)]


def to_torchtitan_args(plan: Plan, *, schedule_csv_path: str = "schedule.csv") -> list[str]:
    """torchtitan arguments for a plan (an argv list for ``torchtitan/train.py``).

    Args:
        plan: the plan; it needs ``plan.transformer`` (the model) and a transformer profile
            (embedding, decoders, head).
        schedule_csv_path: where the plan's schedule CSV will be (``--format torch-csv``), named in
            the arguments when the schedule is not a torch built-in.

    Raises:
        InvalidProblemError: a plan without a transformer, or a model torchtitan has no config for.
    """
    export = _export(plan, schedule_csv_path)
    for warning in export.warnings:
        logger.warning("torchtitan export: %s", warning)
    return export.flags


def torchtitan_args_text(plan: Plan, *, schedule_csv_path: str = "schedule.csv") -> str:
    """The arguments one per line with ``\\`` continuations, warnings as ``#`` comments."""
    export = _export(plan, schedule_csv_path)
    d = plan.degrees
    lines = [
        f"# paraplan plan ({plan.solver}, schedule {plan.schedule}) for torchtitan: launch on "
        f"{d.data * d.tensor * d.pipeline * d.context} GPUs (torchrun ... -m torchtitan.train)"
    ]
    lines += [f"# WARNING: {w}" for w in export.warnings]
    groups: list[list[str]] = []
    for token in export.flags:
        if token.startswith("-") or token.startswith("activation-checkpoint:") or not groups:
            groups.append([token])
        else:
            groups[-1].append(token)
    body = [" ".join(shlex.quote(t) for t in g) for g in groups]
    lines += [f"{line} \\" for line in body[:-1]] + body[-1:]
    return "\n".join(lines) + "\n"


def _export(plan: Plan, schedule_csv_path: str) -> _Export:
    cfg = plan.transformer
    if cfg is None:
        raise InvalidProblemError(
            f"profile {plan.model.name!r} is not a transformer config; torchtitan builds its models from "
            "config_registry functions: plan a transformer (preset, hf: or torchtitan: model) to export it"
        )
    export = _Export()
    module, config, _ = _registry_entry(cfg)
    export.add("--module", module)
    export.add("--config", config)
    _parallel(plan, export)
    _pipeline(plan, export, schedule_csv_path)
    d = plan.degrees
    export.add("--training.local-batch-size", plan.microbatch_size * plan.num_microbatches)
    export.add("--training.global-batch-size", plan.global_batch_size)
    export.add("--training.seq-len", cfg.seq_length)
    if d.pipeline > 1 or d.expert > 1:
        # torchtitan's config check: CUDA graphs support neither pipelining nor the default EP dispatcher
        export.flags.append("--training.disable-cuda-graphs")
    if plan.global_batch_size != plan.microbatch_size * plan.num_microbatches * d.data:
        export.warnings.append(
            "global_batch_size differs from microbatch_size x num_microbatches x data; torchtitan "
            "accumulates gradients over the difference"
        )
    _activation_checkpoint(plan, export)
    if cfg.mtp_layers:
        export.warnings.append(
            f"mtp_layers={cfg.mtp_layers}: torchtitan's models have no multi-token-prediction module; the run "
            "trains without it, faster than the plan (which costs it on the last stage) predicts")
    return export


def _registry_entry(cfg: TransformerConfig) -> tuple[str, str, str]:
    from cost_models.models import model_preset

    shape = tuple(getattr(cfg, f) for f in _SHAPE_FIELDS)
    for preset, entry in TORCHTITAN_CONFIGS.items():
        if tuple(getattr(model_preset(preset), f) for f in _SHAPE_FIELDS) == shape:
            return entry
    raise InvalidProblemError(
        f"torchtitan ships no config_registry function for the shape of {cfg.name!r}; paraplan exports "
        f"{sorted(TORCHTITAN_CONFIGS)} (write a config_registry function for other shapes, or use --format megatron)"
    )


def _parallel(plan: Plan, export: _Export) -> None:
    d = plan.degrees
    sharded = plan.zero_stage >= 1 or d.expert > 1
    export.add("--parallelism.data-parallel-replicate-degree", 1 if sharded else d.data)
    export.add("--parallelism.data-parallel-shard-degree", d.data if sharded else 1)
    if sharded and plan.zero_stage < 3:
        export.add("--parallelism.fsdp-reshard-after-forward", "never")
        export.warnings.append(
            f"zero_stage={plan.zero_stage}{' with expert parallelism' if plan.zero_stage == 0 else ''}: torchtitan "
            "has no ZeRO-1/2; exported as FSDP that keeps parameters unsharded from forward to backward "
            "(reshard_after_forward=never): optimizer states and gradients sharded, more communication than planned"
        )
    export.add("--parallelism.tensor-parallel-degree", d.tensor)
    if d.tensor > 1:
        export.add(
            "--parallelism.enable-sequence-parallel"
            if plan.sequence_parallel
            else "--parallelism.no-enable-sequence-parallel"
        )
    export.add("--parallelism.context-parallel-degree", d.context)
    export.add("--parallelism.expert-parallel-degree", d.expert)


def _pipeline(plan: Plan, export: _Export, schedule_csv_path: str) -> None:
    d = plan.degrees
    export.add("--parallelism.pipeline-parallel-degree", d.pipeline)
    builtin = _BUILTIN_SCHEDULES.get(plan.schedule)
    if plan.bpipe is not None:
        export.warnings.append("BPipe activation balancing has no torchtitan equivalent; only the schedule is exported")
    if builtin is None:
        # Loop-style stage placement (virtual stage c*p + x on rank x) as the plan's; the CSV gives the order.
        export.add("--parallelism.pipeline-parallel-schedule", "Interleaved1F1B" if d.virtual > 1 else "1F1B")
        export.add("--parallelism.pipeline-parallel-schedule-csv", schedule_csv_path)
        export.warnings.append(
            f"schedule {plan.schedule!r} runs from the per-rank CSV: write it with "
            f"'paraplan export PLAN --format torch-csv -o {schedule_csv_path}'"
        )
        if plan.schedule == "2bw":
            export.warnings.append("torch has no PipeDream-2BW weight stashing: the CSV order runs with flushes")
    else:
        export.add("--parallelism.pipeline-parallel-schedule", builtin)
    export.add("--parallelism.pipeline-parallel-microbatch-size", plan.microbatch_size)
    if d.pipeline > 1:
        export.add("--parallelism.module-fqns-per-model-part", *[",".join(p) for p in _module_fqns(plan)])


def _module_fqns(plan: Plan) -> list[list[str]]:
    """Per virtual stage in model order: torchtitan's module names of its layers."""
    layers = plan.model.layers
    kinds = [layer.kind for layer in layers]
    if kinds[0] != "embedding" or kinds[-1] != "head" or set(kinds[1:-1]) != {"decoder"}:
        raise InvalidProblemError(
            f"cannot name torchtitan modules for profile {plan.model.name!r}: its layers must be 'embedding', "
            "'decoder' layers, 'head' in order; build the profile from a transformer config"
        )
    parts = []
    for chunk in plan.virtual_stages():
        names = []
        for i in range(*chunk.layers):
            names += {"embedding": ["tok_embeddings"], "head": ["norm", "lm_head"]}.get(kinds[i], [f"layers.{i - 1}"])
        parts.append(names)
    return parts


def _activation_checkpoint(plan: Plan, export: _Export) -> None:
    used = {
        s
        for stage in plan.stages
        for chunk in stage.chunks
        for s, i in zip(chunk.layer_strategies(), range(*chunk.layers))
        if plan.model.layers[i].kind == "decoder"
    }
    if used == {"none"}:
        export.flags.append("activation-checkpoint:none")
    elif "offload" in used:
        export.flags.append("activation-checkpoint:full")
        export.warnings.append(
            "the plan keeps activations in host memory ('offload'); torchtitan has no activation offloading: "
            "exported full activation checkpointing, which frees as much device memory and recomputes instead "
            "(more time than planned where the copies were hidden)"
        )
    elif used == {"full"}:
        export.flags.append("activation-checkpoint:full")
        if plan.cluster.device is not None and compute_constants(plan.cluster.device).full_recompute == "whole":
            export.warnings.append(
                "torchtitan's full checkpointing (PyTorch's non-reentrant checkpoint) stops its recompute before "
                "each block's FFN output projection; the plan costs the whole forward again, so its times are a "
                "little long for torchtitan (plan with --full-recompute early-stop for torchtitan's)"
            )
    elif used == {"selective"}:
        export.flags.append("activation-checkpoint:selective")
        export.warnings.append(
            "torchtitan's selective checkpointing saves chosen matmul outputs (op-level), not "
            "exactly the attention-core recompute the plan costs"
        )
    elif len(used - {"none"}) == 1 and set(recompute_modules_of(min(used - {"none"})) or ("x",)) <= _OP_LEVEL:
        modules = recompute_modules_of(min(used - {"none"}))
        export.flags.append("activation-checkpoint:selective")
        export.warnings.append(
            f"the plan recomputes Megatron-Core modules {list(modules or ())}; torchtitan's op-level selective "
            "checkpointing saves the matmul and attention outputs and recomputes every other op (norms, "
            "activations, rotary): the closest it has, on every block (memory and time differ from the plan's)"
        )
    elif len(used - {"none"}) == 1 and recompute_modules_of(min(used - {"none"})):
        export.flags.append("activation-checkpoint:full")
        export.warnings.append(
            f"the plan recomputes Megatron-Core modules {list(recompute_modules_of(min(used - {'none'})) or ())}; "
            "torchtitan cannot checkpoint single submodules (whole MLP, MoE block, shared experts, MLA up "
            "projections): exported full (less memory, more time than planned)"
        )
    else:
        export.flags.append("activation-checkpoint:full")
        export.warnings.append(
            f"the plan mixes recompute strategies {sorted(used)} over layers; torchtitan applies "
            "one to every block: exported full (less memory, more time than planned)"
        )
