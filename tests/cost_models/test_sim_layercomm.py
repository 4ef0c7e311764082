"""FSDP gathers, the context ring and expert all-to-alls as engine operations (cost_models/sim/layercomm.py).

Without contention the engine's layers reproduce the closed form the compute durations carry
(``layercomm.closed_form_extra``); when a gather and a gradient bucket or an activation send want one
NIC, the one that waits takes longer by the hand-computed amount.
"""

from __future__ import annotations

import dataclasses

import pytest

from cost_models.schedules import build_actions
from cost_models.sim.costs import pipeline_costs
from cost_models.sim.layercomm import CommSpec, LayerComm, StageComm, closed_form_extra
from cost_models.sim.sync import RankSync, SyncSpec
from cost_models.simulate import PipelineCosts, plan_actions, simulate_costs
from planner.schema import Plan
from tests.cost_models.test_sim_dims import DENSE, MOE, _with_weights
from tests.planner.modern_plans import preset_plan


def _events_and_closed_form(plan: Plan) -> tuple[float, float]:
    costs = pipeline_costs(plan)
    assert costs.comm is not None  # the collectives run as engine operations
    actions, m = plan_actions(plan), plan.num_microbatches
    events = simulate_costs(costs, actions, num_microbatches=m, include_events=False)
    closed = simulate_costs(dataclasses.replace(costs, comm=None), actions, num_microbatches=m, include_events=False)
    return events.iteration_time_s, closed.iteration_time_s


def _slow_ring(plan: Plan) -> Plan:
    return plan.model_copy(update={"cluster": plan.cluster.model_copy(update={"intra_node_bytes_per_s": 1e4})})


@pytest.mark.parametrize("plan", [
    _with_weights(preset_plan(DENSE, data=8, zero_stage=3, p=2, m=4), 1e9),  # FSDP inside a node
    preset_plan(MOE.model_copy(update={"num_experts": 16}), data=16, expert=16),  # all-to-alls over 2 nodes' NICs
    _with_weights(preset_plan(MOE, p=2, data=4, context=2, expert=4, tensor=2, zero_stage=3, m=4), 1e8),
    # gathers outlasting a layer's 0.1 s compute: 0.117 s (the compute slowed to 0.82 of its speed still
    # ends last) and 0.194 s (the gather ends last)
    _with_weights(preset_plan(DENSE, data=8, zero_stage=3, p=2, m=4), 6e10),
    _with_weights(preset_plan(DENSE, data=8, zero_stage=3, p=2, m=4), 1e11),
], ids=["fsdp", "expert-alltoall-nic", "every-dimension", "fsdp-gather-past-compute", "fsdp-gather-past-slowed"])
def test_without_contention_the_engine_reproduces_the_closed_form(plan: Plan) -> None:
    events, closed = _events_and_closed_form(plan)
    assert events == pytest.approx(closed, rel=1e-12)


def test_the_context_ring_stays_in_the_layer_as_its_closed_form() -> None:
    # An exposed ring (slow link) adds its closed form to F and B; it takes no operations of its own.
    plan = _slow_ring(preset_plan(DENSE, tensor=2, context=2, p=2, m=4))
    costs = pipeline_costs(plan)
    assert costs.comm is None
    assert costs.forward_s[0] > pipeline_costs(preset_plan(DENSE, tensor=2, context=2, p=2, m=4)).forward_s[0]


def _fsdp_stage(forward_s: float, backward_s: float, gather_s: float, nic: int) -> StageComm:
    """Two layers of one forward and one backward compute time, each gathered in ``gather_s``."""
    return StageComm(forward=(LayerComm(forward_s, gather_s),) * 2, backward=(LayerComm(backward_s, gather_s),) * 2,
                     fsdp=True, fsdp_nic=nic)


