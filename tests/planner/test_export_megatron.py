"""Exported Megatron-LM arguments of today's models, validated by megatron-core's own classes
(see tests/planner/megatron_check.py for exactly what is built and checked)."""

from __future__ import annotations

import pytest

from cost_models.models import model_preset
from planner.config_readers.megatron_reader import read_megatron_args
from planner.export import megatron_args_text, to_megatron_args
from tests.planner.megatron_check import parse, validate
from tests.planner.modern_plans import preset_plan

pytest.importorskip("megatron.core")

# (id, plan, world size): every dimension the plans carry.
CASES = [
    ("llama2-7b-d8-zero1", lambda: preset_plan("llama2-7b", data=8, zero_stage=1), 8),
    ("llama3-8b-t2-sp", lambda: preset_plan("llama3-8b", p=2, tensor=2, data=2, zero_stage=1), 8),
    ("llama3-70b-fsdp", lambda: preset_plan("llama3-70b", tensor=8, data=4, zero_stage=3), 32),
    (
        "llama3-405b-p16-uneven-ends",
        lambda: preset_plan("llama3-405b", [7] + [8] * 14 + [7], p=16, tensor=8, data=2, zero_stage=1, m=16),
        256,
    ),
    (
        "llama3-405b-cp",
        lambda: preset_plan("llama3-405b", [7] + [8] * 14 + [7], p=16, tensor=8, context=2, zero_stage=1, m=16),
        256,
    ),
    ("llama3-8b-interleaved-p2", lambda: preset_plan("llama3-8b", p=2, v=2, tensor=1, data=4, m=4), 8),
    ("llama3-8b-layout", lambda: preset_plan("llama3-8b", [5, 9, 9, 9], p=4, data=2), 8),
    ("llama3-8b-recompute-full", lambda: preset_plan("llama3-8b", p=2, data=4, recompute="full"), 8),
    ("llama3-8b-recompute-selective", lambda: preset_plan("llama3-8b", p=2, data=4, recompute="selective"), 8),
    ("mixtral-8x7b-ep8", lambda: preset_plan("mixtral-8x7b", p=4, tensor=2, data=8, expert=8, zero_stage=1), 64),
    ("qwen3-30b-a3b-ep8-cp2", lambda: preset_plan("qwen3-30b-a3b", data=4, context=2, expert=8, zero_stage=1), 8),
    ("qwen3-32b-kv-channels", lambda: preset_plan("qwen3-32b", tensor=8, data=1, zero_stage=1), 8),
    (
        "deepseek-v3-pp16-ep64",
        lambda: preset_plan("deepseek-v3", [3] + [4] * 14 + [2], p=16, data=128, expert=64, zero_stage=1, m=16),
        2048,
    ),
    ("gpt-oss-120b-ep8", lambda: preset_plan("gpt-oss-120b", data=8, expert=8, zero_stage=1), 8),
]


@pytest.mark.parametrize(("name", "make", "world"), CASES, ids=[c[0] for c in CASES])
def test_megatron_core_accepts_the_export(name: str, make, world: int) -> None:
    plan = make()
    argv = to_megatron_args(plan)
    built = validate(argv, world_size=world)
    d = plan.degrees
    assert built["data_parallel_size"] == d.data
    cfg = built["transformer"]
    assert cfg.tensor_model_parallel_size == d.tensor and cfg.pipeline_model_parallel_size == d.pipeline
    assert cfg.context_parallel_size == d.context and cfg.expert_model_parallel_size == d.expert
    assert cfg.sequence_parallel == (d.tensor > 1)
    assert built["ddp"].use_distributed_optimizer == (plan.zero_stage >= 1)
    assert built["microbatches"].get() == plan.num_microbatches
    model = plan.transformer
    assert cfg.layernorm_epsilon == model.norm_eps
    if model.num_experts:
        assert cfg.num_moe_experts == model.num_experts and cfg.moe_router_topk == model.experts_per_token
    if model.sliding_window:  # GPT-OSS: 128-token windows, every 2nd layer global
        assert cfg.window_size == (model.sliding_window - 1, 0)
        assert cfg.window_attn_skip_freq == model.global_attention_every
    else:
        assert cfg.window_size is None
    args = parse(argv)
    assert args["--rotary-base"] == model.rope_theta
    if built["rope"] is not None:  # Megatron's RotaryEmbedding uses the exported base
        dim = cfg.kv_channels
        expected = 1.0 / model.rope_theta ** (2 / dim)
        # (Llama 3.1 scaling leaves this high-frequency component unscaled)
        assert float(built["rope"].inv_freq[1]) == pytest.approx(expected, rel=1e-5)
        lowest = 1.0 / model.rope_theta ** ((dim - 2) / dim)
        scale = 8.0 if args.get("--use-rope-scaling") else 1.0  # Llama 3.1: long wavelengths / factor
        assert float(built["rope"].inv_freq[-1]) == pytest.approx(lowest / scale, rel=1e-4)


