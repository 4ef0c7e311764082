"""The simulator's charges for ZeRO, FSDP, context and expert parallelism (cost_models/sim/dims.py),
each against a hand-computed value on small plans (the toy profile of tests/planner/modern_plans)."""

from __future__ import annotations

import pytest

from cost_models import collectives
from cost_models.sim import dims
from cost_models.compute import compute_constants
from cost_models.simulate import allreduce_link, pipeline_costs, simulate
from planner.schema import Plan, TransformerConfig
from tests.planner.modern_plans import preset_plan

INTRA, INTER = 450e9, 50e9  # the test cluster's links (bytes/s), no latency

MOE = TransformerConfig(name="tiny-moe", hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2, seq_length=32,
                        vocab_size=128, ffn_hidden_size=128, mlp="swiglu", norm="rmsnorm", bias=False,
                        position_embedding="rope", tied_embeddings=False, num_experts=8, experts_per_token=2)
DENSE = MOE.model_copy(update={"name": "tiny-dense", "num_experts": None, "experts_per_token": None})


def _with_weights(plan: Plan, param_bytes: float, static_bytes: float | None = None, **update: object) -> Plan:
    """Give every layer ``param_bytes`` of 16-bit weights and ``static_bytes`` (default 8x) of model states."""
    static = 8 * param_bytes if static_bytes is None else static_bytes
    layers = tuple(layer.model_copy(update={"param_bytes": param_bytes, "static_bytes": static})
                   for layer in plan.model.layers)
    return plan.model_copy(update={"model": plan.model.model_copy(update={"layers": layers}), **update})


def _ring_gather_s(num_bytes: float, n: int, bandwidth: float) -> float:
    return (n - 1) / n * num_bytes / bandwidth


def _bus(plan: Plan, bandwidth: float) -> float:
    """The link at the device's bus-bandwidth fraction: what the gradient collectives run at
    (``collectives.ranks_allreduce_s``, shared with the ptdp closed form)."""
    assert plan.cluster.device is not None
    return bandwidth * compute_constants(plan.cluster.device).collective_bandwidth_fraction


def test_zero_1_without_overlap_costs_what_the_ddp_allreduce_costs() -> None:
    """ZeRO Sec. 7.2: reduce-scatter + all-gather move what one all-reduce moves."""
    ddp = _with_weights(preset_plan(DENSE, data=4), 1e9)
    zero1 = ddp.model_copy(update={"zero_stage": 1})
    assert not dims.applies(ddp) and dims.applies(zero1)
    ring = 2 * _ring_gather_s(6e9, 4, _bus(ddp, INTRA))  # 6 layers x 1 GB, 4 replicas in one node
    assert pipeline_costs(ddp).allreduce_s[0] == pytest.approx(ring, rel=1e-12)
    assert pipeline_costs(zero1).allreduce_s[0] == pytest.approx(ring, rel=1e-12)
    # states: (2 + 2 + 12 / 4) of 16 bytes per parameter stay
    assert pipeline_costs(zero1).static_bytes[0] == pytest.approx(6 * 8e9 * (4 + 3) / 16)


def test_distributed_optimizer_overlaps_the_reduce_scatter_and_the_gather_bucket_by_bucket() -> None:
    plan = _with_weights(preset_plan(DENSE, data=4, zero_stage=1), 1e9,
                         options={"overlap_grad_reduce": True, "overlap_param_gather": True})
    half = _ring_gather_s(6e9, 4, _bus(plan, INTRA))  # 0.0125 s each
    forward, backward = 0.1 + 4 * 1.0 + 0.5, 0.2 + 4 * 2.0 + 1.0  # toy profile: one stage holds all
    exposed = half / 4 + max(0.0, 3 * half / 4 - backward) + half / 4 + max(0.0, 3 * half / 4 - forward)
    assert pipeline_costs(plan).allreduce_s[0] == pytest.approx(exposed, rel=1e-12)
    assert exposed == pytest.approx(half / 2)


