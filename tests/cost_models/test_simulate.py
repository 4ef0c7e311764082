"""The one schedule simulator against closed forms: fill-drain bubbles (dissertation L3512-3588),
interleaved bubbles and warm-up (L3590-3652, ptdp-gavel-cloud.md Sec. 1.2), PipeFill's per-stage
bubbles (pipefill.md Sec. 1.2), 1F1B in-flight counts (BPipe Eq. 2), Zero Bubble (Table 2) and
PipeDream-2BW's steady state."""

from __future__ import annotations

import pytest

from cost_models.schedules import build_actions
from cost_models.simulate import PipelineCosts, simulate, simulate_2bw, simulate_costs
from planner.schema import SimResult
from tests.cost_models.sim_helpers import plan, uniform_layers

EXACT = 1e-9


def _run(schedule: str, p: int, m: int, tf: float, tb: float, *, v: int = 1, tw: float | None = None) -> SimResult:
    costs = PipelineCosts.uniform(num_stages=p, num_chunks=v, forward_s=tf, backward_s=tb, backward_weight_s=tw)
    actions = build_actions(schedule, num_stages=p, num_chunks=v, num_microbatches=m)
    return simulate_costs(costs, actions, num_microbatches=m)


def _lengths(result: SimResult, rank: int) -> list[float]:
    return [b.end_s - b.start_s for b in result.stages[rank].bubbles]


_SHAPES = [(p, m) for p in (1, 2, 3, 4, 7) for m in (1, 2, 3, 5, 8, 13)]
_TIMES = [(1.0, 2.0), (1.0, 1.0), (0.3, 0.7), (2.0, 3.0)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("tf", "tb"), _TIMES)
def test_fill_drain_fraction_for_gpipe_and_1f1b(schedule: str, tf: float, tb: float) -> None:
    for p, m in _SHAPES:
        result = _run(schedule, p, m, tf, tb)
        assert result.iteration_time_s == pytest.approx((m + p - 1) * (tf + tb), abs=EXACT)
        assert result.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), abs=EXACT)
        for stage in result.stages:
            # every stage idles (p-1)(t_f+t_b) (pipefill.md Sec. 1.2, "total idle per stage")
            assert stage.idle_s == pytest.approx((p - 1) * (tf + tb), abs=EXACT)
            assert sum(_lengths(result, stage.index)) == pytest.approx(stage.idle_s, abs=EXACT)


def test_simulate_plan_matches_the_closed_form_and_flush_is_1f1b() -> None:
    layers = uniform_layers(8, 1.0, 2.0)
    one = simulate(plan(layers, num_stages=4, num_microbatches=8, schedule="1f1b"))
    flush = simulate(plan(layers, num_stages=4, num_microbatches=8, schedule="flush"))
    assert one.iteration_time_s == pytest.approx(11 * 6.0, abs=EXACT)
    assert flush.model_dump() == one.model_dump()
    assert one.throughput_samples_per_s == pytest.approx(8 / 66.0)


@pytest.mark.parametrize(("tf", "tb"), _TIMES)
def test_pipefill_per_stage_bubbles(tf: float, tb: float) -> None:
    # pipefill.md Sec. 1.2: head s t_f and tail s t_b (fill-drain s(t_f+t_b)); GPipe's fwd-bwd
    # (S-s-1)(t_f+t_b); 1F1B's fwd-bwd (S-s-1) t_b + max(0, S-s-m) t_f and min(S-s-1, m-1)
    # non-contiguous gaps of t_f.
    for S, m in _SHAPES:
        gpipe, one = _run("gpipe", S, m, tf, tb), _run("1f1b", S, m, tf, tb)
        for s in range(S):
            head, tail = [s * tf] if s else [], [s * tb] if s else []
            fwd_bwd = (S - s - 1) * (tf + tb)
            assert _lengths(gpipe, s) == pytest.approx(head + ([fwd_bwd] if fwd_bwd else []) + tail, abs=EXACT)
            fwd_bwd = (S - s - 1) * tb + max(0, S - s - m) * tf
            gaps = [tf] * min(S - s - 1, m - 1)
            expected = head + ([fwd_bwd] if fwd_bwd else []) + gaps + tail
            assert _lengths(one, s) == pytest.approx(expected, abs=EXACT)
            if s:  # fill-drain: the head starts at 0, the tail ends with the iteration
                assert one.stages[s].bubbles[0].start_s == 0.0
                assert one.stages[s].bubbles[-1].end_s == one.iteration_time_s


