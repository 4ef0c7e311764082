"""Re-ranking of stage-ILP candidates with the one simulator (issue 4: choose by simulated time).

The ILP minimizes the *modelled* iteration time, which equals the simulated one for uniform
stages but only estimates it for imbalanced ones (two stages of 13 and 12 units per microbatch,
4 microbatches: modelled 13 + 12 + 3 x 13 = 64, simulated 63). So the returned plan is chosen
by simulation: the ILP optimum and the warm-start plans are simulated, then a best-improvement
local search moves one layer across a chunk boundary or changes one layer's recompute strategy
at a time, simulating the ``width`` neighbours with the smallest modelled time, until no
neighbour is faster or ``max_simulations`` is spent. Only plans whose memory fits (exact
in-flight check, ``_stage_ilp_model.fits``) are simulated.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from cost_models.schedules import build_actions
from cost_models.simulate import simulate_costs
from solvers._stage_ilp_model import Counts, StageModel, candidate_costs, fits, modelled_time_s


@dataclass(slots=True)
class Search:
    model: StageModel
    max_simulations: int
    width: int = 16
    time_budget_s: float = 30.0
    simulated: dict[Counts, float] = field(default_factory=dict)
    source: dict[Counts, str] = field(default_factory=dict)
    evaluate: Callable[[Counts], float] | None = None
    """Simulated time of a plan when the fast path does not apply (BPipe plans, simulated with
    their transfers); ``math.inf`` for a plan that does not fit in simulation."""
    clock: Callable[[], float] = time.perf_counter
    """The time source of ``time_budget_s`` (tests pass a counter)."""
    _actions: tuple[object, ...] | None = None
    _began: float = 0.0
    _longest_s: float = 0.0

    def __post_init__(self) -> None:
        self._began = self.clock()

    def simulate(self, counts: Counts, label: str) -> float:
        if counts in self.simulated:
            return self.simulated[counts]
        began = self.clock()
        if self.evaluate is not None:
            self.simulated[counts] = self.evaluate(counts)
        else:
            if self._actions is None:
                m = self.model
                self._actions = build_actions(m.schedule, num_stages=m.num_stages, num_chunks=m.num_chunks,
                                              num_microbatches=m.num_microbatches)
            result = simulate_costs(candidate_costs(self.model, counts), self._actions,  # type: ignore[arg-type]
                                    num_microbatches=self.model.num_microbatches, include_events=False, validate=False)
            self.simulated[counts] = result.iteration_time_s
        self.source[counts] = label
        self._longest_s = max(self._longest_s, self.clock() - began)
        return self.simulated[counts]

    def _past_budget(self, more_s: float = 0.0) -> bool:
        return self.clock() - self._began + more_s > self.time_budget_s

    @property
    def out_of_time(self) -> bool:
        """Whether one more simulation, as long as the longest so far, would end past the budget
        (a large plan's simulation takes seconds: checking only the time already spent let the
        search overrun the budget by one of them)."""
        return self._past_budget(self._longest_s)

    @property
    def exhausted(self) -> bool:
        return len(self.simulated) >= self.max_simulations or self.out_of_time

    def run(self, seeds: Sequence[tuple[str, Counts]]) -> Counts:
        """The fastest plan found by simulation, starting from the seeds (all must fit). The first
        seed (the ILP's plan) is always simulated, the others while the time budget allows."""
        for i, (label, counts) in enumerate(seeds):
            if i and self.out_of_time:
                break
            self.simulate(counts, label)
        best = min((c for _, c in seeds if c in self.simulated), key=lambda c: self.simulated[c])
        while not self.exhausted:
            ranked = self._ranked_neighbours(best)
            if ranked is None:
                break
            improved = best
            for counts in ranked[: self.width]:
                if self.exhausted:
                    break
                if self.simulate(counts, "local search") < self.simulated[improved] * (1 - 1e-12):
                    improved = counts
            if improved == best:
                break
            best = improved
        return best

    def _ranked_neighbours(self, best: Counts) -> list[Counts] | None:
        """The unsimulated neighbours of ``best`` that fit, by modelled time; None when the time
        budget runs out while ranking them (a plan of 128 virtual stages has thousands of
        neighbours, each checked for memory and modelled: seconds of work)."""
        pool: set[Counts] = set()
        for i, counts in enumerate(neighbours(best)):
            if i % 64 == 0 and self._past_budget():
                return None
            if counts not in self.simulated and fits(self.model, counts):
                pool.add(counts)
        keys: dict[Counts, float] = {}
        for i, counts in enumerate(pool):
            if i % 64 == 0 and self._past_budget():
                return None
            keys[counts] = modelled_time_s(self.model, counts)
        return sorted(pool, key=keys.__getitem__)

    def table(self, limit: int = 10) -> list[tuple[Counts, float, str]]:
        """The best simulated plans, fastest first."""
        rows = sorted(((c, t) for c, t in self.simulated.items() if t < float("inf")), key=lambda kv: kv[1])[:limit]
        return [(c, t, self.source[c]) for c, t in rows]


def _with(counts: Counts, k: int, t: int, j: int, delta: int) -> list[list[list[int]]]:
    out = [[list(n) for n in per_type] for per_type in counts]
    out[k][t][j] += delta
    return out


def _freeze(rows: list[list[list[int]]]) -> Counts:
    return tuple(tuple(tuple(n) for n in per_type) for per_type in rows)


def neighbours(counts: Counts) -> Iterator[Counts]:
    """Plans one move away: one layer across a boundary, or one layer's strategy changed."""
    num_k = len(counts)
    sizes = [sum(sum(n) for n in per_type) for per_type in counts]
    for k in range(num_k - 1):
        last_t = max(t for t, n in enumerate(counts[k]) if sum(n))
        first_t = min(t for t, n in enumerate(counts[k + 1]) if sum(n))
        if sizes[k] > 1:  # last layer of k joins k + 1
            for j, nj in enumerate(counts[k][last_t]):
                if nj:
                    rows = _with(counts, k, last_t, j, -1)
                    rows[k + 1][last_t][j] += 1
                    yield _freeze(rows)
        if sizes[k + 1] > 1:  # first layer of k + 1 joins k
            for j, nj in enumerate(counts[k + 1][first_t]):
                if nj:
                    rows = _with(counts, k + 1, first_t, j, -1)
                    rows[k][first_t][j] += 1
                    yield _freeze(rows)
    for k, per_type in enumerate(counts):
        for t, n in enumerate(per_type):
            for j, nj in enumerate(n):
                if not nj:
                    continue
                for j2 in range(len(n)):
                    if j2 != j:
                        rows = _with(counts, k, t, j, -1)
                        rows[k][t][j2] += 1
                        yield _freeze(rows)
