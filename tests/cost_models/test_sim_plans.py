"""The simulator on plans: costs derived from profiles, communication, memory and bubbles'
free memory by hand, deadlocks and malformed lists, and the predicted block."""

from __future__ import annotations

import pytest

from cost_models.schedules import build_actions
from cost_models.simulate import PipelineCosts, bottleneck_s, pipeline_costs, predicted, simulate, simulate_costs
from planner.errors import InvalidProblemError
from planner.schema import Action, LayerProfile, RecomputeOption, SimResult
from tests.cost_models.sim_helpers import cluster, plan, uniform_layers

EXACT = 1e-9


def _comm_plan(ranks=None):  # noqa: ANN001, ANN202
    layers = [
        LayerProfile(name="a", forward_s=1.0, backward_s=2.0, output_bytes=100.0, param_bytes=500.0),
        LayerProfile(name="b", forward_s=1.0, backward_s=2.0, param_bytes=1000.0),
    ]
    two_nodes = cluster(
        num_nodes=2, devices_per_node=2, intra_bytes_per_s=1000.0, intra_latency_s=0.1,
        inter_bytes_per_s=100.0, inter_latency_s=0.5,
    )
    return plan(layers, num_stages=2, num_microbatches=2, data_parallel=2, the_cluster=two_nodes, ranks=ranks)


def test_p2p_and_allreduce_by_hand() -> None:
    # Megatron order: stage 0 on ranks 0,1 (node 0), stage 1 on ranks 2,3 (node 1).
    # p2p over the inter-node link: 0.5 + 100 / 100 = 1.5 s each way.
    # ring all-reduce, d = 2, intra-node: 2(1)/2 x 500 / 1000 + 2 x 0.1 = 0.7 s; 1000 B: 1.2 s.
    costs = pipeline_costs(_comm_plan())
    assert costs.send_forward_s == pytest.approx((1.5,)) and costs.send_backward_s == pytest.approx((1.5,))
    assert costs.allreduce_s == pytest.approx((0.7, 1.2))
    result = simulate(_comm_plan())
    # rank 0: F0 [0,1] F1 [1,2] B0 [7,9] B1 [10,12] AR [12,12.7]
    # rank 1: F0 [2.5,3.5] B0 [3.5,5.5] F1 [5.5,6.5] B1 [6.5,8.5] AR [8.5,9.7]
    timeline = [(e.rank, e.kind, e.microbatch, round(e.start_s, 9), round(e.end_s, 9)) for e in result.events]
    assert timeline == ([
        (0, "F", 0, 0.0, 1.0), (0, "F", 1, 1.0, 2.0), (0, "B", 0, 7.0, 9.0), (0, "B", 1, 10.0, 12.0),
        (0, "AR", -1, 12.0, 12.7),
        (1, "F", 0, 2.5, 3.5), (1, "B", 0, 3.5, 5.5), (1, "F", 1, 5.5, 6.5), (1, "B", 1, 6.5, 8.5),
        (1, "AR", -1, 8.5, 9.7),
    ])
    assert result.iteration_time_s == pytest.approx(12.7)
    assert result.allreduce_s == pytest.approx(1.2)
    assert _spans(result.stages[0].bubbles) == [(2.0, 7.0), (9.0, 10.0)]
    assert _spans(result.stages[1].bubbles) == [(0.0, 2.5), (9.7, 12.7)]
    assert [s.busy_s for s in result.stages] == pytest.approx([6.7, 7.2])
    assert [s.idle_s for s in result.stages] == pytest.approx([6.0, 5.5])
    assert result.bubble_fraction == pytest.approx(11.5 / (2 * 12.7))
    assert result.throughput_samples_per_s == pytest.approx(4 / 12.7)  # 2 microbatches x 2 replicas


def _spans(bubbles) -> list[tuple[float, float]]:  # noqa: ANN001
    return [(round(b.start_s, 9), round(b.end_s, 9)) for b in bubbles]


