"""Exporters: a plan as torch.distributed.pipelining's per-rank action CSV, or as Megatron-LM
command-line arguments.

torch CSV (compute_only): one row per pipeline rank, no header, one action per cell written
like torch's ``_Action`` (``"2F0"``, ``"1I3"``, ``"0W3"``). ``_PipelineScheduleRuntime._load_csv(path,
format="compute_only")`` reads it and lowers it (adds sends and receives); torchtitan takes the
same file through ``pipeline_parallel_schedule_csv`` (its ``tests/assets/custom_schedule.csv``
is the reference); see [torch-pipelining] in docs/references.md.

Megatron-LM arguments: names and semantics from NVIDIA/Megatron-LM
``megatron/training/arguments.py`` (``--decoder-first-pipeline-num-layers``,
``--num-layers-per-virtual-pipeline-stage``, the recompute group) and
``docs/api-guide/pipeline_parallel_layout.md`` with
``megatron/core/transformer/pipeline_parallel_layer_layout.py`` (the layout grammar: virtual
stages in order separated by ``|``, ``E`` embedding, ``t`` decoder layer, ``L`` loss, ``x*n``
repeats). What stock Megatron cannot say is exported as the closest setting plus a warning.
"""

from __future__ import annotations

import csv
import io
import logging
import re
import shlex
from dataclasses import dataclass, field

from cost_models import simulate
from cost_models.activation_offload import OFFLOAD
from cost_models.compute import compute_constants
from cost_models.schedules import overlapped_blocks, validate_actions
from planner.errors import InvalidProblemError
from planner.export_megatron_flags import model_flags, parallel_flags
from planner.schema import KNOWN_RECOMPUTE, RECOMPUTE_MODULES, V_SCHEDULES, Action, Plan, recompute_modules_of

logger = logging.getLogger(__name__)
_OVERLAP_RE = re.compile(r"^\((\d+[FBIW]\d+);(\d+[FBIW]\d+)\)OVERLAP_F_B$")

__all__ = ["megatron_args_text", "parse_torch_csv", "plan_actions", "to_megatron_args", "to_torch_csv"]

_SCHEDULE_NOTES = {
    "gpipe": "Megatron-LM has no GPipe schedule; it runs 1F1B (PipeDream-Flush): same bubble, less memory",
    "2bw": "Megatron-LM has no PipeDream-2BW; it runs PipeDream-Flush (1F1B), same order, synchronous weights",
    "zb-h1": "stock Megatron-LM has no zero-bubble schedule; it runs 1F1B, with a (p-1)(T_F+T_B+T_W) bubble",
    "zb-h2": "stock Megatron-LM has no zero-bubble schedule; it runs 1F1B, with a (p-1)(T_F+T_B+T_W) bubble",
    "custom": "Megatron-LM runs its own order, not the plan's custom actions; use --format torch-csv for them",
}


# ------------------------------------------------------------------------------------------
# torch CSV
# ------------------------------------------------------------------------------------------


def plan_actions(plan: Plan) -> tuple[tuple[Action, ...], ...]:
    """Per pipeline rank, the compute actions the plan runs.

    Args:
        plan: any plan; schedule ``custom`` uses its own ``actions``.

    Returns:
        One tuple of ``Action`` per pipeline rank, in execution order.

    Raises:
        InvalidProblemError: a custom action list that is malformed (see ``validate_actions``)
            or a built-in schedule that does not fit the plan's degrees.
    """
    actions = simulate.plan_actions(plan)
    if plan.schedule == "custom":  # built-in orders are valid by construction
        p, v = plan.degrees.pipeline, plan.degrees.virtual
        validate_actions(actions, num_virtual_stages=p * v, num_microbatches=plan.num_microbatches)
    return actions


def to_torch_csv(plan: Plan) -> str:
    """torch's compute_only schedule CSV of a plan: one row per pipeline rank, no header.

    Args:
        plan: the plan to export.

    Returns:
        The CSV text (``\\n`` line ends), loadable by ``_PipelineScheduleRuntime._load_csv`` and
        by torchtitan's ``pipeline_parallel_schedule_csv``.

    Raises:
        InvalidProblemError: as ``plan_actions``.
    """
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    blocks = overlapped_blocks(plan.schedule, num_stages=plan.degrees.pipeline, num_microbatches=plan.num_microbatches)
    for rank, starts in zip(plan_actions(plan), blocks):
        writer.writerow(_cells(rank, frozenset(starts)))
    return out.getvalue()


