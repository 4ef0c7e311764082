"""torchtitan exports loaded by torchtitan's own config code (ConfigManager.parse_args, the same
parser as ``torchtitan/train.py``), its ParallelDims validation, and its model modules."""

from __future__ import annotations

import warnings

import pytest

from cost_models import moe
from planner.config_readers.torchtitan_reader import read_torchtitan_model
from planner.errors import InvalidProblemError
from planner.export import to_torch_csv
from planner.export_torchtitan import TORCHTITAN_CONFIGS, to_torchtitan_args, torchtitan_args_text
from tests.planner.modern_plans import preset_plan

pytest.importorskip("torchtitan")
pytest.importorskip("triton")  # torchtitan 0.3's model package imports it


# torchtitan's llama3_405b and deepseek_v3_671b functions add float8 converters whose constructor
# refuses to run without an SM89+ GPU (and needs torchao). On CPU those two exports are parsed with
# the same module's function without float8 (llama3_70b, deepseek_v3_16b): every --parallelism,
# --training and activation-checkpoint flag goes through torchtitan's ConfigManager and ParallelDims
# all the same; the model side (shape, module names) is checked on the 405B / 671B flavor built by
# torchtitan's model_registry, which needs no GPU.
CPU_STAND_INS = {"llama3_405b": "llama3_70b", "deepseek_v3_671b": "deepseek_v3_16b"}


def _load(argv: list[str]):
    warnings.filterwarnings("ignore")
    from torchtitan.config.manager import ConfigManager

    argv = [CPU_STAND_INS.get(token, token) for token in argv]
    return ConfigManager().parse_args(argv)


def _flavor_model(plan):
    import importlib

    module, _, flavor = TORCHTITAN_CONFIGS[plan.transformer.name]
    return module, flavor, importlib.import_module(f"torchtitan.models.{module}").model_registry(flavor).model


def _parallel_dims(config, world: int):
    from torchtitan.distributed.parallel_dims import ParallelDims

    return ParallelDims.from_config(config.parallelism, world)


CASES = [
    ("llama3-8b-d8-fsdp", lambda: preset_plan("llama3-8b", data=8, zero_stage=3), 8),
    ("llama3-8b-ddp-t2", lambda: preset_plan("llama3-8b", data=4, tensor=2), 8),
    (
        "llama3-405b-p16",
        lambda: preset_plan(
            "llama3-405b", [7] + [8] * 14 + [7], p=16, tensor=8, data=2, zero_stage=1, m=16, recompute="full"
        ),
        256,
    ),
    ("llama3-70b-interleaved", lambda: preset_plan("llama3-70b", p=4, v=2, tensor=8, data=2, zero_stage=3, m=8), 64),
    ("qwen3-30b-a3b-ep8-cp2", lambda: preset_plan("qwen3-30b-a3b", data=4, context=2, expert=8, zero_stage=3), 8),
    ("gpt-oss-20b-p2-ep8", lambda: preset_plan("gpt-oss-20b", p=2, data=4, expert=4, zero_stage=3, m=4), 8),
    ("llama3-8b-zbv-p4", lambda: preset_plan("llama3-8b", p=4, v=2, data=2, zero_stage=3, m=8, schedule="zb-v"), 8),
    ("llama3-70b-dualpipev-p4",
     lambda: preset_plan("llama3-70b", p=4, v=2, tensor=8, data=2, zero_stage=1, m=8, schedule="dualpipe-v"), 64),
    (
        "deepseek-v3-pp16-ep64",
        lambda: preset_plan("deepseek-v3", [3] + [4] * 14 + [2], p=16, data=128, expert=64, zero_stage=1, m=16),
        2048,
    ),
]


