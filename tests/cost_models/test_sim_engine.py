"""The one discrete-event engine (cost_models.sim.engine): shared resources by hand, and the
contention that pipeline, BPipe and offload plans now see."""

from __future__ import annotations

import math

import pytest

from cost_models.schedules import build_actions
from cost_models.sim import engine
from cost_models.simulate import PipelineCosts, simulate, simulate_costs
from planner.schema import Plan
from tests.cost_models.sim_helpers import plan, uniform_layers


def test_two_transfers_on_one_link_take_twice_as_long() -> None:
    g = engine.Graph()
    a = g.add(1.0, resource=("link", 0, 1))
    b = g.add(1.0, resource=("link", 0, 1))
    c = g.add(1.0, resource=("link", 1, 0))  # the other direction is its own resource
    timed = engine.run(g)
    assert timed.done
    assert (timed.start_s[a], timed.end_s[a]) == (0.0, 1.0)
    assert (timed.start_s[b], timed.end_s[b]) == (1.0, 2.0)
    assert (timed.start_s[c], timed.end_s[c]) == (0.0, 1.0)


def test_fifo_by_ready_time_then_program_order() -> None:
    g = engine.Graph()
    first = g.add(2.0, resource="link")
    late = g.add(0.5)  # no resource: ends at 0.5
    waits_late = g.add(1.0, resource="link", deps=[late])  # ready at 0.5
    early = g.add(1.0, resource="link")  # ready at 0, created after waits_late
    timed = engine.run(g)
    # Both wait for `first` (ends at 2); when it frees, the one created first goes next.
    assert timed.start_s[first] == 0.0
    assert timed.start_s[waits_late] == 2.0 and timed.start_s[early] == 3.0


def test_operation_holding_two_resources_waits_for_both() -> None:
    g = engine.Graph()
    up = g.add(3.0, resource="d2h:0")
    down = g.add(1.0, resource="h2d:1")
    peer = g.add(2.0, resource="d2h:0", also=("h2d:1",))
    after = g.add(1.0, resource="h2d:1")
    timed = engine.run(g)
    assert timed.end_s[up] == 3.0 and timed.end_s[down] == 1.0
    assert (timed.start_s[peer], timed.end_s[peer]) == (3.0, 5.0)
    assert timed.start_s[after] == 1.0  # ready before the peer copy: FIFO, it went first


def test_streams_keep_order_and_start_dependencies() -> None:
    g = engine.Graph()
    x = g.add(1.0, stream="s")
    y = g.add(1.0, stream="s")
    z = g.add(0.5, deps=[x])
    g.add_start_dep(z, y)  # z also waits for y to start (at 1.0)
    timed = engine.run(g)
    assert timed.start_s[y] == 1.0 and timed.start_s[z] == 1.0


def test_a_cycle_is_left_untimed() -> None:
    g = engine.Graph()
    a = g.add(1.0)
    b = g.add(1.0, deps=[a])
    g.add_dep(a, b)
    timed = engine.run(g)
    assert not timed.done and math.isnan(timed.end_s[a])


def test_gpipe_activations_queue_on_a_slow_link() -> None:
    # F = 0.1 s, transfer 1 s: F0/F1 leave rank 0 at 0.1/0.2; the link carries one at a time,
    # so rank 1 gets microbatch 1 at 2.1 (1.2 when transfers did not share the link; 2.9 s in all then).
    costs = PipelineCosts.uniform(num_stages=2, forward_s=0.1, backward_s=0.2, send_s=1.0)
    result = simulate_costs(costs, build_actions("gpipe", num_stages=2, num_microbatches=2), num_microbatches=2)
    f1 = next(e for e in result.events if e.rank == 1 and e.kind == "F" and e.microbatch == 1)
    assert f1.start_s == pytest.approx(2.1)
    # Rank 1 runs B0 [2.2, 2.4] and B1 [2.4, 2.6]; the gradients leave at 2.4 and 2.6 and reach
    # rank 0 at 3.4 and 4.4 (the second queues behind the first); B(0, 1) ends at 4.6.
    assert result.iteration_time_s == pytest.approx(4.6)


def test_link_bound_gpipe_is_paced_by_the_link() -> None:
    # 64 forwards of 0.1 s leave rank 0 every 0.1 s but the link carries one per second: the last
    # activation arrives at 0.1 + 64, rank 1's F63 ends at 64.2, its B0 at 64.4; gradients then
    # leave every 0.2 s and again queue one per second: the last reaches rank 0 at 64.4 + 64,
    # whose B63 ends 0.2 s later (21.5 s before links were shared).
    costs = PipelineCosts.uniform(num_stages=2, forward_s=0.1, backward_s=0.2, send_s=1.0)
    m = 64
    result = simulate_costs(costs, build_actions("gpipe", num_stages=2, num_microbatches=m), num_microbatches=m)
    assert result.iteration_time_s == pytest.approx(0.1 + 64 + 0.1 + 0.2 + 64 + 0.2)


def test_interleaved_chunks_queue_on_the_link_between_two_ranks() -> None:
    # p = 2, v = 2, F = 0.1 s, 1 s transfers: rank 0's F(0, 0) and F(0, 1) end at 0.1 and 0.2;
    # their activations share link 0 -> 1: [0.1, 1.1] and [1.1, 2.1], so F(1, 1) starts at 2.1
    # (1.2 with unshared links). The whole iteration takes 14.2 s (12.2 s with unshared links).
    costs = PipelineCosts.uniform(num_stages=2, num_chunks=2, forward_s=0.1, backward_s=0.2, send_s=1.0)
    actions = build_actions("interleaved-1f1b", num_stages=2, num_chunks=2, num_microbatches=4)
    result = simulate_costs(costs, actions, num_microbatches=4)
    f11 = next(e for e in result.events if e.kind == "F" and e.stage == 1 and e.microbatch == 1)
    assert f11.start_s == pytest.approx(2.1)
    assert result.iteration_time_s == pytest.approx(14.2)


def test_plan_links_follow_the_cluster() -> None:
    fast = plan(uniform_layers(4, 1.0, 2.0), num_stages=2, num_chunks=2, num_microbatches=4,
                schedule="interleaved-1f1b")
    assert simulate(fast).iteration_time_s == pytest.approx(simulate(_slow_links(fast, 1e18)).iteration_time_s)
    assert simulate(_slow_links(fast, 1.0)).iteration_time_s == pytest.approx(33.0)  # 1 s per transfer


def _slow_links(p: Plan, bandwidth: float) -> Plan:
    layers = tuple(layer.model_copy(update={"output_bytes": 1.0}) for layer in p.model.layers)
    cluster = p.cluster.model_copy(update={"intra_node_bytes_per_s": bandwidth, "inter_node_bytes_per_s": bandwidth})
    return p.model_copy(update={"model": p.model.model_copy(update={"layers": layers}), "cluster": cluster})
