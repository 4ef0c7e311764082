"""Pipeline schedules on the engine: per-rank action lists as compute chains plus link transfers.

Every rank (or PipeDream worker) is a compute stream that runs its list strictly in order, as
torch.distributed.pipelining's ``_simulate_comms_compute`` does; time is continuous and actions
have real durations, so without contention the result is the dependency-driven makespan that
the closed forms of the PTD-P dissertation and of the Zero Bubble paper (Table 2) describe.

Dependencies (virtual stage k, microbatch i, last virtual stage K):
- F(k, i) needs F(k-1, i) plus the activation transfer k-1 -> k (k > 0);
- B(k, i) and I(k, i) need F(k, i) and, for k < K, B/I(k+1, i) plus the gradient transfer
  k+1 -> k;
- W(k, i) needs I(k, i).

A transfer between two ranks occupies the link resource ``("link", src, dst)`` of that
direction (``cost_models.sim.engine``: one transfer at a time, FIFO): activations and
gradients flow in opposite directions and do not compete, but boundaries that map to the same
pair of ranks (interleaved chunks, PipeDream replicas) and BPipe evictions on a neighbour link
do. A transfer of zero duration (same rank) is a plain dependency.

Memory: the (k, i) activation is allocated when F(k, i) runs and released when B(k, i) ends,
or W(k, i) ends when the backward is split into I and W; held bytes are counted in each rank's
program order.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from cost_models.sim import engine

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
                    f"on rank {stage_rank[k]} (the plan's placement of virtual stages); move "
                    f"its actions to rank {stage_rank[k]}'s list"
                )
        out.append(ops)
    return out


def run(
    ops: list[list[tuple[int, int, int]]],
    *,
    num_microbatches: int,
    durations: Durations,
    link_names: Sequence[Hashable] | None = None,
    trusted: bool = False,
) -> Trace:
    """Time every action on the engine; see the module docstring for the rules.

    Args:
        ops: per rank (or worker), its actions in order.
        num_microbatches: m.
        durations: per virtual stage costs.
        link_names: per rank, the name of its device in link resources (default: the rank).

    Raises:
        InvalidProblemError: deadlock; the message names each blocked rank, the action it is
            at and the action it waits for.
    """
    built = build(ops, num_microbatches=num_microbatches, durations=durations, link_names=link_names, trusted=trusted)
    return finish(built, engine.run(built.graph))


@dataclass(slots=True)
class PipelineGraph:
    """The engine graph of per-rank action lists, with the ids other layers attach to."""

    graph: engine.Graph
    ops: list[list[tuple[int, int, int]]]
    num_microbatches: int
    durations: Durations
    rank_base: list[int]
    """Op id of rank r's action j is rank_base[r] + j."""
    f_op: list[int]
    """Per key k * m + i: the op id of F(k, i); b_op likewise for B or I."""
    b_op: list[int]
    transfers: list[tuple[int, str, int, int]] = field(default_factory=list)
    """(id, kind, virtual stage, microbatch) of every link transfer (kinds SF, SB, EV, LD): an
    operation id for EV / LD and when ``sends_as_ops``, else an engine transfer id."""
    sends_as_ops: bool = False


