"""Multi-token-prediction modules ([deepseek-v3] Sec. 2.2; Megatron-Core's ``--mtp-num-layers``): folded
into the output head's layer on the last pipeline stage (``mtp.fold_mtp``), counted in the
parameters and model FLOPs, and, with p > 1, a copy of the embedding on the rank holding the head."""

from __future__ import annotations

import pytest

from cost_models import moe
from cost_models.mtp import mtp_extra_layer
from cost_models.hardware import device_preset
from cost_models.simulate import simulate
from cost_models.transformer import model_flops_per_sample, transformer_profile
from planner import api
from planner.schema import TransformerConfig
from solvers import ptdp

TOY = TransformerConfig(name="toy-mtp", hidden_size=512, num_layers=4, num_heads=8, seq_length=256, vocab_size=8192,
                        ffn_hidden_size=1024, num_experts=4, experts_per_token=2, moe_ffn_hidden_size=512,
                        first_dense_layers=1, mlp="swiglu", norm="rmsnorm", bias=False, position_embedding="rope",
                        tied_embeddings=False, mtp_layers=1)


def test_the_head_carries_the_modules_by_hand() -> None:
    """Per module: the embedding lookup, the norms and projection, a block like the last (MoE) layer and
    the head again; the block's weights join the head's, the embedding and head weights are shared; the
    head offers the block's recompute strategies, each keeping the block's bytes as the strategy says and
    adding its recompute time (Megatron-Core recomputes the module's layer as the model's)."""
    h100 = device_preset("h100")
    kw = {"device": h100, "microbatch_size": 2, "tensor_parallel": 2, "intra_node_bytes_per_s": 450e9}
    with_mtp = transformer_profile(TOY, **kw)
    without = transformer_profile(TOY.model_copy(update={"mtp_layers": 0}), **kw)
    emb, block, head = without.layers[0], without.layers[-2], without.layers[-1]
    extra = mtp_extra_layer(TOY, h100, 2, 2, True, None)
    folded = with_mtp.layers[-1]
    assert with_mtp.layers[:-1] == without.layers[:-1]
    for field in ("forward_s", "backward_s", "backward_weight_s"):
        parts = [getattr(layer, field) for layer in (head, block, emb, extra)]
        assert getattr(folded, field) == pytest.approx(2 * parts[0] + sum(parts[1:]))
    assert folded.static_bytes == pytest.approx(head.static_bytes + block.static_bytes + extra.static_bytes)
    assert folded.activation_bytes == pytest.approx(
        2 * head.activation_bytes + block.strategies()["none"].activation_bytes + emb.activation_bytes
        + extra.activation_bytes)
    assert folded.strategies().keys() == block.strategies().keys() == {"none", "selective", "full"}
    kept = 2 * head.activation_bytes + emb.activation_bytes + extra.activation_bytes
    for name, option in block.strategies().items():
        assert folded.strategies()[name].activation_bytes == pytest.approx(kept + option.activation_bytes)
        assert folded.strategies()[name].extra_s == pytest.approx(option.extra_s)


def test_parameters_and_model_flops() -> None:
    """One module: 3 norms + 2h^2 + one MoE block; its forward per token 2 x 2h^2 + 2 x the block's
    active matmul weights + the attention core + the logits 2hV, three times for F + B + W."""
    h, main = TOY.hidden_size, TOY.model_copy(update={"mtp_layers": 0})
    assert moe.num_parameters(TOY) - moe.num_parameters(main) == 3 * h + 2 * h * h + moe.decoder_layer_params(TOY, 3)
    core = moe.attention_core_forward_flops(TOY, microbatch_size=1) / TOY.seq_length
    per_token = 4 * h * h + 2 * moe.decoder_matmul_params(TOY, 3) + core + 2 * h * TOY.vocab_size
    assert model_flops_per_sample(TOY) - model_flops_per_sample(main) == pytest.approx(3 * per_token * TOY.seq_length)


@pytest.mark.parametrize(("pipeline", "schedules", "copy"), [(2, "1f1b", True), (1, "1f1b", False),
                                                             (2, "zb-v", False)])
