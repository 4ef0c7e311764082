"""Event engine of the one schedule simulator: time per-rank action lists, detect deadlocks.

The style follows torch.distributed.pipelining's ``_simulate_comms_compute``: every rank runs
its list strictly in order, and an action starts as soon as its rank is free and its inputs
have arrived. Unlike torch's step-synchronous version, time here is continuous and actions
have real durations, so the result is the dependency-driven makespan that the closed forms of
the dissertation (seed 001, L3512-3652) and of the Zero Bubble paper (Table 2) describe.

Dependencies (virtual stage k, microbatch i, last virtual stage K):
- F(k, i) needs F(k-1, i) plus the activation transfer k-1 -> k (k > 0);
- B(k, i) and I(k, i) need F(k, i) and, for k < K, B/I(k+1, i) plus the gradient transfer
  k+1 -> k;
- W(k, i) needs I(k, i).
Transfers delay the consumer only; they never occupy a rank (no link contention).

Memory: the (k, i) activation is allocated when F(k, i) starts and released when B(k, i)
ends, or W(k, i) ends when the backward is split into I and W.

The engine processes ranks from a work stack: a rank advances until its next action waits on
an action not yet timed, then parks on that action; finishing an action wakes the ranks parked
on it. Each action is timed once, so the cost is linear in the number of actions. Start times
do not depend on the processing order (they are a longest-path computation), only deadlock
detection does: if the stack empties while actions remain, the parked ranks form a cycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.errors import InvalidProblemError
from planner.schema import Action

KIND_CODE = {"F": 0, "B": 1, "I": 2, "W": 3}
KIND_NAME = "FBIW"
_MAX_DEADLOCK_LINES = 8


@dataclass(frozen=True, slots=True)
class Durations:
    """Per virtual stage: what each kind of action costs and what it keeps in memory."""

    forward_s: Sequence[float]
    backward_s: Sequence[float]
    """B: recompute + whole backward."""
    input_s: Sequence[float]
    """I: recompute + input-gradient part of the backward."""
    weight_s: Sequence[float]
    """W: weight-gradient part of the backward."""
    activation_bytes: Sequence[float]
    send_forward_s: Sequence[float]
    """Activation transfer k -> k+1, length K (the last entry is unused)."""
    send_backward_s: Sequence[float]
    """Gradient transfer k+1 -> k, length K (the last entry is unused)."""


@dataclass(frozen=True, slots=True)
class Trace:
    """Per rank, what ran when: ``ops[r][j] = (kind code, virtual stage, microbatch)``."""

    ops: list[list[tuple[int, int, int]]]
    starts: list[list[float]]
    ends: list[list[float]]
    held_bytes: list[list[float]]
    """Activation bytes held on the rank right after each action ends."""
    peak_activation_bytes: list[float]
    peak_inflight: list[int]


def compile_actions(
    actions: Sequence[Sequence[Action]], *, stage_rank: Sequence[int]
) -> list[list[tuple[int, int, int]]]:
    """Encode actions as (kind code, stage, microbatch) after checking each stage's placement.

    Structural checks (ranges, duplicates, completeness) are ``schedules.validate_actions``;
    this adds that every virtual stage runs on the rank that holds its layers.

    Raises:
        InvalidProblemError: a virtual stage's actions are on a rank other than its own.
    """
    out: list[list[tuple[int, int, int]]] = []
    for r, rank_actions in enumerate(actions):
        ops = [(KIND_CODE[a[1]], a[0], a[2]) for a in rank_actions]
        for position, (_, k, _) in enumerate(ops):
            if stage_rank[k] != r:
                raise InvalidProblemError(
                    f"rank {r} action {position} ({rank_actions[position]}): virtual stage {k} lives "
                    f"on rank {stage_rank[k]} (virtual stage k is chunk k // p of rank k % p); move "
                    f"its actions to rank {stage_rank[k]}'s list"
                )
        out.append(ops)
    return out


def run(ops: list[list[tuple[int, int, int]]], *, num_microbatches: int, durations: Durations) -> Trace:
    """Time every action; see the module docstring for the rules.

    Raises:
        InvalidProblemError: deadlock; the message names each blocked rank, the action it is
            at and the action it waits for.
    """
    m = num_microbatches
    num_ranks = len(ops)
    num_keys = len(durations.forward_s) * m
    state = _State(num_ranks, num_keys)
    stack = list(range(num_ranks - 1, -1, -1))
    while stack:
        r = stack.pop()
        key = _advance(r, ops[r], m, durations, state)
        if key is not None:
            state.parked.setdefault(key, []).append(r)
            state.blocked[r] = key
        stack.extend(state.woken)
        state.woken.clear()
    if any(state.pos[r] < len(ops[r]) for r in range(num_ranks)):
        raise InvalidProblemError(_deadlock_message(ops, state, num_keys, m))
    return Trace(
        ops=ops,
        starts=state.starts,
        ends=state.ends,
        held_bytes=state.held_after,
        peak_activation_bytes=state.peak_bytes,
        peak_inflight=state.peak_count,
    )


class _State:
    """Mutable bookkeeping of one run (private to the engine)."""

    def __init__(self, num_ranks: int, num_keys: int) -> None:
        self.f_end: list[float | None] = [None] * num_keys
        self.b_end: list[float | None] = [None] * num_keys  # end of B or I
        self.pos = [0] * num_ranks
        self.free = [0.0] * num_ranks
        self.held = [0.0] * num_ranks
        self.count = [0] * num_ranks
        self.peak_bytes = [0.0] * num_ranks
        self.peak_count = [0] * num_ranks
        self.starts: list[list[float]] = [[] for _ in range(num_ranks)]
        self.ends: list[list[float]] = [[] for _ in range(num_ranks)]
        self.held_after: list[list[float]] = [[] for _ in range(num_ranks)]
        # Waiting key: idx for an F, num_keys + idx for a B/I, idx = stage * m + microbatch.
        self.parked: dict[int, list[int]] = {}
        self.blocked: dict[int, int] = {}
        self.woken: list[int] = []
        self.num_keys = num_keys


def _advance(
    r: int, rank_ops: list[tuple[int, int, int]], m: int, d: Durations, st: _State
) -> int | None:
    """Run rank r until it finishes (None) or waits; return the key it waits on.

    One flat loop on purpose: this is the simulator's hot path (one iteration per action), and
    helper calls per action would double the run time of large schedules.
    """
    f_end, b_end, parked, woken, nk = st.f_end, st.b_end, st.parked, st.woken, st.num_keys
    fwd, bwd, inp, wgt = d.forward_s, d.backward_s, d.input_s, d.weight_s
    act, send_f, send_b = d.activation_bytes, d.send_forward_s, d.send_backward_s
    last = len(fwd) - 1
    starts, ends, held_after = st.starts[r], st.ends[r], st.held_after[r]
    j, t, held, count = st.pos[r], st.free[r], st.held[r], st.count[r]
    peak_bytes, peak_count = st.peak_bytes[r], st.peak_count[r]
    n = len(rank_ops)
    wait: int | None = None
    while j < n:
        code, k, i = rank_ops[j]
        idx = k * m + i
        if code == 0:
            start = t
            if k:
                ready = f_end[idx - m]
                if ready is None:
                    wait = idx - m
                    break
                ready += send_f[k - 1]
                if ready > start:
                    start = ready
            end = start + fwd[k]
            f_end[idx] = end
            held += act[k]
            count += 1
            if held > peak_bytes:
                peak_bytes = held
            if count > peak_count:
                peak_count = count
            if parked and idx in parked:
                woken.extend(parked.pop(idx))
        elif code == 3:
            ready = b_end[idx]
            if ready is None:
                wait = nk + idx
                break
            start = ready if ready > t else t
            end = start + wgt[k]
            held -= act[k]
            count -= 1
        else:
            ready = f_end[idx]
            if ready is None:
                wait = idx
                break
            if k < last:
                grad = b_end[idx + m]
                if grad is None:
                    wait = nk + idx + m
                    break
                grad += send_b[k]
                if grad > ready:
                    ready = grad
            start = ready if ready > t else t
            if code == 1:
                end = start + bwd[k]
                held -= act[k]
                count -= 1
            else:
                end = start + inp[k]
            b_end[idx] = end
            if parked and nk + idx in parked:
                woken.extend(parked.pop(nk + idx))
        starts.append(start)
        ends.append(end)
        held_after.append(held)
        t = end
        j += 1
    st.pos[r], st.free[r], st.held[r], st.count[r] = j, t, held, count
    st.peak_bytes[r], st.peak_count[r] = peak_bytes, peak_count
    return wait


def _key_action(
    key: int, num_keys: int, m: int, ops: list[list[tuple[int, int, int]]], stage_rank: dict[int, int]
) -> str:
    """The action a waiting key stands for (B or I, whichever the owning rank runs)."""
    backward, idx = divmod(key, num_keys)
    k, i = divmod(idx, m)
    if not backward:
        return f"{k}F{i}"
    rank = stage_rank.get(k)
    kinds = {c for c, s, mb in ops[rank] if s == k and mb == i} if rank is not None else set()
    return f"{k}{'I' if 2 in kinds else 'B'}{i}"


def _deadlock_message(ops: list[list[tuple[int, int, int]]], st: _State, num_keys: int, m: int) -> str:
    stage_rank = {k: r for r, rank_ops in enumerate(ops) for _, k, _ in rank_ops}

    def next_action(r: int) -> str:
        if st.pos[r] >= len(ops[r]):
            return "none (it has finished)"
        code, k, i = ops[r][st.pos[r]]
        return f"{k}{KIND_NAME[code]}{i}"

    lines = []
    for r in sorted(st.blocked):
        if st.pos[r] >= len(ops[r]):
            continue
        waited = _key_action(st.blocked[r], num_keys, m, ops, stage_rank)
        owner = stage_rank[st.blocked[r] % num_keys // m]
        where = (
            "which comes later in its own list"
            if owner == r
            else f"rank {owner}'s next action is {next_action(owner)}"
        )
        lines.append(f"  rank {r} waits at {next_action(r)} for {waited} ({where})")
    shown = lines[:_MAX_DEADLOCK_LINES]
    if len(lines) > len(shown):
        shown.append(f"  ... and {len(lines) - len(shown)} more blocked ranks")
    return (
        "deadlock: no rank can start its next action while actions remain:\n"
        + "\n".join(shown)
        + "\nreorder the action lists so that every action comes after the actions it needs "
        "(F after the previous stage's F, B/I after the next stage's B/I, W after its I)"
    )