def build(
    ops: list[list[tuple[int, int, int]]],
    *,
    num_microbatches: int,
    durations: Durations,
    link_names: Sequence[Hashable] | None = None,
    shared: bool = False,
    sends_as_ops: bool = False,
    trusted: bool = False,
) -> PipelineGraph:
    """Compute operations (one chain per rank) and the point-to-point transfers between them.

    Args:
        shared: reuse the dependency structure of an earlier call with the same ``ops`` object
            (solvers simulate many cost sets on one schedule); the graph must then not be
            extended (BPipe adds operations: it builds its own).
        sends_as_ops: make activations and gradients engine operations rather than transfers,
            so that other operations (BPipe's evictions and loads) can share their links.
        trusted: the lists are built-in ones (each rank runs F before B/I and I before W of every
            microbatch): those same-rank dependencies then come from the rank's order alone.
    """
    key = (id(ops), num_microbatches, None if link_names is None else tuple(link_names), sends_as_ops, trusted)
    top = _TOPOLOGIES.get(key) if shared else None
    if top is None or top.ops is not ops:
        top = _topology(ops, num_microbatches, list(range(len(ops))) if link_names is None else list(link_names),
                        sends_as_ops, trusted)
        if shared:
            if len(_TOPOLOGIES) >= _MAX_TOPOLOGIES:
                _TOPOLOGIES.pop(next(iter(_TOPOLOGIES)))
            _TOPOLOGIES[key] = top
    d = durations
    per_kind = (d.forward_s, d.backward_s, d.input_s, d.weight_s)
    dur = [per_kind[c][k] for c, k in top.code_stage]
    delays = [d.send_forward_s[k - 1] if forward else d.send_backward_s[k] for forward, k in top.transfer_boundary]
    # A transfer of zero time, or between virtual stages of one rank, holds no link.
    link = [rid if delay > 0 else engine.NO_RESOURCE for rid, delay in zip(top.transfer_resource, delays)]
    res = [engine.NO_RESOURCE] * len(top.code_stage)
    if sends_as_ops:
        dur += delays
        res += link
    graph = engine.Graph(
        duration_s=dur, resource=res, num_deps=top.num_deps if shared else list(top.num_deps),
        children=top.children if shared else [None if c is None else list(c) for c in top.children],
        chained=top.chained if shared else list(top.chained),
        resource_names=list(top.resource_names), ordered=[True] * len(top.resource_names),
        transfers_out=_transfers_out(top, len(dur), shared),
        transfer_child=top.transfer_child, transfer_s=[] if sends_as_ops else delays,
        transfer_resource=[] if sends_as_ops else link,
    )
    for name in top.resource_names:
        graph._resource_ids[name] = len(graph._resource_ids)
    return PipelineGraph(graph=graph, ops=ops, num_microbatches=num_microbatches, durations=d,
                         rank_base=top.rank_base, f_op=top.f_op, b_op=top.b_op,
                         transfers=top.transfers if shared else list(top.transfers), sends_as_ops=sends_as_ops)


def _transfers_out(top: _Topology, num_ops: int, shared: bool) -> list[list[int] | None]:
    """Per operation, its outgoing transfers (a private copy unless the graph is shared)."""
    out = top.transfers_out if shared else [None if x is None else list(x) for x in top.transfers_out]
    return out if len(out) == num_ops else out + [None] * (num_ops - len(out))


@dataclass(slots=True)
class _Topology:
    """What a pipeline graph's structure depends on: the action lists, m and the link names."""

    ops: list[list[tuple[int, int, int]]]
    code_stage: list[tuple[int, int]]
    """Per compute op: (kind code, virtual stage)."""
    transfer_boundary: list[tuple[bool, int]]
    """Per transfer op (ids after the compute ops): (activation?, virtual stage it feeds or leaves)."""
    transfer_resource: list[int]
    transfer_child: list[int]
    """Engine transfers only: the op each transfer delivers to."""
    transfers_out: list[list[int] | None]
    num_deps: list[int]
    children: list[list[int] | None]
    chained: list[bool]
    resource_names: list[Hashable]
    rank_base: list[int]
    f_op: list[int]
    b_op: list[int]
    transfers: list[tuple[int, str, int, int]]


_TOPOLOGIES: dict[tuple[object, ...], _Topology] = {}
_MAX_TOPOLOGIES = 2  # each can hold hundreds of thousands of operations


