"""Layouts in the ``ptdp`` search: MoE groups, expert dispatch and near-even pipeline splits.

- Megatron-Core's MoE parallel folding: with the experts whole (expert tensor parallelism 1) the
  expert-parallel group may take the tensor ranks as well as the data ranks, so e divides t d c / etp
  instead of d c (Qwen3-235B-A22B on 256 H100: t = 2, p = 8, d = 16, e = 32, as Megatron-Bridge's
  recipe runs it). Plans check the rule with the plan's own etp, and the Megatron export builds
  megatron-core's expert rank generator.
- The expert token dispatcher: node-deduplicated (DeepEP, Megatron's flex dispatcher) against one
  copy per (token, expert), costed, simulated and exported.
- Near-even pipeline layouts for a pinned interleaving depth (prime layer counts), exported as a
  Megatron layout string, and their closed form against the simulator."""

from __future__ import annotations

import pytest

from planner import api
from planner.errors import InfeasibleError, InvalidProblemError
from planner.schema import Plan
from solvers import _ptdp_model as model
from solvers import ptdp

OPTIONS = {"tensor_parallel": 2, "pipeline_parallel": 8, "virtual_pipeline": 4, "expert_parallel": 32,
           "microbatch_size": 1, "recompute": "none,modules", "schedules": "interleaved-1f1b"}


@pytest.fixture(scope="module")
def folded() -> Plan:
    problem = api.make_problem("qwen3-235b-a22b", "h100:256", global_batch_size=2048, precision="fp8-cs")
    return ptdp.solve(problem, options=OPTIONS)


def test_expert_group_takes_the_tensor_ranks(folded: Plan) -> None:
    """d = 16 data ranks, e = 32: only the folded layout (etp = 1, 2 x 16 / 1 = 32 ranks) exists."""
    d = folded.degrees
    assert (d.tensor, d.pipeline, d.data, d.expert) == (2, 8, 16, 32)
    assert folded.options["expert_tensor_parallel"] == 1


def test_experts_split_like_the_dense_layers_cannot_fold() -> None:
    """etp = t = 2 leaves the experts the d x c = 16 data ranks: e = 32 is refused, naming the fix."""
    problem = api.make_problem("qwen3-235b-a22b", "h100:256", global_batch_size=2048)
    with pytest.raises(InfeasibleError, match=r"expert_parallel=32 must divide the ranks the expert layers spread "
                                              r"over.*they are \[16\].*expert_tensor_parallel=2"):
        ptdp.solve(problem, options={**OPTIONS, "expert_tensor_parallel": 2})


def test_plan_checks_the_rule_with_its_own_etp(folded: Plan) -> None:
    """The same plan without its etp option (Megatron's default etp = t) is not a valid plan."""
    data = folded.model_dump(mode="json")
    Plan.model_validate(data)
    data["options"] = {k: v for k, v in data["options"].items() if k != "expert_tensor_parallel"}
    with pytest.raises(ValueError, match=r"degrees.expert=32 must divide the 16 ranks the experts spread over"):
        Plan.model_validate(data)


def test_megatron_core_builds_the_folded_expert_groups(folded: Plan) -> None:
    pytest.importorskip("megatron.core")
    from planner.export import to_megatron_args
    from tests.planner.megatron_check import parse, validate

    argv = to_megatron_args(folded)
    args = parse(argv)
    assert args["--expert-model-parallel-size"] == 32 and args["--expert-tensor-parallel-size"] == 1
    built = validate(argv, world_size=256)
    assert built["data_parallel_size"] == 16 and built["transformer"].expert_model_parallel_size == 32


def test_the_runtime_bridge_refuses_folding_by_name(folded: Plan) -> None:
    pytest.importorskip("torch")
    from runtime_bridge.validate import check_plan

    with pytest.raises(InvalidProblemError, match=r"degrees.expert=32 must divide degrees.data x degrees.context"):
        check_plan(folded, folded.transformer)


@pytest.fixture(scope="module")
def deepseek_plans() -> dict[str, Plan]:
    """DeepSeek-V3 on 1,024 H100 (t 2, p 8, v 2, e 64: 8 nodes per expert group) under both dispatchers."""
    problem = api.make_problem("deepseek-v3", "h100:1024", global_batch_size=8192, precision="fp8-cs")
    opts = {"tensor_parallel": 2, "pipeline_parallel": 8, "virtual_pipeline": 2, "expert_parallel": 64,
            "microbatch_size": 1, "recompute": "none,modules", "schedules": "interleaved-1f1b"}
    return {d: ptdp.solve(problem, options={**opts, "moe_dispatcher": d}) for d in ("alltoall", "deepep")}


