"""Pipeline schedules as per-rank compute action lists.

Each schedule is written as the order in which every pipeline rank runs its compute
actions, in the vocabulary of torch.distributed.pipelining's ``_Action`` (F = forward,
B = full backward, I = input-gradient backward, W = weight-gradient backward). The one
simulator (``cost_models.simulate``) runs these orders dependency-driven; the runtime bridge
and the torch CSV exporter hand them to ``_PipelineScheduleRuntime`` unchanged.

Sources:
- GPipe (Huang et al. 2019) and PipeDream-Flush / 1F1B (Narayanan et al. 2021): dissertation
  seed 001, Sec. 4.2.2 "Default Schedule" (L3512-3588): all forwards then all backwards;
  1F1B warms up with p - r - 1 forwards on rank r, alternates, then drains. PipeDream-2BW
  (Ch. 3) runs the same per-rank order as 1F1B; it differs in weight versioning only.
- Interleaved 1F1B (seed 001, Sec. 4.2.2 "Schedule with Interleaved Stages", L3590-3652;
  needs m a multiple of p, L3612-3616): the order of Megatron-LM's ``forward_backward_pipelining_with_interleaving``
  (NVIDIA/Megatron-LM ``megatron/core/pipeline_parallel/schedules.py`` at 00611e6e,
  ``get_pp_rank_microbatches`` and ``get_schedule_table`` with the default microbatch group
  of p): warm-up (p - r - 1) * 2 + (v - 1) * p forwards capped at m v, forward k on chunk
  (k mod p v) div p, backward k on chunk v - 1 - (k mod p v) div p, both on microbatch
  (k div p v) * p + k mod p; steady state one forward then one backward. Restated in
  shared/design/ptdp-gavel-cloud.md Sec. 1.2. Older Megatron releases ran every forward first
  when m == p; current Megatron and torch's ScheduleInterleaved1F1B do not, nor do we.
- Zero Bubble ZB-H1 / ZB-H2 (Qi et al. 2023, arXiv:2401.10241, Sec. 3.1 and Table 2; restated
  in shared/design/stage-ilp-spipe-bpipe.md Sec. A.6.6): the backward is split into I and W,
  W passes are delayed into the bubbles. See ``_zb_rank`` for the orders built here.

- ZB-V and DualPipeV (``cost_models.vschedules``): two chunks per rank in V placement.

Virtual stage k lives on rank k % p (Megatron's placement, ``Plan.virtual_stages``), except
in the V schedules, where it lives on rank k for k < p and on rank 2p - 1 - k after the turn
(``planner.schema.virtual_stage_home``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from cost_models import vschedules
from planner.errors import InvalidProblemError
from planner.schema import SCHEDULE_NAMES, V_SCHEDULES, Action

__all__ = ["BUILTIN_SCHEDULES", "build_actions", "overlapped_blocks", "validate_actions", "warmup_forwards"]

# Every schedule name of the schema that has a built-in order ("custom" has none).
BUILTIN_SCHEDULES: tuple[str, ...] = tuple(s for s in SCHEDULE_NAMES if s != "custom")
_ONE_F_ONE_B = ("1f1b", "flush", "2bw")


def build_actions(
    schedule: str, *, num_stages: int, num_chunks: int = 1, num_microbatches: int
) -> tuple[tuple[Action, ...], ...]:
    """Per pipeline rank, the compute actions of a built-in schedule in execution order.

    Args:
        schedule: one of ``BUILTIN_SCHEDULES``.
        num_stages: pipeline ranks p.
        num_chunks: model chunks per rank v (``interleaved-1f1b`` takes v > 1, the V schedules
            ``zb-v`` and ``dualpipe-v`` exactly 2).
        num_microbatches: microbatches per iteration m.

    Returns:
        ``actions[r]`` is rank r's tuple of ``Action(stage, kind, microbatch)``; ``stage`` is the
        virtual stage, on rank ``stage % num_stages`` (V schedules: ``virtual_stage_home``).

    Raises:
        InvalidProblemError: unknown schedule, non-positive sizes, chunks with a schedule that
            has none, or an interleaved microbatch count that is not a multiple of p.
    """
    _check_sizes(schedule, num_stages, num_chunks, num_microbatches)
    p, v, m = num_stages, num_chunks, num_microbatches
    if schedule == "gpipe":
        return tuple(_gpipe_rank(r, m) for r in range(p))
    if schedule in _ONE_F_ONE_B:
        return tuple(_one_f_one_b_rank(r, p, m) for r in range(p))
    if schedule == "interleaved-1f1b":
        return tuple(_interleaved_rank(r, p, v, m) for r in range(p))
    if schedule in V_SCHEDULES:
        return tuple(tuple(_v_rank(schedule, r, p, m).actions) for r in range(p))
    return tuple(_zb_rank(schedule, r, p, m) for r in range(p))


@functools.lru_cache(maxsize=64)
def overlapped_blocks(schedule: str, *, num_stages: int, num_microbatches: int) -> tuple[tuple[int, ...], ...]:
    """Per rank, the positions j of ``build_actions``' list whose actions j (F) and j + 1 (B) run
    as one overlapped F&B block (DualPipeV); empty for every other schedule."""
    if schedule != "dualpipe-v":
        return ((),) * num_stages
    _check_sizes(schedule, num_stages, 2, num_microbatches)
    return tuple(tuple(_v_rank(schedule, r, num_stages, num_microbatches).overlapped) for r in range(num_stages))


def _v_rank(schedule: str, rank: int, p: int, m: int) -> vschedules.VSchedule:
    build = vschedules.zb_v if schedule == "zb-v" else vschedules.dualpipe_v
    return build(rank, p, m)


def warmup_forwards(
    schedule: str, *, num_stages: int, num_chunks: int = 1, num_microbatches: int, rank: int
) -> int:
    """Forward passes rank ``rank`` runs before its first backward (B or I) pass.

    Args:
        schedule: one of ``BUILTIN_SCHEDULES``.
        num_stages: pipeline ranks p.
        num_chunks: model chunks per rank v.
        num_microbatches: microbatches per iteration m.
        rank: the pipeline rank r, 0 <= r < p.

    Returns:
        m for GPipe; min(p - r - 1, m) for 1F1B, flush, 2BW and ZB-H1 (Megatron's
        ``num_warmup_microbatches``); Megatron's interleaved count (p - r - 1) * 2 + (v - 1) * p
        capped at m v; min(2 (p - r) - 2, m) for ZB-H2; for the V schedules the chunk
        forwards before the rank's first backward, less one (ZB-V 2p - 2 and DualPipeV
        2p - 1 for m >= 2p - 1, on every rank). The steady-state forward that precedes
        the first backward is not counted (Megatron's convention).

    Raises:
        InvalidProblemError: as ``build_actions``, or a rank outside [0, p).
    """
    _check_sizes(schedule, num_stages, num_chunks, num_microbatches)
    p, v, m = num_stages, num_chunks, num_microbatches
    if not 0 <= rank < p:
        raise InvalidProblemError(f"rank={rank} is outside [0, num_stages={p}); use 0..{p - 1}")
    if schedule == "gpipe":
        return m
    if schedule in _ONE_F_ONE_B or schedule == "zb-h1":
        return min(p - rank - 1, m)
    if schedule == "zb-h2":
        return min(2 * (p - rank) - 2, m)
    if schedule in V_SCHEDULES:
        actions = _v_rank(schedule, rank, p, m).actions
        first_backward = next(j for j, a in enumerate(actions) if a.kind in "BI")
        return sum(1 for a in actions[:first_backward] if a.kind == "F") - 1
    return min((p - rank - 1) * 2 + (v - 1) * p, m * v)


def _check_sizes(schedule: str, p: int, v: int, m: int) -> None:
    if schedule not in BUILTIN_SCHEDULES:
        raise InvalidProblemError(
            f"unknown schedule {schedule!r}; choose from {list(BUILTIN_SCHEDULES)} "
            "('custom' plans carry their own actions)"
        )
    for name, value in (("num_stages", p), ("num_chunks", v), ("num_microbatches", m)):
        if not isinstance(value, int) or value < 1:
            raise InvalidProblemError(f"{name}={value!r} must be a positive integer")
    if schedule == "interleaved-1f1b":
        if v < 2:
            raise InvalidProblemError(
                f"schedule 'interleaved-1f1b' needs num_chunks >= 2, got {v}; use '1f1b' for one chunk"
            )
        if m % p:
            lo = m // p * p
            nearest = f"{lo} or {lo + p}" if lo else f"{p}"
            raise InvalidProblemError(
                f"schedule 'interleaved-1f1b' needs num_microbatches to be a multiple of num_stages={p} "
                f"([narayanan-thesis] Sec. 4.2.2); got num_microbatches={m}, use {nearest}"
            )
    elif schedule in V_SCHEDULES:
        if v != 2:
            raise InvalidProblemError(
                f"schedule {schedule!r} places exactly 2 chunks per rank (V placement), got num_chunks={v}; use 2"
            )
        if schedule == "dualpipe-v" and m < 2 * p:
            raise InvalidProblemError(
                f"schedule 'dualpipe-v' needs num_microbatches >= 2 x num_stages = {2 * p} (every rank overlaps "
                f"a forward with a backward in its steady state); got num_microbatches={m}, use {2 * p} or more"
            )
    elif v != 1:
        raise InvalidProblemError(
            f"num_chunks={v} needs schedule 'interleaved-1f1b', not {schedule!r}; use num_chunks=1"
        )


def _gpipe_rank(rank: int, m: int) -> tuple[Action, ...]:
    forwards = [Action(rank, "F", i) for i in range(m)]
    backwards = [Action(rank, "B", i) for i in range(m)]
    return tuple(forwards + backwards)


def _one_f_one_b_rank(rank: int, p: int, m: int) -> tuple[Action, ...]:
    warmup = min(p - rank - 1, m)
    out = [Action(rank, "F", i) for i in range(warmup)]
    for i in range(m - warmup):
        out.append(Action(rank, "F", i + warmup))
        out.append(Action(rank, "B", i))
    out.extend(Action(rank, "B", i) for i in range(m - warmup, m))
    return tuple(out)


def _interleaved_virtual_stage(k: int, rank: int, p: int, v: int, *, forward: bool) -> int:
    """Virtual stage of the k-th forward (or backward) on ``rank`` (Megatron's chunk id)."""
    chunk = (k % (p * v)) // p
    if not forward:
        chunk = v - 1 - chunk
    return chunk * p + rank


def _interleaved_microbatch(k: int, p: int, v: int) -> int:
    """Microbatch of the k-th forward (or backward) within its chunk (groups of p)."""
    return (k // (p * v)) * p + k % p


def _interleaved_rank(rank: int, p: int, v: int, m: int) -> tuple[Action, ...]:
    total = m * v
    warmup = warmup_forwards("interleaved-1f1b", num_stages=p, num_chunks=v, num_microbatches=m, rank=rank)

    group = p * v  # ``_interleaved_virtual_stage`` and ``_interleaved_microbatch`` inlined (10^5 calls)

    def fwd(k: int) -> Action:
        return Action((k % group) // p * p + rank, "F", k // group * p + k % p)

    def bwd(k: int) -> Action:
        return Action((v - 1 - (k % group) // p) * p + rank, "B", k // group * p + k % p)

    out = [fwd(k) for k in range(warmup)]
    for k in range(total - warmup):
        out.append(fwd(k + warmup))
        out.append(bwd(k))
    out.extend(bwd(k) for k in range(total - warmup, total))
    return tuple(out)


def _zb_rank(schedule: str, rank: int, p: int, m: int) -> tuple[Action, ...]:
    """Zero Bubble ZB-H1 / ZB-H2 order of one rank (Qi et al. 2023, Sec. 3.1, Fig. 3).

    Warm-up forwards as ``warmup_forwards``; then steady triples F(j + warm-up), I(j) and
    W(j - delay); then the cool-down runs each remaining I followed by one delayed W, and the
    last delayed W passes close the iteration. The W delay grows down the pipeline (r steps
    for ZB-H1, 2 r for ZB-H2): rank r runs its last I about r backward steps before rank 0
    does, and the delayed W passes fill that tail instead of idling (ZB-H2's longer warm-up
    doubles it). With dependency-driven execution and T_W <= min(T_F, T_B) this gives exactly the
    paper's Table 2 bubbles: ZB-H1 makespan m(T_F + T_B + T_W) + (p - 1)(T_F + T_B - T_W)
    for m >= p; ZB-H2 idle (p - 1)(T_F + T_B - 2 T_W) inside every rank's own busy span for
    m >= 2p - 1 (the paper drops the optimizer-step synchronization, so iterations tile as
    parallelograms), and a synchronized makespan m(T_F + T_B + T_W) + (p - 1) max(T_F,
    T_F + T_B - 2 T_W). tests/cost_models/test_schedules.py checks all three by simulation.
    """
    warmup = warmup_forwards(schedule, num_stages=p, num_microbatches=m, rank=rank)
    delay = rank if schedule == "zb-h1" else 2 * rank
    out = [Action(rank, "F", i) for i in range(warmup)]
    next_w = 0
    for j in range(m - warmup):
        out.append(Action(rank, "F", j + warmup))
        out.append(Action(rank, "I", j))
        if j >= delay:
            out.append(Action(rank, "W", j - delay))
            next_w = j - delay + 1
    for j in range(m - warmup, m):
        out.append(Action(rank, "I", j))
        if next_w < m:
            out.append(Action(rank, "W", next_w))
            next_w += 1
    out.extend(Action(rank, "W", i) for i in range(next_w, m))
    return tuple(out)


def validate_actions(
    actions: Sequence[Sequence[Action]], *, num_virtual_stages: int, num_microbatches: int
) -> None:
    """Structural checks of a per-rank action list (cycles across ranks are the simulator's job).

    Args:
        actions: one sequence of ``Action`` per pipeline rank.
        num_virtual_stages: p v, the number of virtual stages.
        num_microbatches: m.

    Raises:
        InvalidProblemError: naming the rank, the action and the fix, when an index is out of
            range, a kind is not F/B/I/W, a virtual stage appears on two ranks, a
            (stage, microbatch) lacks its F or has duplicates, mixes B with I/W, or a B/I comes
            before its F or a W before its I on the rank.
    """
    placement: dict[int, int] = {}
    seen: dict[tuple[int, int], list[str]] = {}
    for rank, rank_actions in enumerate(actions):
        for position, action in enumerate(rank_actions):
            _check_one_action(action, rank, position, placement, seen, num_virtual_stages, num_microbatches)
    missing = [s for s in range(num_virtual_stages) if s not in placement]
    if missing:
        raise InvalidProblemError(
            f"virtual stages {missing} have no actions; every stage 0..{num_virtual_stages - 1} needs "
            f"an F and a backward for each of the {num_microbatches} microbatches"
        )
    for (stage, mb), kinds in sorted(seen.items()):
        if kinds not in (["F", "B"], ["F", "I", "W"]):
            raise InvalidProblemError(
                f"stage {stage} microbatch {mb} has actions {kinds} on rank {placement[stage]}; "
                "it needs exactly one F then either one B or one I then one W"
            )
    for stage in range(num_virtual_stages):
        absent = [mb for mb in range(num_microbatches) if (stage, mb) not in seen]
        if absent:
            raise InvalidProblemError(
                f"stage {stage} has no actions for microbatches {absent[:8]}; add an F and a "
                f"backward for each of the {num_microbatches} microbatches"
            )


def _check_one_action(
    action: Action,
    rank: int,
    position: int,
    placement: dict[int, int],
    seen: dict[tuple[int, int], list[str]],
    num_virtual_stages: int,
    num_microbatches: int,
) -> None:
    where = f"rank {rank} action {position} ({action})"
    if action.kind not in ("F", "B", "I", "W"):
        raise InvalidProblemError(f"{where}: kind {action.kind!r} must be one of F, B, I, W")
    if not 0 <= action.stage < num_virtual_stages:
        raise InvalidProblemError(
            f"{where}: stage {action.stage} is outside [0, {num_virtual_stages}); the plan has "
            f"{num_virtual_stages} virtual stages"
        )
    if not 0 <= action.microbatch < num_microbatches:
        raise InvalidProblemError(
            f"{where}: microbatch {action.microbatch} is outside [0, {num_microbatches}); "
            f"num_microbatches={num_microbatches}"
        )
    owner = placement.setdefault(action.stage, rank)
    if owner != rank:
        raise InvalidProblemError(
            f"{where}: stage {action.stage} already runs on rank {owner}; a virtual stage must "
            "live on exactly one rank"
        )
    kinds = seen.setdefault((action.stage, action.microbatch), [])
    expected = {"F": (), "B": ("F",), "I": ("F",), "W": ("F", "I")}[action.kind]
    if tuple(kinds) != expected:
        done = "nothing" if not kinds else "/".join(kinds)
        raise InvalidProblemError(
            f"{where}: {action.kind} follows {done} for stage {action.stage} microbatch "
            f"{action.microbatch}; the order must be F then B, or F then I then W, each once"
        )
    kinds.append(action.kind)
