"""Model configs in: Hugging Face config.json (transformers' AutoConfig), torchtitan's model
registry, Megatron-LM arguments; --seq-length; bad input gets exit 2 naming the field and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cost_models import moe
from cost_models.models import model_preset
from planner import api
from planner.cli import main
from planner.errors import InvalidProblemError
from tests.planner.modern_plans import preset_plan

HF = Path(__file__).resolve().parents[1] / "data" / "hf"


@pytest.fixture(scope="module")
def hf_reader():
    pytest.importorskip("transformers")
    from planner.config_readers import hf_reader

    return hf_reader


# bundled config.json -> the preset with the same model (None: no preset; published total instead)
HF_CASES = [
    ("llama-3-8b", "llama3-8b", None),
    ("llama-3.1-405b", "llama3-405b", None),
    ("mixtral-8x7b", "mixtral-8x7b", None),
    ("qwen3-30b-a3b", "qwen3-30b-a3b", None),
    ("deepseek-v3", "deepseek-v3", None),
    ("gpt-oss-20b", "gpt-oss-20b", None),
    ("qwen2-7b", None, 7_615_616_512),
    ("mistral-7b", None, 7_241_732_096),
]


@pytest.mark.parametrize(("directory", "preset", "total"), HF_CASES)
def test_hf_configs_read_into_the_preset_model(
    hf_reader, directory: str, preset: str | None, total: int | None
) -> None:
    cfg = hf_reader.read_hf_config(HF / directory / "config.json", seq_length=4096)
    if preset is None:  # the released checkpoints' exact parameter counts
        assert moe.num_parameters(cfg) == total
        assert cfg.qkv_bias == (directory == "qwen2-7b") and not cfg.bias
        return
    ref = model_preset(preset)
    assert moe.num_parameters(cfg) == moe.num_parameters(ref)
    assert moe.num_active_parameters(cfg) == moe.num_active_parameters(ref)
    # nothing the file states is lost: RoPE base and norm epsilon travel to the exports
    raw = json.loads((HF / directory / "config.json").read_text())
    assert cfg.rope_theta == raw["rope_theta"] and cfg.norm_eps == raw["rms_norm_eps"]
    assert cfg.seq_length == 4096 and cfg.dtype == "bf16" and not cfg.tied_embeddings
    router = (
        "router_score_function",
        "router_expert_bias",
        "router_topk_scaling_factor",
        "router_num_groups",
        "router_group_topk",
        "first_dense_layers",
        "num_shared_experts",
        "qk_norm",
        "head_dim",
        "sliding_window",
        "global_attention_every",
    )
    assert {k: getattr(cfg, k) for k in router} == {k: getattr(ref, k) for k in router}


def test_hf_sliding_windows(hf_reader, tmp_path) -> None:
    """gpt-oss: a 128-token window, layer_types alternating sliding and full (every 2nd layer global);
    Mistral 7B v0.1: a 4,096-token window in every layer; Qwen2 states a window it does not use
    (use_sliding_window false); a layer_types pattern with no period is refused, naming the field."""
    oss = hf_reader.read_hf_config(HF / "gpt-oss-20b" / "config.json", seq_length=4096)
    assert (oss.sliding_window, oss.global_attention_every, oss.windowed_layers) == (128, 2, 12)
    mistral = hf_reader.read_hf_config(HF / "mistral-7b" / "config.json", seq_length=8192)
    assert (mistral.sliding_window, mistral.global_attention_every, mistral.windowed_layers) == (4096, None, 32)
    assert hf_reader.read_hf_config(HF / "qwen2-7b" / "config.json", seq_length=4096).sliding_window is None
    raw = json.loads((HF / "gpt-oss-20b" / "config.json").read_text())
    raw["layer_types"] = ["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 19 + ["full_attention"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(InvalidProblemError, match="layer_types=.*not periodic"):
        hf_reader.read_hf_config(tmp_path / "config.json", seq_length=4096)


def test_hf_sequence_length_defaults(hf_reader) -> None:
    # DeepSeek-V3 and Llama 3.1 state their pre-training length in rope_scaling; Llama 3 only its maximum
    assert hf_reader.read_hf_config(HF / "deepseek-v3").seq_length == 4096
    llama31 = hf_reader.read_hf_config(HF / "llama-3.1-405b")
    assert llama31.seq_length == 8192 and llama31.rope_scaling["rope_type"] == "llama3"
    assert llama31.rope_scaling["factor"] == 8.0
    assert hf_reader.read_hf_config(HF / "llama-3-8b").seq_length == 8192
    assert api.load_model(f"hf:{HF / 'llama-3-8b'}", seq_length=2048).seq_length == 2048


def test_hf_values_reach_the_megatron_export(hf_reader) -> None:
    from planner.export import to_megatron_args

    cfg = hf_reader.read_hf_config(HF / "deepseek-v3" / "config.json")
    args = to_megatron_args(preset_plan(cfg.model_copy(update={"name": "x"}), data=8, expert=8))
    pairs = dict(zip(args, [*args[1:], None]))
    assert pairs["--rotary-base"] == "10000" and pairs["--norm-epsilon"] == "1e-06"
    assert pairs["--num-experts"] == "256" and pairs["--moe-layer-freq"] == "([0]*3+[1]*58)"
    assert pairs["--moe-shared-expert-intermediate-size"] == "2048" and pairs["--kv-lora-rank"] == "512"


def test_hf_config_json_without_prefix_is_recognised(hf_reader) -> None:
    """The issue's first-hour failure: a plain config.json path used to fail with 15 'unknown key' lines."""
    cfg = api.load_model(HF / "llama-3-8b" / "config.json", seq_length=4096)
    assert cfg.rope_theta == 500000.0 and moe.num_parameters(cfg) == 8_030_261_248