@pytest.mark.parametrize(("name", "make", "world"), CASES, ids=[c[0] for c in CASES])
def test_torchtitan_config_manager_loads_the_export(name: str, make, world: int) -> None:
    plan = make()
    config = _load(to_torchtitan_args(plan))
    par, d = config.parallelism, plan.degrees
    dims = _parallel_dims(config, world)  # asserts dp_replicate x dp_shard x cp x tp x pp == world
    assert dims.dp_replicate * dims.dp_shard == d.data
    assert (
        par.tensor_parallel_degree,
        par.pipeline_parallel_degree,
        par.context_parallel_degree,
        par.expert_parallel_degree,
    ) == (d.tensor, d.pipeline, d.context, d.expert)
    assert (dims.dp_shard * d.context * d.tensor) % d.expert == 0  # torchtitan's EP mesh constraint
    assert (par.data_parallel_shard_degree > 1) == (plan.zero_stage >= 1 or d.expert > 1) or d.data == 1
    assert config.training.local_batch_size == plan.microbatch_size * plan.num_microbatches
    assert config.training.local_batch_size // par.pipeline_parallel_microbatch_size == plan.num_microbatches
    assert config.training.global_batch_size == plan.global_batch_size
    assert config.training.seq_len == plan.transformer.seq_length
    # the registry flavor is the plan's model
    module, flavor, _ = _flavor_model(plan)
    if CPU_STAND_INS.get(TORCHTITAN_CONFIGS[plan.transformer.name][1]) is None:
        assert config.model_spec.flavor == flavor
    built = read_torchtitan_model(f"{module}:{flavor}", seq_length=plan.transformer.seq_length)
    assert _shape(built) == _shape(plan.transformer)
    if d.pipeline > 1:
        _check_fqns(config, plan)


def _check_fqns(config, plan) -> None:
    """Every module name exists in torchtitan's model (built on the meta device), each once, in order."""
    import torch

    with torch.device("meta"):
        model = _flavor_model(plan)[2].build()
    names = set(dict(model.named_modules()))
    parts = config.parallelism.module_fqns_per_model_part
    assert len(parts) == plan.degrees.pipeline * plan.degrees.virtual
    flat = [fqn for part in parts for fqn in part]
    assert set(flat) <= names and len(flat) == len(set(flat))
    assert flat == ["tok_embeddings", *[f"layers.{i}" for i in range(plan.transformer.num_layers)], "norm", "lm_head"]
    assert [len(p) for p in parts][0] == len(range(*plan.virtual_stages()[0].layers))


def test_activation_checkpointing_and_schedules() -> None:
    from torchtitan.distributed.activation_checkpoint import FullAC

    config = _load(to_torchtitan_args(preset_plan("llama3-8b", p=2, data=4, recompute="full")))
    assert isinstance(config.activation_checkpoint, FullAC.Config)
    assert config.parallelism.pipeline_parallel_schedule == "1F1B"
    none = _load(to_torchtitan_args(preset_plan("llama3-8b", data=8)))
    assert type(none.activation_checkpoint).__name__ != "FullAC.Config"
    zb = preset_plan("llama3-8b", p=2, data=4, schedule="zb-h1")
    config = _load(to_torchtitan_args(zb, schedule_csv_path="/tmp/plan.csv"))
    assert config.parallelism.pipeline_parallel_schedule_csv == "/tmp/plan.csv"
    text = torchtitan_args_text(zb, schedule_csv_path="/tmp/plan.csv")
    assert "--format torch-csv -o /tmp/plan.csv" in text
    assert to_torch_csv(zb).count("\n") == 2  # the CSV it names: one row per pipeline rank
    # torchtitan has no activation offloading: full checkpointing, with a warning that says so
    offload = preset_plan("llama3-8b", data=8, recompute="offload")
    assert isinstance(_load(to_torchtitan_args(offload)).activation_checkpoint, FullAC.Config)
    assert "torchtitan has no activation offloading" in torchtitan_args_text(offload)


def test_models_torchtitan_does_not_ship_are_refused() -> None:
    with pytest.raises(InvalidProblemError, match="no config_registry function"):
        to_torchtitan_args(preset_plan("mixtral-8x7b", data=8))