def test_fsdp_gathers_each_layer_before_forward_and_backward_with_one_layer_prefetched() -> None:
    plan = _with_weights(preset_plan(DENSE, data=16, zero_stage=3), 8e11)  # 16 ranks on 2 nodes
    ranks = dims.data_context_ranks(plan, 0)
    bandwidth, _ = allreduce_link(plan.cluster, ranks)  # min(NVLink, 8 NICs)
    assert bandwidth == 8 * INTER
    gather = _ring_gather_s(8e11, 16, bandwidth)  # 1.875 s: over a forward, under a backward
    layers = plan.model.layers
    fwd = [layer.forward_s for layer in layers]
    bwd = [layer.backward_s for layer in layers][::-1]
    # a gather holds NCCL's 24 CTAs of the device's SMs: the compute under it runs on the rest, at
    # 1 - share of its speed, and the next layer waits for the later of it and the gather
    share = 24 / compute_constants(plan.cluster.device).num_sms  # type: ignore[arg-type]
    exposed_f = gather + sum(max(gather - c, share * min(gather, c / (1 - share))) for c in fwd[:-1])
    exposed_b = gather + sum(max(gather - c, share * min(gather, c / (1 - share))) for c in bwd[:-1])
    costs = pipeline_costs(plan)
    assert costs.forward_s[0] == pytest.approx(sum(fwd) + exposed_f, rel=1e-12)
    assert costs.backward_s[0] == pytest.approx(sum(bwd) + exposed_b, rel=1e-12)
    # after the backward only the reduce-scatter remains, hidden under it but its last bucket
    # (NCCL's hierarchical reduce-scatter: half of collectives.ranks_allreduce_s over 8 ranks x 2 nodes)
    reduce = _ring_gather_s(6 * 8e11, 8, _bus(plan, INTRA)) + _ring_gather_s(6 * 8e11 / 8, 2, _bus(plan, INTER))
    assert costs.allreduce_s[0] == pytest.approx(reduce / 4 + max(0.0, 3 * reduce / 4 - costs.backward_s[0]))
    # states sharded 16 ways, plus the layer computed and the one prefetched, unsharded
    assert costs.static_bytes[0] == pytest.approx(6 * 8 * 8e11 / 16 + 2 * 8e11)


def test_context_parallelism_splits_a_whole_sequence_profile_and_adds_the_exposed_ring() -> None:
    base = preset_plan(DENSE, tensor=2)
    plan = preset_plan(DENSE, tensor=2, context=2)
    assert dims.context_scale(plan) == 0.5
    # one ring step: K and V of s/c = 16 tokens, width n_kv d = 2 x 16 = 32, split over min(t, n_kv) = 2
    step_bytes = 1 * 16 * (32 + 32) / 2 * 2
    transfer = step_bytes / INTRA  # ranks 0 and 2 share a node
    block = 0.1 / 4  # the attention core (selective recompute time) over c x c blocks
    ring_f, ring_b = max(0.0, transfer - block), max(0.0, 2 * transfer - 2.5 * block)
    assert ring_f == ring_b == 0.0  # tiny blocks hide under the attention
    costs, whole = pipeline_costs(plan), pipeline_costs(base)
    assert costs.forward_s[0] == pytest.approx(whole.forward_s[0] / 2)
    assert costs.activation_bytes[0] == pytest.approx(whole.activation_bytes[0] / 2)
    slow = plan.model_copy(update={"cluster": plan.cluster.model_copy(update={"intra_node_bytes_per_s": 1e4})})
    transfer = step_bytes / 1e4
    extra_f = 4 * (transfer - block)  # four attention layers, c - 1 = 1 step each
    extra_b = 4 * (2 * transfer - 2.5 * block)
    assert pipeline_costs(slow).forward_s[0] == pytest.approx(whole.forward_s[0] / 2 + extra_f)
    assert pipeline_costs(slow).backward_s[0] == pytest.approx(whole.backward_s[0] / 2 + extra_b)