@pytest.mark.parametrize(
    ("p", "m", "v", "makespan"),
    [(4, 8, 1, 33.0), (4, 8, 2, 28.5), (8, 32, 2, 106.5), (8, 32, 4, 101.25), (4, 16, 2, None), (2, 6, 3, None)],
)
def test_interleaved_bubble_makespan_and_memory(p: int, m: int, v: int, makespan: float | None) -> None:
    # ptdp-gavel-cloud.md Sec. 1.2: t_f = 1/v, t_b = 2/v per chunk; bubble (p-1)/(v m) of ideal.
    schedule = "interleaved-1f1b" if v > 1 else "1f1b"
    result = _run(schedule, p, m, 1 / v, 2 / v, v=v)
    ideal = m * 3.0
    assert (result.iteration_time_s - ideal) / ideal == pytest.approx((p - 1) / (v * m), abs=EXACT)
    if makespan is not None:
        assert result.iteration_time_s == pytest.approx(makespan, abs=EXACT)
    # rank 0 peaks at p v + p - 1 chunk activations = p + (p-1)/v stage equivalents (m >= p)
    assert result.stages[0].peak_inflight_microbatches == (min(p * v + p - 1, m * v) if v > 1 else p)


@pytest.mark.parametrize(("p", "v", "m"), [(4, 2, 8), (4, 2, 4), (8, 4, 16), (3, 2, 6), (2, 3, 2)])
def test_interleaved_warmup_counts_on_the_timeline(p: int, v: int, m: int) -> None:
    result = _run("interleaved-1f1b", p, m, 1 / v, 2 / v, v=v)
    for r in range(p):
        events = sorted((e for e in result.events if e.rank == r), key=lambda e: e.start_s)
        first_b = next(i for i, e in enumerate(events) if e.kind == "B")
        warmup = min((p - r - 1) * 2 + (v - 1) * p, m * v)  # Megatron's num_warmup_microbatches
        # Megatron runs one steady-state forward before the first backward unless all are warm-up.
        assert first_b == min(warmup + 1, m * v)
        assert all(e.kind == "F" for e in events[:first_b])


@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("m", [1, 2, 4, 9, 16])
def test_peak_inflight_1f1b_and_gpipe(p: int, m: int) -> None:
    # BPipe Eq. 2 (stage-ilp-spipe-bpipe.md Sec. C.2): 1F1B holds min(p-s, m); GPipe holds m.
    one, gpipe = _run("1f1b", p, m, 1.0, 2.0), _run("gpipe", p, m, 1.0, 2.0)
    assert [s.peak_inflight_microbatches for s in one.stages] == [min(p - s, m) for s in range(p)]
    assert [s.peak_inflight_microbatches for s in gpipe.stages] == [m] * p


_ZB_TIMES = [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (2.0, 1.0, 1.0), (1.0, 1.0, 0.5), (3.0, 2.0, 1.0), (1.0, 3.0, 1.0)]


