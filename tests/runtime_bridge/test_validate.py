"""Plans that cannot run are refused before launch (exit 2), without torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cost_models.models import model_preset
from planner import api
from planner.cli import main
from planner.errors import InvalidProblemError
from planner.schema import Plan, TransformerConfig
from runtime_bridge.validate import check_plan, layer_param_counts, num_ranks, resolve_config

TINY = model_preset("gpt-tiny")


def _plan(**kwargs) -> Plan:
    args = {"num_stages": 2, "global_batch_size": 4} | kwargs
    return api.plan(api.make_problem("gpt-tiny", f"cpu:{args.pop('devices', 2)}", **args))


def _edit(plan: Plan, **fields) -> Plan:
    return Plan.from_dict(plan.model_dump(mode="json") | fields)


def test_even_plan_passes_and_names_its_ranks() -> None:
    plan = _plan()
    check_plan(plan, TINY, world_size=2)
    assert num_ranks(plan) == 2
    assert resolve_config(plan) == TINY


def test_other_model_is_refused_with_layer_counts() -> None:
    with pytest.raises(InvalidProblemError, match=r"6 layers but model 'gpt-1.7b' has 26"):
        check_plan(_plan(), model_preset("gpt-1.7b"))


def test_wrong_world_size_is_refused() -> None:
    with pytest.raises(InvalidProblemError, match=r"needs 2 processes .* starts 4"):
        check_plan(_plan(), TINY, world_size=4)


def test_batch_that_microbatches_do_not_divide_is_refused() -> None:
    plan = _edit(_plan(), global_batch_size=5)
    with pytest.raises(InvalidProblemError, match=r"global_batch_size=5 is not data 1 x microbatches 4"):
        check_plan(plan, TINY)


def test_torch_schedule_constraints() -> None:
    with pytest.raises(InvalidProblemError, match=r"needs num_microbatches >= pipeline stages; got 1"):
        check_plan(_edit(_plan(), num_microbatches=1, global_batch_size=1), TINY)
    with pytest.raises(InvalidProblemError, match="PipeDream-2BW updates weights asynchronously"):
        check_plan(_edit(_plan(), schedule="2bw"), TINY)


def test_v_schedule_constraints() -> None:
    zbv = _plan(schedule="zb-v", global_batch_size=2)  # m = 2 < 2p is fine for ZB-V
    check_plan(zbv, TINY, world_size=2)
    dualpipe = _plan(schedule="dualpipe-v")
    check_plan(dualpipe, TINY, world_size=2)
    with pytest.raises(InvalidProblemError, match=r"ScheduleDualPipeV needs num_microbatches >= its 4 stages"):
        check_plan(_edit(dualpipe, num_microbatches=2, global_batch_size=2), TINY)
    check_plan(_plan(schedule="zb-v", devices=4, data_parallel=2), TINY, world_size=4)  # DDP: reduced after the step


def _tp_plan(model=TINY, t: int = 2, **fields) -> Plan:
    problem = api.make_problem(model, f"cpu:{2 * t}", num_stages=2, global_batch_size=4, tensor_parallel=t)
    return _edit(api.plan(problem), **fields)


def test_tensor_parallel_runs_when_it_divides_the_model() -> None:
    check_plan(_tp_plan(sequence_parallel=True), TINY, world_size=4)
    assert num_ranks(_tp_plan()) == 4
    with pytest.raises(InvalidProblemError, match=r"needs 4 processes \(pipeline 2 x data 1 x tensor 2\)"):
        check_plan(_tp_plan(), TINY, world_size=2)
    odd = TINY.model_copy(update={"name": "odd", "num_kv_heads": 1, "vocab_size": 129})
    with pytest.raises(InvalidProblemError, match=r"degrees.tensor=2 must divide num_kv_heads=1, vocab_size=129"):
        check_plan(_tp_plan(transformer=None), odd)  # a profile-only plan: the layer counts agree


def test_sequence_parallel_needs_t_to_divide_the_sequence() -> None:
    short = TINY.model_copy(update={"name": "short", "seq_length": 15})
    check_plan(_tp_plan(short, sequence_parallel=False), short)
    with pytest.raises(InvalidProblemError, match=r"must divide seq_length=15 .*with sequence parallelism"):
        check_plan(_tp_plan(short, sequence_parallel=True), short)


def test_context_parallelism_with_pipeline_and_data_only() -> None:
    from tests.runtime_bridge.plans import tiny_plan

    cp = tiny_plan("1f1b", context=2)
    check_plan(cp, TINY, world_size=4)  # runs (test_multirank)
    with pytest.raises(InvalidProblemError, match=r"needs 4 processes \(pipeline 2 x data 1 x context 2 x tensor 1\)"):
        check_plan(cp, TINY, world_size=2)
    check_plan(_edit(cp, zero_stage=3), TINY)  # FSDP2 over the data x context ranks
    from runtime_bridge.validate import _check_context  # shapes the plan schema refuses itself

    odd = TINY.model_copy(update={"seq_length": 18})
    with pytest.raises(InvalidProblemError, match=r"seq_length=18 is not divisible by 2 x degrees.context = 4"):
        _check_context(cp, odd)
    tp = cp.model_construct(**(dict(cp) | {"degrees": cp.degrees.model_copy(update={"tensor": 2})}))
    _check_context(tp, TINY)  # TP x CP runs (test_multirank)
    sp = tp.model_construct(**(dict(tp) | {"sequence_parallel": True, "degrees": tp.degrees.model_copy(
        update={"tensor": 3})}))
    with pytest.raises(InvalidProblemError, match=r"splits each context rank's 8 tokens over degrees.tensor=3"):
        _check_context(sp, TINY)


def test_expert_parallelism_over_replicas() -> None:
    moe = TINY.model_copy(update={"name": "moe", "num_experts": 4, "experts_per_token": 2})
    moe_plan = api.plan(api.make_problem(moe, "cpu:4", num_stages=2, data_parallel=2, global_batch_size=8))
    ep2 = _edit(moe_plan, degrees={"pipeline": 2, "data": 2, "expert": 2})
    check_plan(ep2, moe, world_size=4)  # experts split over the 2 replicas: runs (test_multirank)
    check_plan(_edit(ep2, zero_stage=3), moe)  # experts FSDP2-sharded over the expert-data-parallel ranks
    from runtime_bridge.validate import _check_expert  # the plan schema refuses some shapes itself

    with pytest.raises(InvalidProblemError, match=r"degrees.expert=2: .*no experts"):
        _check_expert(ep2, TINY)
    odd = ep2.model_construct(**(dict(ep2) | {"degrees": ep2.degrees.model_copy(update={"pipeline": 1, "data": 3})}))
    with pytest.raises(InvalidProblemError, match="must divide degrees.data x degrees.context = 3"):
        _check_expert(odd, moe)
    tp = ep2.model_construct(**(dict(ep2) | {"degrees": ep2.degrees.model_copy(update={"tensor": 2})}))
    _check_expert(tp, moe)
    with pytest.raises(InvalidProblemError, match=r"zero_stage=3 with degrees.tensor=2: .*whole experts only"):
        _check_expert(tp.model_construct(**(dict(tp) | {"zero_stage": 3})), moe)
    check_plan(_tp_plan(moe), moe)
    odd = moe.model_copy(update={"moe_ffn_hidden_size": 33})
    # Refused when the plan is made (the cost model needs t | expert FFN width) or, for a plan
    # made elsewhere, by the runtime's own check.
    with pytest.raises(InvalidProblemError, match=r"must divide moe_ffn_hidden_size=33|experts' 33"):
        check_plan(_tp_plan(odd), odd)


def test_the_whole_config_must_match_not_only_the_layer_count() -> None:
    wider = TINY.model_copy(update={"name": "wider", "hidden_size": 64, "num_kv_heads": 2})
    with pytest.raises(InvalidProblemError, match=r"differs \(hidden_size 32 vs 64, kv_heads 4 vs 2, ffn_size 128 vs 256; plan vs model\); "
                                                   r"plan again with --model wider"):
        check_plan(_plan(), wider)


def test_custom_actions_are_lowered_with_torch_rules_before_launch(tmp_path, capsys) -> None:
    pytest.importorskip("torch")
    rows = [["0F0", "0F1", "0F2", "0F3", "0B0", "0B1", "0B2", "0B3"],
            ["1B0", "1F0", "1F1", "1F2", "1F3", "1B1", "1B2", "1B3"]]  # backward before forward: torch refuses
    path = tmp_path / "plan.json"
    api.save(_edit(_plan(), schedule="custom", actions=rows), path)
    assert main(["run", str(path)]) == 2
    # the plan validator (planner.validate) finds the deadlock when the plan is loaded; torch's own
    # rules (runtime_bridge.validate) are the second line for what the structural check lets through
    err = capsys.readouterr().err
    assert "torch.distributed.pipelining rejects the plan's action list" in err or "action lists deadlock" in err


def test_custom_action_on_the_wrong_rank_is_refused() -> None:
    plan = _plan()
    rows = [["0F0", "1F1"], ["1F0", "0B0"]]
    with pytest.raises(InvalidProblemError, match=r"actions\[0\] has '1F1'.* lives on pipeline rank 1"):
        check_plan(_edit(plan, schedule="custom", actions=rows), TINY)


def test_profile_without_a_known_model_needs_model_flag() -> None:
    plan = _plan()
    data = plan.model_dump(mode="json")
    data["transformer"] = None
    data["model"]["name"] = "my-net"
    with pytest.raises(InvalidProblemError, match="pass the model to build with --model"):
        resolve_config(Plan.from_dict(data))


def test_cli_refuses_mismatch_with_exit_2_before_torch(tmp_path, capsys) -> None:
    path = tmp_path / "plan.json"
    api.save(_plan(), path)
    assert main(["run", str(path), "--model", "gpt-1.7b"]) == 2
    assert "plan again with --model gpt-1.7b" in capsys.readouterr().err


def test_cli_parser_with_run_and_profile_does_not_load_torch() -> None:
    code = (
        "import sys\nfrom planner.cli import build_parser\np = build_parser()\n"
        "p.parse_args(['run', 'x.json', '--check']); p.parse_args(['profile', '--model', 'gpt-tiny'])\n"
        # docs/runtime-bridge.md's several-node and Slurm command lines
        "p.parse_args(['run', 'plan.json', '--device', 'cuda', '--nnodes', '2', '--nproc-per-node', '4', '--node-rank',"
        " '1', '--rdzv-endpoint', 'node0.example:29500', '--rdzv-id', '77', '--rdzv-backend', 'c10d', '--rdzv-conf',"
        " 'join_timeout=600', '--json'])\n"
        "p.parse_args(['profile', '--model', 'x.json', '--clock', 'cpu', '--microbatch-size', '2'])\n"
        "assert 'torch' not in sys.modules\nprint('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny", "mixtral-tiny", "mixtral-mixed"])
def test_parameter_counts_without_torch_equal_the_model(name: str) -> None:
    torch = pytest.importorskip("torch")  # noqa: F841
    from runtime_bridge import model as gpt
    from tests.runtime_bridge.plans import LLAMA_TINY, MIXTRAL_TINY

    cfg = {"gpt-tiny": TINY, "llama-tiny": LLAMA_TINY, "mixtral-tiny": MIXTRAL_TINY,
           "mixtral-mixed": MIXTRAL_TINY.model_copy(update={"first_dense_layers": 1, "num_shared_experts": 1,
                                                            "bias": True, "norm": "layernorm"})}[name]
    built = [sum(q.numel() for q in gpt.build_layer(cfg, i).parameters()) for i in range(cfg.num_layers + 2)]
    assert layer_param_counts(cfg) == built


def test_a_measured_profile_of_another_network_is_refused() -> None:
    from tests.runtime_bridge.plans import LLAMA_TINY

    plan = _plan()
    layers = [x.model_copy(update={"param_bytes": 4.0 * n})  # fp32, as `paraplan profile` on a CPU writes it
              for x, n in zip(plan.model.layers, layer_param_counts(LLAMA_TINY))]
    data = plan.model_dump(mode="json")
    data["transformer"] = None
    data["model"] = plan.model.model_copy(update={"layers": tuple(layers), "source": "profiler",
                                                  "name": "llama-tiny"}).model_dump(mode="json")
    profiled = Plan.from_dict(data)
    check_plan(profiled, LLAMA_TINY)
    with pytest.raises(InvalidProblemError, match=r"measured 16384 parameter bytes for layer 0 \(embedding\) but that "
                                                   r"layer of model 'gpt-tiny' has 4608 parameters"):
        check_plan(profiled, TINY)


_HAS_VARIANTS = "head_dim" in TransformerConfig.model_fields


@pytest.mark.skipif(not _HAS_VARIANTS, reason="the schema has no attention-variant fields yet")
def test_attention_variants_are_built_or_refused() -> None:
    torch = pytest.importorskip("torch")
    from runtime_bridge import model as gpt
    from tests.runtime_bridge.plans import LLAMA_TINY

    qwen = LLAMA_TINY.model_copy(update={"name": "qwen-like", "head_dim": 16, "qk_norm": True, "qkv_bias": True})
    built = [sum(q.numel() for q in gpt.build_layer(qwen, i).parameters()) for i in range(qwen.num_layers + 2)]
    assert layer_param_counts(qwen) == built
    block = gpt.build_layer(qwen, 1)
    assert block.attention.wq.weight.shape == (4 * 16, 32) and block.attention.wk.bias is not None
    assert block(torch.randn(2, 16, 32)).shape == (2, 16, 32)
    llama31 = LLAMA_TINY.model_copy(update={"rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8}})
    x = torch.randn(1, 4, 16, 8)
    assert not torch.equal(gpt._rope(x, 500000.0, llama31.rope_scaling), gpt._rope(x, 500000.0))
    from runtime_bridge.validate import check_buildable

    check_buildable(llama31)
    with pytest.raises(InvalidProblemError, match="rope_scaling type 'yarn'"):
        check_buildable(LLAMA_TINY.model_copy(update={"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}))
    with pytest.raises(InvalidProblemError, match="multi-latent attention"):
        check_buildable(LLAMA_TINY.model_copy(update={
            "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8}))
    with pytest.raises(InvalidProblemError, match="mtp_layers=1 multi-token-prediction module.*set mtp_layers to 0"):
        check_buildable(LLAMA_TINY.model_copy(update={"mtp_layers": 1}))


def test_split_backward_runs_with_every_zero_stage() -> None:
    # zero-bubble I/W under torch's DDP averaged incomplete gradients (max_grad_diff 4e-2) and ZeRO-3 lost the
    # weight gradients of the stage's first block (3e-2); now every stage runs (test_multirank checks them)
    problem = api.make_problem("gpt-tiny", "cpu:4", num_stages=2, data_parallel=2, global_batch_size=8,
                               schedule="zb-h1")
    for zero in (0, 1, 2, 3):
        check_plan(_edit(api.plan(problem), zero_stage=zero), TINY)
    from runtime_bridge.validate import splits_backward

    assert splits_backward(api.plan(problem))
    assert not splits_backward(_edit(api.plan(problem), schedule="1f1b"))