"""PipeFill's fill work on the engine: pieces of fill jobs in the main job's bubbles.

A pipeline rank's t tensor-parallel GPUs each run an Executor (Arfeen et al., PipeFill,
MLSys 2025, Sec. 4.2-4.3). At a bubble the main job's engine frees its cached memory and
signals the Executor (the *switch*, ``switch_s``); the Executor then runs its next piece (a
run of fill-job nodes sized to the bubble). Both run on the GPU's compute stream, so the main
job's next action on that rank starts only when the rank's inputs have arrived *and* every one
of its GPUs has finished its piece: a piece that overruns its bubble delays the main job, and
the delay travels along the pipeline's dependencies like any other. Here every piece is an
engine operation on a per-GPU stream:

    action j  ->  switch (switch_s)  ->  piece  ->  action j + 1 (also waits for the other GPUs)

Bubbles are named by their start time in the unfilled iteration (``Bubble.start_s`` of
``SimResult``): the end of the action before it, 0 for the head of the iteration, or the end
of the rank's data-parallel all-reduce for the tail. The tail of iteration i and the head of
iteration i + 1 are one bubble (PipeFill's fill-drain bubble): a piece placed there may run
past the end of the iteration into the next one's head. With iterations back to back (each
starts when the previous one's flush ends), rank r's next first action starts ``head_r`` after
the iteration boundary, so the steady iteration time is

    max(flushed makespan, max_r (end of r's tail piece - head_r)).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from cost_models.sim import engine, overlap, pipeline
from cost_models.sim.costs import PipelineCosts, durations
from planner.errors import InvalidProblemError
from planner.schema import Action

__all__ = ["FilledIteration", "simulate_filled"]

_TOLERANCE = 1e-9


@dataclass(frozen=True, slots=True)
class FilledIteration:
    """One main-job iteration with and without its bubbles filled."""

    base_iteration_s: float
    """Without fill (the simulator's iteration time)."""
    iteration_s: float
    """With every given piece run in its bubble (steady state, see the module docstring)."""
    pieces: tuple[tuple[int, int, float, float], ...]
    """(rank, GPU of the rank, start, end) of every piece run, switch included."""

    @property
    def slowdown(self) -> float:
        """Fractional increase of the iteration time caused by the fill work."""
        return self.iteration_s / self.base_iteration_s - 1.0 if self.base_iteration_s > 0 else 0.0


def simulate_filled(
    costs: PipelineCosts,
    actions: Sequence[Sequence[Action]],
    *,
    num_microbatches: int,
    pieces: Sequence[Sequence[Sequence[tuple[float, float]]]],
    switch_s: float,
    trusted: bool = True,
    overlapped: Sequence[Sequence[int]] | None = None,
) -> FilledIteration:
    """Time one flushed iteration with fill pieces in its bubbles.

    Args:
        costs, actions, num_microbatches: the main job (as ``simulate_costs`` takes them).
        pieces: ``pieces[r][g]`` lists (bubble start in the unfilled iteration, piece seconds)
            for GPU g of rank r; a bubble without a piece is left idle (no switch either).
        switch_s: main-job time spent at each filled bubble before the piece starts.
        trusted: the action lists are a built-in schedule's (see ``pipeline.build``).
        overlapped: DualPipeV's overlapped F&B blocks (as ``simulate_costs`` takes them).

    Raises:
        InvalidProblemError: a bubble start that is no idle instant of its rank, or a deadlock.
    """
    with engine.gc_paused():
        return _simulate_filled(costs, actions, num_microbatches, pieces, switch_s, trusted, overlapped)


def _simulate_filled(costs: PipelineCosts, actions: Sequence[Sequence[Action]], num_microbatches: int,
                     pieces: Sequence[Sequence[Sequence[tuple[float, float]]]], switch_s: float,
                     trusted: bool, overlapped: Sequence[Sequence[int]] | None) -> FilledIteration:
    num_ranks = costs.num_ranks
    ops = pipeline.compile_actions(actions, stage_rank=costs.ranks())
    durs = durations(costs, actions)
    fused = overlapped if overlapped and any(overlapped) else None

    def build() -> pipeline.PipelineGraph:
        built = pipeline.build(ops, num_microbatches=num_microbatches, durations=durs, trusted=trusted)
        if fused:
            overlap.fuse_blocks(built, fused, forward_comm_s=costs.forward_comm_s,
                                backward_comm_s=costs.backward_comm_s)
        return built

    def finish(built: pipeline.PipelineGraph, schedule: engine.Schedule) -> pipeline.Trace:
        trace = pipeline.finish(built, schedule)
        if fused:
            overlap.split_fused_trace(trace, built, fused)
        return trace

    base = build()
    base_trace = finish(base, engine.run(base.graph))
    base_s = _flush_s(base_trace, costs.allreduce_s)
    built = build()
    ids, tails = _add_pieces(built, base_trace, base_s, costs.allreduce_s, pieces[:num_ranks], switch_s)
    schedule = engine.run(built.graph)
    trace = finish(built, schedule)
    iteration = _flush_s(trace, costs.allreduce_s)
    for r, piece in tails:
        head = trace.starts[r][0] if trace.starts[r] else 0.0
        iteration = max(iteration, schedule.end_s[piece] - head)
    return FilledIteration(
        base_iteration_s=base_s, iteration_s=max(iteration, base_s),
        pieces=tuple((r, g, schedule.start_s[sw], schedule.end_s[pc]) for r, g, sw, pc in ids),
    )


def _add_pieces(built: pipeline.PipelineGraph, base_trace: pipeline.Trace, base_s: float,
                allreduce_s: Sequence[float], pieces: Sequence[Sequence[Sequence[tuple[float, float]]]],
                switch_s: float) -> tuple[list[tuple[int, int, int, int]], list[tuple[int, int]]]:
    """Switch and piece operations of every GPU in its bubbles; returns (rank, GPU, switch op,
    piece op) of each and the (rank, piece op) of the pieces in a rank's tail."""
    graph, ids, tails = built.graph, [], []
    for r, rank_gpus in enumerate(pieces):
        ar_op, first, n = -1, built.rank_base[r], len(built.ops[r])
        for g, rank_pieces in enumerate(rank_gpus):
            for start_s, piece_s in sorted(rank_pieces):
                j = _action_before(base_trace, r, start_s, allreduce_s[r], base_s)
                if j == n - 1 and ar_op < 0:  # the tail: after the rank's all-reduce
                    ar_op = graph.add(allreduce_s[r], deps=[first + j])
                after = ar_op if j == n - 1 else first + j
                switch = graph.add(switch_s, deps=[after] if j >= 0 else ())
                piece = graph.add(piece_s, deps=[switch])
                ids.append((r, g, switch, piece))
                if j < n - 1:
                    graph.add_dep(first + j + 1, piece)
                else:
                    tails.append((r, piece))
    return ids, tails


def _flush_s(trace: pipeline.Trace, allreduce_s: Sequence[float]) -> float:
    """Flushed iteration: the latest end of a rank's last action plus its all-reduce."""
    return max((ends[-1] + ar for ends, ar in zip(trace.ends, allreduce_s) if ends), default=0.0)


def _action_before(trace: pipeline.Trace, r: int, start_s: float, allreduce_s: float, iteration_s: float) -> int:
    """Index of rank r's action a bubble starting at ``start_s`` follows (-1: the head).

    Raises:
        InvalidProblemError: no action of the rank ends at ``start_s`` (nor its all-reduce).
    """
    ends, tol = trace.ends[r], _TOLERANCE * max(iteration_s, 1e-30)
    if not ends:
        raise InvalidProblemError(f"rank {r} runs no action; it has no bubble to fill")
    last = len(ends) - 1
    if allreduce_s > 0 and abs(start_s - (ends[last] + allreduce_s)) <= tol:
        return last
    j = bisect.bisect_right(ends, start_s + tol) - 1
    if j < 0:
        if start_s <= tol and trace.starts[r][0] > tol:
            return -1
    elif abs(ends[j] - start_s) <= tol and (j == last or trace.starts[r][j + 1] > start_s + tol):
        return j
    raise InvalidProblemError(
        f"rank {r} has no bubble starting at {start_s:.6g} s (bubbles start where an action or the "
        "all-reduce ends); take the starts from the unfilled simulation's StageResult.bubbles"
    )