@pytest.mark.parametrize(("tf", "ti", "tw"), _ZB_TIMES)
@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 9), (8, 16)])
def test_zero_bubble_h1_and_h2(p: int, m: int, tf: float, ti: float, tw: float) -> None:
    # stage-ilp-spipe-bpipe.md Sec. A.6.6 (ZB Table 2), T_B = the input part ti:
    # ZB-H1 bubble (p-1)(T_F+T_B-T_W) per stage at peak p; ZB-H2 (p-1)(T_F+T_B-2T_W) at 2p-1.
    h1 = _run("zb-h1", p, m, tf, ti + tw, tw=tw)
    for stage in h1.stages:
        assert stage.idle_s == pytest.approx((p - 1) * (tf + ti - tw), abs=EXACT)
        assert stage.busy_s == pytest.approx(m * (tf + ti + tw), abs=EXACT)
    assert h1.stages[0].peak_inflight_microbatches == p
    h2 = _run("zb-h2", p, m, tf, ti + tw, tw=tw)
    # ZB-H2's bubble is the idle inside each rank's own span: the paper drops the optimizer-step
    # synchronization, so the head and tail of consecutive iterations overlap.
    inner = []
    for r in range(p):
        own = [e for e in h2.events if e.rank == r]
        inner.append(max(e.end_s for e in own) - min(e.start_s for e in own) - h2.stages[r].busy_s)
    assert max(inner) == pytest.approx(max(0.0, (p - 1) * (tf + ti - 2 * tw)), abs=EXACT)
    assert h2.stages[0].peak_inflight_microbatches == 2 * p - 1


@pytest.mark.parametrize(("p", "m"), [(1, 4), (2, 4), (4, 8), (4, 2), (8, 16)])
@pytest.mark.parametrize(("tf", "tb"), [(1.0, 2.0), (0.3, 0.7)])
def test_2bw_steady_state_is_m_stage_times(p: int, m: int, tf: float, tb: float) -> None:
    costs = PipelineCosts.uniform(num_stages=p, forward_s=tf, backward_s=tb)
    result = simulate_2bw(costs, num_microbatches=m)
    assert result.iteration_time_s == pytest.approx(m * (tf + tb), abs=EXACT)
    assert result.bubble_fraction == pytest.approx(0.0, abs=EXACT)
    assert all(s.bubbles == () for s in result.stages)
    assert sum(e.end_s - e.start_s for e in result.events) == pytest.approx(p * m * (tf + tb), abs=EXACT)


def test_2bw_steady_state_is_set_by_the_slowest_stage() -> None:
    # PipeDream's steady state: one microbatch per bottleneck time (dissertation L1237-1245).
    costs = PipelineCosts(
        forward_s=(1.0, 2.0, 0.5), backward_s=(2.0, 4.0, 1.0), backward_weight_s=None,
        recompute_s=(0.0, 0.0, 0.0), activation_bytes=(1.0, 1.0, 1.0), send_forward_s=(0.0, 0.0),
        send_backward_s=(0.0, 0.0), static_bytes=(0.0, 0.0, 0.0), allreduce_s=(0.0, 0.0, 0.0),
    )
    result = simulate_2bw(costs, num_microbatches=8)
    assert result.iteration_time_s == pytest.approx(8 * 6.0, abs=EXACT)
    assert result.stages[1].idle_s == pytest.approx(0.0, abs=EXACT)
    assert result.stages[0].idle_s == pytest.approx(8 * 3.0, abs=EXACT)


def test_2bw_plan_adds_a_weight_version_and_overlaps_the_allreduce() -> None:
    layers = uniform_layers(4, 1.0, 2.0, static_bytes=100.0, param_bytes=40.0)
    flush = simulate(plan(layers, num_stages=2, num_microbatches=4, schedule="1f1b"))
    two = simulate(plan(layers, num_stages=2, num_microbatches=4, schedule="2bw"))
    assert two.iteration_time_s == pytest.approx(4 * 6.0, abs=EXACT)
    assert [s.peak_memory_bytes - f.peak_memory_bytes for s, f in zip(two.stages, flush.stages)] == [80.0, 80.0]
    slow_ar = plan(layers, num_stages=2, num_microbatches=4, schedule="2bw", data_parallel=2,
                   the_cluster=_slow_cluster())
    result = simulate(slow_ar)
    assert result.allreduce_s == pytest.approx(2 * 0.5 * 80.0 / 2.0)  # ring, d = 2, 80 bytes at 2 B/s
    assert result.iteration_time_s == pytest.approx(max(24.0, result.allreduce_s))


def _slow_cluster():  # noqa: ANN202
    from tests.cost_models.sim_helpers import cluster

    return cluster(intra_bytes_per_s=2.0)
