"""BPipe (seed 004; stage-ilp-spipe-bpipe.md Part C): targets, Algorithm 1 with the fix, counts,
placement, the appendix's bandwidth check, and the simulator's evictions and loads."""

from __future__ import annotations

import random

import pytest

from cost_models import bpipe
from cost_models.sim.bpipe import run_bpipe
from cost_models.schedules import build_actions
from cost_models.simulate import simulate
from planner.errors import InfeasibleError, InvalidProblemError
from planner.schema import Action, BPipeSpec, LayerProfile, Plan
from tests.cost_models.sim_helpers import cluster, plan

# ---------------------------------------------------------------- targets and pairs (C.2, C.3, C.11)


@pytest.mark.parametrize(("p", "mu_opt"), [(4, 3), (5, 4), (6, 4), (8, 5), (12, 7), (16, 9), (64, 33)])
def test_optimal_inflight_by_depth(p: int, mu_opt: int) -> None:
    assert bpipe.optimal_inflight(p) == mu_opt


def test_pairs_and_unbalanced_counts() -> None:
    assert bpipe.pairs(8) == ((0, 7), (1, 6), (2, 5), (3, 4))
    assert bpipe.pairs(5) == ((0, 4), (1, 3))
    assert bpipe.unbalanced_inflight(8, 64) == [8, 7, 6, 5, 4, 3, 2, 1]  # oracle C.11.1
    assert bpipe.unbalanced_inflight(8, 3) == [3, 3, 3, 3, 3, 3, 2, 1]  # min(p - s, m)