def test_deepseek_v3_yarn_reaches_the_mla_config() -> None:
    """The released config's YaRN scaling (factor 40, mscale 1, mscale_all_dim 1) is not left at
    Megatron-LM's argument defaults (--rotary-scaling-factor 1.0, --mscale-all-dim 0.0)."""
    cfg = validate(to_megatron_args(preset_plan("deepseek-v3", data=8, expert=8)), world_size=8)["transformer"]
    assert (cfg.rope_type, cfg.rotary_scaling_factor, cfg.mscale, cfg.mscale_all_dim) == ("yarn", 40, 1.0, 1.0)
    # the router as released: sigmoid scores, expert bias, 2.5 scaling, 4 of 8 groups
    assert (
        cfg.moe_router_score_function,
        cfg.moe_router_enable_expert_bias,
        cfg.moe_router_topk_scaling_factor,
        cfg.moe_router_num_groups,
        cfg.moe_router_group_topk,
    ) == ("sigmoid", True, 2.5, 8, 4)
    assert (cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_head_dim, cfg.qk_pos_emb_head_dim, cfg.v_head_dim) == (
        1536,
        512,
        128,
        64,
        128,
    )


def test_uneven_ends_reach_megatron_core_as_first_and_last_stage_counts() -> None:
    plan = preset_plan("llama3-405b", [7] + [8] * 14 + [7], p=16, tensor=8, data=2, m=16)
    cfg = validate(to_megatron_args(plan), world_size=256)["transformer"]
    assert (cfg.num_layers_in_first_pipeline_stage, cfg.num_layers_in_last_pipeline_stage) == (7, 7)