def test_hf_unsupported_architecture_exits_2(hf_reader, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model-info", f"hf:{HF / 'unsupported-mamba' / 'config.json'}"]) == 2
    err = capsys.readouterr().err
    assert "model_type='mamba'" in err and "'llama'" in err and "'gpt_neox'" in err and "Traceback" not in err


# (directory, paraplan's count minus transformers' count of the same config and why, mlp, position
#  embedding, parallel block, K/V heads)
HF_FAMILIES = [
    ("gpt2", 0, "gelu", "learned", False, 12),
    ("starcoder", 0, "gelu", "learned", False, 1),  # multi-query attention
    ("opt-125m", -2 * 768, "relu", "learned", False, 12),  # OPT's 2 offset rows of positions
    ("bloom-560m", -2 * 1024, "gelu", "alibi", False, 16),  # the LayerNorm after the word embedding
    ("mpt-7b", 65 * 4096, "gelu", "alibi", False, 32),  # no_bias LayerNorms (paraplan counts a LayerNorm's bias)
    ("pythia-160m", 0, "gelu", "rope", True, 12),
    ("gptj-6b", 28 * (4 + 2) * 4096 - 50_400, "gelu", "rope", True, 16),  # no Q/K/V/O biases, one norm; head bias
    ("falcon-7b", 32 * 2 * 4544, "gelu", "rope", True, 1),  # one LayerNorm per block
    ("phi-2", 32 * 2 * 2560 - 51_200, "gelu", "rope", True, 32),  # one LayerNorm per block; head bias
    ("gemma-2b", 0, "geglu", "rope", False, 1),
    ("starcoder2-3b", 0, "gelu", "rope", False, 2),
    ("qwen1.5-moe", -24 * 2048, "swiglu", "rope", False, 16),  # the shared expert's sigmoid gate
]


@pytest.mark.parametrize(("directory", "delta", "mlp", "positions", "parallel", "kv"), HF_FAMILIES)
def test_hf_families_count_transformers_parameters(
    hf_reader, directory: str, delta: int, mlp: str, positions: str, parallel: bool, kv: int
) -> None:
    """GPT-2, StarCoder, OPT, BLOOM, MPT, Pythia, GPT-J, Falcon, Phi-2, Gemma, StarCoder 2 and Qwen1.5-MoE:
    the architecture read from the file, and the parameters of transformers' own model built from it
    (on the meta device: no memory) up to the tensors paraplan does not model, each named next to its
    case. Planned at the context the file states, the length of a learned position table."""
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(HF / directory / "config.json"))
    cfg = hf_reader.read_hf_config(HF / directory / "config.json")
    assert moe.num_parameters(cfg) == sum(p.numel() for p in reference.parameters()) + delta
    assert (cfg.mlp, cfg.position_embedding, cfg.parallel_block, cfg.kv_heads) == (mlp, positions, parallel, kv)