def test_node_deduplicated_dispatch_is_faster_across_nodes(deepseek_plans: dict[str, Plan]) -> None:
    """Each token crosses InfiniBand to at most 4 nodes (group-limited routing) instead of 8 x 7/8
    copies: the plan is faster, the plan records its dispatcher, and the simulator agrees."""
    plain, dedup = deepseek_plans["alltoall"], deepseek_plans["deepep"]
    assert dedup.predicted.iteration_time_s < 0.8 * plain.predicted.iteration_time_s
    assert dedup.options["moe_dispatcher"] == "deepep"
    assert api.simulate(dedup).iteration_time_s == pytest.approx(dedup.predicted.iteration_time_s, rel=1e-9)


def test_megatron_export_of_the_flex_dispatcher(deepseek_plans: dict[str, Plan]) -> None:
    pytest.importorskip("megatron.core")
    from planner.export import to_megatron_args
    from tests.planner.megatron_check import parse, validate

    argv = to_megatron_args(deepseek_plans["deepep"])
    args = parse(argv)
    assert args["--moe-token-dispatcher-type"] == "flex" and args["--moe-flex-dispatcher-backend"] == "deepep"
    cfg = validate(argv, world_size=1024)["transformer"]
    assert cfg.moe_token_dispatcher_type == "flex" and cfg.moe_flex_dispatcher_backend == "deepep"
    assert parse(to_megatron_args(deepseek_plans["alltoall"]))["--moe-token-dispatcher-type"] == "alltoall"


def test_an_unknown_dispatcher_is_refused() -> None:
    problem = api.make_problem("mixtral-8x7b", "h100:8", global_batch_size=64)
    with pytest.raises(InvalidProblemError, match=r"moe_dispatcher='nccl' of solver 'ptdp' must be one of "
                                                  r"\['alltoall', 'deepep'\]"):
        ptdp.solve(problem, options={"moe_dispatcher": "nccl"})


def test_the_near_even_layout_reaches_megatron_core() -> None:
    """DeepSeek-V3 at p 8 v 4 on 1,024 GPUs: its head with the multi-token-prediction module weighs about
    three layers, so the balanced split gives the last virtual stage the module and the loss alone
    (1, 2 x 30, 0 decoder layers; near-even 1, 2 x 29, 1, 1 before a head-only virtual stage was allowed):
    exactly the recipe's 'Et|(tt|)*30mL', which megatron-core's config accepts for 8 stages of 4 chunks."""
    pytest.importorskip("megatron.core")
    from planner.export import to_megatron_args
    from tests.planner.megatron_check import parse, validate

    problem = api.make_problem("deepseek-v3", "h100:1024", global_batch_size=8192)
    plan = ptdp.solve(problem, options={"tensor_parallel": 2, "pipeline_parallel": 8, "virtual_pipeline": 4,
                                        "expert_parallel": 64, "microbatch_size": 1, "moe_dispatcher": "deepep",
                                        "schedules": "interleaved-1f1b"})
    argv = to_megatron_args(plan)
    layout = parse(argv)["--pipeline-model-parallel-layout"]
    assert layout == "Et|" + "t*2|" * 30 + "mL"
    cfg = validate(argv, world_size=1024)["transformer"]
    assert cfg.pipeline_model_parallel_size == 8 and cfg.virtual_pipeline_model_parallel_size == 4
    assert cfg.mtp_num_layers == 1


