"""The one plan validator: every structural invariant of a plan against its own cluster and model.

``planner.schema.Plan`` checks what a plan says about itself (stages cover the layers once,
chunks per stage, recompute names). ``validate_plan`` adds what a plan must satisfy to be
simulated, exported, filled or run: devices, degrees, ranks, replicas, batch arithmetic, BPipe
pairs and custom action lists. ``paraplan simulate``, ``export``, ``fill`` and ``run`` call it
(through ``planner.api.load_plan``) before any work, so a plan that could never run is refused
with exit code 2 naming the field, the value and the fix, instead of being simulated.

``check_actions`` is the structural check of a custom action list on its own (the runtime
bridge calls it before launching processes).
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.errors import InvalidProblemError
from planner.schema import Action, Plan, expert_group_ranks
from planner.schema_io import MAX_PIPELINE_WORK

__all__ = ["check_actions", "plan_defects", "validate_plan"]

_MAX_SHOWN = 8


def validate_plan(plan: Plan) -> Plan:
    """Return ``plan`` if it is consistent; else refuse it listing its defects.

    Raises:
        InvalidProblemError: one line per defect (at most eight), each with the fix.
    """
    defects = plan_defects(plan)
    if defects:
        shown = defects[:_MAX_SHOWN] + ([f"... and {len(defects) - _MAX_SHOWN} more"] if len(defects) > _MAX_SHOWN else [])
        raise InvalidProblemError("invalid plan:\n  " + "\n  ".join(shown))
    return plan


def plan_defects(plan: Plan) -> list[str]:
    """Every defect of the plan, in the order: devices, batch, ranks, BPipe, actions."""
    defects = (_device_defects(plan) + _transformer_defects(plan) + _batch_defects(plan) + _rank_defects(plan)
               + _bpipe_defects(plan))
    if plan.actions is not None:
        defects += action_defects(plan.actions, num_stages=plan.degrees.pipeline,
                                  num_chunks=plan.degrees.virtual, num_microbatches=plan.num_microbatches)
    return defects


def _uniform(plan: Plan) -> bool:
    """Every stage replicated degrees.data times (no PipeDream per-stage replication)."""
    return all(stage.replicas == plan.degrees.data for stage in plan.stages)


def _device_defects(plan: Plan) -> list[str]:
    d, devices = plan.degrees, plan.cluster.num_devices
    out: list[str] = []
    work = plan.num_microbatches * d.pipeline * d.virtual
    if work > MAX_PIPELINE_WORK:
        out.append(f"num_microbatches x stages x chunks = {work:,} exceeds the limit of {MAX_PIPELINE_WORK:,} (the "
                   "simulator steps each microbatch on each stage; 32 times PTD-P's largest run); use fewer microbatches")
    if d.tensor > devices:
        out.append(f"degrees.tensor={d.tensor} but the cluster has {devices} devices; use a tensor degree <= {devices}")
    if plan.model.tensor_parallel != d.tensor:
        out.append(f"degrees.tensor={d.tensor} but the layer profile was derived for tensor_parallel="
                   f"{plan.model.tensor_parallel}; plan again (the profile's costs assume its own degree)")
    if plan.model.microbatch_size != plan.microbatch_size:
        out.append(f"microbatch_size={plan.microbatch_size} but the layer profile was derived for microbatch_size="
                   f"{plan.model.microbatch_size}; plan again at one microbatch size")
    needed = sum(stage.replicas for stage in plan.stages) * d.tensor * d.context
    if needed > devices:
        out.append(
            f"the plan needs {needed} devices (pipeline {d.pipeline} x data {d.data} x tensor {d.tensor}"
            f"{f' x context {d.context}' if d.context > 1 else ''}) but its cluster {plan.cluster.name!r} has "
            f"{devices}; plan again for this cluster or use fewer stages or replicas"
        )
    etp = plan.options.get("expert_tensor_parallel")
    ranks = expert_group_ranks(d, etp if isinstance(etp, int) and etp >= 1 else None)
    if ranks % d.expert:
        out.append(f"degrees.expert={d.expert} must divide the {ranks} ranks the experts spread over (data x context"
                   f"{', x tensor with expert_tensor_parallel=1' if ranks != d.data * d.context else ''}); use an "
                   f"expert degree dividing {ranks}")
    return out


def _transformer_defects(plan: Plan) -> list[str]:
    """The embedded transformer config must be the one the layer profile was derived from."""
    cfg = plan.transformer
    if cfg is None:
        return []
    out = []
    if plan.model.num_layers != cfg.num_layers + 2:
        out.append(f"the plan's transformer {cfg.name!r} has {cfg.num_layers} blocks but its layer profile has "
                   f"{plan.model.num_layers} layers (embedding + blocks + head = {cfg.num_layers + 2}); plan again")
    t = plan.degrees.tensor
    for name, size in (("num_heads", cfg.num_heads), ("num_kv_heads", cfg.kv_heads), ("ffn size", cfg.ffn_size)):
        if size % t:
            out.append(f"degrees.tensor={t} does not divide the transformer's {name}={size}; use a divisor")
            break
    return out


def _batch_defects(plan: Plan) -> list[str]:
    m, b, big_b = plan.num_microbatches, plan.microbatch_size, plan.global_batch_size
    if _uniform(plan):
        d = plan.degrees.data
        if m * b * d != big_b:
            return [f"num_microbatches x microbatch_size x degrees.data = {m} x {b} x {d} = {m * b * d} but "
                    f"global_batch_size={big_b}; set global_batch_size={m * b * d} or num_microbatches="
                    f"{big_b // (b * d) if big_b % (b * d) == 0 else 'a value with m x b x d = B'}"]
        return []
    if big_b % (m * b):  # PipeDream's replicated stages: each replica of the input stage takes m x b samples
        return [f"global_batch_size={big_b} is not a multiple of num_microbatches x microbatch_size = {m * b}"]
    return []


def _rank_defects(plan: Plan) -> list[str]:
    out: list[str] = []
    devices, t = plan.cluster.num_devices, plan.degrees.tensor
    seen: dict[int, int] = {}
    for position, stage in enumerate(plan.stages):
        if stage.index != position:
            out.append(f"stages[{position}].index={stage.index}; stages are listed in order 0, 1, ..., p-1")
        if not stage.ranks:
            continue
        want = stage.replicas * t * plan.degrees.context
        if len(stage.ranks) != want:
            out.append(f"stage {stage.index} lists {len(stage.ranks)} ranks but replicas x tensor = "
                       f"{stage.replicas} x {t} = {want}; list one rank per replica and tensor shard")
        for rank in stage.ranks:
            if rank >= devices:
                out.append(f"stage {stage.index} names rank {rank} but the cluster has ranks 0..{devices - 1}")
            elif rank in seen and seen[rank] != stage.index:
                out.append(f"rank {rank} is listed by stages {seen[rank]} and {stage.index}; each rank holds one stage")
            elif rank in seen:
                out.append(f"stage {stage.index} lists rank {rank} twice")
            seen.setdefault(rank, stage.index)
    return out


def _bpipe_defects(plan: Plan) -> list[str]:
    if plan.bpipe is None:
        return []
    p, out = plan.degrees.pipeline, []
    paired: set[int] = set()
    for a, b in plan.bpipe.pairs:
        if a >= p or b >= p:
            out.append(f"bpipe pair ({a}, {b}) names a stage outside 0..{p - 1}")
        if a == b:
            out.append(f"bpipe pair ({a}, {b}) pairs a stage with itself; pair stage s with stage p-1-s")
        for s in (a, b):
            if s in paired:
                out.append(f"stage {s} is in two bpipe pairs; each stage has at most one partner")
            paired.add(s)
    if plan.schedule not in ("1f1b", "interleaved-1f1b"):
        out.append(f"bpipe balances the 1f1b and interleaved-1f1b schedules, not {plan.schedule!r}; remove bpipe")
    return out


def check_actions(
    actions: Sequence[Sequence[str]], *, num_stages: int, num_chunks: int, num_microbatches: int
) -> None:
    """Refuse a custom action list that cannot run (see ``action_defects``).

    Raises:
        InvalidProblemError: the defects, at most eight lines.
    """
    defects = action_defects(actions, num_stages=num_stages, num_chunks=num_chunks,
                             num_microbatches=num_microbatches)
    if defects:
        raise InvalidProblemError("invalid actions:\n  " + "\n  ".join(defects[:_MAX_SHOWN]))


def action_defects(
    actions: Sequence[Sequence[str]], *, num_stages: int, num_chunks: int, num_microbatches: int
) -> list[str]:
    """Structural defects of per-rank action lists (``"2F0"``: virtual stage, kind, microbatch).

    Each action runs on the rank holding its virtual stage (stage s on rank s mod p); every
    (virtual stage, microbatch) has one F and either one B or one I and one W; and some order
    of the ranks' lists respects the dependencies (F after the previous stage's F, the
    backward after the next stage's backward and its own F, W after I), so the lists cannot
    deadlock.
    """
    p, v, m = num_stages, num_chunks, num_microbatches
    if len(actions) != p:
        return [f"'actions' has {len(actions)} rank lists for {p} pipeline ranks; give one list per rank"]
    parsed: list[list[Action]] = []
    out: list[str] = []
    for rank, row in enumerate(actions):
        parsed.append([])
        for text in row:
            try:
                action = Action.parse(text)
            except InvalidProblemError as e:
                out.append(f"rank {rank}: {e}")
                continue
            if action.stage >= p * v or action.microbatch >= m:
                out.append(f"rank {rank}: action {text!r} names virtual stage {action.stage} or microbatch "
                           f"{action.microbatch}, outside 0..{p * v - 1} and 0..{m - 1}")
            elif action.stage % p != rank:
                out.append(f"rank {rank}: action {text!r} belongs to rank {action.stage % p} "
                           f"(virtual stage s runs on rank s mod {p})")
            else:
                parsed[rank].append(action)
    if out:
        return out
    return _count_defects(parsed, p * v, m) or _order_defects(parsed, p * v)


def _count_defects(parsed: list[list[Action]], num_virtual: int, m: int) -> list[str]:
    counts: dict[tuple[int, str, int], int] = {}
    for row in parsed:
        for a in row:
            counts[a] = counts.get(a, 0) + 1
    out = [f"action {s}{k}{mb} appears {n} times; each runs once" for (s, k, mb), n in counts.items() if n > 1]
    for s in range(num_virtual):
        for mb in range(m):
            has = {k for k in "FBIW" if (s, k, mb) in counts}
            if "F" not in has:
                out.append(f"virtual stage {s} never runs the forward of microbatch {mb} ({s}F{mb})")
            if has & {"B", "I", "W"} not in ({"B"}, {"I", "W"}):
                got = ", ".join(f"{s}{k}{mb}" for k in "BIW" if k in has) or "none"
                out.append(f"virtual stage {s}, microbatch {mb}: the backward must be one B or one I plus one W "
                           f"({s}B{mb}, or {s}I{mb} and {s}W{mb}); got {got}")
            if len(out) >= _MAX_SHOWN:
                return out
    return out


def _order_defects(parsed: list[list[Action]], num_virtual: int) -> list[str]:
    """Run the lists with every dependency: a deadlock means no valid order exists."""
    done: set[tuple[int, str, int]] = set()
    position = [0] * len(parsed)
    remaining = sum(len(row) for row in parsed)
    while remaining:
        progressed = False
        for rank, row in enumerate(parsed):
            while position[rank] < len(row) and _ready(row[position[rank]], done, num_virtual):
                done.add(tuple(row[position[rank]]))  # type: ignore[arg-type]
                position[rank] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = [f"rank {r} at {row[position[r]]}" for r, row in enumerate(parsed) if position[r] < len(row)]
            return [f"the action lists deadlock: {', '.join(stuck[:4])} each wait for an action that runs later; "
                    "reorder them so that every F follows the previous stage's F and every backward follows "
                    "the next stage's backward"]
    return []


def _ready(a: Action, done: set[tuple[int, str, int]], num_virtual: int) -> bool:
    s, kind, mb = a
    if kind == "F":
        return s == 0 or (s - 1, "F", mb) in done
    if kind == "W":
        return (s, "I", mb) in done
    later = s == num_virtual - 1 or (s + 1, "B", mb) in done or (s + 1, "I", mb) in done
    return later and (s, "F", mb) in done
