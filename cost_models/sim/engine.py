"""The discrete-event engine every simulation runs on: operations, streams and shared resources.

A simulation is a ``Graph`` of operations. Each operation has a duration, the operations it
waits for (``deps``) and, optionally, a shared resource it occupies while it runs. ``run``
times the graph:

- an operation becomes *ready* when the last of its dependencies ends (or starts, for the
  dependencies added with ``add_start_dep``);
- an operation without a resource starts when it is ready (a device's compute stream is such a
  chain: each operation depends on the stream's previous one, given by ``stream=`` or, for a
  stream built in one piece, by ``chained``; it never runs two at once and needs no
  arbitration);
- a *transfer* (``add_transfer``) is a light edge: it leaves when its sender ends, occupies an
  ordered resource for its duration and delivers to its receiver;
- a resource (a link direction, a host link, a node's CPU) runs one operation at a time,
  non-preemptively, at its full speed. When it frees, the waiting operation that became ready
  first starts; ties go to the operation created first (program order). Two transfers that
  want one link at the same time therefore take twice as long together as one alone: the
  second starts when the first ends (FIFO sharing, not fair share). An operation may hold
  several resources at once (``also``); it starts when all of them are free.

Events are processed in time order with one heap that holds only operations that need a
shared resource; operations without one are timed as soon as they are ready, so a pipeline's
compute chains cost no heap traffic, and so are those of an *ordered* resource (one whose
operations are all produced by one stream, hence become ready in time order: a pipeline link),
which FIFO serves in that order. The start times are those of list scheduling; an operation whose
dependencies never end (a cycle, e.g. a deadlocked action list) is left untimed (``nan``) and
``Schedule.done`` is False.
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import math
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field

__all__ = ["Graph", "Schedule", "gc_paused", "run"]

NO_RESOURCE = -1
_EPS = 1e-12


@dataclass(slots=True)
class Graph:
    """Operations to time. Build with ``add``; ``resource_names[r]`` names resource id r."""

    duration_s: list[float] = field(default_factory=list)
    resource: list[int] = field(default_factory=list)
    """Resource id per operation, ``NO_RESOURCE`` (-1) for none."""
    num_deps: list[int] = field(default_factory=list)
    children: list[list[int] | None] = field(default_factory=list)
    chained: list[bool] = field(default_factory=list)
    """Per operation: the next operation (id + 1) waits for it, without a ``children`` entry
    (a compute stream built in one piece, as pipelines are)."""
    resource_names: list[Hashable] = field(default_factory=list)
    also_holds: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Further resources an operation occupies together with its first one (``add(also=...)``)."""
    start_children: dict[int, list[int]] = field(default_factory=dict)
    """Operations that wait for the *start* of an operation (``add_start_dep``)."""
    _resource_ids: dict[Hashable, int] = field(default_factory=dict)
    _stream_last: dict[Hashable, int] = field(default_factory=dict)

    ordered: list[bool] = field(default_factory=list)
    """Per resource: served in the order its operations become ready, timed without the heap."""
    transfers_out: list[list[int] | None] = field(default_factory=list)
    """Per operation: the transfers (``add_transfer``) that leave when it ends, or None."""
    transfer_child: list[int] = field(default_factory=list)
    transfer_s: list[float] = field(default_factory=list)
    transfer_resource: list[int] = field(default_factory=list)

    def resource_id(self, name: Hashable, *, ordered: bool = False) -> int:
        """The id of a named resource (created on first use).

        Args:
            ordered: the caller guarantees that the resource's operations become ready in
                nondecreasing time order as the engine releases them (all are produced by one
                stream, e.g. a pipeline rank's sends on one link). FIFO then needs no heap:
                each operation is timed when it is released. Any other use (another
                ``add`` on the same resource) makes it unordered.
        """
        rid = self._resource_ids.get(name)
        if rid is None:
            rid = self._resource_ids[name] = len(self.resource_names)
            self.resource_names.append(name)
            self.ordered.append(ordered)
        elif not ordered:
            self.ordered[rid] = False
        return rid

    def add(
        self,
        duration_s: float,
        *,
        deps: Sequence[int] = (),
        resource: Hashable | None = None,
        also: Sequence[Hashable] = (),
        stream: Hashable | None = None,
    ) -> int:
        """Add an operation and return its id.

        Args:
            duration_s: how long it occupies its resource (or just takes, without one).
            deps: operations it waits for; negative ids are ignored.
            resource: a shared resource it occupies (see the module docstring).
            also: more resources it occupies at the same time (a GPU peer copy over PCIe holds
                the sender's and the receiver's host links); it starts when all are free.
            stream: keeps program order: the operation also waits for the previous one added
                with the same stream.
        """
        # Offload simulations add some 10^5 operations: ``resource_id`` and ``_child`` are inlined.
        op = len(self.duration_s)
        preds = {d for d in deps if d >= 0}
        if stream is not None:
            prev = self._stream_last.get(stream)
            if prev is not None:
                preds.add(prev)
            self._stream_last[stream] = op
        self.duration_s.append(duration_s)
        self.transfers_out.append(None)
        rid = NO_RESOURCE if resource is None else self._resource_ids.get(resource)
        if rid is None:
            rid = self.resource_id(resource)
        elif rid >= 0:
            self.ordered[rid] = False  # what ``resource_id(resource)`` does for a known name
        self.resource.append(rid)
        if also:
            assert resource is not None, "give the first resource as 'resource'"
            self.also_holds[op] = tuple(self.resource_id(name) for name in also)
        self.num_deps.append(len(preds))
        children = self.children
        children.append([])
        self.chained.append(False)
        for p in preds:
            kids = children[p]
            if kids is None:
                children[p] = [op]
            else:
                kids.append(op)
        return op

    def _child(self, parent: int, op: int) -> None:
        kids = self.children[parent]
        if kids is None:
            self.children[parent] = [op]
        else:
            kids.append(op)

    def add_dep(self, op: int, dep: int) -> None:
        """Make ``op`` also wait for ``dep`` (ids from ``add``; call before ``run``)."""
        self._child(dep, op)
        self.num_deps[op] += 1

    def add_transfer(self, src: int, dst: int, duration_s: float, *, resource: Hashable | None = None) -> int:
        """A transfer from ``src`` to ``dst``: it leaves when src ends, takes ``duration_s`` on an
        ordered resource (FIFO in the order its senders end; see ``resource_id``), and dst waits
        for its arrival. Lighter than an operation; times in ``Schedule.transfer_start_s``.
        """
        x = len(self.transfer_child)
        self.transfer_child.append(dst)
        self.transfer_s.append(duration_s)
        self.transfer_resource.append(NO_RESOURCE if resource is None else self.resource_id(resource, ordered=True))
        out = self.transfers_out[src]
        if out is None:
            self.transfers_out[src] = [x]
        else:
            out.append(x)
        self.num_deps[dst] += 1
        return x

    def add_start_dep(self, op: int, dep: int) -> None:
        """Make ``op`` also wait for ``dep`` to start (a transfer issued together with an action)."""
        self.start_children.setdefault(dep, []).append(op)
        self.num_deps[op] += 1

    def __len__(self) -> int:
        return len(self.duration_s)