def test_near_even_closed_form_against_the_simulator() -> None:
    """Llama 3 405B (126 layers) on 8,192 H100 at p 16, v 7 pinned: near-even chunks of 1 and 2 layers.
    The closed form's fill and drain run at the larger chunks' pace; it stays 3 % under the simulator
    (it was 7 % under with the average chunk), and the even-chunk v = 4 plan still ranks ahead of it."""
    from tests.bench_loader import load_bench

    heldout = load_bench("fidelity_heldout")
    problem = api.make_problem("llama3-405b", heldout.unbounded_h100(8192), global_batch_size=2048, num_stages=16,
                               data_parallel=64)
    opts = {"tensor_parallel": 8, "microbatch_size": 1, "recompute": "none", "schedules": "interleaved-1f1b",
            "context_parallel": 1, "zero_stage": 1, "overlap_tp_comm": True, "overlap_grad_reduce": True,
            "num_simulated": 1}
    seven = ptdp.solve(problem, options={**opts, "virtual_pipeline": 7}).candidates[0]
    four = ptdp.solve(problem, options={**opts, "virtual_pipeline": 4}).candidates[0]
    assert 0.95 < float(seven["closed_form_s"]) / float(seven["iteration_s"]) < 0.98
    assert float(four["closed_form_s"]) < float(seven["closed_form_s"])


def test_dualpipev_refusal_names_the_layout_not_the_batch() -> None:
    """DeepSeek-V3's 61 layers on DualPipeV at p = 16 (two chunks per rank: 32 virtual stages) have no
    even V layout; the batch (15,360 over d = 128, 120 microbatches: DualPipeV needs no m % p) splits.
    With uneven stages off the message says so, where it used to blame the batch with d from the layer
    count's divisors; with them on the near-even chunks lay it out and nothing is refused."""
    from solvers._ptdp_messages import _layout_conflict

    text = _layout_conflict(61, 16, 2, 2048, 1, 15360, 1, ("dualpipe-v",), uneven=False)
    assert text is not None and "no layer layout of 61 decoder layers over pipeline_parallel=16" in text
    assert "global_batch_size=15360 itself splits (b=1, d=128)" in text and "uneven_stages is off" in text
    assert _layout_conflict(61, 16, 2, 2048, 1, 15360, 1, ("dualpipe-v",), uneven=True) is None
    assert _layout_conflict(61, 16, 2, 2048, 1, 15360, 1, ("interleaved-1f1b",), uneven=True) is None  # m % p != 0


def test_v_layouts_where_2p_does_not_divide_the_layers() -> None:
    """A V schedule's chunks (rank r: virtual stages r and 2p - 1 - r) where 2p does not divide l:
    per-rank totals as even as they go with rank 0 among the lightest, or rank 0 at two floor-sized
    chunks with the rest even (room for its embedding and head); both sum to l, every chunk keeps a
    layer, and the second is offered only where it differs."""
    from solvers._ptdp_dims import V_EVEN_RANKS, V_LIGHT_RANK0, chunk_layer_counts, v_layouts

    def totals(layers: int, p: int, ends: tuple[int, int]) -> list[int]:
        counts = chunk_layer_counts(layers, p, 2, ends)
        assert sum(counts) == layers and min(counts) >= 1
        return [counts[r] + counts[2 * p - 1 - r] for r in range(p)]

    assert v_layouts(64, 16) == [(0, 0)] and v_layouts(13, 2) == [V_EVEN_RANKS]
    assert v_layouts(5, 1) == [V_EVEN_RANKS] and chunk_layer_counts(5, 1, 2, V_EVEN_RANKS) == [3, 2]  # one rank
    for layers in range(1, 40):  # every layout sums to the layers and keeps a layer in every chunk
        for p in range(1, 12):
            for ends in (e for e in v_layouts(layers, p) if e != (0, 0)):
                counts = chunk_layer_counts(layers, p, 2, ends)
                assert len(counts) == 2 * p and sum(counts) == layers and min(counts) >= 1, (layers, p, ends)
    assert v_layouts(61, 16) == [V_EVEN_RANKS, V_LIGHT_RANK0]
    assert totals(61, 16, V_EVEN_RANKS) == [3, 3, 3] + [4] * 13
    assert totals(61, 16, V_LIGHT_RANK0) == [2, 3] + [4] * 14  # DeepSeek-V3: chunks 1, 2 x 29, 1, 1
    assert chunk_layer_counts(61, 16, 2, V_LIGHT_RANK0) == [1] + [2] * 29 + [1, 1]
    assert totals(48, 16, V_EVEN_RANKS) == [3] * 16 and chunk_layer_counts(48, 16, 2, V_EVEN_RANKS)[:2] == [2, 2]
    assert totals(32, 3, V_EVEN_RANKS) == [10, 11, 11]