def test_explicit_ranks_choose_the_links() -> None:
    # stage 0 on ranks (0, 2), stage 1 on (1, 3): p2p stays in node 0, replicas cross nodes.
    costs = pipeline_costs(_comm_plan(ranks=[(0, 2), (1, 3)]))
    assert costs.send_forward_s == pytest.approx((0.1 + 100 / 1000,))
    assert costs.allreduce_s == pytest.approx((500 / 100 + 2 * 0.5, 1000 / 100 + 2 * 0.5))


def _memory_layers() -> list[LayerProfile]:
    return [
        LayerProfile(
            name="a", forward_s=1.0, backward_s=2.0, static_bytes=100.0,
            recompute={
                "none": RecomputeOption(activation_bytes=10.0),
                "full": RecomputeOption(activation_bytes=2.0, extra_s=0.5),
            },
        ),
        LayerProfile(name="b", forward_s=1.0, backward_s=2.0, static_bytes=50.0, activation_bytes=20.0),
    ]


def test_memory_and_free_memory_in_bubbles_by_hand() -> None:
    # GPipe, m = 2. rank 0: F0 [0,1] F1 [1,2] idle [2,5] holding 2 x 10 B, B0 [5,7] B1 [7,9].
    # rank 1: idle [0,1], F0 F1 B0 B1 over [1,7], idle [7,9].
    result = simulate(plan(_memory_layers(), num_stages=2, num_microbatches=2, schedule="gpipe",
                           the_cluster=cluster(memory_bytes=1000.0)))
    assert [s.peak_memory_bytes for s in result.stages] == [120.0, 90.0]
    assert [s.peak_inflight_microbatches for s in result.stages] == [2, 2]
    assert result.fits_memory and result.memory_capacity_bytes == 1000.0
    assert [(b.start_s, b.end_s, b.free_memory_bytes) for b in result.stages[0].bubbles] == [(2.0, 5.0, 880.0)]
    assert [(b.start_s, b.end_s, b.free_memory_bytes) for b in result.stages[1].bubbles] == [
        (0.0, 1.0, 950.0), (7.0, 9.0, 950.0)]
    small = simulate(plan(_memory_layers(), num_stages=2, num_microbatches=2, schedule="gpipe",
                          the_cluster=cluster(memory_bytes=100.0)))
    assert not small.fits_memory


def test_recompute_runs_inside_the_backward() -> None:
    # Layer a recomputed in full: 2 B kept, 0.5 s of recompute before each of its backwards.
    result = simulate(plan(_memory_layers(), num_stages=2, num_microbatches=2, schedule="gpipe",
                           recompute={0: "full"}, the_cluster=cluster(memory_bytes=1000.0)))
    rank0 = [(e.kind, e.microbatch, e.start_s, e.end_s) for e in result.events if e.rank == 0]
    assert rank0 == [("F", 0, 0.0, 1.0), ("F", 1, 1.0, 2.0), ("R", 0, 5.0, 5.5), ("B", 0, 5.5, 7.5),
                     ("R", 1, 7.5, 8.0), ("B", 1, 8.0, 10.0)]
    assert result.iteration_time_s == 10.0
    assert result.stages[0].peak_memory_bytes == 104.0
    assert result.stages[0].bubbles[0].free_memory_bytes == 896.0
    assert result.stages[0].busy_s == 7.0


def test_predicted_and_bottleneck() -> None:
    the_plan = _comm_plan()
    sim = simulate(the_plan, include_events=False)
    assert sim.events == ()
    pred = predicted(the_plan, sim)
    assert pred.iteration_time_s == sim.iteration_time_s and pred.bubble_fraction == sim.bubble_fraction
    assert pred.throughput_samples_per_s == pytest.approx(4 / 12.7)
    assert pred.peak_memory_bytes == (0.0, 0.0)
    # ranks do 3 s per microbatch; the one link carries 1.5 + 1.5 s
    assert pred.bottleneck_s == pytest.approx(3.0)
    costs = PipelineCosts.uniform(num_stages=2, num_chunks=2, forward_s=1.0, backward_s=1.0, send_s=0.75)
    # one link between ranks 0 and 1 carries three boundaries: 3 x (0.75 + 0.75) = 4.5 > 2 x 2
    assert bottleneck_s(costs) == pytest.approx(4.5)


