"""Cost terms and tables of PipeDream's partitioning DP (``solvers.pipedream_dp`` is the solver).

The cost terms come in the dissertation's and the public artifact's accounting. Both price a
stage (a contiguous layer range a..b replicated over y workers of one topology level) and the
boundary between two stages; the DP minimizes the slowest term. Times are per input
(microbatch), in seconds.

``dissertation`` (Narayanan's dissertation Sec. 2.4.1, seed 001 L1218-1274; digest
``pipedream-2bw.md`` Sec. 2.4):

- stage: T^k(a->b, y) = max(C^k(a..b), 2 (y-1) sum_l |w_l| / B_k) / y        (L1218-1235)
- boundary after layer s: 2 a_s / B_k                                        (L1247-1274)

``artifact`` (the public optimizer, msr-fiddle/pipedream
``optimizer/optimizer_graph_hierarchical.py`` at 7db6a1c; digest Sec. 8.1), all-reduce and
compute are added, not overlapped:

- the first stage of a (sub-)pipeline, the DP's base case:
  (C + 4 (y-1) W / (B_k y) / n_below) / y, with n_below the worker count of the level below (1
  at level 1);
- every later stage: (C + 4 (y-1) W / (B_k y)) / y; the artifact does not divide by n_below here;
- activation transfers only when an activation compression ratio c is given, charged to the
  later stage: 2 a_in / (B_k y c) and, unless the stage ends the model, 2 a_out / (B_k y c).

C^k is the layers' compute sum_l T_l at level 1 and the lower level's optimal pipeline time
A^{k-1}(a->b, m_{k-1}) above (L1276-1291); ``RangeValues`` looks those up.

``memory`` is a third accounting used only to find the smallest device memory that admits a plan:
a stage's cost is its per-device memory and boundaries are free.

Memory per device of a stage (option ``memory``, checked at level 1; PipeDream stashes one weight
version per in-flight input, L1389-1409, L1499-1511): ``static + (n - 1) param + n activation``
with n = ceil((D - u) / y) in-flight inputs per replica, D the workers of the whole cluster and u
the workers before the stage in its level-1 pipeline. n is 1F1B's count for a straight pipeline
(p - s) and NOAM for the input stage (L1313-1319); for a multi-level topology it counts every
worker outside the node as downstream, which over-estimates and so never admits a plan that
does not fit.

The tables (second half of this module) are numpy arrays with inf for infeasible entries:
``all_range_values`` (A^k for every range, the levels below the top), ``forward_values`` (A^k
from one start), ``suffix_values`` (A^k for every range ending at the last layer) and
``solve_range`` (the final entry and the read-back of its stages).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from planner.schema import ModelProfile

COST_MODES = ("dissertation", "artifact")


@dataclass(frozen=True)
class Chain:
    """Per-layer data of the model as prefix sums (index b + 1 minus index a = layers a..b)."""

    compute_prefix_s: np.ndarray
    param_prefix_bytes: np.ndarray
    static_prefix_bytes: np.ndarray
    activation_prefix_bytes: np.ndarray
    output_bytes: np.ndarray

    @classmethod
    def from_model(cls, model: ModelProfile) -> Chain:
        """T_l = forward + backward, w_l = param_bytes, a_l = output_bytes (L1158-1164)."""

        def prefix(values: list[float]) -> np.ndarray:
            return np.concatenate(([0.0], np.cumsum(np.asarray(values, dtype=np.float64))))

        layers = model.layers
        return cls(
            compute_prefix_s=prefix([layer.forward_s + layer.backward_s for layer in layers]),
            param_prefix_bytes=prefix([layer.param_bytes for layer in layers]),
            static_prefix_bytes=prefix([layer.static_bytes for layer in layers]),
            activation_prefix_bytes=prefix([layer.strategies()["none"].activation_bytes for layer in layers]),
            output_bytes=np.asarray([layer.output_bytes for layer in layers], dtype=np.float64),
        )

    @property
    def num_layers(self) -> int:
        return len(self.output_bytes)

    @staticmethod
    def span(prefix: np.ndarray, a: np.ndarray | int, b: np.ndarray | int) -> np.ndarray:
        """Sum over layers a..b (inclusive) from a prefix array; broadcasts a and b."""
        return prefix[np.asarray(b) + 1] - prefix[np.asarray(a)]


@dataclass(frozen=True)
class MemoryLimit:
    """The memory constraint: device capacity and D, the workers of the whole cluster."""

    capacity_bytes: float
    num_workers: int


@dataclass(frozen=True)
class RangeValues:
    """Optimal pipeline times of the level below for layer ranges (the C^k of the level above).

    Either a full table ``table[i, j]`` for every range, or only prefixes (``prefix[j]`` = range
    0..j) and suffixes (``suffix[i]`` = range i..N-1), which is all a top level of 2 workers reads.
    """

    table: np.ndarray | None = None
    prefix: np.ndarray | None = None
    suffix: np.ndarray | None = None

    def lookup(self, a: np.ndarray | int, b: np.ndarray | int) -> np.ndarray:
        a_arr, b_arr = np.broadcast_arrays(np.asarray(a), np.asarray(b))
        if self.table is not None:
            return self.table[a_arr, b_arr]
        assert self.prefix is not None and self.suffix is not None
        last = len(self.suffix) - 1
        assert np.all((a_arr == 0) | (b_arr == last)), "prefix/suffix values read for an inner range"
        return np.where(a_arr == 0, self.prefix[b_arr], self.suffix[a_arr])


class OutOfTime(Exception):
    """The DP tables were cut short by the command's time limit."""