def _cells(rank: tuple[Action, ...], block_starts: frozenset[int]) -> list[str]:
    """One rank's cells; DualPipeV's overlapped F&B pairs as torch's ``(F;B)OVERLAP_F_B``."""
    cells, j = [], 0
    while j < len(rank):
        if j in block_starts:
            cells.append(f"({rank[j]};{rank[j + 1]})OVERLAP_F_B")
            j += 2
        else:
            cells.append(str(rank[j]))
            j += 1
    return cells


def parse_torch_csv(text: str) -> tuple[tuple[Action, ...], ...]:
    """Per-rank compute actions from a compute_only CSV (torch's or torchtitan's).

    Empty cells (torch's visual bubbles) are skipped; blank lines are ranks with no actions; an
    overlapped block ``(2F3;1B0)OVERLAP_F_B`` reads as its F then its B.

    Args:
        text: the CSV text, one row per pipeline rank.

    Returns:
        One tuple of ``Action`` per row.

    Raises:
        InvalidProblemError: a cell that is not a compute action (F, B, I or W), e.g. the
            SEND/RECV cells of a compute_comms CSV.
    """
    ranks = []
    for row_index, row in enumerate(csv.reader(io.StringIO(text))):
        rank = []
        for cell in row:
            if not cell.strip():
                continue
            pair = _OVERLAP_RE.match(cell.strip())
            if pair is not None:  # an overlapped F&B block (DualPipeV): its F, then its B
                rank += [Action.parse(pair.group(1)), Action.parse(pair.group(2))]
                continue
            try:
                rank.append(Action.parse(cell))
            except InvalidProblemError:
                raise InvalidProblemError(
                    f"row {row_index} (rank {row_index}) has cell {cell.strip()!r}, not a compute action "
                    "<stage><F|B|I|W><microbatch>; export the compute_only format (no SEND/RECV/UNSHARD)"
                ) from None
        ranks.append(tuple(rank))
    return tuple(ranks)


# ------------------------------------------------------------------------------------------
# Megatron-LM
# ------------------------------------------------------------------------------------------