def test_interleaved_plan_through_simulate() -> None:
    result = simulate(plan(uniform_layers(8, 0.5, 1.0), num_stages=4, num_chunks=2, num_microbatches=8,
                           schedule="interleaved-1f1b"))
    assert result.iteration_time_s == pytest.approx(28.5, abs=EXACT)


def test_deadlock_names_the_ranks_and_actions() -> None:
    rows = ["0F0 0B0 0F1 0B1".split(), "1F1 1F0 1B0 1B1".split()]
    cyclic = plan(uniform_layers(2, 1.0, 2.0), num_stages=2, num_microbatches=2, schedule="custom", actions=rows)
    with pytest.raises(InvalidProblemError, match="deadlock") as info:
        simulate(cyclic)
    message = str(info.value)
    assert "rank 0 waits at 0B0 for 1B0 (rank 1's next action is 1F1)" in message
    assert "rank 1 waits at 1F1 for 0F1 (rank 0's next action is 0B0)" in message


def test_custom_plan_runs_its_own_order() -> None:
    rows = ["0F0 0F1 0B0 0B1".split(), "1F0 1F1 1B0 1B1".split()]  # GPipe written by hand
    custom = plan(uniform_layers(2, 1.0, 2.0), num_stages=2, num_microbatches=2, schedule="custom", actions=rows)
    gpipe = plan(uniform_layers(2, 1.0, 2.0), num_stages=2, num_microbatches=2, schedule="gpipe")
    assert simulate(custom).model_dump() == simulate(gpipe).model_dump()


def _costs(p: int, weight: bool = False) -> PipelineCosts:
    return PipelineCosts.uniform(num_stages=p, forward_s=1.0, backward_s=2.0, backward_weight_s=1.0 if weight else None)


def _rows(text: list[str]) -> list[list[Action]]:
    return [[Action.parse(a) for a in row.split()] for row in text]


@pytest.mark.parametrize(
    ("rows", "pattern"),
    [
        (["0F0 0F0 0B0 0F1 0B1", "1F0 1B0 1F1 1B1"], r"F follows F"),  # an action twice
        (["0B0 0F1 0B1", "1F0 1B0 1F1 1B1"], r"B follows nothing"),  # a missing forward
        (["0F0 0B0 0F1 0B1 1F0", "1B0 1F1 1B1"], r"stage 1 already runs on rank 0"),
        (["0F0 0B0 0F2 0B2", "1F0 1B0 1F1 1B1"], r"microbatch 2 is outside \[0, 2\)"),
        (["1F0 1B0 1F1 1B1", "0F0 0B0 0F1 0B1"], r"virtual stage 1 lives on rank 1"),
        (["0F0 0B0 0F1 0B1"], r"1 action lists for 2 pipeline ranks"),
        (["0F0 0I0 0W0 0F1 0I1 0W1", "1F0 1B0 1F1 1B1"], r"weight-gradient time is unknown"),
    ],
)
def test_malformed_lists_are_rejected(rows: list[str], pattern: str) -> None:
    with pytest.raises(InvalidProblemError, match=pattern):
        simulate_costs(_costs(2), _rows(rows), num_microbatches=2)


def test_bad_plans_are_rejected() -> None:
    with pytest.raises(InvalidProblemError, match="cannot parse action '0X0'"):
        simulate(plan(uniform_layers(2, 1.0, 2.0), num_stages=2, num_microbatches=1, schedule="custom",
                      actions=[["0F0", "0X0"], ["1F0", "1B0"]]))
    with pytest.raises(InvalidProblemError, match="backward_weight_s for every layer"):
        simulate(plan(uniform_layers(2, 1.0, 2.0), num_stages=2, num_microbatches=4, schedule="zb-h1"))
    with pytest.raises(InvalidProblemError, match="PipelineCosts.recompute_s has 1 entries; expected 2"):
        PipelineCosts(forward_s=(1.0, 1.0), backward_s=(1.0, 1.0), backward_weight_s=None, recompute_s=(0.0,),
                      activation_bytes=(0.0, 0.0), send_forward_s=(0.0,), send_backward_s=(0.0,),
                      static_bytes=(0.0, 0.0), allreduce_s=(0.0, 0.0))