def test_expert_parallelism_adds_four_all_to_alls_per_moe_layer() -> None:
    plan = preset_plan(MOE, data=8, expert=8)
    tokens = 1 * 32  # b s, no context or sequence parallelism
    buffer = tokens * 2 * 64 * 2  # k copies of h at 2 bytes
    a2a = 7 / 8 * buffer / INTRA  # 8 ranks in one node: 7/8 of the buffer over NVLink
    assert collectives.alltoall_s(buffer, 8, 8, INTRA, INTER) == pytest.approx(a2a)
    base = pipeline_costs(preset_plan(MOE, data=8))
    costs = pipeline_costs(plan)
    assert costs.forward_s[0] == pytest.approx(base.forward_s[0] + 4 * 2 * a2a)
    assert costs.backward_s[0] == pytest.approx(base.backward_s[0] + 4 * 2 * a2a)


def test_all_to_all_across_nodes_is_bound_by_the_nic() -> None:
    # 16 ranks, 8 per node: 7/16 over NVLink, 8/16 over the NIC, at once
    expected = max(7 / 16 * 1e9 / INTRA, 8 / 16 * 1e9 / INTER + 1e-5)
    assert collectives.alltoall_s(1e9, 16, 8, INTRA, INTER, 0.0, 1e-5) == pytest.approx(expected)
    assert collectives.alltoall_s(1e9, 1, 1, INTRA, INTER) == 0.0


def test_expert_weights_are_split_over_the_expert_ranks_and_synchronised_over_the_rest() -> None:
    plan = _with_weights(preset_plan(MOE, data=8, expert=4), 1e9)
    share = dims.expert_fraction(plan, 1)
    assert 0 < share < 1 and dims.expert_fraction(plan, 0) == 0.0  # embedding: dense
    layers = plan.model.layers
    expert_bytes = sum(1e9 * dims.expert_fraction(plan, i) for i in range(len(layers)))
    dense_bytes = 6e9 - expert_bytes
    # dense over the 8 replicas; experts: E/4 per rank, all-reduced over 8 / 4 = 2 ranks
    expected = 2 * _ring_gather_s(dense_bytes, 8, _bus(plan, INTRA)) + 2 * _ring_gather_s(expert_bytes / 4, 2,
                                                                                        _bus(plan, INTRA))
    assert pipeline_costs(plan).allreduce_s[0] == pytest.approx(expected, rel=1e-12)
    assert pipeline_costs(plan).static_bytes[0] == pytest.approx(8 * dense_bytes + 8 * expert_bytes / 4)


def test_hierarchical_collectives_use_nccl_bus_bandwidth() -> None:
    plan = _with_weights(preset_plan(DENSE, data=16), 1e9, options={"collectives": "hierarchical"})
    assert plan.cluster.device is not None
    fraction = compute_constants(plan.cluster.device).collective_bandwidth_fraction
    expected = collectives.hierarchical_allreduce_s(6e9, 8, 2, INTRA * fraction, INTER * fraction)
    assert pipeline_costs(plan).allreduce_s[0] == pytest.approx(expected, rel=1e-12)
    with pytest.raises(Exception, match="collectives"):
        pipeline_costs(plan.model_copy(update={"options": {"collectives": "mesh"}}))


def test_plans_with_every_dimension_simulate() -> None:
    plan = _with_weights(preset_plan(MOE, p=2, data=4, context=2, expert=4, tensor=2, zero_stage=1, m=4), 1e8)
    result = simulate(plan, include_events=False)
    assert result.iteration_time_s > 0 and len(result.stages) == 2


