"""Per-rank layouts and interleaved in-flight states of the PTD-P closed form (``solvers._ptdp_model``),
cached: the search asks for the same layouts and states thousands of times.

Sums over a rank's chunks are taken from its distinct (dense, MoE) blocks and their counts
(``multiset``, ``_exact_sum``): the correctly rounded sum of every chunk's value, the float
``math.fsum`` of the chunk list gives, in time independent of the number of chunks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from solvers import _ptdp_dims as dims_mod


class Layout(tuple):  # type: ignore[type-arg]
    """Every rank's chunk list (a tuple of tuples) that hashes once: layouts key the caches below,
    and hashing p x v ranges on every lookup cost more than the lookups save."""

    def __hash__(self) -> int:
        try:
            return self._hash  # type: ignore[no-any-return]
        except AttributeError:
            self._hash: int = tuple.__hash__(self)
            return self._hash


@lru_cache(maxsize=4096)
def _rank_ranges(num_layers: int, p: int, v: int, ends: tuple[int, int],
                 v_shape: bool) -> tuple[tuple[tuple[int, int], ...], ...]:
    out: list[list[tuple[int, int]]] = [[] for _ in range(p)]
    first = 0
    for k, n in enumerate(dims_mod.chunk_layer_counts(num_layers, p, v, ends)):
        out[(k if k < p else 2 * p - 1 - k) if v_shape else k % p].append((first, n))
        first += n
    return Layout(tuple(r) for r in out)


@lru_cache(maxsize=4096)
def rank_blocks(all_ranges: tuple[tuple[tuple[int, int], ...], ...], first_dense: int | None
                ) -> tuple[tuple[tuple[tuple[int, int], ...], ...], tuple[int, ...]]:
    """The distinct (dense, MoE) layer counts of the ranks' chunks, and each rank's index into them
    (``first_dense`` None: a dense model). Most ranks of a layout hold the same chunks, so per-rank sums
    are taken once per distinct list."""
    distinct: dict[tuple[tuple[int, int], ...], int] = {}
    index = []
    for ranges in all_ranges:
        key = tuple((num, 0) if first_dense is None else (max(0, min(first + num, first_dense) - first),
                                                          num - max(0, min(first + num, first_dense) - first))
                    for first, num in ranges)
        index.append(distinct.setdefault(key, len(distinct)))
    return tuple(distinct), tuple(index)


@lru_cache(maxsize=4096)
def multiset(blocks: tuple[tuple[int, int], ...]) -> tuple[tuple[tuple[int, int], int], ...]:
    """The distinct (dense, MoE) blocks of a chunk list and how many chunks have each."""
    counts: dict[tuple[int, int], int] = {}
    for block in blocks:
        counts[block] = counts.get(block, 0) + 1
    return tuple(counts.items())


def block_value(block: tuple[int, int], vd: float, vm: float) -> float:
    """One chunk's value from its (dense, MoE) layer counts and the per-layer values, rounded as
    ``_ptdp_model._block_sum`` rounds it."""
    dense, n_moe = block
    return (dense * vd if dense else 0.0) + (n_moe * vm if n_moe else 0.0)


def _exact_sum(blocks: tuple[tuple[tuple[int, int], int], ...], vd: float, vm: float) -> float:
    """The correctly rounded sum of every chunk's value (dense x vd + MoE x vm, each rounded as
    ``_block_sum`` does), as ``math.fsum`` of the chunk list gives: k equal values sum to k x value rounded
    once; several distinct ones are summed exactly as fractions."""
    values = [(block_value(block, vd, vm), k) for block, k in blocks]
    if len(values) == 1:
        return values[0][1] * values[0][0]
    ratios = [(x.as_integer_ratio(), k) for x, k in values]  # denominators are powers of two
    den = max(d for (_, d), _ in ratios)
    return sum(k * n * (den // d) for (n, d), k in ratios) / den  # int / int rounds correctly


@lru_cache(maxsize=4096)
def first_chunk_inflight(p: int, v: int, m: int) -> int:
    """Peak activations of chunk 0 (the one with the embedding) on rank 0, following Megatron's
    order: forward k runs chunk (k mod p v) div p, backward k chunk v - 1 - (k mod p v) div p."""
    total = m * v
    warmup = min(p - 1, m) if v == 1 else min(2 * (p - 1) + (v - 1) * p, total)
    held = peak = 0
    # Past the warm-up each step runs one forward and one backward, and the chunk pattern
    # repeats every p v steps with no net change: two periods hold the peak of the whole run.
    steps = total + warmup if total <= warmup + 2 * p * v else warmup + 2 * p * v
    for k in range(steps):
        if k < total and (k % (p * v)) // p == 0:  # forward k
            held += 1
            peak = max(peak, held)
        j = k - warmup  # backward j follows forward j + warmup
        if 0 <= j < total and v - 1 - (j % (p * v)) // p == 0:
            held -= 1
    return peak


@lru_cache(maxsize=4096)
def held_chunk_counts(p: int, v: int, m: int, rank: int) -> tuple[tuple[int, ...], ...]:
    """Per step of rank ``rank``'s Megatron interleaved order, how many activations of each of its v chunks
    it holds right after the step's forward (forward k runs chunk (k mod p v) div p, backward j chunk
    v - 1 - (j mod p v) div p, after a warm-up of min(2 (p - r - 1) + (v - 1) p, m v) forwards). Past the
    warm-up the pattern repeats every p v steps, so two periods hold every distinct state."""
    total = m * v
    warmup = min(2 * (p - rank - 1) + (v - 1) * p, total)
    held = [0] * v
    states = []
    steps = total + warmup if total <= warmup + 2 * p * v else warmup + 2 * p * v
    for k in range(steps):
        if k < total:
            held[(k % (p * v)) // p] += 1
            states.append(tuple(held))
        j = k - warmup
        if 0 <= j < total:
            held[v - 1 - (j % (p * v)) // p] -= 1
    return tuple(set(states))


def heaviest_state_bytes(p: int, v: int, m: int, rank: int, sizes: Sequence[float]) -> float:
    """max over the held states of sum(count x chunk size), summed exactly (``math.fsum``); cached (the
    ZeRO stages and recompute bisection of one layout ask for the same sizes)."""
    return _heaviest_state_bytes(p, v, m, rank, tuple(sizes))


@lru_cache(maxsize=65536)
def _heaviest_state_bytes(p: int, v: int, m: int, rank: int, sizes: tuple[float, ...]) -> float:
    states = held_chunk_array(p, v, m, rank)
    approx = states @ np.asarray(sizes, dtype=np.float64)
    top = float(approx.max())
    # The product's rounding is far below this margin: the exact sums are taken of every state near the
    # top, so the result is the correctly rounded maximum, as summing every state with fsum gives.
    near = states[np.nonzero(approx >= top - 1e-9 * abs(top) - 1.0)[0]]
    # count x size in float64 is Python's int x float (the count converts exactly): the same products
    products = (near * np.asarray(sizes, dtype=np.float64)).tolist()
    return max(map(math.fsum, products))


@lru_cache(maxsize=4096)
def held_chunk_array(p: int, v: int, m: int, rank: int) -> np.ndarray:
    """``held_chunk_counts`` as a read-only (states x v) integer array."""
    out = np.array(sorted(held_chunk_counts(p, v, m, rank)), dtype=np.int64).reshape(-1, v)
    out.setflags(write=False)
    return out
