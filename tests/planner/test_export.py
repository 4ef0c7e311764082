"""Tests of planner.export: torch CSV (checked by torch's own loader), torchtitan's CSV round
trip, and hand-checked Megatron-LM argument lists."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from cost_models.schedules import build_actions
from planner.errors import InvalidProblemError
from planner.export import megatron_args_text, parse_torch_csv, plan_actions, to_megatron_args, to_torch_csv
from planner.schema import (
    Chunk,
    Cluster,
    Degrees,
    Device,
    LayerProfile,
    ModelProfile,
    Plan,
    RecomputeOption,
    Stage,
    TransformerConfig,
)

# torchtitan tests/assets/custom_schedule.csv (2 ranks, stages {0, 2} and {1, 3}, I/W split), kept
# inline so that the test needs no file outside the repository; shared/data/torchtitan has a copy.
TORCHTITAN_CSV = (
    "0F0,0F1,0F2,0F3,0F4,0F5,0F6,0F7,2F0,2F1,2F2,2F3,2F4,2F5,2F6,2F7,"
    "2I0,2W0,2I1,2W1,0I0,0W0,0I1,0W1,2I2,2W2,2I3,2W3,0I2,0W2,0I3,0W3,"
    "2I4,2W4,2I5,2W5,0I4,0W4,0I5,0W5,2I6,2W6,2I7,2W7,0I6,0W6,0I7,0W7\n"
    "1F0,1F1,1F2,1F3,1F4,1F5,1F6,1F7,3F0,3F1,3F2,3F3,3F4,3F5,3F6,3F7,"
    "3I0,3W0,3I1,3W1,1I0,1W0,1I1,1W1,3I2,3W2,3I3,3W3,1I2,1W2,1I3,1W3,"
    "3I4,3W4,3I5,3W5,1I4,1W4,1I5,1W5,3I6,3W6,3I7,3W7,1I6,1W6,1I7,1W7\n"
)
TORCHTITAN_CSV_COPY = Path("/work/shared/data/torchtitan/custom_schedule.csv")

_RECOMPUTE = {
    "none": RecomputeOption(activation_bytes=8.0),
    "selective": RecomputeOption(activation_bytes=4.0, extra_s=0.1),
    "full": RecomputeOption(activation_bytes=1.0, extra_s=1.0),
}


def _transformer(num_layers: int, **kwargs) -> TransformerConfig:
    base = {"name": "toy", "hidden_size": 64, "num_layers": num_layers, "num_heads": 4, "seq_length": 128,
            "vocab_size": 1000}
    return TransformerConfig(**(base | kwargs))


def _profile(num_decoders: int) -> ModelProfile:
    layers = [LayerProfile(name="embedding", kind="embedding", forward_s=0.1, backward_s=0.2, activation_bytes=1.0)]
    layers += [LayerProfile(name=f"decoder{i}", kind="decoder", forward_s=1.0, backward_s=2.0, recompute=_RECOMPUTE)
               for i in range(num_decoders)]
    layers.append(LayerProfile(name="head", kind="head", forward_s=0.5, backward_s=1.0, activation_bytes=2.0))
    return ModelProfile(name="toy", layers=tuple(layers))


def _cluster(num_devices: int) -> Cluster:
    device = Device(name="gpu", memory_headroom_bytes=0, memory_bytes=1e12, peak_flops=1e12)
    return Cluster(name="c", device=device, devices_per_node=num_devices, intra_node_bytes_per_s=1e11,
                   inter_node_bytes_per_s=1e10)


def _plan(
    decoders: list[int],
    *,
    p: int,
    v: int = 1,
    recompute: list[dict] | None = None,
    schedule: str = "1f1b",
    transformer: TransformerConfig | None | bool = True,
    tensor: int = 1,
    data: int = 1,
    m: int = 8,
    b: int = 1,
    global_batch: int | None = None,
    actions: tuple[tuple[str, ...], ...] | None = None,
) -> Plan:
    """A plan whose virtual stage k holds ``decoders[k]`` decoder layers (plus the embedding on
    virtual stage 0 and the head on the last)."""
    num = sum(decoders)
    bounds, start = [], 0
    for k, n in enumerate(decoders):
        end = start + n + (1 if k == 0 else 0) + (1 if k == len(decoders) - 1 else 0)
        bounds.append((start, end))
        start = end
    recompute = recompute or [{}] * len(decoders)
    stages = tuple(
        Stage(index=x, chunks=tuple(Chunk(layers=bounds[c * p + x], recompute=recompute[c * p + x]) for c in range(v)))
        for x in range(p)
    )
    cfg = _transformer(num) if transformer is True else (transformer or None)
    return Plan(
        solver="test", model=_profile(num), cluster=_cluster(p * tensor * data), transformer=cfg,
        degrees=Degrees(data=data, tensor=tensor, pipeline=p, virtual=v), schedule=schedule, microbatch_size=b,
        num_microbatches=m, global_batch_size=global_batch or b * m * data, stages=stages, actions=actions,
    )


# ------------------------------------------------------------------------------------------
# torch CSV
# ------------------------------------------------------------------------------------------


def test_torch_csv_text_is_one_row_per_rank() -> None:
    plan = _plan([2, 2], p=2, m=3)
    assert to_torch_csv(plan) == "0F0,0F1,0B0,0F2,0B1,0B2\n1F0,1B0,1F1,1B1,1F2,1B2\n"


@pytest.mark.parametrize(
    ("schedule", "decoders", "p", "v", "m"),
    [
        ("1f1b", [2, 2, 2, 2], 4, 1, 8),
        ("gpipe", [2, 2], 2, 1, 3),
        ("interleaved-1f1b", [1] * 8, 4, 2, 8),
        ("zb-h1", [2, 2, 2], 3, 1, 6),
        ("zb-h2", [2, 2, 2, 2], 4, 1, 8),
    ],
)
def test_torch_load_csv_reads_the_plans_order(tmp_path: Path, schedule: str, decoders: list[int], p: int, v: int,
                                              m: int) -> None:
    pytest.importorskip("torch")
    from unittest import mock

    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime
    from torch.distributed.pipelining.stage import PipelineStage

    plan = _plan(decoders, p=p, v=v, m=m, schedule=schedule)
    path = tmp_path / "plan.csv"
    path.write_text(to_torch_csv(plan))
    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod, stage.num_stages = 0, p, None, p * v
    runtime = _PipelineScheduleRuntime([stage] * v, m)
    runtime._load_csv(str(path), format="compute_only")  # validates and lowers with sends/recvs
    loaded = [[str(a) for a in runtime.pipeline_order[r]] for r in range(p)]
    assert loaded == [[str(a) for a in rank] for rank in plan_actions(plan)]
    assert runtime.stage_index_to_group_rank == {s: s % p for s in range(p * v)}


def test_torchtitan_custom_schedule_round_trips() -> None:
    text = TORCHTITAN_CSV
    if TORCHTITAN_CSV_COPY.exists():
        assert TORCHTITAN_CSV_COPY.read_text().split() == text.split()
    actions = parse_torch_csv(text)
    assert len(actions) == 2 and all(len(rank) == 48 for rank in actions)
    assert [str(a) for a in actions[0][:3]] == ["0F0", "0F1", "0F2"]
    assert str(actions[1][-1]) == "1W7"
    # a custom plan carrying these actions exports the same text back
    rows = tuple(tuple(str(a) for a in rank) for rank in actions)
    plan = _plan([1, 1, 1, 1], p=2, v=2, m=8, schedule="custom", actions=rows)
    assert to_torch_csv(plan).split() == text.split()


def test_torch_loads_the_reexported_torchtitan_schedule(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from unittest import mock

    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime
    from torch.distributed.pipelining.stage import PipelineStage

    rows = tuple(tuple(str(a) for a in rank) for rank in parse_torch_csv(TORCHTITAN_CSV))
    path = tmp_path / "titan.csv"
    path.write_text(to_torch_csv(_plan([1, 1, 1, 1], p=2, v=2, m=8, schedule="custom", actions=rows)))
    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod, stage.num_stages = 0, 2, None, 4
    runtime = _PipelineScheduleRuntime([stage] * 2, 8)
    runtime._load_csv(str(path), format="compute_only")
    assert [tuple(str(a) for a in runtime.pipeline_order[r]) for r in range(2)] == list(rows)


def test_parse_torch_csv_skips_bubbles_and_rejects_comm_actions() -> None:
    assert [[str(a) for a in r] for r in parse_torch_csv("0F0,,0B0\n1F0, 1B0\n")] == [["0F0", "0B0"], ["1F0", "1B0"]]
    with pytest.raises(InvalidProblemError, match=r"row 1 .*'1RECV_F0'.*compute_only"):
        parse_torch_csv("0F0,0B0\n1RECV_F0,1F0,1B0\n")


def test_plan_actions_builtin_and_custom() -> None:
    plan = _plan([1] * 8, p=4, v=2, m=8, schedule="interleaved-1f1b")
    assert plan_actions(plan) == build_actions("interleaved-1f1b", num_stages=4, num_chunks=2, num_microbatches=8)
    bad = _plan([2, 2], p=2, m=2, schedule="custom", actions=(("0F0", "0B0", "0F1", "0B1"), ("1F0", "1B0", "1F1")))
    with pytest.raises(InvalidProblemError, match=r"stage 1 microbatch 1 has actions \['F'\]"):
        plan_actions(bad)


# ------------------------------------------------------------------------------------------
# Megatron-LM
# ------------------------------------------------------------------------------------------


def test_megatron_even_plan() -> None:
    plan = _plan([4, 4], p=2, tensor=2, data=2, m=8, b=2)
    assert to_megatron_args(plan) == [
        "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
        "--micro-batch-size", "2", "--global-batch-size", "32",
        "--num-layers", "8", "--hidden-size", "64", "--ffn-hidden-size", "256", "--num-attention-heads", "4",
        "--seq-length", "128", "--max-position-embeddings", "128", "--vocab-size", "1000", "--bf16",
    ]


def test_megatron_uneven_ends_only() -> None:
    plan = _plan([1, 3, 3, 2], p=4)
    args = to_megatron_args(plan)
    assert args[4:8] == ["--decoder-first-pipeline-num-layers", "1", "--decoder-last-pipeline-num-layers", "2"]
    assert "--pipeline-model-parallel-layout" not in args
    # only the first stage differs: the last flag is left out (Megatron splits the rest evenly)
    assert to_megatron_args(_plan([2, 3, 3, 3], p=4))[4:6] == ["--decoder-first-pipeline-num-layers", "2"]
    assert "--decoder-last-pipeline-num-layers" not in to_megatron_args(_plan([2, 3, 3, 3], p=4))
    # two stages: the first count fixes the last
    assert to_megatron_args(_plan([3, 5], p=2))[4:6] == ["--decoder-first-pipeline-num-layers", "3"]


def test_megatron_arbitrary_split_uses_the_layout_string() -> None:
    args = to_megatron_args(_plan([2, 3, 1, 2], p=4))
    i = args.index("--pipeline-model-parallel-layout")
    assert args[i + 1] == "Et*2|t*3|t|t*2L"
    assert "--decoder-first-pipeline-num-layers" not in args


def test_megatron_interleaved_even_and_uneven() -> None:
    even = to_megatron_args(_plan([2, 2, 2, 2], p=2, v=2, schedule="interleaved-1f1b", m=4))
    # no "--overlap-p2p-comm": Megatron-LM has no such flag (p2p overlap is its default, on; only
    # --no-overlap-p2p-communication exists), and with it on the interleaved schedule takes p = 2
    assert even[4:8] == ["--num-layers-per-virtual-pipeline-stage", "2", "--micro-batch-size", "1"]
    assert not any("overlap-p2p" in a for a in even)
    # virtual stage k = c*p + x: stage 0 holds vs 0 and 3, stage 1 holds vs 1 and 4...
    uneven = _plan([1, 2, 2, 2, 2, 1], p=3, v=2, schedule="interleaved-1f1b", m=6)
    args = to_megatron_args(uneven)
    i = args.index("--pipeline-model-parallel-layout")
    assert args[i + 1] == "Et|t*2|t*2|t*2|t*2|tL"
    assert not any("overlap-p2p" in a for a in args)


def test_megatron_recompute_uniform_block_and_selective() -> None:
    # Stage 0's first layer is the embedding (no recompute): its decoders are named by index.
    all_full = _plan([2, 2], p=2, recompute=[{"full": (1, 2)}, {"full": 2}])
    assert to_megatron_args(all_full)[-6:] == ["--recompute-granularity", "full", "--recompute-method", "uniform",
                                               "--recompute-num-layers", "1"]
    block = _plan([3, 3], p=2, recompute=[{"full": (1, 2)}, {"full": 2}])
    assert to_megatron_args(block)[-6:] == ["--recompute-granularity", "full", "--recompute-method", "block",
                                            "--recompute-num-layers", "2"]
    assert "WARNING" not in megatron_args_text(block)
    selective = _plan([2, 2], p=2, recompute=[{"selective": (1, 2)}, {"selective": 2}])
    assert to_megatron_args(selective)[-2:] == ["--recompute-granularity", "selective"]
    assert "WARNING" not in megatron_args_text(selective)


def test_megatron_recompute_differing_counts_warns(caplog: pytest.LogCaptureFixture) -> None:
    plan = _plan([3, 3, 3, 3], p=4, recompute=[{"full": (1, 2, 3)}, {"full": 2}, {"full": 1}, {}])
    with caplog.at_level(logging.WARNING, logger="planner.export"):
        args = to_megatron_args(plan)
    assert args[-6:] == ["--recompute-granularity", "full", "--recompute-method", "block",
                         "--recompute-num-layers", "3"]
    assert "per-stage full-recompute counts differ ([3, 2, 1, 0]" in caplog.text
    text = megatron_args_text(plan)
    assert "# WARNING: per-stage full-recompute counts differ" in text
    mixed = _plan([2, 2], p=2, recompute=[{"selective": (1,), "full": (2,)}, {}])
    assert "cannot mix selective and full" in megatron_args_text(mixed)
    not_prefix = _plan([3, 3], p=2, recompute=[{"full": (3,)}, {"full": (6,)}])
    assert "recomputes other positions" in megatron_args_text(not_prefix)


def test_megatron_text_format_and_schedule_warnings() -> None:
    plan = _plan([2, 3, 1, 2], p=4, schedule="zb-h1")
    text = megatron_args_text(plan)
    lines = text.splitlines()
    assert lines[0].startswith(
        "# paraplan plan (test, schedule zb-h1): data=1 tensor=1 pipeline=4 virtual=1 context=1 expert=1 "
        "zero_stage=0; launch on 4 GPUs"
    )
    assert "# WARNING: stock Megatron-LM has no zero-bubble schedule" in text
    body = [line for line in lines if not line.startswith("#")]
    assert body[0] == "--tensor-model-parallel-size 1 \\"
    assert "--pipeline-model-parallel-layout 'Et*2|t*3|t|t*2L' \\" in body
    assert body[-1] == "--bf16" and all(line.endswith(" \\") for line in body[:-1])


def test_megatron_model_flags_for_llama_style_config() -> None:
    cfg = _transformer(4, num_kv_heads=2, mlp="swiglu", norm="rmsnorm", position_embedding="rope",
                       tied_embeddings=False, bias=False, dtype="fp16", ffn_hidden_size=172)
    args = to_megatron_args(_plan([2, 2], p=2, transformer=cfg))
    tail = args[args.index("--num-layers"):]
    assert tail == ["--num-layers", "4", "--hidden-size", "64", "--ffn-hidden-size", "172",
                    "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2", "--seq-length", "128",
                    "--max-position-embeddings", "128", "--vocab-size", str(cfg.vocab_size), "--swiglu",
                    "--normalization", "RMSNorm",
                    "--position-embedding-type", "rope", "--untie-embeddings-and-output-weights",
                    "--disable-bias-linear", "--fp16"]


def test_megatron_non_transformer_profile_exports_sizes_only() -> None:
    plan = _plan([2, 2, 2, 2], p=2, v=2, schedule="interleaved-1f1b", transformer=None, m=4, b=4, data=2)
    assert to_megatron_args(plan) == [
        "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "2",
        "--num-virtual-stages-per-pipeline-rank", "2",
        "--micro-batch-size", "4", "--global-batch-size", "32",
    ]
    assert "only parallel sizes and batch sizes" in megatron_args_text(plan)


def test_megatron_batch_mismatch_warns() -> None:
    plan = _plan([2, 2], p=2, m=8, b=1, global_batch=16)
    assert "global_batch_size=16 is not microbatch_size x num_microbatches x data = 8" in megatron_args_text(plan)


def test_megatron_rejects_what_it_cannot_say() -> None:
    with pytest.raises(InvalidProblemError, match=r"has 4 decoder layers but transformer.num_layers=6"):
        to_megatron_args(_plan([2, 2], p=2, transformer=_transformer(6)))
    layers = _profile(4).layers
    odd = _profile(4).model_copy(update={"layers": (layers[1], layers[0], *layers[2:])})
    plan = _plan([2, 2], p=2).model_copy(update={"model": odd})
    with pytest.raises(InvalidProblemError, match=r"must be 'embedding', then 'decoder' layers, then 'head'"):
        to_megatron_args(plan)
    custom = {"none": RecomputeOption(activation_bytes=8.0), "swap": RecomputeOption(activation_bytes=0.0)}
    off = _profile(4).model_copy(update={"layers": (layers[0], *(l.model_copy(update={"recompute": custom})
                                                                 for l in layers[1:5]), layers[5])})
    plan = _plan([2, 2], p=2).model_copy(
        update={"model": off, "stages": (Stage(index=0, chunks=(Chunk(layers=(0, 3), recompute={"swap": 1}),)),
                                         Stage(index=1, chunks=(Chunk(layers=(3, 6)),)))})
    with pytest.raises(InvalidProblemError, match=r"recompute strategies \['swap'\].*no Megatron-LM equivalent"):
        to_megatron_args(plan)


@pytest.mark.parametrize(("schedule", "torch_name"), [("zb-v", "ZBVZeroBubble"), ("dualpipe-v", "DualPipeV")])
def test_v_schedule_csv_loads_as_torchs_own_order(tmp_path: Path, schedule: str, torch_name: str) -> None:
    """The exported CSV, read by torch's ``_load_csv``, is torch's own ZBVZeroBubble / DualPipeV
    order (DualPipeV's blocks as OVERLAP_F_B cells), with V stage placement; it parses back."""
    pytest.importorskip("torch")
    from unittest import mock

    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime
    from torch.distributed.pipelining.stage import PipelineStage

    from tests.planner.modern_plans import preset_plan

    p, m = 4, 8
    plan = preset_plan("llama3-8b", p=p, v=2, m=m, schedule=schedule)
    text = to_torch_csv(plan)
    path = tmp_path / "v.csv"
    path.write_text(text)
    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod, stage.num_stages = 0, p, None, 2 * p
    runtime = _PipelineScheduleRuntime([stage] * 2, m)
    runtime._load_csv(str(path), format="compute_only")
    loaded = [[str(a) for a in runtime.pipeline_order[r]] for r in range(p)]
    assert loaded == [[str(a) for a in row if a is not None] for row in get_schedule_ops(torch_name, p, m)]
    assert runtime.stage_index_to_group_rank == {k: k if k < p else 2 * p - 1 - k for k in range(2 * p)}
    assert [list(r) for r in parse_torch_csv(text)] == [list(r) for r in plan_actions(plan)]
    assert ("OVERLAP_F_B" in text) == (schedule == "dualpipe-v")


@pytest.mark.parametrize("schedule", ["zb-v", "dualpipe-v"])
def test_megatron_refuses_v_schedules_with_the_fix(tmp_path: Path, schedule: str, capsys) -> None:
    from planner.cli import main
    from tests.planner.modern_plans import preset_plan

    plan = preset_plan("llama3-8b", p=4, v=2, m=8, schedule=schedule)
    with pytest.raises(InvalidProblemError, match=rf"schedule '{schedule}' cannot be exported to Megatron-LM.*"
                                                  r"--schedule interleaved-1f1b --chunks 2"):
        to_megatron_args(plan)
    path = tmp_path / "plan.json"
    path.write_text(plan.model_dump_json())
    assert main(["export", str(path), "--format", "megatron"]) == 2
    assert "V-shaped" in capsys.readouterr().err