H, L = 256, 4  # the small configs below: hidden 256, 4 layers, 8 heads of 32, 4 K/V heads
# model_type -> paraplan's count minus transformers' and why
HF_DEFAULT_FAMILIES = {
    "gemma2": -2 * H * L,  # Gemma 2's post-attention and post-FFN norms
    "gemma3_text": -2 * H * L,
    "olmo": 2 * H * (2 * L + 1),  # OLMo's LayerNorms have no parameters
    "olmo2": -(8 * 32 + 4 * 32 - 2 * 32) * L,  # OLMo 2 normalises whole Q and K projections, not per head
    "cohere": 2 * H * (2 * L + 1) - H * (L + 1),  # one bias-free LayerNorm per block
    "stablelm": 0,
    "granite": 0,
    "phi3": 0,
    "deepseek_v2": 0,
    "glm4": -2 * H * L,  # GLM-4's post-attention and post-FFN norms
    "glm4_moe": 0,
    "dots1": 0,
    "olmo3": -(8 * 32 + 4 * 32 - 2 * 32) * L,  # as OLMo 2
    "olmoe": -(8 * 32 + 4 * 32 - 2 * 32) * L,
    "minimax_m2": -(8 * 32 + 4 * 32 - 2 * 32) * L,
    "granitemoe": 0,
    "granitemoeshared": 0,
    "phimoe": 0,
    "ernie4_5": 0,
    "ernie4_5_moe": -8 * (L - 1),  # ERNIE's per-expert selection bias is a parameter (a buffer elsewhere)
    "seed_oss": 0,
    "smollm3": 0,
}
MOE_SHAPE = {"n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128, "n_shared_experts": 1,
             "first_k_dense_replace": 1}
HF_FAMILY_FIELDS: dict[str, dict[str, object]] = {
    "deepseek_v2": {"kv_lora_rank": 64, "q_lora_rank": 96, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
                    "v_head_dim": 32, **MOE_SHAPE, "n_group": 2, "topk_group": 1},
    "glm4": {"head_dim": 32},
    "glm4_moe": {**MOE_SHAPE, "n_group": 2, "topk_group": 1, "attention_bias": True},
    "dots1": MOE_SHAPE,
    "olmo3": {"sliding_window": 128},
    "olmoe": {"num_experts": 8, "num_experts_per_tok": 2},
    "minimax_m2": {"num_local_experts": 8, "num_experts_per_tok": 2, "head_dim": 32},
    "granitemoe": {"num_local_experts": 8, "num_experts_per_tok": 2},
    "granitemoeshared": {"num_local_experts": 8, "num_experts_per_tok": 2, "shared_intermediate_size": 1024},
    "phimoe": {"num_local_experts": 8, "num_experts_per_tok": 2},
    "ernie4_5": {"head_dim": 32},
    "ernie4_5_moe": {"moe_num_experts": 8, "moe_k": 2, "moe_intermediate_size": 128, "moe_num_shared_experts": 1,
                     "moe_layer_start_index": 1, "moe_layer_end_index": L - 1},
    "seed_oss": {"head_dim": 32},
}
"""Each family's own fields at the small size (MoE, MLA, windows) beside the shape every test gives."""