@dataclass
class _MegatronExport:
    flags: list[tuple[str, str | None]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def add(self, flag: str, value: object = None) -> None:
        self.flags.append((flag, None if value is None else str(value)))


def to_megatron_args(plan: Plan) -> list[str]:
    """Megatron-LM command-line arguments for a plan (an argv list, flags and values).

    Always: tensor and pipeline parallel sizes, micro and global batch sizes. With
    ``plan.transformer``: the model shape, the layer split (even: nothing or
    ``--num-layers-per-virtual-pipeline-stage``; only the end stages differ:
    ``--decoder-first/last-pipeline-num-layers``; otherwise ``--pipeline-model-parallel-layout``)
    and the recompute flags. What Megatron cannot express is logged as a warning and exported
    as the closest setting (``megatron_args_text`` prints the warnings as comments).

    Args:
        plan: the plan to export.

    Returns:
        The arguments, e.g. ``["--tensor-model-parallel-size", "2", ...]``.

    Raises:
        InvalidProblemError: a transformer plan whose profile is not embedding, decoders, head
            in order, whose chunks are not in model order, or that uses a recompute strategy
            Megatron does not have.
    """
    export = _megatron_export(plan)
    for warning in export.warnings:
        logger.warning("Megatron export: %s", warning)
    # a value with spaces is a list flag (nargs="*", e.g. --recompute-modules core_attn mlp)
    return [token for flag, value in export.flags for token in ((flag,) if value is None else (flag, *value.split(" ")))]


def megatron_args_text(plan: Plan) -> str:
    """The Megatron-LM arguments one flag per line with ``\\`` continuations, warnings as comments.

    Args:
        plan: the plan to export.

    Returns:
        Text to paste after ``pretrain_gpt.py`` in a shell script.

    Raises:
        InvalidProblemError: as ``to_megatron_args``.
    """
    export = _megatron_export(plan)
    d = plan.degrees
    lines = [
        f"# paraplan plan ({plan.solver}, schedule {plan.schedule}): data={d.data} tensor={d.tensor} "
        f"pipeline={d.pipeline} virtual={d.virtual} context={d.context} expert={d.expert} zero_stage={plan.zero_stage}; "
        f"launch on {d.data * d.tensor * d.pipeline * d.context} GPUs "
        "(Megatron derives the data-parallel size from the world size)"
    ]
    lines += [f"# WARNING: {w}" for w in export.warnings]
    body = [flag if value is None else f"{flag} {' '.join(shlex.quote(v) for v in value.split(' '))}"
            for flag, value in export.flags]
    lines += [f"{line} \\" for line in body[:-1]] + body[-1:]
    return "\n".join(lines) + "\n"


def _megatron_export(plan: Plan) -> _MegatronExport:
    simulate.check_pipeline_ranks(plan)
    if plan.schedule in V_SCHEDULES:
        raise InvalidProblemError(
            f"schedule {plan.schedule!r} cannot be exported to Megatron-LM: Megatron places virtual stages "
            "loop-style (stage k on rank k mod p) and has no V-shaped schedule, so it cannot hold the first and "
            "last stages on one rank or run the plan's order. Export it with --format torchtitan (torch's "
            f"{'ZBVZeroBubble' if plan.schedule == 'zb-v' else 'DualPipeV'}) or --format torch-csv, or plan "
            "for Megatron with --schedule interleaved-1f1b --chunks 2 (solver ptdp: --option "
            "schedules=1f1b,interleaved-1f1b)")
    export = _MegatronExport()
    d = plan.degrees
    export.add("--tensor-model-parallel-size", d.tensor)
    export.add("--pipeline-model-parallel-size", d.pipeline)
    parallel_flags(plan, export)
    if plan.transformer is None:
        if d.virtual > 1:
            export.add("--num-virtual-stages-per-pipeline-rank", d.virtual)
        export.warnings.append(
            f"profile {plan.model.name!r} is not a transformer config: only parallel sizes and batch "
            "sizes are exported (no layer split, no model shape, no recompute)"
        )
    else:
        _split_flags(plan, export)
    export.add("--micro-batch-size", plan.microbatch_size)
    export.add("--global-batch-size", plan.global_batch_size)
    if plan.transformer is not None:
        model_flags(plan.transformer, export, str(plan.options.get("moe_dispatcher", "alltoall")))
        _recompute_flags(plan, export)
    if plan.schedule in _SCHEDULE_NOTES:
        export.warnings.append(_SCHEDULE_NOTES[plan.schedule])
    if plan.bpipe is not None:
        export.warnings.append(
            "the plan balances activations with BPipe (evictions to the paired stage); stock Megatron-LM has no "
            "BPipe: only the compute schedule is exported, so stages may need the unbalanced memory"
        )
    expected = plan.microbatch_size * plan.num_microbatches * d.data
    if plan.global_batch_size != expected:
        export.warnings.append(
            f"global_batch_size={plan.global_batch_size} is not microbatch_size x num_microbatches x data "
            f"= {expected}; Megatron will run {plan.global_batch_size // (plan.microbatch_size * d.data)} "
            f"microbatches, the plan assumed {plan.num_microbatches}"
        )
    return export


def _chunk_kinds(plan: Plan) -> list[tuple[bool, int, bool]]:
    """Per virtual stage: (holds the embedding, number of decoder layers, holds the head)."""
    layers = plan.model.layers
    kinds = [layer.kind for layer in layers]
    num_decoders = len(layers) - 2
    if kinds[0] != "embedding" or kinds[-1] != "head" or set(kinds[1:-1]) != {"decoder"}:
        raise InvalidProblemError(
            f"cannot export the layer split of profile {plan.model.name!r} to Megatron-LM: its layers must be "
            f"'embedding', then 'decoder' layers, then 'head' (got kinds {sorted(set(kinds))}); "
            "build the profile from a transformer config"
        )
    if plan.transformer is not None and num_decoders != plan.transformer.num_layers:
        raise InvalidProblemError(
            f"the profile has {num_decoders} decoder layers but transformer.num_layers="
            f"{plan.transformer.num_layers}; re-derive the profile from the transformer config"
        )
    out, expected_first = [], 0
    for k, chunk in enumerate(plan.virtual_stages()):
        first, last = chunk.layers
        if first != expected_first:
            raise InvalidProblemError(
                f"virtual stage {k} starts at layer {first}, expected {expected_first}: Megatron-LM places "
                "virtual stage c*p + x (chunk c of stage x) in model order; reorder the chunks"
            )
        expected_first = last
        decoders = sum(1 for i in range(first, last) if kinds[i] == "decoder")
        out.append((first == 0, decoders, last == len(layers)))
    return out


def _split_flags(plan: Plan, export: _MegatronExport) -> None:
    p, v = plan.degrees.pipeline, plan.degrees.virtual
    chunks = _chunk_kinds(plan)
    counts = [n for _, n, _ in chunks]
    if len(set(counts)) == 1:
        if v > 1:
            export.add("--num-layers-per-virtual-pipeline-stage", counts[0])
        return
    middle = counts[1:-1]
    if v == 1 and p == 2:
        export.add("--decoder-first-pipeline-num-layers", counts[0])
        return
    if v == 1 and len(set(middle)) == 1:
        if counts[0] != middle[0]:
            export.add("--decoder-first-pipeline-num-layers", counts[0])
        if counts[-1] != middle[0]:
            export.add("--decoder-last-pipeline-num-layers", counts[-1])
        return
    mtp = plan.transformer.mtp_layers if plan.transformer is not None else 0
    export.add("--pipeline-model-parallel-layout", _layout_string(chunks, mtp))


def _layout_string(chunks: list[tuple[bool, int, bool]], mtp_layers: int = 0) -> str:
    """Megatron's layout: virtual stages in order joined by ``|``; ``t*n`` for n > 1 decoders; the
    multi-token-prediction modules (``m``) before the loss, in the head's virtual stage, where the plan
    costs them (Megatron-Core requires them in a rank's last virtual stage)."""
    stages = []
    for has_embedding, decoders, has_head in chunks:
        body = "t" if decoders == 1 else (f"t*{decoders}" if decoders else "")
        tail = "m" * mtp_layers + "L" if has_head else ""
        stages.append(("E" if has_embedding else "") + body + tail)
    return "|".join(stages)


def _decoder_strategies(plan: Plan) -> list[list[str]]:
    """Per virtual stage, the recompute strategy of each decoder layer, in layer order."""
    out = []
    for chunk in plan.virtual_stages():
        kinds = [plan.model.layers[i].kind for i in range(*chunk.layers)]
        strategies = chunk.layer_strategies()
        unknown = sorted({s for s in strategies
                          if s not in (*KNOWN_RECOMPUTE, OFFLOAD) and recompute_modules_of(s) is None})
        if unknown:
            raise InvalidProblemError(
                f"recompute strategies {unknown} (layers {list(range(*chunk.layers))}) have no Megatron-LM "
                f"equivalent; Megatron knows {list(KNOWN_RECOMPUTE)}, module sets of {list(RECOMPUTE_MODULES)} "
                f"joined by '+', and {OFFLOAD!r} (CPU offloading)"
            )
        out.append([s for s, kind in zip(strategies, kinds) if kind == "decoder"])
    return out


def _recompute_flags(plan: Plan, export: _MegatronExport) -> None:
    per_chunk = _decoder_strategies(plan)
    used = {s for chunk in per_chunk for s in chunk} - {"none"}
    if not used:
        return
    if OFFLOAD in used:
        _offload_flags(plan, sum(chunk.count(OFFLOAD) for chunk in per_chunk), used, export)
        return
    total = sum(len(chunk) for chunk in per_chunk)
    if len(used) == 1 and "full" not in used:
        (strategy,) = used
        export.add("--recompute-granularity", "selective")
        modules = recompute_modules_of(strategy) or ()
        if modules != ("core_attn",):  # Megatron's default set
            export.add("--recompute-modules", " ".join(modules))
        if "moe_act" in modules:  # Megatron-Core recomputes the expert activation only in grouped GEMM
            export.add("--moe-grouped-gemm")
        num = sum(chunk.count(strategy) for chunk in per_chunk)
        if num < total:
            export.warnings.append(
                f"Megatron applies selective recompute ({', '.join(modules)}) to every decoder layer; the plan "
                f"uses it on {num} of {total} (exported: all, which needs less memory and more time than planned)"
            )
        return
    if "full" in used and plan.cluster.device is not None and (
            compute_constants(plan.cluster.device).full_recompute == "early-stop"):
        export.warnings.append(
            "the plan costs full recompute as PyTorch's early-stopping checkpoint (--full-recompute early-stop); "
            "Megatron re-runs each recomputed layer's whole forward, its FFN output projection too: steps take "
            "longer than planned (plan with --full-recompute whole)"
        )
    if used == {"full"} and all(s == "full" for chunk in per_chunk for s in chunk):
        for flag, value in (("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                            ("--recompute-num-layers", 1)):
            export.add(flag, value)
        return
    _block_recompute(per_chunk, used, export)


def _offload_flags(plan: Plan, offloaded: int, used: set[str], export: _MegatronExport) -> None:
    """Megatron-Core's layer-level CPU offloading (``--cpu-offloading``, Transformer Engine's CPU-offload
    context): the activations of the first N decoder layers, N below the layer count, without pipeline
    parallelism and without activation recompute (``TransformerConfig`` refuses either)."""
    layers = plan.transformer.num_layers if plan.transformer is not None else offloaded + 1
    problems = []
    if used != {OFFLOAD}:
        problems.append(f"the plan also recomputes ({', '.join(sorted(used - {OFFLOAD}))}) and Megatron-Core's CPU "
                        "offloading does not run with activation recompute")
    if plan.degrees.pipeline > 1:
        problems.append(f"degrees.pipeline={plan.degrees.pipeline} and Megatron-Core has no CPU offloading with "
                        "pipeline parallelism")
    if problems:
        raise InvalidProblemError(
            f"the plan offloads the activations of {offloaded} decoder layers, which Megatron-LM cannot run: "
            f"{'; '.join(problems)}. Export the schedule with --format torch-csv (the runtime bridge runs the plan "
            "as it is), or plan without offload (ptdp: --option recompute=none,selective,modules,full)")
    if offloaded >= layers:
        export.warnings.append(
            f"the plan offloads all {layers} decoder layers; Megatron-Core offloads at most num_layers - 1 "
            f"(the last layer's activations are used at once): exported {layers - 1}")
    export.add("--cpu-offloading")
    export.add("--cpu-offloading-num-layers", min(offloaded, layers - 1))


def _block_recompute(per_chunk: list[list[str]], used: set[str], export: _MegatronExport) -> None:
    """Full recompute of the first N decoder layers of every virtual stage (Megatron's block method)."""
    counts = [sum(1 for s in chunk if s != "none") for chunk in per_chunk]
    n = max(counts)
    for flag, value in (("--recompute-granularity", "full"), ("--recompute-method", "block"),
                        ("--recompute-num-layers", n)):
        export.add(flag, value)
    if used - {"full"}:
        export.warnings.append(
            "Megatron cannot mix selective and full recompute; the plan's selective layers are exported "
            "as full (more recompute time, less memory than planned)"
        )
    if len(set(counts)) > 1:
        export.warnings.append(
            f"per-stage full-recompute counts differ ({counts} by virtual stage); stock Megatron takes one "
            f"--recompute-num-layers for every stage: exported the maximum {n}, so that no stage uses more "
            "memory than planned (stages with fewer recomputed layers in the plan run slower than predicted)"
        )
    prefix = all(all(s != "none" for s in chunk[:c]) for chunk, c in zip(per_chunk, counts))
    if not prefix:
        export.warnings.append(
            "Megatron's block method recomputes the first N decoder layers of each stage; the plan "
            "recomputes other positions (same count, same cost for identical layers)"
        )