@pytest.mark.parametrize("p", range(4, 17))
def test_only_evictors_up_to_floor_p_minus_4_over_2_transfer(p: int) -> None:
    moving = [s for s in range(p) if bpipe.transfer_schedule(p, s, 2 * p)]
    assert moving == list(range((p - 4) // 2 + 1))  # seed L100


# ---------------------------------------------------------------- Algorithm 1 and its fix (C.4)


def test_figure_4_transfers() -> None:
    # p=4, m=8, stage 0 (reading C.4): Evict(1)@F2, Evict(3)@B0, Load(1)@F4, Evict(5)@B2, Load(3)@F6,
    # Load(5) after B4 (before B5).
    ops = build_actions("1f1b", num_stages=4, num_microbatches=8)[0]
    transfers = bpipe.transfer_schedule(4, 0, 8)
    named = [(t.kind, t.microbatch, str(ops[t.op_index]), t.after) for t in transfers]
    assert named == [
        ("evict", 1, "0F2", False), ("evict", 3, "0B0", False), ("load", 1, "0F4", False),
        ("evict", 5, "0B2", False), ("load", 3, "0F6", False), ("load", 5, "0B4", True),
    ]
    assert bpipe.inflight_peaks(ops, transfers) == (3, 2)  # stage 0 peaks at mu_opt; stage 3 keeps 2 of 0's


def test_figure_4_timeline_has_the_papers_22_decisions_and_line_22_would_pick_a_bubble() -> None:
    # Unit-time 1F1B, F = B = 1 (reading C.4): stage 0 runs F0 F1 F2 F3 _ _ _ B0 F4 B1 F5 B2 F6 B3 F7 B4 _ B5 _ B6 _ B7.
    layers = [LayerProfile(name=f"l{i}", forward_s=1.0, backward_s=1.0, activation_bytes=1.0) for i in range(4)]
    base = plan(layers, num_stages=4, num_microbatches=8)
    sim = simulate(_with_spec(base))
    slots = ["_"] * 22
    for e in sim.events:
        if e.rank == 0:
            slots[int(e.start_s)] = f"{e.kind}{e.microbatch}"
    assert " ".join(slots) == "F0 F1 F2 F3 _ _ _ B0 F4 B1 F5 B2 F6 B3 F7 B4 _ B5 _ B6 _ B7"
    assert (slots[0], slots[9], slots[18]) == ("F0", "B1", "_")  # C_0, C_9, C_18 (seed L104)
    # Literal line 22 at i = 9 (B1, evicted): Evict(C_6.idx), but C_6 is a bubble; the fix evicts 3 with B0 = C_7.
    assert slots[6] == "_" and slots[7] == "B0"
    assert sim.iteration_time_s == simulate(base).iteration_time_s == 22.0


def _algorithm_1(p: int, m: int, s: int) -> list[tuple[str, int, int, bool]]:
    """Algorithm 1 (seed L111-140) literally, over the bubble-free op list, cooldown loads after the backward."""
    ops = build_actions("1f1b", num_stages=p, num_microbatches=m)[s]
    mu_opt = -(-(p + 2) // 2)
    n_evict = min(p - s, m) - mu_opt
    evicted: set[int] = set()
    out = []
    for i, c in enumerate(ops):
        if c.kind == "F" and mu_opt - 1 <= c.microbatch < mu_opt - 1 + n_evict:
            out.append(("evict", ops[i - 1].microbatch, i, False))
            evicted.add(ops[i - 1].microbatch)
        elif c.kind == "B" and c.microbatch in evicted:
            out.append(("load", c.microbatch, i - 1, ops[i - 1].kind == "B"))
            evicted.discard(c.microbatch)
            if ops[i - 1].kind == "F":
                out.append(("evict", ops[i - 3].microbatch, i - 2, False))
                evicted.add(ops[i - 3].microbatch)
    return sorted(out, key=lambda t: (t[2], t[0] != "evict"))


@pytest.mark.parametrize("p", [4, 5, 6, 7, 8, 12, 16])
@pytest.mark.parametrize("factor", [1, 2, 4])
def test_schedule_equals_algorithm_1_on_the_bubble_free_list(p: int, factor: int) -> None:
    m = factor * p
    for s in range(p):
        ours = [(t.kind, t.microbatch, t.op_index, t.after) for t in bpipe.transfer_schedule(p, s, m)]
        assert ours == _algorithm_1(p, m, s), (p, m, s)


@pytest.mark.parametrize(
    ("p", "m", "evicts"),
    [(4, 8, [3]), (4, 16, [7]), (8, 8, [3, 2, 1]), (8, 16, [6, 6, 3]), (8, 32, [15, 12, 7]),
     (12, 24, [10, 8, 8, 6, 3]), (16, 32, [14, 12, 10, 10, 9, 6, 3])],
)
def test_eviction_counts_of_the_reading(p: int, m: int, evicts: list[int]) -> None:
    counts = [sum(t.kind == "evict" for t in bpipe.transfer_schedule(p, s, m)) for s in range(p)]
    assert counts == evicts + [0] * (p - len(evicts))


@pytest.mark.parametrize("p", range(4, 17))
@pytest.mark.parametrize("factor", [1, 2, 4])
def test_balanced_counts_hold_for_every_depth(p: int, factor: int) -> None:
    m, mu_opt = factor * p, bpipe.optimal_inflight(p)
    split = bpipe.inflight_split(p, m)
    for s, (own, foreign) in enumerate(split):
        if s <= (p - 4) // 2:  # transferring evictor: exactly mu_opt
            assert (own, foreign) == (mu_opt, 0)
        elif 2 * s < p - 1:  # evictor already within the target
            assert (own, foreign) == (min(p - s, m), 0)
        else:  # acceptor of e = p-1-s: its own s+1 (capped) plus at most (p-e) - mu_opt + 1 (seed L98)
            e = p - 1 - s
            assert own == min(p - s, m)
            if e > (p - 4) // 2:
                assert foreign == 0
            elif factor > 1:
                assert foreign == (p - e) - mu_opt + 1
            else:  # m = p: only the warm-up evictions are outstanding at once
                assert foreign == (p - e) - mu_opt
    assert max(bpipe.balanced_inflight(p, m)) == mu_opt


def test_interleaved_target_and_counts() -> None:
    # C.6: mu(s) = p(v-1) + 2(p-s-1) + 1; mu_opt = p v + 1; p=4, v=2: 11 -> 9, stage 0 evicts 2 in the warm-up.
    kw = {"schedule": "interleaved-1f1b", "num_chunks": 2}
    assert bpipe.optimal_inflight(4, num_chunks=2) == 9 and bpipe.optimal_inflight(8, num_chunks=2) == 17
    assert bpipe.unbalanced_inflight(4, 8, **kw) == [11, 9, 7, 5]
    assert bpipe.unbalanced_inflight(8, 16, **kw)[::7] == [23, 9]
    transfers = bpipe.transfer_schedule(4, 0, 8, **kw)
    ops = build_actions("interleaved-1f1b", num_stages=4, num_chunks=2, num_microbatches=8)[0]
    first_backward = next(j for j, a in enumerate(ops) if a.kind == "B")
    assert sum(t.kind == "evict" and t.op_index < first_backward for t in transfers) == 2
    assert bpipe.balanced_inflight(4, 8, **kw) == [9, 9, 7, 7]
    assert max(bpipe.balanced_inflight(8, 16, **kw)) == 17


def test_every_eviction_is_loaded_with_or_after_the_op_before_its_backward() -> None:
    ops = build_actions("1f1b", num_stages=8, num_microbatches=32)[0]
    transfers = bpipe.schedule_transfers(ops, 5)
    loads = {(t.stage, t.microbatch): t for t in transfers if t.kind == "load"}
    for t in transfers:
        if t.kind == "evict":
            load = loads[(t.stage, t.microbatch)]
            assert t.op_index < load.op_index and ops[load.op_index + 1] == Action(0, "B", t.microbatch)


def test_too_small_a_target_is_rejected() -> None:
    ops = build_actions("1f1b", num_stages=4, num_microbatches=8)[0]
    with pytest.raises(InvalidProblemError, match="target_inflight=1 is too small"):
        bpipe.schedule_transfers(ops, 1)
    with pytest.raises(InvalidProblemError, match="schedule 'gpipe'"):
        bpipe.balanced_inflight(4, 8, schedule="gpipe")


def test_balanced_memory_bytes_uses_own_and_partner_sizes() -> None:
    # p=4, m=8: split [(3,0), (3,0), (2,0), (1,2)]; stage 3 keeps two of stage 0's sets.
    act, static = [10.0, 20.0, 30.0, 40.0], [1.0, 2.0, 3.0, 4.0]
    assert bpipe.balanced_memory_bytes(act, 8, static_bytes=static) == [31.0, 62.0, 63.0, 4 + 40 + 2 * 10]


# ---------------------------------------------------------------- placement (C.5)


def test_pair_adjacent_ranks_reproduce_figure_6() -> None:
    # p=4, t=2, d=2 on 2 nodes x 8: node 0 GPU0..7 hold PP 0,0,3,3,1,1,2,2 with TP 0,1,...; GPU 8+i as i with DP1.
    ranks = bpipe.pair_adjacent_ranks(4, data_parallel=2, tensor_parallel=2)
    gpu = {r: (tp, s, dp) for s, rs in enumerate(ranks) for j, r in enumerate(rs) for dp, tp in [divmod(j, 2)]}
    assert [gpu[g][1] for g in range(8)] == [0, 0, 3, 3, 1, 1, 2, 2]
    assert [gpu[g][0] for g in range(8)] == [0, 1] * 4
    assert all(gpu[g][2] == 0 and gpu[g + 8] == (gpu[g][0], gpu[g][1], 1) for g in range(8))


def test_pair_adjacent_order_of_figure_5_keeps_pairs_in_a_node() -> None:
    order = bpipe.pair_adjacent_order(16)
    assert order[:8] == (0, 15, 1, 14, 2, 13, 3, 12) and order[8:] == (4, 11, 5, 10, 6, 9, 7, 8)
    ranks = bpipe.pair_adjacent_ranks(16)
    assert all(ranks[e][0] // 8 == ranks[a][0] // 8 for e, a in bpipe.pairs(16))
    assert bpipe.pair_adjacent_order(5) == (0, 4, 1, 3, 2)


# ---------------------------------------------------------------- bandwidth (C.7)


def test_appendix_b_worked_example_rates() -> None:
    # GPT-3 96B, t=4, p=8, b=2, f=143.37 ms (seed L431): 24.25 GB/s; relaxed 16.16; none 100.31 / 66.87; layer 5.70.
    f = 0.14337
    attention, none, layer = 3_476_029_440, 14.38e9, 2 * 80 * 2048 * 2 * 9984 / 8
    assert bpipe.required_link_bytes_per_s(attention, f) / 1e9 == pytest.approx(24.25, abs=0.005)
    assert bpipe.required_link_bytes_per_s(attention, f, backward_s=2 * f) / 1e9 == pytest.approx(16.16, abs=0.01)
    assert bpipe.required_link_bytes_per_s(none, f) / 1e9 == pytest.approx(100.31, abs=0.05)
    assert bpipe.required_link_bytes_per_s(none, f, backward_s=2 * f) / 1e9 == pytest.approx(66.87, abs=0.05)
    assert bpipe.required_link_bytes_per_s(layer, f) / 1e9 == pytest.approx(5.70, abs=0.01)


def _toy(bandwidth: float, m: int = 8) -> Plan:
    # 4 stages, F = 1, B = 2, 10 bytes per set: a transfer takes 10 / bandwidth seconds.
    layers = [LayerProfile(name=f"l{i}", forward_s=1.0, backward_s=2.0, activation_bytes=10.0) for i in range(4)]
    return _with_spec(plan(layers, num_stages=4, num_microbatches=m, the_cluster=cluster(intra_bytes_per_s=bandwidth)))


def _with_spec(base: Plan) -> Plan:
    p = base.degrees.pipeline
    return base.model_copy(update={"bpipe": BPipeSpec(pairs=bpipe.pairs(p), target_inflight=bpipe.optimal_inflight(p))})


def test_link_check_warns_beyond_a_forward_and_rejects_beyond_the_relaxed_bound() -> None:
    assert bpipe.check_link_bandwidth(_toy(10.0)) == ()  # 1 s = F
    (warning,) = bpipe.check_link_bandwidth(_toy(10.0 / 1.5))  # 1.5 s: 2 x 1.5 = F + B
    assert "stage 0 -> 3" in warning and "relaxed" in warning
    with pytest.raises(InfeasibleError, match=r"pair link too slow .* needs 6.67e-09 GB/s"):
        bpipe.check_link_bandwidth(_toy(10.0 / 1.6))


# ---------------------------------------------------------------- simulator (transfers take time, hold memory)


def test_fast_link_balances_without_slowing_figure_4() -> None:
    plain = simulate(_toy(100.0).model_copy(update={"bpipe": None}))
    run = run_bpipe(_toy(100.0))  # 0.1 s per transfer
    assert run.result.iteration_time_s == plain.iteration_time_s == 33.0  # (m + p - 1)(F + B)
    assert [s.peak_inflight_microbatches for s in plain.stages] == [4, 3, 2, 1]
    assert [s.peak_inflight_microbatches for s in run.result.stages] == [3, 3, 2, 3]
    assert [s.peak_memory_bytes for s in run.result.stages] == [30.0, 30.0, 20.0, 30.0]
    # Stage 0's F2 starts at 2, B0 at 10, F4 at 12, B2 at 16, F6 at 18, B4 ends at 24.
    assert [(t.kind, t.microbatch) for t in run.transfers] == [
        ("evict", 1), ("evict", 3), ("load", 1), ("evict", 5), ("load", 3), ("load", 5)]
    assert [t.start_s for t in run.transfers] == [2.0, 10.0, 12.0, 16.0, 18.0, 24.0]
    assert [t.end_s - t.start_s for t in run.transfers] == pytest.approx([0.1] * 6)


def test_slow_load_delays_the_backward_by_hand() -> None:
    # p=4, m=4: stage 0 evicts 1 with F2 (t=2) and loads it after B0 ([10, 12]); B1 is due at 13 (from stage 1).
    # d = 2: load [12, 14] -> B1 [14, 16], B2 [16, 18] (its gradient comes at 16), B3 [19, 21]: still 21.
    # d = 4: load [12, 16] -> B1 [16, 18], B2 [18, 20], B3 [20, 22]: 22.
    for d, iteration in ((2.0, 21.0), (4.0, 22.0)):
        run = run_bpipe(_toy(10.0 / d, m=4))
        assert [t.kind for t in run.transfers] == ["evict", "load"]
        assert [(t.start_s, t.end_s) for t in run.transfers] == [(2.0, 2.0 + d), (12.0, 12.0 + d)]
        assert run.result.iteration_time_s == pytest.approx(iteration)
        b1 = next(e for e in run.result.events if e.rank == 0 and e.kind == "B" and e.microbatch == 1)
        assert b1.start_s == pytest.approx(12.0 + d if d > 1 else 13.0)


def test_transfers_hold_memory_on_both_sides() -> None:
    # d = 2: set 1 stays on stage 0 until t = 4, so F3 (t = 3) finds 4 sets there: a slow link saves nothing.
    slow = run_bpipe(_toy(5.0, m=4)).result
    assert slow.stages[0].peak_inflight_microbatches == 4 and slow.stages[0].peak_memory_bytes == 40.0
    # Stage 3 holds its own set (F0 at 3 .. B0 at 6) and set 1 of stage 0 (t = 2 .. 14): 2 sets.
    assert slow.stages[3].peak_inflight_microbatches == 2 and slow.stages[3].peak_memory_bytes == 20.0
    fast = run_bpipe(_toy(100.0, m=4)).result
    assert [s.peak_inflight_microbatches for s in fast.stages] == [3, 3, 2, 2]


@pytest.mark.parametrize("p", [4, 6, 9, 16])
def test_simulated_peaks_stay_within_the_balanced_bounds(p: int) -> None:
    # Unequal stages and a fast link: the simulated peak never exceeds balanced_memory_bytes (what the ILP uses).
    rng = random.Random(p)
    m = 2 * p
    layers = [LayerProfile(name=f"l{i}", forward_s=rng.uniform(0.5, 2), backward_s=rng.uniform(1, 4),
                           activation_bytes=rng.uniform(1, 100), static_bytes=rng.uniform(0, 50)) for i in range(p)]
    base = plan(layers, num_stages=p, num_microbatches=m, the_cluster=cluster(intra_bytes_per_s=1e9))
    run = run_bpipe(_with_spec(base))
    bound = bpipe.balanced_memory_bytes([x.activation_bytes or 0.0 for x in layers], m,
                                        static_bytes=[x.static_bytes for x in layers])
    for stage, limit, count in zip(run.result.stages, bound, bpipe.balanced_inflight(p, m)):
        assert stage.peak_memory_bytes <= limit + 1e-9
        assert stage.peak_inflight_microbatches <= count
    assert run.result.iteration_time_s == pytest.approx(simulate(base).iteration_time_s)


def test_interleaved_plan_simulates_with_balanced_chunks() -> None:
    layers = [LayerProfile(name=f"l{i}", forward_s=1.0, backward_s=2.0, activation_bytes=1.0) for i in range(8)]
    base = plan(layers, num_stages=4, num_chunks=2, num_microbatches=8, schedule="interleaved-1f1b")
    spec = BPipeSpec(pairs=bpipe.pairs(4), target_inflight=bpipe.optimal_inflight(4, num_chunks=2))
    result = simulate(base.model_copy(update={"bpipe": spec}))
    assert [s.peak_inflight_microbatches for s in simulate(base).stages] == [11, 9, 7, 5]
    assert [s.peak_inflight_microbatches for s in result.stages] == [9, 9, 7, 7]
    assert result.iteration_time_s == simulate(base).iteration_time_s


def test_invalid_specs_are_rejected() -> None:
    toy = _toy(100.0)
    for pairs in (((0, 4),), ((0, 0),), ((0, 3), (3, 1))):
        with pytest.raises(InvalidProblemError, match="bpipe.pairs entry"):
            simulate(toy.model_copy(update={"bpipe": BPipeSpec(pairs=pairs, target_inflight=3)}))
    with pytest.raises(InvalidProblemError, match="bpipe needs schedule"):
        simulate(toy.model_copy(update={"schedule": "gpipe"}))
    round_trip = Plan.from_json(toy.to_json())
    assert round_trip.bpipe == toy.bpipe and simulate(round_trip).iteration_time_s == 33.0
