"""Partitioned solving (POP, Narayanan et al., SOSP 2021) for large allocation problems.

The full LP grows with jobs x accelerator types (x pairs with space sharing). POP splits the
jobs at random into k groups of near-equal size and gives each group 1/k of every accelerator
type (capacities may be fractional: X is a time fraction, so a group holding 4.5 V100s is a
valid share). The k sub-problems are solved independently and their allocations stacked;
since the capacity shares sum to the cluster, the combined allocation satisfies (5.1)-(5.3).
Pairs whose jobs land in different groups are dropped. Each job keeps the normalizers of the
full problem (X^equal, X^iso, the fastest type), so the levels stay comparable across
groups. With many jobs per group every group looks like the whole cluster in miniature,
which is why the objective stays close to the full LP's (docs/gavel-scaling.md).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from solvers.gavel.common import Formulation

PolicyFn = Callable[..., tuple[np.ndarray, float]]


def split_jobs(num_jobs: int, num_partitions: int, *, seed: int) -> list[np.ndarray]:
    """A random balanced split of job indices into ``num_partitions`` sorted groups."""
    order = np.random.default_rng(seed).permutation(num_jobs)
    return [np.sort(group) for group in np.array_split(order, num_partitions) if len(group)]


def solve_partitioned(
    f: Formulation, policy_fn: PolicyFn, *, policy: str, num_partitions: int, seed: int
) -> tuple[np.ndarray, float, list[float]]:
    """Solve ``policy_fn`` on k sub-problems and stack the allocations.

    Returns:
        The combined X over ``f``'s combinations, the worst sub-problem objective for
        max-min style objectives (min over groups), and every group's objective.
    """
    groups = split_jobs(f.num_jobs, num_partitions, seed=seed)
    share = f.capacity / len(groups)
    x = np.zeros((f.num_combos, len(f.types)))
    combo_index = {c: k for k, c in enumerate(f.combos)}
    objectives: list[float] = []
    for group in groups:
        sub = f.subset(list(group), capacity=share)
        x_sub, value = policy_fn(sub, policy=policy)
        objectives.append(value)
        for k_sub, members in enumerate(sub.combos):
            x[combo_index[tuple(int(group[m]) for m in members)]] = x_sub[k_sub]
    return x, min(objectives), objectives