def test_fp8_expert_regrouping_keeps_layer_times_physical() -> None:
    """DeepSeek-V3 on 2,048 H800 in FP8 with the all-to-all overlapped: at t = 8, e = 256 and t = 4,
    e = 32 the expert GEMMs' change of shape used to be costed in BF16 against FP8 layers that also
    cast every expert's weights per microbatch, and took more time out of a layer than it held (the plan
    failed validation, exit 2). Costed in the layers' FP8, with the weights cast once per step, every
    decoder time is positive, the weight gradient within the backward and every recompute time >= 0."""
    problem = api.make_problem("deepseek-v3", "h800:2048", global_batch_size=15360, seq_length=4096,
                               precision="fp8-cs", schedule="dualpipe-v")
    opts = ptdp.parse_options(ptdp.Options, {"recompute": "layernorm+mla_up_proj", "moe_dispatcher": "deepep",
                                            "overlap_moe_alltoall": True}, solver="ptdp")
    units = ptdp.unit_cache(ptdp._prepare(problem, opts), opts)
    for t, e, p, d in ((8, 256, 1, 256), (4, 32, 2, 256), (1, 64, 16, 128)):
        c = model.Config(tensor=t, pipeline=p, data=d, virtual=2, microbatch_size=1, num_microbatches=15360 // d,
                         recompute="layernorm+mla_up_proj", expert=e, zero_stage=1, v_schedule="dualpipe-v")
        u = units(c)
        for layer in (u.decoder, u.moe_decoder):
            assert layer is not None and layer.forward_s > 0 and layer.backward_s > 0
            assert 0 < (layer.backward_weight_s or 0.0) < layer.backward_s
            assert all(o.extra_s >= 0 for o in (layer.recompute or {}).values())


def test_a_head_heavier_than_a_stage_keeps_one_layer_beside_it() -> None:
    """DeepSeek-V3's head with its multi-token-prediction module (the logits twice and an MoE block: more
    than four layers' time at t = 1) would empty the last of 16 stages in the balanced split, and 61 - 2
    layers do not split evenly over the 14 middle stages, so 1F1B found no layout at all (exit 3 with a
    batch-size message). The best split keeping a layer at each end is 4, 4 x 14, 1; where no such split
    beats the near-even one (61 layers on 32 virtual stages), near-even is the fallback."""
    from solvers._ptdp_dims import NEAR_EVEN, _nonempty_ends, stage_layouts

    assert _nonempty_ends(61, 16, 0.02, 4.6) == (4, *[4] * 14, 1)
    assert _nonempty_ends(61, 32, 0.02, 2.5) is None
    assert stage_layouts(61, 32, 1, embedding_layers=0.02, head_layers=40.0, uneven=True) == [NEAR_EVEN]
    problem = api.make_problem("deepseek-v3", "h800:2048", global_batch_size=15360, precision="fp8-cs")
    plan = ptdp.solve(problem, options={"tensor_parallel": 1, "pipeline_parallel": 16, "expert_parallel": 64,
                                        "microbatch_size": 1, "zero_stage": 1, "schedules": "1f1b",
                                        "recompute": "layernorm+mla_up_proj", "moe_dispatcher": "deepep",
                                        "num_simulated": 1})
    kinds = [layer.kind for layer in plan.model.layers]
    decoders = [sum(1 for c in s.chunks for i in range(*c.layers) if kinds[i] == "decoder") for s in plan.stages]
    assert decoders == [4] * 15 + [1]


def test_an_interleaved_last_virtual_stage_may_hold_the_head_alone() -> None:
    """When the head outweighs a virtual stage's layers, the balanced interleaved split gives the last
    virtual stage no decoder layer (Megatron's layout string allows it: DeepSeek-V3's recipe ends in
    'mL'); 1F1B keeps a layer on its last stage (a whole rank would idle but for the head), and the
    first stage always keeps one."""
    from solvers._ptdp_dims import _balanced, stage_layouts

    assert _balanced(61, 32, 0.02, 3.1, True) == (1, *[2] * 30, 0)
    assert _balanced(61, 32, 0.02, 3.1, False) is None
    assert stage_layouts(61, 8, 4, embedding_layers=0.02, head_layers=3.1, uneven=True) == [(1, 0)]
    assert stage_layouts(61, 16, 1, embedding_layers=0.02, head_layers=4.6, uneven=True) == [(4, 1)]
