"""Algorithm 1 (pipefill.md Sec. 2.2): the literal algorithm as an oracle, the guard, fits."""

from __future__ import annotations

import random

import numpy as np
import pytest

from cost_models.hardware import device_preset
from planner.errors import InfeasibleError
from planner.schema_fill import FillBubble, FillJob
from solvers.fill.executor import Config, NodeChain, node_chain, partition, plan_executor
from solvers.fill.jobs import job_chains
from solvers.fill.models import fill_model_profile


def _chain(nodes: list[tuple[float, float]]) -> NodeChain:
    return NodeChain(tuple(f"n{i}" for i in range(len(nodes))), np.array([d for d, _ in nodes], dtype=float),
                     np.array([m for _, m in nodes], dtype=float), 1, 1.0)


def _literal(B: list[float], M: list[float], F: list[tuple[float, float]]) -> list[list[int]]:
    """The reading's reference semantics, node by node (positions in the replicated chain)."""
    dur = lambda X: sum(F[x % len(F)][0] for x in X)  # noqa: E731
    total = len(F)
    while dur(range(total)) + dur(range(len(F))) < sum(B):
        total += len(F)
    P, i, x = [], 0, 0
    for _ in range(100_000):
        if x >= total:
            return P
        Pp: list[int] = []
        while x < total and dur(Pp) + F[x % len(F)][0] < B[i] and F[x % len(F)][1] <= M[i]:
            Pp.append(x)
            x += 1
        P.append(Pp)
        i = (i + 1) % len(B)
    raise AssertionError("literal algorithm did not terminate")


def test_hand_checked_partition() -> None:
    # bubbles 5 s and 3 s; nodes 2, 2, 2 s: k = ceil(8/6) - 1 = 1; P = [[0,1], [2]]
    k, parts = partition(_chain([(2, 1), (2, 1), (2, 1)]), [5.0, 3.0], [10, 10])
    assert (k, parts) == (1, [(0, 2), (2, 3)])
    # strict duration test: a 2 s node does not fit a 2 s bubble, so bubble 0 stays empty
    k, parts = partition(_chain([(2, 1), (1, 1)]), [2.0, 4.0], [10, 10])
    assert k == 1 and parts == [(0, 0), (0, 2)]
    # memory is per node and non-strict: the 5-byte node fits a 5-byte bubble only
    k, parts = partition(_chain([(1, 1), (1, 5)]), [1.5, 1.5], [4, 5])
    assert k == 1 and parts == [(0, 1), (1, 2)]


def test_replication_count_matches_lines_3_to_7() -> None:
    # sum B = 12, dur F = 3: copies while (k+1) 3 < 12, so k = 3 (exact multiple gives n - 1)
    k, _ = partition(_chain([(1, 0), (2, 0)]), [6.5, 5.5], [1, 1])
    assert k == 3
    k, _ = partition(_chain([(1, 0), (2, 0)]), [6.6, 5.5], [1, 1])
    assert k == 4


def test_agrees_with_the_literal_algorithm_on_random_cases() -> None:
    rng = random.Random(7)
    for _ in range(300):
        nb, nf = rng.randint(1, 4), rng.randint(1, 6)
        B = [rng.choice([0.5, 1.0, 2.0, 3.5, 6.0]) for _ in range(nb)]
        M = [rng.choice([1, 2, 4]) for _ in range(nb)]
        F = [(rng.choice([0.25, 0.5, 1.0, 1.5]), rng.choice([1, 2, 3])) for _ in range(nf)]
        fits_somewhere = all(any(d < b and m <= mm for b, mm in zip(B, M)) for d, m in F)
        if not fits_somewhere:
            with pytest.raises(InfeasibleError, match="fits no|no bubble has both"):
                partition(_chain(F), B, M)
            continue
        _, parts = partition(_chain(F), B, M)
        assert [list(range(a, b)) for a, b in parts] == _literal(B, M, F)


@pytest.mark.timeout(10)
def test_a_node_that_fits_no_bubble_raises_instead_of_looping() -> None:
    with pytest.raises(InfeasibleError, match="'n1'.*needs 5 s"):
        partition(_chain([(1, 1), (5, 1)]), [4.0, 3.0], [10, 10])
    with pytest.raises(InfeasibleError, match="GB"):
        partition(_chain([(1, 20e9)]), [4.0], [4.5e9])


def test_every_piece_fits_its_bubble() -> None:
    device = device_preset("v100")
    bubbles = [FillBubble(kind="fwd-bwd", start_s=0.0, duration_s=2.0, usable_s=1.36, free_memory_bytes=4.5e9),
               FillBubble(kind="fill-drain", start_s=3.0, duration_s=0.5, usable_s=0.34, free_memory_bytes=3e9)]
    for name, mode in (("bert-large", "training"), ("bert-base", "inference"), ("resnet50", "training")):
        job = FillJob(id=name, model=name, mode=mode)
        ep = plan_executor(name, 0, job_chains(job, device, 0.5), bubbles, 4.0)
        assert ep.pieces and ep.throughput_samples_per_s > 0
        for piece in ep.pieces:
            assert piece.duration_s < bubbles[piece.bubble].usable_s
            assert piece.peak_memory_bytes <= bubbles[piece.bubble].free_memory_bytes
        covered = sum(p.num_nodes for p in ep.pieces)
        assert covered == ep.num_iterations * ep.nodes_per_iteration


def test_training_chain_memory_and_offload() -> None:
    device = device_preset("v100")
    profile = fill_model_profile("bert-large", device, 0.5)
    plain = node_chain(profile, "training", Config(8), device)
    ckpt = node_chain(profile, "training", Config(8, checkpointing=True), device)
    off = node_chain(profile, "training", Config(8, offload=True), device)
    n = profile.num_layers
    assert len(plain.names) == 2 * n + 1
    static = sum(x.static_bytes for x in profile.layers)
    assert plain.memory_bytes[-1] == pytest.approx(static)  # optimizer step: only the resident state
    assert off.memory_bytes[-1] == pytest.approx(2 * sum(x.param_bytes for x in profile.layers))
    assert ckpt.memory_bytes.max() < plain.memory_bytes.max()
    assert ckpt.duration_s[n:2 * n].sum() == pytest.approx(plain.duration_s[n:2 * n].sum() + plain.duration_s[:n].sum())
    assert ckpt.flops == plain.flops  # recomputation is not useful work


def test_a_job_larger_than_any_free_memory_is_infeasible() -> None:
    device = device_preset("v100")
    bubbles = [FillBubble(kind="fwd-bwd", start_s=0.0, duration_s=2.0, usable_s=1.36, free_memory_bytes=1e9)]
    job = FillJob(id="xl", model="xlm-roberta-xl", mode="inference")
    with pytest.raises(InfeasibleError, match="'xl' fits no bubble of stage 0.*no bubble has both"):
        plan_executor("xl", 0, job_chains(job, device, 0.5), bubbles, 4.0)