def test_a_gradient_bucket_on_the_nic_delays_the_next_gather_by_its_duration() -> None:
    # One stage of two layers (F 1 s, B 2 s each), 2 s gathers over node 0's NICs, a 3.2 s reduce-scatter
    # in four 0.8 s buckets. Closed form: F = 2 + 2 + max(0, 2 - 1) = 5, B = 4 + 2 + max(0, 2 - 2) = 6,
    # reduction tail 0.8 + max(0, 2.4 - 6) = 0.8.
    stage = _fsdp_stage(1.0, 2.0, 2.0, nic=0)
    assert closed_form_extra(stage.forward, True) == 3.0
    assert closed_form_extra(stage.backward, True, backward=True) == 2.0
    costs = dataclasses.replace(
        PipelineCosts.uniform(num_stages=1, forward_s=5.0, backward_s=6.0, allreduce_s=0.8),
        sync=SyncSpec(ranks=(RankSync(reduce_s=3.2, stage_share=(1.0,), overlap=True, nic=0),), node=(0,)),
        comm=CommSpec(stages=(stage,), node=(0,)))
    actions = build_actions("1f1b", num_stages=1, num_microbatches=1)
    # Closed form: B [5, 11]; buckets released at 6.5, 8, 9.5, 11 run at once; the last ends at 11.8.
    closed = simulate_costs(dataclasses.replace(costs, comm=None), actions, num_microbatches=1)
    assert closed.iteration_time_s == pytest.approx(11.8)
    # Events: B's first gather [5, 7]; bucket 0 (released at 6.5) waits for it and runs [7, 7.8], ahead of
    # the second gather issued at 7, which runs [7.8, 9.8]: the second layer's backward [9.8, 11.8]
    # starts 0.8 s (one bucket) late. Buckets 1-3 follow [9.8, 10.6], [10.6, 11.4], [11.4, 12.2].
    sim = simulate_costs(costs, actions, num_microbatches=1)
    backward = next(e for e in sim.events if e.kind == "B")
    assert [backward.start_s, backward.end_s] == pytest.approx([5.0, 11.8])
    assert sim.iteration_time_s == pytest.approx(12.2)
    # Alone (no reduction on the engine) the gathers take exactly the closed form's 5 + 6 s.
    alone = simulate_costs(dataclasses.replace(costs, sync=None), actions, num_microbatches=1)
    assert alone.iteration_time_s == pytest.approx(11.0 + 0.8)  # + the closed-form tail allreduce_s


def test_an_activation_send_on_the_nic_delays_the_next_forwards_first_gather() -> None:
    # Two stages on two nodes, two layers each (F 1 s, B 2 s), 0.5 s gathers, 0.3 s sends: F = 2.5, B = 4.5.
    stages = (_fsdp_stage(1.0, 2.0, 0.5, nic=0), _fsdp_stage(1.0, 2.0, 0.5, nic=1))
    costs = dataclasses.replace(
        PipelineCosts.uniform(num_stages=2, forward_s=2.5, backward_s=4.5, send_s=0.3),
        comm=CommSpec(stages=stages, node=(0, 1)))
    actions = build_actions("1f1b", num_stages=2, num_microbatches=2)

    def rank0_forwards(result) -> list[float]:  # type: ignore[no-untyped-def]
        return [t for e in result.events if e.rank == 0 and e.kind == "F" for t in (e.start_s, e.end_s)]

    closed = simulate_costs(dataclasses.replace(costs, comm=None), actions, num_microbatches=2)
    assert rank0_forwards(closed) == pytest.approx([0.0, 2.5, 2.5, 5.0])
    # F0's activation leaves at 2.5 holding node 0's NIC until 2.8; F1's first gather, issued at 2.5
    # too, waits for it: F1 ends 0.3 s later. Rank 1's F0 receives it at 2.8 as before.
    sim = simulate_costs(costs, actions, num_microbatches=2)
    assert rank0_forwards(sim) == pytest.approx([0.0, 2.5, 2.5, 5.3])
    rank1_first = next(e for e in sim.events if e.rank == 1 and e.kind == "F")
    assert rank1_first.start_s == pytest.approx(2.8)
    assert sim.iteration_time_s > closed.iteration_time_s


def test_hidden_alltoalls_slow_the_compute_under_them_by_their_sm_share() -> None:
    """With overlap_moe_alltoall a layer's dispatch and combine (2 x 3 ms) run under 10 ms of the other
    microbatch's compute; holding a quarter of the SMs they leave that compute at 3/4 of its speed for
    their 6 ms: 1.5 ms more (max(6 - 10, 0.25 min(6, 10 / 0.75))). Longer than the compute (2 x 8 ms under
    10 ms), what shows is the part beyond it, 6 ms, as without the share; without a cover, both in full."""
    hidden = LayerComm(compute_s=0.01, alltoall_s=0.003, alltoall_cover_s=0.01, alltoall_sm_share=0.25)
    assert hidden.alltoall_exposed_s() == pytest.approx(0.0015)
    longer = dataclasses.replace(hidden, alltoall_s=0.008)
    assert longer.alltoall_exposed_s() == pytest.approx(0.006)
    assert dataclasses.replace(hidden, alltoall_sm_share=0.0).alltoall_exposed_s() == 0.0
    assert dataclasses.replace(hidden, alltoall_cover_s=None).alltoall_exposed_s() == pytest.approx(0.006)
    assert closed_form_extra([hidden, hidden], False) == pytest.approx(0.003)
