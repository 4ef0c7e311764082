"""Round-based mechanism: priorities, Algorithm 2 selection, placement with leases."""

from __future__ import annotations

import numpy as np

from solvers.gavel.mechanism import NEVER_RUN_BOOST, Placer, priorities, select

X_EXAMPLE = np.array([[0.6, 0.4, 0.0], [0.2, 0.6, 0.2], [0.2, 0.0, 0.8]])  # L5071-5084


def _run(x: np.ndarray, rounds: int) -> np.ndarray:
    received = np.zeros_like(x)
    for _ in range(rounds):
        combos = tuple((k,) for k in range(x.shape[0]))
        cells = select(x, received, combos=combos, combo_scale=np.ones(x.shape[0]), capacity=np.ones(x.shape[1]))
        for k, j in cells:
            received[k, j] += 1.0
    return received / rounds


def test_received_fractions_match_x_example_every_five_rounds() -> None:
    # Reading sec. 2.4 [DERIVED]: with one global queue the time received equals X exactly at
    # every multiple of 5 rounds.
    for rounds in (5, 10, 50, 200):
        np.testing.assert_allclose(_run(X_EXAMPLE, rounds), X_EXAMPLE, atol=1e-12)


def test_received_fractions_converge_on_random_allocations() -> None:
    rng = np.random.default_rng(0)
    x = rng.random((4, 2))
    for _ in range(200):  # Sinkhorn: rows sum to 1/2, columns to 1 (a full allocation of 2 GPUs)
        x = x / x.sum(axis=1, keepdims=True) / 2
        x = x / x.sum(axis=0, keepdims=True)
    got = _run(x, 400)
    assert np.abs(got - x).max() < 0.02


def test_priorities_formula() -> None:
    x = np.array([[0.5, 0.5], [0.5, 0.0]])
    received = np.array([[2.0, 0.0], [6.0, 4.0]])
    p = priorities(x, received)
    # f = t / column total: [[0.25, 0], [0.75, 1]]; X/f; never run there -> X * 1e9; X = 0 -> 0.
    np.testing.assert_allclose(p, [[2.0, 0.5 * NEVER_RUN_BOOST], [0.5 / 0.75, 0.0]])


def test_select_respects_capacity_scale_and_conflicts() -> None:
    x = np.array([[0.5, 0.5], [0.5, 0.5], [1.0, 0.0], [0.2, 0.8]])
    combos = ((0,), (1,), (2,), (0, 1))
    cells = select(x, np.zeros_like(x), combos=combos, combo_scale=np.array([2, 2, 1, 2]), capacity=np.array([3, 2]))
    used = np.zeros(2)
    jobs: list[int] = []
    for k, j in cells:
        used[j] += [2, 2, 1, 2][k]
        jobs.extend(combos[k])
    assert (used <= [3, 2]).all()
    assert len(jobs) == len(set(jobs))  # at most one combination per job per round


def test_placer_keeps_leases_and_never_double_books() -> None:
    placer = Placer(capacity={"v100": 8}, gpus_per_server=4)
    first, pre = placer.place([("a", "v100", 4), ("b", "v100", 2), ("c", "v100", 1)])
    assert pre == 0
    assert len(set(first["a"][1])) == 4 and len({g // 4 for g in first["a"][1]}) == 1  # one server
    ids = [g for _, gpus in first.values() for g in gpus]
    assert len(ids) == len(set(ids))
    second, pre = placer.place([("b", "v100", 2), ("d", "v100", 4)])
    assert second["b"] == first["b"]  # lease renewed
    assert pre == 2  # a and c stopped
    ids = [g for _, gpus in second.values() for g in gpus]
    assert len(ids) == len(set(ids))