@dataclass(frozen=True, slots=True)
class Schedule:
    """Start and end time of every operation (``nan`` for those never run)."""

    start_s: list[float]
    end_s: list[float]
    transfer_start_s: list[float]
    transfer_end_s: list[float]
    done: bool
    """False when some operation never became ready (a dependency cycle)."""


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a simulation allocates its graph and report.

    A 64 x 512 pipeline allocates a few hundred thousand lists, tuples and floats, none of them in
    a reference cycle; the collector's full passes over them took about half of the simulation's
    CPU time. Reference counting still frees everything; the collector resumes (if it was on)
    when the block ends, also on an exception, and nested blocks keep the outer state.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def run(graph: Graph) -> Schedule:
    """Time every operation of the graph (see the module docstring for the rules)."""
    n = len(graph.duration_s)
    dur, res, kids, ordered, chained = graph.duration_s, graph.resource, graph.children, graph.ordered, graph.chained
    start_kids, also = graph.start_children, graph.also_holds
    st = _Run(graph)
    stack, heap, ready, waiting, start, end, free = st.stack, st.heap, st.ready, st.waiting, st.start, st.end, st.free
    push, pop, append = heapq.heappush, heapq.heappop, stack.append
    release = st.release
    txo, t_child, t_s, t_res = graph.transfers_out, graph.transfer_child, graph.transfer_s, graph.transfer_resource
    t_start, t_end = st.transfer_start, st.transfer_end
    assert all(ordered[r] for r in set(t_res) if r >= 0), "transfers need resources only they use (ordered)"
    timed = 0
    while True:
        # The hot loop: one pass per operation, the release of its children inlined.
        while stack:
            op = stack.pop()
            if op < 0:  # timed when released (an ordered resource): release its children now
                op = ~op
                e = end[op]
            else:
                t = ready[op]
                if res[op] >= 0:
                    push(heap, (t, op))
                    continue
                e = t + dur[op]
                start[op] = t
                end[op] = e
                timed += 1
            if start_kids and op in start_kids:
                release(start_kids[op], start[op])
            if chained[op]:  # the stream's next operation
                c = op + 1
                if e > ready[c]:
                    ready[c] = e
                w = waiting[c] - 1
                waiting[c] = w
                if not w:
                    if res[c] >= 0:
                        st.ready_now(c)
                    else:
                        append(c)
            ks = kids[op]
            if ks is not None:
                for c in ks:
                    if e > ready[c]:
                        ready[c] = e
                    w = waiting[c] - 1
                    waiting[c] = w
                    if not w:
                        r = res[c]
                        if r >= 0 and ordered[r]:
                            begin = ready[c]
                            if free[r] > begin:
                                begin = free[r]
                            start[c] = begin
                            end[c] = free[r] = begin + dur[c]
                            timed += 1
                            append(~c)
                        else:
                            append(c)
            tx = txo[op]
            if tx is None:
                continue
            for x in tx:  # transfers leave now, each on its ordered resource (FIFO in send order)
                r = t_res[x]
                begin = e
                if r >= 0:
                    if free[r] > begin:
                        begin = free[r]
                    arrive = free[r] = begin + t_s[x]
                else:
                    arrive = begin + t_s[x]
                t_start[x] = begin
                t_end[x] = arrive
                c = t_child[x]
                if arrive > ready[c]:
                    ready[c] = arrive
                w = waiting[c] - 1
                waiting[c] = w
                if not w:
                    if res[c] >= 0:
                        st.ready_now(c)
                    else:
                        append(c)
        if not heap:
            break
        t, op = pop(heap)
        r = res[op]
        more = also.get(op, ()) if also else ()
        busy_until = max([free[r]] + [free[x] for x in more]) if more else free[r]
        if busy_until > t + _EPS:
            push(heap, (busy_until, op))  # a resource was taken meanwhile: wait for it
            continue
        t = max(t, busy_until)
        e = t + dur[op]
        start[op] = t
        end[op] = e
        free[r] = e
        for x in more:
            free[x] = e
        timed += 1
        if start_kids and op in start_kids:
            release(start_kids[op], t)
        if chained[op]:
            release([op + 1], e)
        release(kids[op] or (), e)
        if txo[op] is not None:
            st.send(txo[op], e)
    return Schedule(start_s=start, end_s=end, transfer_start_s=t_start, transfer_end_s=t_end,
                    done=timed + st.timed == n)