def test_a_profile_already_at_the_degrees_is_charged_no_second_time() -> None:
    """The ptdp search bakes the per-rank shape and the ring, all-to-all and FSDP gathers into its layer
    costs (ModelProfile.degrees_included): the simulator adds none of them."""
    plan = _with_weights(preset_plan(MOE, data=8, context=2, expert=4, zero_stage=3), 1e9)
    baked = plan.model_copy(update={"model": plan.model.model_copy(update={"degrees_included": True})})
    whole_costs, baked_costs = pipeline_costs(plan), pipeline_costs(baked)
    layers = plan.model.layers
    assert baked_costs.forward_s[0] == pytest.approx(sum(layer.forward_s for layer in layers))
    assert baked_costs.backward_s[0] == pytest.approx(sum(layer.backward_s for layer in layers))
    assert whole_costs.forward_s[0] != pytest.approx(baked_costs.forward_s[0])
    # its MoE layers hold E/e experts already: the expert part is not divided again
    assert dims.expert_share_per_rank(baked) == 1.0 and dims.expert_share_per_rank(plan) == 1 / 4
    assert baked_costs.static_bytes[0] > whole_costs.static_bytes[0]


def test_overlapped_all_to_all_shows_only_beyond_the_other_microbatchs_compute() -> None:
    plan = preset_plan(MOE, data=8, expert=8)
    slow = plan.cluster.model_copy(update={"intra_node_bytes_per_s": 2e3})  # a2a of 8192 B: 7/8 x 4.096 s
    a2a = 7 / 8 * 8192 / 2e3
    base = pipeline_costs(preset_plan(MOE, data=8))
    hidden = pipeline_costs(plan.model_copy(update={"cluster": slow, "options": {"overlap_moe_alltoall": True}}))
    # four MoE layers of forward 1 s and backward 2 s: the forward's 2 a2a show beyond the backward's 2 s
    assert hidden.forward_s[0] == pytest.approx(base.forward_s[0] + 4 * max(0.0, 2 * a2a - 2.0))
    assert hidden.backward_s[0] == pytest.approx(base.backward_s[0] + 4 * max(0.0, 2 * a2a - 1.0))


def _v_plan(schedule: str) -> Plan:
    """p = 2, two chunks per rank in V placement: rank 0 holds virtual stages 0 and 3, rank 1 stages 1 and 2."""
    plan = _with_weights(preset_plan(MOE, p=2, v=2, data=8, expert=8, zero_stage=1, m=4), 1e9)
    layers = tuple(layer.model_copy(update={"backward_weight_s": layer.backward_s / 2}) for layer in plan.model.layers)
    plan = plan.model_copy(update={"model": plan.model.model_copy(update={"layers": layers})})
    model_order = [plan.stages[k % 2].chunks[k // 2] for k in range(4)]
    stages = (plan.stages[0].model_copy(update={"chunks": (model_order[0], model_order[3])}),
              plan.stages[1].model_copy(update={"chunks": (model_order[1], model_order[2])}))
    return plan.model_copy(update={"schedule": schedule, "stages": stages})


def test_v_placement_charges_each_rank_its_own_chunks_and_dualpipe_may_hide_the_all_to_alls() -> None:
    plan = _v_plan("dualpipe-v")
    costs = pipeline_costs(plan)
    a2a = 7 / 8 * (32 * 2 * 64 * 2) / INTRA
    layers = plan.model.layers
    for k, chunk in enumerate(plan.virtual_stages()):
        moe_layers = sum(1 for i in range(*chunk.layers) if dims.expert_fraction(plan, i) > 0)
        own_f = sum(layers[i].forward_s for i in range(*chunk.layers))
        assert costs.forward_s[k] == pytest.approx(own_f + 2 * a2a * moe_layers)
        assert costs.forward_comm_s is not None and costs.forward_comm_s[k] == pytest.approx(2 * a2a * moe_layers)
    # rank 0 holds virtual stages 0 and 3 (embedding and head): its states are theirs
    zb = pipeline_costs(_v_plan("zb-v"))
    assert zb.forward_comm_s is None
    rank0 = [i for chunk in plan.stages[0].chunks for i in range(*chunk.layers)]
    assert costs.static_bytes[0] == pytest.approx(dims.rank_terms(plan, 0, rank0, forward_s=0.0,
                                                                   backward_s=0.0).static_bytes)
    assert simulate(plan, include_events=False).iteration_time_s > 0
