"""The isolated allocation: every job gets 1/n of each accelerator type (no LP).

Dissertation ch. 5 L5361-5387 (the "isolated" baseline of the worked example) and the
sharing-incentive property L5690-5695: every fairness policy must do at least as well for
every job. X^iso_mj = (num_workers_j / n) / scale_factor_m, restricted to the types the job
can use, with rows scaled to sum to at most one (reading sec. 2.9 item 2).
"""

from __future__ import annotations

import numpy as np

from solvers.gavel.common import Formulation, repair


def isolated_matrix(f: Formulation) -> np.ndarray:
    """X^iso over the single-job rows of ``f``."""
    n = f.num_jobs
    x = np.minimum(f.capacity[None, :] / n / f.scale[:, None], 1.0) * (f.throughput > 0)
    return x / np.maximum(x.sum(axis=1, keepdims=True), 1.0)


def isolated(f: Formulation, *, policy: str) -> tuple[np.ndarray, float]:
    """The isolated split; objective 0 (there is none)."""
    x = np.zeros((f.num_combos, len(f.types)))
    x[: f.num_jobs] = isolated_matrix(f)
    return repair(f, x), 0.0