class _Run:
    """Mutable state of one ``run`` (private)."""

    def __init__(self, graph: Graph) -> None:
        n = len(graph.duration_s)
        self.graph = graph
        self.waiting = list(graph.num_deps)
        self.ready = [0.0] * n
        self.start, self.end = [math.nan] * n, [math.nan] * n
        self.free = [0.0] * len(graph.resource_names)
        self.heap: list[tuple[float, int]] = []
        self.stack = [op for op in range(n - 1, -1, -1) if self.waiting[op] == 0]
        self.timed = 0
        self.transfer_start = [math.nan] * len(graph.transfer_child)
        self.transfer_end = [math.nan] * len(graph.transfer_child)

    def release(self, children: Sequence[int], t: float) -> None:
        """Children whose dependency ended (or started) at t: ready ones go on the stack.

        An operation on an ordered resource is timed here, at release, so that the resource
        serves its operations in release order whatever order the stack pops them in.
        """
        ready, waiting = self.ready, self.waiting
        for c in children:
            if t > ready[c]:
                ready[c] = t
            waiting[c] -= 1
            if not waiting[c]:
                self.ready_now(c)

    def ready_now(self, c: int) -> None:
        """c's last dependency ended: time it now if it is on an ordered resource, else stack it."""
        r = self.graph.resource[c]
        if r >= 0 and self.graph.ordered[r]:
            begin = self.ready[c]
            if self.free[r] > begin:
                begin = self.free[r]
            self.start[c] = begin
            self.end[c] = self.free[r] = begin + self.graph.duration_s[c]
            self.timed += 1
            self.stack.append(~c)
        else:
            self.stack.append(c)

    def send(self, transfers: list[int], t: float) -> None:
        """Transfers leaving at t (from an operation timed off the hot loop)."""
        g, free = self.graph, self.free
        for x in transfers:
            r = g.transfer_resource[x]
            begin = max(t, free[r]) if r >= 0 else t
            arrive = begin + g.transfer_s[x]
            if r >= 0:
                free[r] = arrive
            self.transfer_start[x], self.transfer_end[x] = begin, arrive
            c = g.transfer_child[x]
            self.release([c], arrive)