@pytest.mark.parametrize("preset", sorted(TORCHTITAN_CONFIGS))
def test_registry_table_matches_the_presets(preset: str) -> None:
    """Each table entry's torchtitan flavor has the preset's shape (read by torchtitan's registry)."""
    from cost_models.models import model_preset

    module, function, flavor = TORCHTITAN_CONFIGS[preset]
    if function not in CPU_STAND_INS:
        assert _load(["--module", module, "--config", function]).model_spec.flavor == flavor
    cfg = model_preset(preset)
    built = read_torchtitan_model(f"{module}:{flavor}", seq_length=cfg.seq_length)
    assert _shape(built) == _shape(cfg)
    # biases and norms included; torchtitan's DeepSeek-V3 has no multi-token-prediction module
    assert built.mtp_layers == 0
    assert moe.num_parameters(built) == moe.num_parameters(cfg.model_copy(update={"mtp_layers": 0}))
    assert built.rope_theta == cfg.rope_theta
    router = (
        "router_score_function",
        "router_expert_bias",
        "router_topk_scaling_factor",
        "router_num_groups",
        "router_group_topk",
    )
    assert {k: getattr(built, k) for k in router} == {k: getattr(cfg, k) for k in router}
    # torchtitan states DeepSeek-V3's RMSNorm epsilon as 1e-5, the released config.json as 1e-6
    assert built.norm_eps == (1e-5 if preset == "deepseek-v3" else cfg.norm_eps)


_SHAPE = (
    "hidden_size",
    "num_layers",
    "num_heads",
    "kv_heads",
    "vocab_size",
    "num_experts",
    "experts_per_token",
    "num_shared_experts",
    "first_dense_layers",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "head_size",
    "qk_norm",
    "tied_embeddings",
)


def _shape(cfg) -> dict:
    """The fields that fix parameters and FLOPs (the dense FFN width only where a dense layer uses it)."""
    out = {f: getattr(cfg, f) for f in _SHAPE}
    out["expert_width"] = (cfg.moe_ffn_hidden_size or cfg.ffn_size) if cfg.num_experts else None
    out["dense_width"] = cfg.ffn_size if not cfg.num_experts or cfg.first_dense_layers else None
    return out


@pytest.mark.parametrize(("schedule", "name"), [("zb-v", "ZBVZeroBubble"), ("dualpipe-v", "DualPipeV")])
def test_v_schedules_export_by_name_with_v_stage_placement(schedule: str, name: str) -> None:
    """torchtitan builds the V schedules by name and places stage r and 2p - 1 - r on rank r
    (its own ``_get_pp_rank_to_stage_indices_mapping``): the module names each rank gets are the
    plan's chunks of that rank."""
    from torchtitan.distributed.pipeline_parallel import _get_pp_rank_to_stage_indices_mapping

    plan = preset_plan("llama3-8b", p=4, v=2, data=2, m=8, schedule=schedule)
    config = _load(to_torchtitan_args(plan))
    par = config.parallelism
    assert par.pipeline_parallel_schedule == name and par.pipeline_parallel_schedule_csv in (None, "")
    parts = par.module_fqns_per_model_part
    for rank, stage in enumerate(plan.stages):
        ids = _get_pp_rank_to_stage_indices_mapping(rank, 4, par.pipeline_parallel_schedule, 8)
        assert ids == (rank, 7 - rank)
        for k, chunk in zip(ids, stage.chunks):
            first, last = chunk.layers
            expected = {0: ["tok_embeddings"], plan.model.num_layers - 1: ["norm", "lm_head"]}
            assert parts[k] == [n for i in range(first, last) for n in expected.get(i, [f"layers.{i - 1}"])]


def test_multi_token_prediction_is_a_warning_for_torchtitan() -> None:
    """torchtitan's DeepSeek-V3 has no multi-token-prediction module: the export of a plan that costs one
    says the run trains without it (and so runs faster than planned); the main model's plan says nothing."""
    from cost_models.models import model_preset

    cfg = model_preset("deepseek-v3")
    text = torchtitan_args_text(preset_plan(cfg, data=8, expert=8))
    assert "# WARNING: mtp_layers=1: torchtitan's models have no multi-token-prediction module" in text
    plain = preset_plan(cfg.model_copy(update={"mtp_layers": 0}), data=8, expert=8)
    assert "multi-token" not in torchtitan_args_text(plain)