def test_megatron_core_rejects_what_megatron_rejects() -> None:
    """The check can fail: MoE with TP but no sequence parallelism, and an unknown flag."""
    plan = preset_plan("mixtral-8x7b", p=4, tensor=2, data=8, expert=8, sequence_parallel=False)
    with pytest.raises(UserWarning, match="sequence parallelism must be used"):
        validate(to_megatron_args(plan), world_size=64)
    heads = preset_plan("llama3-8b", tensor=3, data=1)  # 32 heads over 3 ranks
    with pytest.raises(ValueError, match="num_attention_heads"):
        validate(to_megatron_args(heads), world_size=3)
    with pytest.raises(AssertionError, match="not divisible by t x p x c"):
        validate(to_megatron_args(preset_plan("llama3-8b", p=2, data=2)), world_size=5)
    with pytest.raises(AssertionError, match="global batch size"):  # megatron-core's microbatch calculator
        validate(to_megatron_args(preset_plan("llama3-8b", p=2, data=2)), world_size=6)
    with pytest.raises(AssertionError, match="not a Megatron-LM flag"):
        validate(
            ["--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "2", "--overlap-p2p-comm"],
            world_size=2,
        )


@pytest.mark.parametrize("name", ["llama3-405b", "mixtral-8x7b", "deepseek-v3", "qwen3-32b", "gpt-oss-20b"])
def test_megatron_export_reads_back_to_the_same_model(name: str, tmp_path) -> None:
    plan = preset_plan(name, data=8)
    path = tmp_path / "args.sh"
    path.write_text(megatron_args_text(plan))
    back = read_megatron_args(path, name=name)
    assert back == plan.transformer.model_copy(update={"rope_scaling": back.rope_scaling})
    if plan.transformer.rope_scaling and plan.transformer.rope_scaling.get("rope_type") == "llama3":
        assert back.rope_scaling == {"rope_type": "llama3", "factor": 8.0}


@pytest.mark.parametrize(("name", "strategy", "flags"), [
    ("deepseek-v3", "layernorm+mla_up_proj", ["--recompute-modules", "layernorm", "mla_up_proj"]),
    ("qwen3-30b-a3b", "moe_act+layernorm", ["--recompute-modules", "moe_act", "layernorm", "--moe-grouped-gemm"]),
    ("llama3-8b", "core_attn+mlp", ["--recompute-modules", "core_attn", "mlp"]),
    ("mixtral-8x7b", "moe", ["--recompute-modules", "moe"]),
])
def test_recompute_modules_reach_megatron_core(name: str, strategy: str, flags: list[str]) -> None:
    plan = preset_plan(name, data=8, expert=8 if name != "llama3-8b" else 1, recompute=strategy)
    argv = to_megatron_args(plan)
    start = argv.index("--recompute-granularity")
    assert argv[start:start + 2 + len(flags)] == ["--recompute-granularity", "selective", *flags]
    cfg = validate(argv, world_size=8)["transformer"]  # megatron-core's own checks of the set
    assert cfg.recompute_granularity == "selective"
    assert cfg.recompute_modules == flags[1:len(flags) - ("--moe-grouped-gemm" in flags)]
    text = megatron_args_text(plan)
    assert f"--recompute-modules {' '.join(flags[1:len(flags) - ('--moe-grouped-gemm' in flags)])}" in text


def test_megatron_core_rejects_module_sets_megatron_rejects() -> None:
    plan = preset_plan("qwen3-30b-a3b", data=8, expert=8, recompute="moe_act")
    argv = [a for a in to_megatron_args(plan) if a != "--moe-grouped-gemm"]
    with pytest.raises(ValueError, match="moe_grouped_gemm"):  # why the export adds --moe-grouped-gemm
        validate(argv, world_size=8)
    dense = preset_plan("llama3-8b", data=8, recompute="mla_up_proj")
    with pytest.raises(ValueError, match="multi_latent_attention"):
        validate(to_megatron_args(dense), world_size=8)


def test_activation_offload_reaches_megatron_core_or_is_refused() -> None:
    """Offloading every decoder layer of a one-stage plan exports as Megatron-Core's layer-level CPU
    offloading of num_layers - 1 layers (its maximum; a warning says so), which megatron-core's own
    TransformerConfig accepts; with a pipeline, or mixed with recompute, Megatron-Core refuses CPU
    offloading, and so does the export, naming why."""
    from planner.errors import InvalidProblemError
    from planner.export import megatron_args_text

    plan = preset_plan("llama3-8b", data=8, zero_stage=1, recompute="offload")
    argv = to_megatron_args(plan)
    cfg = validate(argv, world_size=8)["transformer"]
    assert cfg.cpu_offloading and cfg.cpu_offloading_num_layers == 31
    assert "--recompute-granularity" not in argv
    assert "offloads at most num_layers - 1" in megatron_args_text(plan)
    with pytest.raises(InvalidProblemError, match="degrees.pipeline=2 and Megatron-Core has no CPU offloading"):
        to_megatron_args(preset_plan("llama3-8b", p=2, data=4, recompute="offload"))


def test_multi_token_prediction_reaches_megatron_core_and_reads_back(tmp_path) -> None:
    """DeepSeek-V3 with its one multi-token-prediction module (the preset's): the export writes
    --mtp-num-layers 1, megatron-core's TransformerConfig takes it, and the arguments read back to the
    same model; without the module, no flag."""
    cfg = model_preset("deepseek-v3")
    plan = preset_plan(cfg, data=8, expert=8)
    argv = to_megatron_args(plan)
    assert argv[argv.index("--mtp-num-layers") + 1] == "1"
    assert validate(argv, world_size=8)["transformer"].mtp_num_layers == 1
    path = tmp_path / "args.sh"
    path.write_text(megatron_args_text(plan))
    back = read_megatron_args(path, name=cfg.name)
    assert back.mtp_layers == 1 and back == cfg.model_copy(update={"rope_scaling": back.rope_scaling})
    main = cfg.model_copy(update={"mtp_layers": 0})
    assert "--mtp-num-layers" not in to_megatron_args(preset_plan(main, data=8, expert=8))


def test_layout_string_places_the_mtp_module_before_the_loss() -> None:
    """An uneven interleaved DeepSeek-V3 plan (61 layers as 15, 16, 15, 15 on p = 2, v = 2) exports a
    layout whose last virtual stage ends in ``mL``: megatron-core checks that the layout holds as many
    ``m`` as --mtp-num-layers, after every decoder layer, in a rank's last virtual stage."""
    cfg = model_preset("deepseek-v3")
    plan = preset_plan(cfg, [15, 16, 15, 15], p=2, v=2, data=4, expert=4)
    argv = to_megatron_args(plan)
    layout = argv[argv.index("--pipeline-model-parallel-layout") + 1]
    assert layout == "Et*15|t*16|t*15|t*15mL"
    assert validate(argv, world_size=8)["transformer"].mtp_num_layers == 1
    plain = preset_plan(cfg.model_copy(update={"mtp_layers": 0}), [15, 16, 15, 15], p=2, v=2, data=4, expert=4)
    bad = [a if a != layout else layout.replace("mL", "L") for a in argv]
    with pytest.raises(AssertionError, match="mtp layers in layout must match"):
        validate(bad, world_size=8)
    assert "mL" not in to_megatron_args(plain)[to_megatron_args(plain).index("--pipeline-model-parallel-layout") + 1]