def test_ptdp_and_the_simulator_agree_on_the_embedding_copy(pipeline: int, schedules: str, copy: bool) -> None:
    """The rank holding the head but not the embedding keeps the embedding's model states again (the
    modules look up the next tokens there): with 1F1B on 2 ranks the last one, not with one rank nor
    under ZB-V, whose rank 0 holds both ends. ptdp's closed-form peak and the simulator's agree."""
    problem = api.make_problem(TOY, "h100:2", global_batch_size=8)
    options = {"pipeline_parallel": pipeline, "tensor_parallel": 1, "microbatch_size": 1, "recompute": "none",
               "zero_stage": 0, "schedules": schedules, "uneven_stages": True, "num_simulated": 1}
    plan = ptdp.solve(problem, options=options)
    stages = simulate(plan).stages
    emb = plan.model.layers[0].static_bytes
    holds_head = [any(plan.model.layers[i].kind == "head" for c in s.chunks for i in range(*c.layers))
                  for s in plan.stages]
    holds_emb = [any(plan.model.layers[i].kind == "embedding" for c in s.chunks for i in range(*c.layers))
                 for s in plan.stages]
    # the same plan told its model has no modules (the folded head kept): only the copy goes
    plain = plan.model_copy(update={"transformer": TOY.model_copy(update={"mtp_layers": 0})})
    for sim, bare, head, embedding in zip(stages, simulate(plain).stages, holds_head, holds_emb):
        assert sim.peak_memory_bytes - bare.peak_memory_bytes == pytest.approx(emb if head and not embedding else 0.0)
    assert any(h and not e for h, e in zip(holds_head, holds_emb)) == copy
    candidate = plan.candidates[0]
    assert float(candidate["closed_form_s"]) == pytest.approx(float(candidate["iteration_s"]), rel=0.05)


@pytest.mark.parametrize(("pipeline", "expert", "zero_stage", "recompute"),
                         [(2, 2, 1, "none"), (2, 1, 0, "none"), (1, 4, 1, "none"), (2, 2, 1, "full"),
                          (2, 1, 0, "moe_act+layernorm")])
def test_closed_form_peak_and_the_simulator_agree_with_mtp(pipeline: int, expert: int, zero_stage: int,
                                                           recompute: str) -> None:
    """ptdp's closed-form peak and the simulator's, with the MTP module's MoE block on the last rank:
    its experts split over the expert ranks and their optimizer states over the expert-data ranks in
    both, the embedding copy in both (as ``test_ptdp.py`` checks the models without modules)."""
    from solvers import _ptdp_model as model

    problem = api.make_problem(TOY, "h100:4", global_batch_size=16)
    options = {"pipeline_parallel": pipeline, "tensor_parallel": 1, "expert_parallel": expert, "microbatch_size": 1,
               "recompute": recompute, "zero_stage": zero_stage, "schedules": "1f1b", "num_simulated": 1}
    plan = ptdp.solve(problem, options=options)
    head = plan.model.layers[-1]
    assert plan.stages[-1].chunks[-1].layer_strategies()[-1] == recompute  # the module follows the setting
    assert head.strategies()[recompute].activation_bytes <= head.activation_bytes
    simulated = max(stage.peak_memory_bytes for stage in simulate(plan).stages)
    d = plan.degrees
    kinds = [layer.kind for layer in plan.model.layers]
    chunks = [sum(1 for i in range(*ch.layers) if kinds[i] == "decoder") for ch in plan.virtual_stages()]
    ends = (0, 0) if len(set(chunks)) == 1 else (chunks[0], chunks[-1])
    c = model.Config(tensor=1, pipeline=d.pipeline, data=d.data, virtual=1, microbatch_size=1,
                     num_microbatches=plan.num_microbatches, recompute=recompute, zero_stage=plan.zero_stage,
                     expert=d.expert, ends=ends)
    settings = model.ProfileSettings(module_sets=(tuple(recompute.split("+")),) if "+" in recompute else ())
    u = model.unit_costs(TOY, problem.cluster, 1, 1, settings, c.dims)
    assert u.head_expert_static_bytes > 0
    estimate = model.estimate(u, TOY, problem.cluster, c)
    assert simulated <= estimate.peak_memory_bytes <= simulated * 1.01
    assert float(plan.candidates[0]["closed_form_s"]) == pytest.approx(estimate.iteration_s, rel=1e-9)
