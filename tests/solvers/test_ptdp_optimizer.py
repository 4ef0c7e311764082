"""The ptdp option ``optimizer='deepspeed-bf16'`` (DeepSpeed's BF16 optimizer under its pipeline
engine, as BLOOM trained; docs/cost-model.md section 9): the per-microbatch fp32 accumulation pass
in every layer's backward, the fp32 all-reduce and the weights' all-gather after the last microbatch,
in the closed form and the simulator alike."""

from __future__ import annotations

import pytest

from cost_models.collectives import deepspeed_bf16_sync_s, ranks_allreduce_s
from cost_models.compute import DEEPSPEED_BF16_ACCUM_BYTES_PER_PARAM, grad_accum_pass_s
from cost_models.transformer import transformer_profile
from planner import api
from planner.errors import InvalidProblemError
from solvers import _ptdp_model as model
from solvers import ptdp

CFG = api.load_model("gpt-1.7b")
OPTIONS = {"tensor_parallel": 1, "microbatch_size": 4, "recompute": "full", "schedules": "1f1b",
           "zero_stage": 1, "num_simulated": 1}


def _best(optimizer: str) -> dict[str, object]:
    problem = api.make_problem(CFG, "a100-80gb:2x8", global_batch_size=128, num_stages=2, data_parallel=8)
    return ptdp.solve(problem, options={**OPTIONS, "optimizer": optimizer}).candidates[0]


def test_accumulation_pass_in_every_layers_backward() -> None:
    """Each layer's backward (and its weight-gradient part) grows by the 18 B/parameter pass over
    its own parameters; the forward does not change."""
    a100 = api.load_cluster("a100-80gb").device
    assert a100 is not None
    plain = transformer_profile(CFG, device=a100, microbatch_size=4)
    ds = transformer_profile(CFG, device=a100, microbatch_size=4,
                             grad_accum_bytes_per_param=DEEPSPEED_BF16_ACCUM_BYTES_PER_PARAM)
    for p, d in zip(plain.layers, ds.layers):
        extra = grad_accum_pass_s(p.param_bytes / 2, a100, bytes_per_param=DEEPSPEED_BF16_ACCUM_BYTES_PER_PARAM)
        assert extra > 0
        assert d.forward_s == p.forward_s
        assert d.backward_s == pytest.approx(p.backward_s + extra)
        assert d.backward_weight_s == pytest.approx(p.backward_weight_s + extra)


def test_sync_is_fp32_allreduce_plus_weight_gather() -> None:
    """ZeRO-1 under Megatron moves one 16-bit all-reduce's volume after the backward (reduce-scatter
    + all-gather, ZeRO Sec. 7.2); DeepSpeed's BF16 optimizer 2.5 of them (the fp32 all-reduce, then
    the 16-bit all-gather), hand-checked against rank 0's group all-reduce (t = 1, so ranks 0-7)."""
    cluster = api.load_cluster("a100-80gb:2x8")
    u = model.unit_costs(CFG, cluster, 1, 4, model.ProfileSettings())
    c = model.Config(tensor=1, pipeline=2, data=8, virtual=1, microbatch_size=4, num_microbatches=4,
                     recompute="full", zero_stage=1)
    params = u.embedding.param_bytes + CFG.num_layers // 2 * u.decoder.param_bytes
    total = ranks_allreduce_s(cluster, params, list(range(8)))
    megatron = model.estimate(u, CFG, cluster, c)
    deepspeed = model.estimate(u, CFG, cluster, c, fp32_allreduce=True)
    assert megatron.allreduce_s == pytest.approx(total)
    assert deepspeed.allreduce_s == pytest.approx(deepspeed_bf16_sync_s(total, 1)) == pytest.approx(2.5 * total)
    assert deepspeed.pipeline_s == megatron.pipeline_s  # the same unit costs: only the sync differs


def test_solver_closed_form_and_simulator_agree() -> None:
    """Forced through the solver, the option costs more than Megatron's handling (the accumulation
    passes and the larger sync) and the simulator agrees with the closed form within 3 %."""
    megatron, deepspeed = _best("megatron"), _best("deepspeed-bf16")
    for row in (megatron, deepspeed):
        assert float(row["iteration_s"]) == pytest.approx(float(row["closed_form_s"]), rel=0.03)
    assert float(deepspeed["iteration_s"]) > float(megatron["iteration_s"])


@pytest.mark.parametrize(("options", "match"), [
    ({"optimizer": "apex"}, "optimizer='apex'"),
    ({"optimizer": "deepspeed-bf16", "zero_stage": 3}, "zero_stage=0 or 1"),
    ({"optimizer": "deepspeed-bf16", "zero_stage": None}, "zero_stage=0 or 1"),
])
def test_optimizer_option_errors(options: dict[str, object], match: str) -> None:
    problem = api.make_problem(CFG, "a100-80gb:2x8", global_batch_size=128, num_stages=2, data_parallel=8)
    with pytest.raises(InvalidProblemError, match=match):
        ptdp.solve(problem, options={**OPTIONS, **options})


def test_fp32_gradient_buffer_is_held_whole_on_every_rank() -> None:
    """DeepSpeed's BF16 optimizer keeps an fp32 gradient of every parameter of the stage, unsharded by
    ZeRO-1: 4 B/parameter (twice the bf16 parameter bytes) more than Megatron's handling, in the
    closed form and in the simulator of the same plan."""
    cluster = api.load_cluster("a100-80gb:2x8")
    c = model.Config(tensor=1, pipeline=2, data=8, virtual=1, microbatch_size=4, num_microbatches=4,
                     recompute="full", zero_stage=1)
    plain = model.unit_costs(CFG, cluster, 1, 4, model.ProfileSettings())
    ds = model.unit_costs(CFG, cluster, 1, 4, model.ProfileSettings(grad_bytes_per_param=6.0))
    half = CFG.num_layers // 2 * plain.decoder.param_bytes
    held = {0: plain.embedding.param_bytes + half, 1: half + plain.head.param_bytes}
    fixed = dict(model.rank_fixed_bytes(plain, CFG, c))
    for rank, total in model.rank_fixed_bytes(ds, CFG, c):
        assert total - fixed[rank] == pytest.approx(2 * held[rank])
    problem = api.make_problem(CFG, "a100-80gb:2x8", global_batch_size=128, num_stages=2, data_parallel=8)
    plan = ptdp.solve(problem, options={**OPTIONS, "optimizer": "deepspeed-bf16"})
    as_megatron = plan.model_copy(update={"options": {**plan.options, "optimizer": "megatron"}})
    held = [sum(plan.model.layers[i].param_bytes for ch in s.chunks for i in range(*ch.layers)) for s in plan.stages]
    ds_sim, mg_sim = api.simulate(plan), api.simulate(as_megatron)
    for stage, params in enumerate(held):
        grown = ds_sim.stages[stage].peak_memory_bytes - mg_sim.stages[stage].peak_memory_bytes
        assert grown == pytest.approx(2 * params)