def test_zero_bubble_plan_uses_the_weight_gradient_times() -> None:
    layers = uniform_layers(4, 1.0, 2.0, backward_weight_s=1.0)
    result = simulate(plan(layers, num_stages=4, num_microbatches=8, schedule="zb-h1"))
    # T_F = 1, T_B (input part) = 1, T_W = 1: makespan m(3) + (p-1)(1 + 1 - 1)
    assert result.iteration_time_s == pytest.approx(8 * 3 + 3 * 1.0, abs=EXACT)
    assert {e.kind for e in result.events} == {"F", "I", "W"}
    assert simulate(plan(layers, num_stages=4, num_microbatches=8)).iteration_time_s == pytest.approx(33.0)


def test_actions_of_other_schedules_are_ignored_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    rows = [["0F0", "0B0"], ["1F0", "1B0"]]
    the_plan = plan(uniform_layers(2, 1.0, 2.0), num_stages=2, num_microbatches=1, schedule="gpipe", actions=rows)
    with caplog.at_level("WARNING"):
        assert simulate(the_plan).iteration_time_s == pytest.approx(6.0)
    assert "plan.actions is ignored" in caplog.text


def test_builtin_lists_agree_with_validated_runs() -> None:
    costs = PipelineCosts.uniform(num_stages=3, forward_s=1.0, backward_s=2.0, backward_weight_s=0.5)
    for schedule in ("gpipe", "1f1b", "zb-h1", "zb-h2"):
        actions = build_actions(schedule, num_stages=3, num_microbatches=5)
        fast = simulate_costs(costs, actions, num_microbatches=5, validate=False)
        assert fast.model_dump() == simulate_costs(costs, actions, num_microbatches=5).model_dump()


def test_result_is_schema_valid_and_round_trips() -> None:
    # The result is assembled with model_construct; validating it again must accept it as is.
    result = simulate(plan(_memory_layers(), num_stages=2, num_microbatches=3, recompute={0: "full"}))
    assert SimResult.model_validate(result.model_dump()) == result
    again = SimResult.from_json(result.to_json())
    assert again == result.model_copy(update={"events": ()})
    assert SimResult.from_json(result.to_json(include_events=True)).events == result.events


def test_allreduce_ring_across_nodes_uses_one_nic_per_replica_on_a_node() -> None:
    from cost_models.sim.costs import pipeline_costs
    from tests.cost_models.sim_helpers import cluster as make_cluster
    from tests.cost_models.sim_helpers import plan as make_plan
    from tests.cost_models.sim_helpers import uniform_layers

    layers = uniform_layers(2, 1.0, 2.0, param_bytes=1e9)
    nodes = make_cluster(num_nodes=2, devices_per_node=4, intra_bytes_per_s=100e9, inter_bytes_per_s=10e9)
    # stage 0 on ranks 0, 1 | 4, 5 (2 replicas per node): NCCL's hierarchical all-reduce
    # (collectives.ranks_allreduce_s; this device has no bus-bandwidth fraction, 1.0): reduce-scatter
    # and all-gather in the node, then 1e9 / 2 bytes all-reduced across the 2 nodes on each rail.
    # The flat ring over min(100, 2 x 10) GB/s it replaces charged 2 x 3/4 x 1e9 / 20e9 = 0.075 s.
    costs = pipeline_costs(make_plan(layers, num_stages=2, num_microbatches=2, data_parallel=4, the_cluster=nodes,
                                     ranks=[(0, 1, 4, 5), (2, 3, 6, 7)]))
    assert costs.allreduce_s[0] == pytest.approx(2 * 1 / 2 * 1e9 / 100e9 + 2 * 1 / 2 * 0.5e9 / 10e9)
    # inside one node: the intra-node link
    costs = pipeline_costs(make_plan(layers, num_stages=2, num_microbatches=2, data_parallel=2, the_cluster=nodes,
                                     ranks=[(0, 1), (2, 3)]))
    assert costs.allreduce_s[0] == pytest.approx(2 * 1 / 2 * 1e9 / 100e9)