def _topology(ops: list[list[tuple[int, int, int]]], m: int, names: list[Hashable], as_ops: bool,
              trusted: bool) -> _Topology:
    num_stages = 1 + max((k for rank_ops in ops for _, k, _ in rank_ops), default=0)
    num_keys = num_stages * m
    f_op, b_op = [-1] * num_keys, [-1] * num_keys
    code_stage: list[tuple[int, int]] = []
    nd: list[int] = []
    chained: list[bool] = []
    rank_base, owner = [], []
    for r, rank_ops in enumerate(ops):
        base = len(code_stage)
        rank_base.append(base)
        for j, (code, k, i) in enumerate(rank_ops):
            code_stage.append((code, k))
            if code == 0:
                f_op[k * m + i] = base + j
            elif code != 3:
                b_op[k * m + i] = base + j
        n = len(rank_ops)
        nd.extend([1] * n)
        chained.extend([True] * n)
        if n:
            nd[base] = 0
            chained[-1] = False  # the rank's last action
        owner.extend([r] * n)
    top = _Topology(ops=ops, code_stage=code_stage, transfer_boundary=[], transfer_resource=[], transfer_child=[],
                    transfers_out=[None] * len(code_stage), num_deps=nd, children=[None] * len(code_stage),
                    chained=chained, resource_names=[], rank_base=rank_base, f_op=f_op, b_op=b_op, transfers=[])
    _add_sends(top, m, owner, names, as_ops, trusted)
    return top


def _add_sends(top: _Topology, m: int, owner: list[int], names: list[Hashable], as_ops: bool,
               trusted: bool) -> None:
    """F(k, i) waits for F(k-1, i) and B/I(k, i) for B/I(k+1, i) through a transfer (on the link between
    the two ranks; a plain delay within a rank). B/I(k, i) also waits for F(k, i) and W(k, i) for
    I(k, i), which run earlier on the same rank: built-in (trusted) lists get that from the
    rank's order alone; other lists keep the edges, so that a misordered list deadlocks."""
    nd, kids, f_op, b_op = top.num_deps, top.children, top.f_op, top.b_op
    # the loop runs once per action (10^5 on deep pipelines): the lists it appends to are locals
    boundary, resource, transfers, child_of = (top.transfer_boundary, top.transfer_resource, top.transfers,
                                               top.transfer_child)
    transfers_out, resource_names = top.transfers_out, top.resource_names
    last = max((k for _, k in top.code_stage), default=0)
    links: dict[tuple[int, int], int] = {}
    for r, rank_ops in enumerate(top.ops):
        base = top.rank_base[r]
        for j, (code, k, i) in enumerate(rank_ops):
            op = base + j
            idx = k * m + i
            if code == 0:
                if not k:
                    continue
                src, forward = f_op[idx - m], True
            elif code == 3:
                if trusted:
                    continue
                src, forward = b_op[idx], None
            else:
                own = f_op[idx]
                if own >= 0 and not trusted:
                    _child(kids, own, op)
                    nd[op] += 1
                if k == last:
                    continue
                src, forward = b_op[idx + m], False
            if src < 0:
                continue  # a malformed list: validate_actions reports it
            nd[op] += 1
            if forward is None:
                _child(kids, src, op)
                continue
            sender = owner[src]
            if sender == r:
                rid = engine.NO_RESOURCE  # on one rank a transfer is a plain delay, no link
            else:
                rid = links.get((sender, r), -1)
                if rid < 0:
                    rid = links[(sender, r)] = len(resource_names)
                    resource_names.append(("link", names[sender], names[r]))
            if as_ops:
                t = len(nd)
                nd.append(1)
                kids.append([op])
                top.chained.append(False)
                _child(kids, src, t)
            else:
                t = len(child_of)
                child_of.append(op)
                out = transfers_out[src]
                if out is None:
                    transfers_out[src] = [t]
                else:
                    out.append(t)
            boundary.append((forward, k))
            resource.append(rid)
            transfers.append((t, "SF" if forward else "SB", k, i))


def _child(kids: list[list[int] | None], parent: int, op: int) -> None:
    out = kids[parent]
    if out is None:
        kids[parent] = [op]
    else:
        out.append(op)


