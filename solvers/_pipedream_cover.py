"""The top level of PipeDream's DP as a min-max cover, when the level below has priced every range.

Above level 1 a stage's term depends on its layer range only through C^k(a..b), the level
below's optimal time (``RangeValues``), and the memory check sits at level 1 (``LevelCosts.
depends_on_upstream``), so at the top level of a hierarchical topology:

- **feasibility**: every accounting's stage term is finite exactly when C^k(a..b) is (it is
  C^k, or a max or sum of C^k and finite transfer terms, divided by y), boundaries are finite,
  and any partition into p <= m_L ranges takes some replication (y_1 + ... + y_p = m_L, y_i >= 1).
  So A^L(0 -> N-1, m_L) is finite iff some cover of the layers by at most m_L ranges has every
  C^k finite, iff ``min_max_cover`` of the level below's values is finite;
- **memory** (the accounting that sizes the memory a plan needs): a stage costs C^k(a..b)
  whatever its y and u, and boundaries cost 0, so A^L(0 -> N-1, m_L) is the minimum over covers
  by at most m_L ranges of the largest C^k: ``min_max_cover`` itself. Min and max are exact on
  floats, so it is the same float the DP table gives.

``min_max_cover`` costs O(P N^2) numpy work (P = min(m_L, N), usually far fewer rounds) instead
of the top-level table's O(N^2 m_L^2) (1,536 layers in 192 blocks on 512 nodes: 5.6 s each).
"""

from __future__ import annotations

import numpy as np

from solvers._pipedream_artifact import RangeValues


def min_max_cover(lower: RangeValues, num_layers: int, max_parts: int) -> float:
    """min over covers of layers 0..N-1 by at most ``max_parts`` contiguous ranges of the largest
    ``lower`` value of a range (inf when no cover has only finite values)."""
    if lower.table is None:  # prefix and suffix values only: a top level of 2 workers
        assert lower.prefix is not None and lower.suffix is not None and max_parts == 2
        best = float(lower.prefix[num_layers - 1])
        if num_layers > 1:
            best = min(best, float(np.maximum(lower.prefix[:-1], lower.suffix[1:]).min()))
        return best
    table = lower.table  # table[i, j] = range i..j, inf below the diagonal
    best = table[0].copy()  # best[j]: the optimum cover of 0..j by at most k ranges, k = 1 here
    for _ in range(min(max_parts, num_layers) - 1):
        # a cover of 0..j by k + 1 ranges: the best of 0..i-1 by k, then the range i..j
        longer = np.minimum(best, np.maximum(best[:-1, None], table[1:, :]).min(axis=0))
        if np.array_equal(longer, best):
            break  # no more ranges improve any prefix, nor will they later
        best = longer
    return float(best[-1])
