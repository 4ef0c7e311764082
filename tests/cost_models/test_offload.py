"""Offload cost model and simulator (seed 003, reading stage-ilp-spipe-bpipe.md Part B): formulas,
the placement rule's figure facts, and timelines computed by hand."""

from __future__ import annotations

import json

import pytest

from cost_models import offload
from cost_models.sim.offload import simulate_offload
from planner import api
from planner.errors import InfeasibleError, InvalidProblemError
from planner.schema import Cluster, LayerProfile, ModelProfile, PipelineProblem, Plan, RecomputeOption
from solvers import _spipe_common as common

TIB = 2**40


def _toy(num_layers: int, forward_s: float, backward_s: float, params: float = 1.0) -> ModelProfile:
    none = RecomputeOption(activation_bytes=8.0)
    full = RecomputeOption(activation_bytes=1.0, extra_s=0.0)
    layer = LayerProfile(name="l", kind="decoder", forward_s=forward_s, backward_s=backward_s,
                         static_bytes=16 * params, param_bytes=2 * params, recompute={"none": none, "full": full})
    return ModelProfile(name="toy", layers=tuple(layer.model_copy(update={"name": f"l{i}"}) for i in range(num_layers)))


def _cluster(num_gpus: int, host_link: float | None = 1e18) -> Cluster:
    device = {"name": "g", "memory_bytes": 1e12, "peak_flops": 1e12}
    if host_link is not None:
        device["host_link_bytes_per_s"] = host_link
    return Cluster.from_dict({"name": "c", "device": device, "num_nodes": 1, "devices_per_node": num_gpus,
                              "intra_node_bytes_per_s": 1e18, "inter_node_bytes_per_s": 1e18})


def _plan(model: ModelProfile, cluster: Cluster, *, v: int, d: int, decoupled: bool, m: int,
          async_opt: bool = True, host: dict | None = None, prefetch: bool = True):
    problem = PipelineProblem(model=model, cluster=cluster)
    spec = offload.host_spec(cluster, {"host": host or {}})
    cfg = common.OffloadConfig(forward_per_gpu=v, backward_per_forward=d, decoupled=decoupled,
                               microbatch_size=1, num_microbatches=m, async_optimizer=async_opt)
    plan = common.build_plan(problem, model, cfg, spec, solver="spipe")
    if not prefetch:
        plan = plan.model_copy(update={"offload": plan.offload.model_copy(update={"prefetch": False})})
    return plan


def test_cpu_state_bytes_match_the_papers_terabytes():
    # Seed 003 L39: "a 0.1 trillion parameter model requires 1.83 terabytes" (1.82 TiB at 20 B/param).
    assert offload.cpu_state_bytes(1e11) / TIB == pytest.approx(1.819, abs=1e-3)


def test_transfer_and_step_times():
    host = offload.HostSpec(host_link_bytes_per_s=10e9, pinned_efficiency=0.5, cpu_optimizer_params_per_s=2e9)
    assert offload.transfer_time_s(10e9, host) == pytest.approx(2.0)
    assert offload.transfer_time_s(10e9, offload.HostSpec(host_link_bytes_per_s=10e9, pinned=False)) == pytest.approx(
        1 / offload.PAGEABLE_EFFICIENCY)
    assert offload.optimizer_step_time_s(3e9, host) == pytest.approx(1.5)