@dataclass(frozen=True)
class LevelCosts:
    """Stage and boundary costs of one topology level (level 1 is the lowest)."""

    chain: Chain
    mode: str
    num_workers: int
    """m_k: components of level k-1 in one component of level k."""
    bandwidth_bytes_per_s: float
    workers_below: int = 1
    """m_{k-1} (1 at level 1): the artifact divides the first stage's all-reduce by it."""
    lower: RangeValues | None = None
    compression_ratio: float | None = None
    memory: MemoryLimit | None = None
    component_workers: int = 1
    """Workers in one component of the level below (product of the lower counts)."""
    deadline: float | None = None
    """``time.perf_counter()`` value past which the tables stop with ``OutOfTime`` (the command's
    --time-limit); None: no limit."""

    def check_time(self) -> None:
        if self.deadline is not None and time.perf_counter() > self.deadline:
            raise OutOfTime()

    @property
    def depends_on_upstream(self) -> bool:
        """Whether a stage's cost depends on the workers before it (the memory check, level 1)."""
        return self.memory is not None and self.lower is None

    def reach(self, s: int, max_replicas: int, bound_s: float, stop: int) -> int:
        """One past the last layer j < stop for which a stage s+1..j on at most ``max_replicas``
        workers can cost at most ``bound_s``: every accounting charges at least the compute
        divided by the devices, C(s+1..j) / (y x component_workers) (a pipeline is no faster
        than its compute spread evenly)."""
        if not np.isfinite(bound_s):
            return stop
        prefix = self.chain.compute_prefix_s
        budget = bound_s * max_replicas * self.component_workers * (1 + 1e-9)
        return min(stop, int(np.searchsorted(prefix, prefix[s + 1] + budget, side="right")) - 1)

    def compute_s(self, a: np.ndarray | int, b: np.ndarray | int) -> np.ndarray:
        """C^k(a..b): the compute sum at level 1, the lower level's pipeline time above."""
        if self.lower is None:
            return Chain.span(self.chain.compute_prefix_s, a, b)
        return self.lower.lookup(a, b)

    def cut_s(self, s: np.ndarray | int) -> np.ndarray:
        """Boundary after layer s: 2 a_s / B_k in the dissertation; the artifact charges its
        transfers to the stage after the boundary (``stage_s``)."""
        if self.mode == "dissertation":
            return 2.0 * self.chain.output_bytes[np.asarray(s)] / self.bandwidth_bytes_per_s
        return np.zeros(np.shape(s))

    def stage_s(
        self, a: np.ndarray | int, b: np.ndarray | int, y: np.ndarray | int, u: np.ndarray | int
    ) -> np.ndarray:
        """Time per input of stage a..b on y workers with u workers before it in its pipeline
        (u = 0: the pipeline's first stage); inf where the memory constraint fails."""
        y_arr, u_arr = np.asarray(y), np.asarray(u)
        compute = self.compute_s(a, b)
        if self.mode == "memory":
            value = compute if self.lower is not None else self._memory_bytes(a, b, y_arr, u_arr)
            return value + 0.0 * y_arr  # broadcast over the workers axis like the other modes
        weights = Chain.span(self.chain.param_prefix_bytes, a, b)
        bandwidth = self.bandwidth_bytes_per_s
        if self.mode == "dissertation":
            time = np.maximum(compute, 2.0 * (y_arr - 1) * weights / bandwidth) / y_arr
        else:
            time = self._artifact_s(a, b, y_arr, u_arr, compute, weights)
        if self.memory is not None and self.lower is None:
            fits = self._memory_bytes(a, b, y_arr, u_arr) <= self.memory.capacity_bytes
            time = np.where(fits, time, np.inf)
        return time

    def _artifact_s(
        self, a: np.ndarray | int, b: np.ndarray | int, y: np.ndarray, u: np.ndarray, compute: np.ndarray,
        weights: np.ndarray,
    ) -> np.ndarray:
        bandwidth = self.bandwidth_bytes_per_s
        allreduce = 4 * (y - 1) * weights / (bandwidth * y)
        first = u == 0
        time = np.where(first, (compute + allreduce / self.workers_below) / y, (compute + allreduce) / y)
        if self.compression_ratio is None:
            return time
        out = self.chain.output_bytes
        scale = bandwidth * y * self.compression_ratio
        before = np.maximum(np.asarray(a) - 1, 0)
        transfer_in = 2.0 * out[before] / scale
        last = self.chain.num_layers - 1
        transfer_out = np.where(np.asarray(b) < last, 2.0 * out[np.asarray(b)] / scale, 0.0)
        transfers = np.where(first, 0.0, np.maximum(transfer_in, transfer_out))
        return np.maximum(time, transfers)

    def _memory_bytes(self, a: np.ndarray | int, b: np.ndarray | int, y: np.ndarray, u: np.ndarray) -> np.ndarray:
        """static + (n - 1) stashed weight versions + n activations, n in-flight inputs."""
        assert self.memory is not None
        chain = self.chain
        inflight = -((-(self.memory.num_workers - u)) // y)  # ceil((D - u) / y)
        return (
            Chain.span(chain.static_prefix_bytes, a, b)
            + (inflight - 1) * Chain.span(chain.param_prefix_bytes, a, b)
            + inflight * Chain.span(chain.activation_prefix_bytes, a, b)
        )


# --------------------------------------------------------------------------------------
# DP tables (numpy, inf = infeasible) and the read-back of the optimal path
# --------------------------------------------------------------------------------------


def forward_values(
    costs: LevelCosts, start: int, stop: int, *, max_workers: int, bound_s: float = np.inf
) -> np.ndarray:
    """A[m, j - start] = A^k(start -> j, m) for j < stop and m <= max_workers (row 0 is inf).

    With ``bound_s`` (an upper bound on the optimum), candidates that must exceed it are skipped:
    a head above it, a last stage whose compute alone, spread over all the workers it could
    get, exceeds it, or a last stage on fewer workers than the fewest on which any of its
    ranges costs at most the bound (at 4,096 GPUs that skips most of the table). Entries whose
    true value is at most ``bound_s`` stay exact; others may be too large, which the optimum
    never reads.
    """
    num, top = stop - start, max_workers
    table = np.full((top + 1, num), np.inf)
    ends = np.arange(start, stop)
    for m in range(1, top + 1):
        table[m] = costs.stage_s(start, ends, m, 0)
    ys = np.arange(1, top)[:, None]
    for s_loc in range(num - 1):
        costs.check_time()
        heads = table[1:top, s_loc]
        xs = np.flatnonzero(heads <= bound_s) + 1  # the workers before the last stage whose head can count
        if not len(xs):
            continue
        s, rows, fewest = start + s_loc, None, 0
        for x in xs.tolist():
            if rows is not None and not costs.depends_on_upstream and x + 1 + fewest > top:
                break  # xs ascend: no later x leaves the last stage enough workers
            stop_loc = costs.reach(s, top - x, bound_s, stop) - start
            if rows is None or costs.depends_on_upstream:
                rows = np.maximum(costs.stage_s(s + 1, ends[s_loc + 1 : stop_loc], ys, x), costs.cut_s(s))
                fewest = _fewest_workers(rows, bound_s, top)
                if x + 1 + fewest > top:
                    continue
            target = table[x + 1 + fewest :, s_loc + 1 : stop_loc]
            np.minimum(target, np.maximum(rows[fewest : top - x, : target.shape[1]], heads[x - 1]), out=target)
    return table


def _fewest_workers(rows: np.ndarray, bound_s: float, top: int) -> int:
    """Index (workers - 1) of the fewest workers on which some range of ``rows`` costs at most
    ``bound_s``; ``top`` when none does."""
    if not np.isfinite(bound_s):
        return 0
    within = (rows <= bound_s).any(axis=1)
    return int(np.argmax(within)) if within.any() else top


def all_range_values(costs: LevelCosts) -> np.ndarray:
    """A^k(i -> j, m_k) for every range i..j (inf below the diagonal)."""
    num, top = costs.chain.num_layers, costs.num_workers
    table = np.full((top + 1, num, num), np.inf)
    first, last = np.triu_indices(num)
    for m in range(1, top + 1):
        table[m, first, last] = costs.stage_s(first, last, m, 0)
    ys = np.arange(1, top)[:, None]
    for s in range(num - 1):
        costs.check_time()
        rows = None
        for x in range(1, top):
            if rows is None or costs.depends_on_upstream:
                rows = np.maximum(costs.stage_s(s + 1, np.arange(s + 1, num), ys, x), costs.cut_s(s))
            head = table[x, : s + 1, s]
            target = table[x + 1 :, : s + 1, s + 1 :]
            np.minimum(target, np.maximum(head[None, :, None], rows[: top - x, None, :]), out=target)
    return table[top]


def suffix_values(costs: LevelCosts) -> np.ndarray:
    """A^k(i -> N-1, m_k) for every i, built from the right (the first stage is split off).

    A tail that uses m of the m_k workers has m_k - m workers before it, which the memory check
    and the artifact's first-stage rule need.
    """
    num, top = costs.chain.num_layers, costs.num_workers
    last = num - 1
    table = np.full((top + 1, num), np.inf)
    starts = np.arange(num)
    for m in range(1, top + 1):
        table[m] = costs.stage_s(starts, last, m, top - m)
    for t in range(num - 1, 0, -1):  # the tail t..N-1 is final; stages i..t-1 go before it
        costs.check_time()
        for x in range(1, top):
            tail = table[x, t]
            if not np.isfinite(tail):
                continue
            ys = np.arange(1, top - x + 1)[:, None]
            rows = np.maximum(costs.stage_s(starts[:t], t - 1, ys, top - x - ys), costs.cut_s(t - 1))
            target = table[x + 1 :, :t]
            np.minimum(target, np.maximum(rows, tail), out=target)
    return table[top]


def solve_range(
    costs: LevelCosts, start: int, stop: int, *, bound_s: float = np.inf
) -> tuple[float, list[tuple[int, int, int]]]:
    """A^k(start -> stop-1, m_k) and its stages (first, last, replicas), in layer order.

    ``bound_s``: an upper bound on the optimum (prunes the table, see ``forward_values``).
    """
    top = costs.num_workers
    table = forward_values(costs, start, stop, max_workers=max(top - 1, 1), bound_s=bound_s)
    value, choice = _best_candidate(costs, table, start, stop - 1, top)
    if not np.isfinite(value):
        return value, []
    stages: list[tuple[int, int, int]] = []
    end, workers = stop - 1, top
    while choice is not None:
        split, replicas = choice
        stages.append((split + 1, end, replicas))
        end, workers = split, workers - replicas
        _, choice = _best_candidate(costs, table, start, end, workers)
    stages.append((start, end, workers))
    return value, stages[::-1]


def _best_candidate(
    costs: LevelCosts, table: np.ndarray, start: int, end: int, workers: int
) -> tuple[float, tuple[int, int] | None]:
    """min over the candidates of A(start -> end, workers) and the first that attains it:
    None for the single replicated stage, else (split s, last-stage replicas m')."""
    base = float(costs.stage_s(start, end, workers, 0))
    if end == start or workers == 1:
        return base, None
    splits = np.arange(start, end)[:, None]
    ys = np.arange(1, workers)[None, :]
    heads = table[workers - ys, splits - start]
    values = np.maximum(np.maximum(heads, costs.cut_s(splits)), costs.stage_s(splits + 1, end, ys, workers - ys))
    best = float(values.min())
    if base <= best:
        return base, None
    flat = int(np.argmax(values.ravel() == best))
    return best, (int(splits[flat // values.shape[1], 0]), int(ys[0, flat % values.shape[1]]))