def finish(built: PipelineGraph, schedule: engine.Schedule) -> Trace:
    """The trace of a timed pipeline graph: per-rank times, held activation bytes and peaks.

    Raises:
        InvalidProblemError: some action never ran (a deadlock).
    """
    if not schedule.done:
        raise InvalidProblemError(_deadlock_message(built, schedule))
    act = built.durations.activation_bytes
    starts, ends, held_after, peak_bytes, peak_count = [], [], [], [], []
    for r, rank_ops in enumerate(built.ops):
        base = built.rank_base[r]
        n = len(rank_ops)
        starts.append(schedule.start_s[base : base + n])
        ends.append(schedule.end_s[base : base + n])
        held, count, top_bytes, top_count, after = 0.0, 0, 0.0, 0, []
        for code, k, _ in rank_ops:
            if code == 0:
                held += act[k]
                count += 1
                if held > top_bytes:
                    top_bytes = held
                if count > top_count:
                    top_count = count
            elif code != 2:
                held -= act[k]
                count -= 1
            after.append(held)
        held_after.append(after)
        peak_bytes.append(top_bytes)
        peak_count.append(top_count)
    return Trace(ops=built.ops, starts=starts, ends=ends, held_bytes=held_after,
                 peak_activation_bytes=peak_bytes, peak_inflight=peak_count)


def link_events(built: PipelineGraph, schedule: engine.Schedule) -> list[tuple[str, str, int, int, float, float]]:
    """Every timed link transfer: (link label ``"link a->b"``, kind, virtual stage, microbatch, start, end)."""
    graph, out = built.graph, []
    for x, kind, k, i in built.transfers:
        as_op = built.sends_as_ops or kind in ("EV", "LD")
        rid = graph.resource[x] if as_op else graph.transfer_resource[x]
        if rid < 0:
            continue  # a transfer that takes no time
        _, src, dst = graph.resource_names[rid]  # type: ignore[misc]
        times = (schedule.start_s[x], schedule.end_s[x]) if as_op else (schedule.transfer_start_s[x],
                                                                         schedule.transfer_end_s[x])
        out.append((f"link {src}->{dst}", kind, k, i, *times))
    return out


def _blocked_key(built: PipelineGraph, end: list[float], code: int, k: int, i: int) -> int:
    """The key an untimed action waits on: idx for an F, num_keys + idx for a B/I."""
    m = built.num_microbatches
    num_keys = len(built.f_op)
    idx = k * m + i
    if code == 0:
        return idx - m
    if code == 3:
        return num_keys + idx
    own = built.f_op[idx]
    if own >= 0 and end[own] != end[own]:  # nan: not timed
        return idx
    return num_keys + idx + m


def _key_action(key: int, num_keys: int, m: int, ops: list[list[tuple[int, int, int]]], stage_rank: dict[int, int]) -> str:
    """The action a waiting key stands for (B or I, whichever the owning rank runs)."""
    backward, idx = divmod(key, num_keys)
    k, i = divmod(idx, m)
    if not backward:
        return f"{k}F{i}"
    rank = stage_rank.get(k)
    kinds = {c for c, s, mb in ops[rank] if s == k and mb == i} if rank is not None else set()
    return f"{k}{'I' if 2 in kinds else 'B'}{i}"


def _deadlock_message(built: PipelineGraph, schedule: engine.Schedule) -> str:
    ops, m, num_keys = built.ops, built.num_microbatches, len(built.f_op)
    stage_rank = {k: r for r, rank_ops in enumerate(ops) for _, k, _ in rank_ops}
    end = schedule.end_s
    pos = []
    for r, rank_ops in enumerate(ops):
        base = built.rank_base[r]
        pos.append(next((j for j in range(len(rank_ops)) if end[base + j] != end[base + j]), len(rank_ops)))

    def next_action(r: int) -> str:
        if pos[r] >= len(ops[r]):
            return "none (it has finished)"
        code, k, i = ops[r][pos[r]]
        return f"{k}{KIND_NAME[code]}{i}"

    lines = []
    for r, rank_ops in enumerate(ops):
        if pos[r] >= len(rank_ops):
            continue
        code, k, i = rank_ops[pos[r]]
        key = _blocked_key(built, end, code, k, i)
        waited = _key_action(key, num_keys, m, ops, stage_rank)
        owner = stage_rank[key % num_keys // m]
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