def test_placement_rule_reproduces_figure_8_caption():
    # Fig. 8 caption (L229): GPU0 runs backward stages S_{7,1}, S_{5,1}, S_{3,1}, S_{1,1} (n = 2i + k).
    gpu0 = sorted(((n // 2, n % 2) for n in range(16) if offload.spipe_backward_gpu(n, 4) == 0), reverse=True)
    assert gpu0 == [(7, 1), (5, 1), (3, 1), (1, 1)]
    assert [i for i in range(8) if offload.forward_gpu(i, 4) == 0] == [0, 4]


@pytest.mark.parametrize("d", [1, 2])
def test_cross_gpu_checkpoints_of_figure_5(d):
    # L182: Fig. 5(b) (d=1) and 5(c) (d=2) both need 2 checkpoint transfers per microbatch.
    backward = [offload.spipe_backward_gpu(n, 2) for n in range(2 * d)]
    assert offload.cross_gpu_checkpoints([0, 1], backward, d) == 2


@pytest.mark.parametrize(("decoupled", "d", "backward_s", "makespan", "idle"), [
    (False, 1, 1.0, 33.0, 9.0),  # Mobius-like: F = 1, B = 2 per full stage (reading B.6)
    (True, 2, 1.0, 27.0, 3.0),   # SPipe-like: d = 2, one unit per half-stage backward
])
def test_unit_time_oracles(decoupled, d, backward_s, makespan, idle):
    # G = 4, 8 forward stages of 2 layers (0.5 each), J = 4; transfers and steps are ~0.
    plan = _plan(_toy(16, 0.5, backward_s), _cluster(4), v=2, d=d, decoupled=decoupled, m=4)
    sim = simulate_offload(plan).sim
    assert sim.iteration_time_s == pytest.approx(makespan, abs=1e-6)
    assert [st.idle_s for st in sim.stages] == pytest.approx([idle] * 4, abs=1e-6)


def _hand_plan(**kw):
    # 1 GPU, 2 layers of 1e9 params: a copy is 2e9 B at 4e9 B/s = 0.5 s; a step 1e9 / (1/3 e9) = 3 s.
    model = _toy(2, 1.0, 2.0, params=1e9)
    host = {"pinned_efficiency": 1.0, "cpu_optimizer_params_per_s": 1e9 / 3}
    return _plan(model, _cluster(1, host_link=4e9), v=2, d=1, decoupled=False, m=1, host=host, **kw)


def test_hand_computed_offload_timeline_async():
    # P(f0) 0-.5, P(f1) .5-1, F0 .5-1.5, F1 1.5-2.5, P(b1) 1.5-2 (after F0 frees its buffer),
    # B1 2.5-4.5, G1 4.5-5, P(b0) 2.5-3, B0 4.5-6.5, G0 6.5-7; O1 5-8, O0 8-11 (one CPU).
    res = simulate_offload(_hand_plan(async_opt=True))
    assert [(e.kind, e.stage, e.start_s, e.end_s) for e in res.sim.events] == [
        ("F", 0, 0.5, 1.5), ("F", 1, 1.5, 2.5), ("B", 1, 2.5, 4.5), ("B", 0, 4.5, 6.5)]
    transfers = sorted((e.kind, e.start_s, e.end_s) for e in res.transfers)
    assert transfers == [("G", 4.5, 5.0), ("G", 6.5, 7.0), ("P", 0.0, 0.5), ("P", 0.5, 1.0), ("P", 1.5, 2.0),
                         ("P", 2.5, 3.0)]
    assert [(e.start_s, e.end_s) for e in res.cpu] == [(5.0, 8.0), (8.0, 11.0)]
    assert res.sim.iteration_time_s == pytest.approx(11.0)
    assert res.gpu_makespan_s == pytest.approx(7.0)
    assert res.cpu_exposed_s == pytest.approx(4.0)


def test_hand_computed_sync_optimizer_and_no_prefetch():
    # Synchronous overflow check (Fig. 3): both steps after the last offload at 7: 7-10, 10-13.
    assert simulate_offload(_hand_plan(async_opt=False)).sim.iteration_time_s == pytest.approx(13.0)
    # No prefetch: each copy waits for the previous stage: F1 2-3, B1 3.5-5.5, B0 6-8, G0 8-8.5,
    # O1 6-9, O0 9-12.
    assert simulate_offload(_hand_plan(prefetch=False)).sim.iteration_time_s == pytest.approx(12.0)


def test_shared_host_link_serializes_copies():
    model = _toy(2, 1.0, 2.0, params=1e9)
    host = {"pinned_efficiency": 1.0}
    own = simulate_offload(_plan(model, _cluster(2, host_link=4e9), v=1, d=1, decoupled=False, m=1, host=host))
    shared = simulate_offload(_plan(model, _cluster(2, host_link=4e9), v=1, d=1, decoupled=False, m=1,
                                    host={**host, "gpus_per_host_link": 2}))
    first = lambda res: sorted((e.start_s, e.end_s) for e in res.transfers if e.kind == "P")[:2]  # noqa: E731
    assert first(own) == [(0.0, 0.5), (0.0, 0.5)]
    assert first(shared) == [(0.0, 0.5), (0.5, 1.0)]


def test_gpu_memory_by_hand():
    # 2 layers, 1e9 params each (2e9 fp16 bytes); checkpoint (input) 1 B, everything saved 8 B.
    model = _toy(2, 1.0, 2.0, params=1e9)
    # Two 1-layer backward stages: backward phase 4 x 2e9 buffers + working 8 - 1 = 7 beats the
    # forward phase 2 x 4e9; one checkpoint per backward stage and microbatch: 4 x (1 + 1).
    mem = offload.gpu_memory_bytes(model, forward_layers=[(0, 2)], backward_layers=[(0, 1), (1, 2)],
                                   num_microbatches=4)
    assert mem == pytest.approx(4 * 2e9 + 7 + 4 * 2.0, abs=1e-3)
    # One 2-layer backward stage keeps only its input (L186): 4 x 1; its recompute holds the
    # second layer's input (1) and expands one layer (7).
    mem = offload.gpu_memory_bytes(model, forward_layers=[(0, 1)], backward_layers=[(0, 2)], num_microbatches=4)
    assert mem == pytest.approx(4 * 4e9 + (1 + 7) + 4 * 1.0, abs=1e-3)
    # Forward phase dominates: two 2-layer forward buffers against a 1-layer backward stage.
    fwd = offload.gpu_memory_bytes(model, forward_layers=[(0, 2)], backward_layers=[(0, 1)], num_microbatches=0)
    assert fwd == pytest.approx(max(2 * 4e9, 4 * 2e9 + 7), abs=1e-3)


def test_head_logits_are_not_kept_between_passes():
    # A head without a full option (8 + 92 B saved) ends the stage: its logits live only while the
    # stage recomputes (working set), never in the J checkpoints, which hold the stage input.
    head = LayerProfile(name="head", kind="head", forward_s=1.0, backward_s=1.0, static_bytes=0.0, param_bytes=2.0,
                        activation_bytes=100.0)
    model = _toy(1, 1.0, 2.0, params=1.0)
    model = model.model_copy(update={"layers": (*model.layers, head)})
    assert offload.stage_checkpoint_bytes(model, (0, 2)) == pytest.approx(1.0)
    assert offload.stage_working_bytes(model, (0, 2)) == pytest.approx(100.0 + 7.0)
    mem = offload.gpu_memory_bytes(model, forward_layers=[(0, 2)], backward_layers=[(0, 2)], num_microbatches=10)
    assert mem == pytest.approx(4 * (2.0 + 2.0) + 107.0 + 10 * 1.0)


def test_missing_host_link_is_a_clear_error():
    with pytest.raises(InvalidProblemError, match="host_link_bytes_per_s"):
        offload.host_spec(_cluster(2, host_link=None))
    with pytest.raises(InvalidProblemError, match="gpus_per_host_link=3 must divide"):
        offload.host_spec(_cluster(2), {"host": {"gpus_per_host_link": 3}})


def test_cpu_memory_bounds_of_table_2():
    # L268: 19B is the largest model on one node (512 GB); 30B needs two.
    host = offload.HostSpec(host_link_bytes_per_s=1e10)
    for name, fits in (("spipe-19b", True), ("spipe-30b", False)):
        model = api.make_problem(name, "v100:1x4").model
        need = offload.cpu_state_bytes(offload.range_num_params(model, (0, model.num_layers)))
        if fits:
            offload.check_cpu_memory([need], host)
        else:
            with pytest.raises(InfeasibleError, match="CPU memory too small.*at least 2 nodes"):
                offload.check_cpu_memory([need], host)


def test_plan_without_offload_section_is_rejected():
    problem = PipelineProblem(model=_toy(4, 1.0, 2.0), cluster=_cluster(2))
    plan = api.plan(problem, solver="even")
    with pytest.raises(InvalidProblemError, match="no 'offload' section"):
        simulate_offload(plan)


def test_plans_with_the_old_options_offload_section_still_load():
    plan = _hand_plan(async_opt=True)
    data = json.loads(plan.to_json())
    data["options"] = {"offload": data.pop("offload")}  # as plan files were written before Plan.offload
    old = Plan.from_dict(data)
    assert old.offload == plan.offload and "offload" not in old.options
    assert simulate_offload(old).sim.iteration_time_s == simulate_offload(plan).sim.iteration_time_s


def test_sweeps_skip_the_bubble_lists_only():
    """``include_bubbles=False`` (the spipe/mobius sweep): every other field is the same."""
    plan = _plan(_toy(16, 0.5, 1.5), _cluster(4), v=2, d=2, decoupled=True, m=4)
    full = simulate_offload(plan, include_events=False)
    lean = simulate_offload(plan, include_events=False, include_bubbles=False)
    assert any(stage.bubbles for stage in full.sim.stages)
    assert all(not stage.bubbles for stage in lean.sim.stages)
    stripped = full.sim.model_copy(update={"stages": tuple(s.model_copy(update={"bubbles": ()})
                                                           for s in full.sim.stages)})
    assert lean.sim == stripped
    assert (lean.gpu_makespan_s, lean.cpu_exposed_s, lean.gpu_memory_bytes) == (
        full.gpu_makespan_s, full.cpu_exposed_s, full.gpu_memory_bytes)
