"""BPipe: memory-balanced pipeline parallelism (Kim et al. 2023, seed 004; reading
shared/design/stage-ilp-spipe-bpipe.md Part C).

Under 1F1B, stage s holds mu(s) = min(p - s, m) microbatch activation sets at its peak (Eq. 1-2,
seed L66-75), so stage 0 runs out of memory first. BPipe pairs stage s with p - 1 - s (L79-84):
the evictor (s < (p - 1) / 2) moves activation sets it will not need soon to its acceptor and
loads them back before their backward.

- Balanced target mu_opt = ceil((p + 2) / 2) for 1F1B (L94-96); p v + 1 in chunk-microbatch sets
  for the interleaved schedule with v chunks (App. A, L373-380).
- Transfer schedule: Algorithm 1 (L111-140) run over the bubble-free per-stage op list, with the
  fix of the reading (Sec. C.4): the literal line 22 can pick a BUBBLE; here an eviction is
  issued with the op before the op that would overflow, its victim is the resident set needed
  furthest in the future (Belady, L144-152), and a cooldown load (its preceding op is a
  backward) starts after that backward frees its buffer. For 1F1B this gives exactly the
  paper's transfers (Figure 4: Evict(1) with F2, Evict(3) with B0, Load(1) with F4, ...).
- Pair-adjacent placement (L156-180, Fig. 5-6): tensor-parallel ranks innermost, then the
  pipeline in the order [0, p-1, 1, p-2, ...], data-parallel replicas outermost.
- Link check (App. B, L396-445): one transfer must finish within one forward (Eq. 7-9); relaxed,
  an evict and a load share a backward plus a forward (Eq. 10-12, 2/3 of the strict rate).

Counts are "activation sets": one microbatch's saved activations of one virtual stage (chunk).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from cost_models.sim.costs import _replica_rank, pipeline_costs
from cost_models.schedules import build_actions
from planner.errors import InfeasibleError, InvalidProblemError
from planner.schema import Action, Plan

__all__ = [
    "SUPPORTED_SCHEDULES",
    "Transfer",
    "balanced_inflight",
    "balanced_memory_bytes",
    "check_link_bandwidth",
    "inflight_peaks",
    "inflight_split",
    "optimal_inflight",
    "pair_adjacent_order",
    "pair_adjacent_ranks",
    "pairs",
    "required_link_bytes_per_s",
    "schedule_transfers",
    "transfer_schedule",
    "unbalanced_inflight",
]

SUPPORTED_SCHEDULES = ("1f1b", "flush", "interleaved-1f1b")
"""Schedules BPipe balances: 1F1B (Algorithm 1) and interleaved 1F1B (App. A)."""

Key = tuple[int, int]  # (virtual stage, microbatch): one activation set


@dataclass(frozen=True, slots=True)
class Transfer:
    """One eviction or load of an evictor, issued with one op of its bubble-free op list."""

    kind: Literal["evict", "load"]
    stage: int
    """Virtual stage of the activation set (a chunk of the evictor)."""
    microbatch: int
    op_index: int
    """Position in the evictor's op list of the op the transfer is issued with."""
    after: bool = False
    """True: starts when that op ends (cooldown loads); False: starts with it."""

    def __str__(self) -> str:
        verb = "Evict" if self.kind == "evict" else "Load"
        return f"{verb}({self.stage},{self.microbatch})@{self.op_index}{'+' if self.after else ''}"


def _check_schedule(schedule: str) -> None:
    if schedule not in SUPPORTED_SCHEDULES:
        raise InvalidProblemError(
            f"BPipe balances the 1F1B and interleaved 1F1B schedules ([bpipe] Sec. 3.4 and App. A); "
            f"schedule {schedule!r} is not supported: use one of {list(SUPPORTED_SCHEDULES)} or turn bpipe off"
        )


def pairs(num_stages: int) -> tuple[tuple[int, int], ...]:
    """Evictor-acceptor pairs (s, p - 1 - s) for every evictor s < (p - 1) / 2 (seed L79-84)."""
    return tuple((s, num_stages - 1 - s) for s in range(num_stages) if 2 * s < num_stages - 1)