@pytest.mark.parametrize("model_type", list(HF_DEFAULT_FAMILIES))
def test_hf_default_configs_of_more_families(hf_reader, tmp_path: Path, model_type: str) -> None:
    """Gemma 2/3, OLMo 1/2/3, OLMoE, Cohere, StableLM, Granite (and its MoEs), Phi-3, PhiMoE, DeepSeek-V2,
    GLM-4 and GLM-4.5 (glm4_moe), dots.llm1, MiniMax-M2, ERNIE 4.5 (dense and MoE), Seed-OSS and SmolLM3
    at a small size written by transformers' own config classes: the parameters of transformers' model up
    to the named tensors, and the MoE layout read from each family's own field names."""
    torch = pytest.importorskip("torch")
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    # pad/bos/eos: some families' default token ids lie outside a 1,000-token vocabulary
    shape = {"hidden_size": H, "num_hidden_layers": L, "num_attention_heads": 8, "num_key_value_heads": 4,
             "intermediate_size": 512, "vocab_size": 1000, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
             **HF_FAMILY_FIELDS.get(model_type, {})}
    config = CONFIG_MAPPING[model_type](**shape)
    config.save_pretrained(tmp_path)
    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(config)
    cfg = hf_reader.read_hf_config(tmp_path, seq_length=512)
    # GLM-4.5 states its multi-token-prediction module (num_nextn_predict_layers), which transformers' model
    # does not build: compared without it
    assert cfg.mtp_layers == (config.num_nextn_predict_layers if model_type == "glm4_moe" else 0)
    main = cfg.model_copy(update={"mtp_layers": 0})
    assert moe.num_parameters(main) == sum(p.numel() for p in reference.parameters()) + HF_DEFAULT_FAMILIES[model_type]
    assert cfg.mlp == ("geglu" if model_type.startswith("gemma") else "swiglu")
    assert cfg.parallel_block == (model_type == "cohere")
    fields = HF_FAMILY_FIELDS.get(model_type, {})
    if cfg.is_moe:  # 8 experts, 2 per token; the shared MLPs and the dense prefix each family states
        shared = 2 if model_type == "granitemoeshared" else int(fields.get("n_shared_experts",  # type: ignore[call-overload]
                                                                               fields.get("moe_num_shared_experts", 0)))
        dense = int(fields.get("first_k_dense_replace", fields.get("moe_layer_start_index", 0)))  # type: ignore[call-overload]
        assert (cfg.num_experts, cfg.experts_per_token, cfg.num_shared_experts, cfg.first_dense_layers) == \
            (8, 2, shared, dense)
    assert cfg.is_moe == any(k in fields for k in ("n_routed_experts", "num_experts", "num_local_experts",
                                                    "moe_num_experts"))


def test_hf_family_details(hf_reader) -> None:
    """Qwen1.5-MoE's 5,632-wide shared expert is 4 routed-expert widths and its Q/K/V carry biases;
    StarCoder 2's 4,096-token window in every layer; GPT-2 and BLOOM plan at their stated lengths."""
    qwen = hf_reader.read_hf_config(HF / "qwen1.5-moe" / "config.json", seq_length=4096)
    assert (qwen.num_experts, qwen.experts_per_token, qwen.num_shared_experts, qwen.qkv_bias) == (60, 4, 4, True)
    coder = hf_reader.read_hf_config(HF / "starcoder2-3b" / "config.json", seq_length=4096)
    assert (coder.sliding_window, coder.global_attention_every, coder.bias, coder.norm) == (4096, None, True, "layernorm")
    assert hf_reader.read_hf_config(HF / "gpt2" / "config.json").seq_length == 1024
    assert hf_reader.read_hf_config(HF / "bloom-560m" / "config.json").seq_length == 2048


