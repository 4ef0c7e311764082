"""Data-parallel gradient synchronisation as engine collectives (cost_models/sim/sync.py), hand-checked.

The plan: 2 pipeline stages, 2 replicas each, one GPU per node (4 nodes), so every replica group and
every stage boundary crosses nodes. Layers: F = 1 s, B = 2 s, 4 GB of weights (the all-reduce over 2
nodes at 1 GB/s: 4 s), stage outputs of 0.1 GB (0.1 s per send).
"""

from __future__ import annotations

import dataclasses

import pytest

from cost_models.sim.costs import pipeline_costs
from cost_models.simulate import plan_actions, simulate, simulate_costs
from planner.schema import RecomputeOption
from tests.cost_models.sim_helpers import cluster, plan, uniform_layers


def _plan(num_microbatches: int = 1, **options: object):  # type: ignore[no-untyped-def]
    nodes = cluster(num_nodes=4, devices_per_node=1, intra_bytes_per_s=1e30, inter_bytes_per_s=1e9)
    layers = uniform_layers(2, 1.0, 2.0, param_bytes=4e9, output_bytes=1e8)
    base = plan(layers, num_stages=2, num_microbatches=num_microbatches, data_parallel=2, the_cluster=nodes,
                ranks=[(0, 1), (2, 3)])
    return base.model_copy(update={"options": dict(options)})


def test_the_collective_cost_is_the_hierarchical_choice() -> None:
    costs = pipeline_costs(_plan())
    # one member per node: all-reduce of 4 GB across 2 nodes (ring 2 x 1/2 x 4e9 / 1e9 beats the tree)
    assert list(costs.allreduce_s) == pytest.approx([4.0, 4.0])
    assert costs.sync is not None and [r.nic for r in costs.sync.ranks] == [0, 2]


def test_without_overlap_the_all_reduce_follows_the_last_backward_as_before() -> None:
    # F0 [0, 1], send, F1 [1.1, 2.1], B1 [2.1, 4.1], send, B0 [4.2, 6.2], all-reduce 4 s -> 10.2 s
    sim = simulate(_plan())
    assert sim.iteration_time_s == pytest.approx(10.2)
    costs = pipeline_costs(_plan(4))
    actions = plan_actions(_plan(4))
    engine = simulate_costs(costs, actions, num_microbatches=4)
    tail = simulate_costs(dataclasses.replace(costs, sync=None), actions, num_microbatches=4)
    assert engine.model_dump() == tail.model_dump()  # no contention: the same values as the per-rank tail


def test_overlapped_buckets_delay_the_pipeline_send_that_shares_the_nic() -> None:
    # Stage 1's buckets (1 s each) start at 2.6, 3.6 (released 2.6, 3.1, 3.6, 4.1 during B1 [2.1, 4.1]);
    # its gradient send, ready at 4.1, waits for the NIC until 4.6 and arrives at 4.7; bucket 2 and 3 follow
    # at 4.7 and 5.7. B0 [4.7, 6.7]; stage 0's buckets released 5.2, 5.7, 6.2, 6.7 end at 9.2.
    sim = simulate(_plan(overlap_grad_reduce=True))
    assert sim.iteration_time_s == pytest.approx(9.2)
    # were the NIC not shared, the send would leave at 4.1 and the iteration end at 8.7
    costs = pipeline_costs(_plan(overlap_grad_reduce=True))
    assert costs.sync is not None
    alone = dataclasses.replace(costs, sync=dataclasses.replace(
        costs.sync, ranks=tuple(dataclasses.replace(r, nic=None) for r in costs.sync.ranks)))
    assert simulate_costs(alone, plan_actions(_plan()), num_microbatches=1).iteration_time_s == pytest.approx(8.7)


def test_buckets_start_after_the_recompute_of_the_last_backward() -> None:
    # full recompute of both layers (1 s): B1 [2.1, 5.1] computes gradients from 3.1, so its buckets are
    # released 3.6, 4.1, 4.6, 5.1 and run 3.6-4.6, 4.6-5.6; the send (ready 5.1) goes 5.6-5.7, buckets 2
    # and 3 follow; B0 [5.7, 8.7] releases 7.2, 7.7, 8.2, 8.7: its buckets run 7.2-8.2 ... 10.2-11.2
    nodes = cluster(num_nodes=4, devices_per_node=1, intra_bytes_per_s=1e30, inter_bytes_per_s=1e9)
    options = {"none": RecomputeOption(activation_bytes=0.0), "full": RecomputeOption(activation_bytes=0.0, extra_s=1.0)}
    layers = uniform_layers(2, 1.0, 2.0, param_bytes=4e9, output_bytes=1e8, recompute=options)
    recomputed = plan(layers, num_stages=2, num_microbatches=1, data_parallel=2, the_cluster=nodes,
                      ranks=[(0, 1), (2, 3)], recompute={0: "full", 1: "full"}).model_copy(
        update={"options": {"overlap_grad_reduce": True}})
    assert list(pipeline_costs(recomputed).recompute_s) == pytest.approx([1.0, 1.0])
    assert simulate(recomputed).iteration_time_s == pytest.approx(11.2)


def test_the_closed_form_tail_bounds_the_overlapped_engine() -> None:
    # one stage, m = 4: the closed form (collectives.exposed_dp_allreduce_s) and the engine agree when
    # the buckets fit under the last backward: only the last bucket shows
    nodes = cluster(num_nodes=2, devices_per_node=1, inter_bytes_per_s=1e9)
    small = plan(uniform_layers(1, 1.0, 2.0, param_bytes=1e9), num_stages=1, num_microbatches=4, data_parallel=2,
                 the_cluster=nodes, ranks=[(0, 1)]).model_copy(update={"options": {"overlap_grad_reduce": True}})
    costs = pipeline_costs(small)
    assert costs.allreduce_s[0] == pytest.approx(0.25)  # 1 s all-reduce, 3/4 of it under a 2 s backward
    assert simulate(small).iteration_time_s == pytest.approx(4 * 3.0 + 0.25)