def optimal_inflight(num_stages: int, *, num_chunks: int = 1) -> int:
    """mu_opt: ceil((p + 2) / 2) activation sets for 1F1B (seed L94-96); p v + 1 chunk sets for
    interleaved 1F1B with v > 1 chunks, ceil((mu(s) + mu(p-1-s) + 1) / 2) (L373-380)."""
    if num_chunks > 1:
        return num_stages * num_chunks + 1
    return -(-(num_stages + 2) // 2)


def _stage_ops(
    num_stages: int, num_microbatches: int, schedule: str, num_chunks: int
) -> tuple[tuple[Action, ...], ...]:
    _check_schedule(schedule)
    return build_actions(schedule, num_stages=num_stages, num_chunks=num_chunks, num_microbatches=num_microbatches)


def schedule_transfers(ops: Sequence[Action], target_inflight: int) -> tuple[Transfer, ...]:
    """Algorithm 1 with the reading's fix, over one stage's bubble-free F/B op list.

    Before each op j + 1 the stage may hold at most ``target_inflight`` sets: the sets resident,
    the one op j + 1 produces (F) and the one loaded alongside it. When that would overflow, op
    j issues evictions of the resident sets whose backward comes last (not the one op j uses).
    A set is loaded with the op before its backward, or after it when that op is a backward.

    Raises:
        InvalidProblemError: the target is too small for the op list (no set can be evicted).
    """
    n = len(ops)
    next_use = {(a.stage, a.microbatch): j for j, a in enumerate(ops) if a.kind == "B"}
    resident: set[Key] = set()
    evicted: set[Key] = set()
    out: list[Transfer] = []

    def load_at(j: int) -> Key | None:  # the set to load alongside / after op j
        if j + 1 < n and ops[j + 1].kind == "B":
            nxt = (ops[j + 1].stage, ops[j + 1].microbatch)
            return nxt if nxt in evicted else None
        return None

    for j, op in enumerate(ops):
        key = (op.stage, op.microbatch)
        load = load_at(j)
        after_set = resident | {key} if op.kind == "F" else resident - {key}
        if load is not None:
            after_set.add(load)
        demand = len(after_set)
        if j + 1 < n and ops[j + 1].kind == "F":
            demand += 1 + (load_at(j + 1) is not None)
        need = demand - target_inflight
        victims: list[Key] = []
        if need > 0:
            candidates = sorted(
                (k for k in resident if k != key and next_use[k] > j + 2), key=lambda k: -next_use[k]
            )
            if len(candidates) < need:
                raise InvalidProblemError(
                    f"target_inflight={target_inflight} is too small for this schedule: before op {j + 1} "
                    f"({ops[j + 1]}) the stage needs {demand} activation sets and can evict only "
                    f"{len(candidates)}; use target_inflight >= {target_inflight + need - len(candidates)}"
                )
            victims = candidates[:need]
            out.extend(Transfer("evict", k[0], k[1], j) for k in victims)
        if load is not None:
            out.append(Transfer("load", load[0], load[1], j, after=op.kind == "B"))
            evicted.discard(load)
        resident = after_set - set(victims)
        evicted.update(victims)
    assert not evicted, "every evicted set is loaded before its backward"
    return tuple(out)


def inflight_peaks(ops: Sequence[Action], transfers: Sequence[Transfer]) -> tuple[int, int]:
    """(own, foreign) peak set counts of an evictor's op list under a transfer schedule.

    Own: during op j, the sets resident before it, plus the set an F produces, plus a set loaded
    with it; an evicted set counts until its op ends. Foreign (held by the acceptor): a set
    counts from the op its eviction is issued with through the op its load is issued with.
    """
    evict_ops: dict[int, list[Key]] = {}
    load_with: dict[int, Key] = {}
    load_after: dict[int, Key] = {}
    spans: list[tuple[int, int]] = []
    pending: dict[Key, int] = {}
    for t in sorted(transfers, key=lambda t: (t.op_index, t.kind != "evict")):
        k = (t.stage, t.microbatch)
        if t.kind == "evict":
            evict_ops.setdefault(t.op_index, []).append(k)
            pending[k] = t.op_index
        else:
            (load_after if t.after else load_with)[t.op_index] = k
            spans.append((pending.pop(k), t.op_index))
    resident: set[Key] = set()
    own = 0
    for j, op in enumerate(ops):
        key = (op.stage, op.microbatch)
        during = len(resident) + (op.kind == "F") + (j in load_with)
        own = max(own, during)
        resident = resident | {key} if op.kind == "F" else resident - {key}
        resident -= set(evict_ops.get(j, ()))
        resident |= {k for k in (load_with.get(j), load_after.get(j)) if k is not None}
        own = max(own, len(resident))
    foreign = max((sum(a <= j <= b for a, b in spans) for j in range(len(ops))), default=0)
    return own, foreign


def transfer_schedule(
    num_stages: int,
    stage: int,
    num_microbatches: int,
    *,
    schedule: str = "1f1b",
    num_chunks: int = 1,
    target_inflight: int | None = None,
) -> tuple[Transfer, ...]:
    """Evictions and loads of one stage (empty unless it holds more than the target).

    Args:
        num_stages: p; stage: the evictor s; num_microbatches: m.
        target_inflight: the cap; default ``optimal_inflight(p, num_chunks=v)``.
    """
    ops = _stage_ops(num_stages, num_microbatches, schedule, num_chunks)[stage]
    target = target_inflight or optimal_inflight(num_stages, num_chunks=num_chunks)
    return schedule_transfers(ops, target)


def inflight_split(
    num_stages: int,
    num_microbatches: int,
    *,
    schedule: str = "1f1b",
    num_chunks: int = 1,
    target_inflight: int | None = None,
) -> list[tuple[int, int]]:
    """Per stage, (own, foreign) peak activation-set counts after balancing.

    ``own[s]`` counts sets of stage s's own layers (size: stage s's activation bytes per
    microbatch, per chunk when v > 1); ``foreign[s]`` counts sets an acceptor keeps for its
    evictor p - 1 - s (size: the evictor's). Evictors have foreign 0; the two peaks of an
    acceptor may come at different times, so own + foreign bounds its peak from above.
    """
    target = target_inflight or optimal_inflight(num_stages, num_chunks=num_chunks)
    return list(_split(num_stages, num_microbatches, schedule, num_chunks, target))


@functools.lru_cache(maxsize=256)
def _split(p: int, m: int, schedule: str, num_chunks: int, target: int) -> tuple[tuple[int, int], ...]:
    # Cached: solvers ask for the same (p, m, schedule) for every candidate they weigh.
    actions = _stage_ops(p, m, schedule, num_chunks)
    out = [(inflight_peaks(ops, ())[0], 0) for ops in actions]
    for evictor, acceptor in pairs(p):
        transfers = schedule_transfers(actions[evictor], target)
        own, foreign = inflight_peaks(actions[evictor], transfers)
        out[evictor] = (own, 0)
        out[acceptor] = (out[acceptor][0], foreign)
    return tuple(out)


def unbalanced_inflight(
    num_stages: int, num_microbatches: int, *, schedule: str = "1f1b", num_chunks: int = 1
) -> list[int]:
    """Per stage, mu(s) without balancing: min(p - s, m) for 1F1B (Eq. 2); for interleaved,
    Megatron's warm-up forwards + 1, p (v - 1) + 2 (p - s - 1) + 1 capped at m v (L373-380)."""
    actions = _stage_ops(num_stages, num_microbatches, schedule, num_chunks)
    return [inflight_peaks(ops, ())[0] for ops in actions]


def balanced_inflight(
    num_stages: int, num_microbatches: int, *, schedule: str = "1f1b", num_chunks: int = 1
) -> list[int]:
    """Per pipeline stage, the activation sets it holds at its peak with BPipe: own + foreign.

    Evictors that transfer hold at most mu_opt = ``optimal_inflight`` own sets; an acceptor holds
    its own min(s + 1, m) sets plus at most (p - e) - mu_opt + 1 of its evictor e (seed L98);
    other stages keep mu(s). Own sets have stage s's activation size, foreign sets the
    evictor's (p - 1 - s): with equal stages the count times one stage's activation bytes bounds
    the stage's activation memory; with unequal stages use ``inflight_split`` or
    ``balanced_memory_bytes``. Counts are chunk-microbatch sets when num_chunks > 1.

    Example: p = 8, m >= 8, 1F1B: [5, 5, 5, 5, 4, 5, 5, 5] (mu_opt = 5; unbalanced [8, 7, ..., 1]).
    """
    return [own + foreign for own, foreign in inflight_split(
        num_stages, num_microbatches, schedule=schedule, num_chunks=num_chunks)]


def balanced_memory_bytes(
    activation_bytes: Sequence[float],
    num_microbatches: int,
    *,
    static_bytes: Sequence[float] | None = None,
    schedule: str = "1f1b",
    num_chunks: int = 1,
) -> list[float]:
    """Per stage, an upper bound of the peak memory with BPipe (Eq. 1 with balanced counts).

    Args:
        activation_bytes: per stage, the bytes of one activation set (one microbatch; with
            v > 1 chunks, pass the largest chunk's bytes of the stage).
        static_bytes: per stage resident bytes (weights, optimizer state); default zero.

    Returns:
        static[s] + own[s] x activation_bytes[s] + foreign[s] x activation_bytes[p - 1 - s].
    """
    p = len(activation_bytes)
    static = static_bytes if static_bytes is not None else [0.0] * p
    if len(static) != p:
        raise InvalidProblemError(f"static_bytes has {len(static)} entries for {p} stages; give one per stage")
    split = inflight_split(p, num_microbatches, schedule=schedule, num_chunks=num_chunks)
    return [static[s] + own * activation_bytes[s] + foreign * activation_bytes[p - 1 - s]
            for s, (own, foreign) in enumerate(split)]


def pair_adjacent_order(num_stages: int) -> tuple[int, ...]:
    """Pipeline stage at each position of a replica's device block: [0, p-1, 1, p-2, ...] (Fig. 5-6)."""
    order: list[int] = []
    for s in range(num_stages // 2):
        order += [s, num_stages - 1 - s]
    if num_stages % 2:
        order.append(num_stages // 2)
    return tuple(order)


def pair_adjacent_ranks(
    num_stages: int, *, data_parallel: int = 1, tensor_parallel: int = 1
) -> tuple[tuple[int, ...], ...]:
    """Global ranks of each stage (replicas x tensor ranks, replica-major), pair-adjacent.

    Tensor-parallel ranks are innermost, then pipeline positions in ``pair_adjacent_order``,
    then data-parallel replicas outermost (seed L180):
    rank = replica * p t + position(s) * t + tensor_rank.
    """
    p, t = num_stages, tensor_parallel
    position = {s: x for x, s in enumerate(pair_adjacent_order(p))}
    return tuple(
        tuple(d * p * t + position[s] * t + r for d in range(data_parallel) for r in range(t)) for s in range(p)
    )


def required_link_bytes_per_s(set_bytes: float, forward_s: float, *, backward_s: float | None = None) -> float:
    """App. B: the pair-link rate for one activation set of ``set_bytes``.

    Strict (Eq. 7-9): set_bytes / forward_s. Relaxed (Eq. 10-12), when ``backward_s`` is given:
    an evict and a load share a backward plus a forward, 2 set_bytes / (forward_s + backward_s).
    """
    if forward_s <= 0 or (backward_s is not None and backward_s <= 0):
        raise InvalidProblemError(f"forward_s={forward_s} and backward_s={backward_s} must be positive")
    if backward_s is None:
        return set_bytes / forward_s
    return 2.0 * set_bytes / (forward_s + backward_s)


def check_link_bandwidth(plan: Plan) -> tuple[str, ...]:
    """The appendix's bandwidth check of a BPipe plan: warnings, or rejection.

    For each chunk of each evictor that transfers, with t_x = latency + set bytes / pair-link
    bandwidth: t_x > F (the chunk's forward) gives a warning (Eq. 7-9 fail: transfers may delay
    the backward); 2 t_x > F + R + B fails even the relaxed Eq. 10-12 and is rejected.

    Returns:
        One warning per chunk that needs the relaxation; empty when every transfer fits a forward.

    Raises:
        InfeasibleError: a pair link is too slow even for the relaxed bound; the message gives
            the rate needed and the fixes.
        InvalidProblemError: the plan has no ``bpipe`` spec.
    """
    if plan.bpipe is None:
        raise InvalidProblemError("check_link_bandwidth needs a plan with 'bpipe' set")
    costs = pipeline_costs(plan)
    p, v = plan.degrees.pipeline, plan.degrees.virtual
    actions = _stage_ops(p, plan.num_microbatches, plan.schedule, v)
    warnings: list[str] = []
    for evictor, acceptor in plan.bpipe.pairs:
        moved = {t.stage for t in schedule_transfers(actions[evictor], plan.bpipe.target_inflight)}
        bandwidth, latency = plan.cluster.link(_replica_rank(plan, evictor, 0), _replica_rank(plan, acceptor, 0))
        for k in sorted(moved):
            set_bytes, fwd = costs.activation_bytes[k], costs.forward_s[k]
            bwd = costs.backward_s[k] + costs.recompute_s[k]
            transfer_s = latency + set_bytes / bandwidth
            where = f"stage {evictor} -> {acceptor} (virtual stage {k}, {set_bytes / 1e9:.3g} GB per set)"
            if 2 * transfer_s > fwd + bwd:
                need = required_link_bytes_per_s(set_bytes, fwd, backward_s=bwd)
                raise InfeasibleError(
                    f"BPipe pair link too slow for {where}: {transfer_s * 1e3:.3g} ms per transfer, but an evict "
                    f"and a load must fit one backward plus forward ({(fwd + bwd) * 1e3:.3g} ms; [bpipe] "
                    f"App. B, Eq. 10-12): it needs {need / 1e9:.3g} GB/s, the link has {bandwidth / 1e9:.3g} GB/s. "
                    "Place pairs in one node (pair-adjacent), recompute more (selective or full), or turn bpipe off"
                )
            if transfer_s > fwd:
                warnings.append(
                    f"BPipe transfer {where} takes {transfer_s * 1e3:.3g} ms, longer than the forward "
                    f"({fwd * 1e3:.3g} ms; App. B Eq. 7-9 wants {set_bytes / fwd / 1e9:.3g} GB/s): "
                    "it relies on the relaxed bound and may delay backwards"
                )
    return tuple(warnings)