def test_hf_families_plan_and_refuse_megatron_export(hf_reader, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A Pythia plan comes out of the CLI; Megatron-LM has no parallel block, so its export exits 2
    naming the field instead of writing flags for another network."""
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", f"hf:{HF / 'pythia-160m'}", "--cluster", "a100-80gb:8", "--solver", "ptdp",
                 "--global-batch", "64", "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["export", str(out), "--format", "megatron"]) == 2
    err = capsys.readouterr().err
    assert "parallel_block=true" in err and "Traceback" not in err


def test_hf_config_plans_without_edits(hf_reader, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    code = main(
        [
            "plan",
            "--model",
            f"hf:{HF / 'llama-3-8b' / 'config.json'}",
            "--seq-length",
            "2048",
            "--cluster",
            "h100:1x8",
            "--solver",
            "even",
            "--tensor-parallel",
            "2",
            "--pipeline",
            "2",
            "--global-batch",
            "16",
            "-o",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr().err
    plan = api.load_plan(out)
    assert plan.transformer.rope_theta == 500000.0 and plan.transformer.seq_length == 2048
    assert plan.sequence_parallel  # t = 2: the memory model assumes sequence parallelism, the plan says so
    assert "--sequence-parallel" in api.export(plan, "megatron")
    assert main(["export", str(out), "--format", "torchtitan", "--schedule-csv", "s.csv"]) == 0
    text = capsys.readouterr().out
    assert "--module llama3 \\\n--config llama3_8b \\" in text and "--parallelism.enable-sequence-parallel" in text


def test_megatron_reader_errors_name_the_flag(tmp_path: Path) -> None:
    path = tmp_path / "args.txt"
    path.write_text("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128\n")
    with pytest.raises(InvalidProblemError, match=r"lack \['--vocab-size'\]"):
        api.load_model(f"megatron:{path}")
    path.write_text(
        "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --vocab-size 100 \\\n"
        "  --num-experts 4 --moe-layer-freq '[1,0,1,0]'  # interleaved dense layers\n"
    )
    with pytest.raises(InvalidProblemError, match="--moe-layer-freq"):
        api.load_model(f"megatron:{path}")


def test_torchtitan_reader_names_flavors() -> None:
    pytest.importorskip("torchtitan")
    pytest.importorskip("triton")
    cfg = api.load_model("torchtitan:llama3:8B", seq_length=8192)
    assert moe.num_parameters(cfg) == moe.num_parameters(model_preset("llama3-8b"))
    with pytest.raises(InvalidProblemError, match=r"no flavor '9B'; choose from \['1B', '3B', '405B'"):
        api.load_model("torchtitan:llama3:9B")
    with pytest.raises(InvalidProblemError, match="not supported; choose from"):
        api.load_model("torchtitan:flux:dev")


def _write_plan(tmp_path: Path, plan) -> str:
    data = json.loads(plan.model_dump_json())
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_expert_degree_not_dividing_the_experts_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = json.loads(preset_plan("mixtral-8x7b", data=8, expert=2).model_dump_json())
    plan["degrees"]["expert"] = 3
    plan["degrees"]["data"] = 6
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    assert main(["export", str(path), "--format", "megatron"]) == 2
    err = capsys.readouterr().err
    assert "transformer.num_experts=8 is not divisible by degrees.expert=3" in err and "e.g. 2" in err


def test_context_degree_not_dividing_the_sequence_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = json.loads(preset_plan("llama3-8b", data=8).model_dump_json())
    plan["degrees"]["context"] = 3
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    assert main(["simulate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "transformer.seq_length=8192 is not divisible by 2 x degrees.context = 6" in err
    assert "Traceback" not in err


def test_seq_length_applies_to_presets_not_profiles() -> None:
    assert api.load_model("llama3-8b", seq_length=131072).seq_length == 131072
    with pytest.raises(InvalidProblemError, match="--seq-length applies to transformer configs"):
        api.load_model("pipedream:vgg16", seq_length=128)


def test_readers_and_exports_load_no_tool_until_used() -> None:
    """The readers import transformers/torchtitan only when called; the modules themselves stay light."""
    import subprocess
    import sys

    code = (
        "import sys, planner.config_readers, planner.export_torchtitan, planner.export_megatron_flags, "
        "cost_models.moe, cost_models.parallelism, planner.api\n"
        "heavy = [m for m in ('torch', 'transformers', 'torchtitan', 'megatron') if m in sys.modules]\n"
        "assert not heavy, heavy\nprint('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_missing_transformers_is_invalid_input_with_the_install_hint(monkeypatch, capsys) -> None:
    import builtins

    real_import = builtins.__import__

    def no_transformers(name, *args, **kwargs):
        if name == "transformers" or name.startswith("transformers."):
            raise ImportError("No module named 'transformers'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_transformers)
    assert main(["model-info", f"hf:{HF / 'llama-3-8b' / 'config.json'}"]) == 2
    assert "pip install 'paraplan[hf]'" in capsys.readouterr().err


def test_model_info_reports_the_windows(capsys) -> None:
    """`paraplan model-info gpt-oss-120b`: 128-token windows, every 2nd layer global, 18 windowed."""
    info = api.model_info("gpt-oss-120b")
    assert (info["sliding_window"], info["global_attention_every"], info["windowed_layers"]) == (128, 2, 18)
    assert "windowed_layers" not in api.model_info("llama3-8b")
    assert main(["model-info", "gpt-oss-120b"]) == 0 and "windowed_layers                    18" in capsys.readouterr().out


def test_megatron_window_flags(tmp_path) -> None:
    """--window-size LEFT,RIGHT (causal: RIGHT 0) and --window-attn-skip-freq N read back as the
    window LEFT + 1 and one global layer every N; -1,0 is Megatron's infinite window (full attention);
    a bidirectional window, a skip frequency without a window or as a list are refused by name."""
    from planner.config_readers.megatron_reader import read_megatron_args

    base = "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 512 --vocab-size 1000 "

    def read(extra: str):
        path = tmp_path / "args.sh"
        path.write_text(base + extra)
        return read_megatron_args(path)

    cfg = read("--window-size 127,0 --window-attn-skip-freq 2")
    assert (cfg.sliding_window, cfg.global_attention_every, cfg.windowed_layers) == (128, 2, 2)
    assert read("--window-size (4095,0)").sliding_window == 4096
    assert read("--window-size=-1,0").sliding_window is None
    for extra, needle in (("--window-size 127,5", "causal windows only"),
                          ("--window-size -1,0", "expected one argument"),
                          ("--num-layers x", "--num-layers: invalid int value"),
                          ("--window-attn-skip-freq 2", "needs --window-size"),
                          ("--window-size 127,0 --window-attn-skip-freq [1,0,1,0]", "write an integer N"),
                          ("--window-size x", "write LEFT,RIGHT")):
        with pytest.raises(InvalidProblemError, match=needle.replace("(", r"\(").replace("[", r"\[")):
            read(extra)


@pytest.mark.parametrize(("model_type", "field", "value"), [
    ("gpt2", "n_embd", None), ("gptj", "n_embd", 0), ("gemma", "sliding_window", "x"),
    ("mpt", "expansion_ratio", 0.0001), ("falcon", "num_attention_heads", -1), ("qwen2_moe", "num_experts", "x"),
])
def test_hf_fields_of_the_wrong_type_or_range_exit_2(hf_reader, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     model_type: str, field: str, value: object) -> None:
    """Whatever a config.json holds, reading it ends in exit 0 or 2 naming the file, never a traceback
    (an in-process sweep of 32 fields x 9 bad values x all 29 architectures found none)."""
    from transformers import CONFIG_MAPPING

    raw = {**CONFIG_MAPPING[model_type]().to_dict(), "model_type": model_type, field: value}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert main(["model-info", f"hf:{tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "config.json" in err and "Traceback" not in err and "internal error" not in err


def test_ernie_moe_layers_other_than_a_dense_prefix_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """ERNIE 4.5 states its MoE layers as a start, an end and an interval; paraplan models dense layers
    only as a prefix, so every other layout is refused naming the three fields."""
    pytest.importorskip("transformers")
    from transformers import CONFIG_MAPPING

    shape = {"hidden_size": H, "num_hidden_layers": L, "num_attention_heads": 8, "num_key_value_heads": 4,
             "intermediate_size": 512, "vocab_size": 1000, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
             **HF_FAMILY_FIELDS["ernie4_5_moe"], "moe_layer_interval": 2}
    CONFIG_MAPPING["ernie4_5_moe"](**shape).save_pretrained(tmp_path)
    assert main(["model-info", f"hf:{tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "moe_layer_interval=2" in err and "first_dense_layers" in err and "Traceback" not in err
