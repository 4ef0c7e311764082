"""The engine's dispatch mode: jobs released over time, list-scheduled onto servers by a policy.

``engine.run`` times operations whose resource and order are fixed in the graph. Job
schedulers instead decide at run time which queued job a free server takes (PipeFill's fill-job
scheduler: a free GPU takes the queued job with the best score). ``dispatch`` is that event
loop, the one for every such scheduler: events are job releases and job completions, in time
order; at each event time the queue receives the released jobs, then every free server, in
index order, asks ``choose`` for a queued job, which runs there without preemption for
``duration_s(job, server)``. No job starts at or after ``horizon_s``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Started", "dispatch"]


@dataclass(frozen=True, slots=True)
class Started:
    """A job that ran: on which server, from when to when."""

    job: int
    server: int
    start_s: float
    end_s: float


Choose = Callable[[list[int], int, float, list[float]], "int | None"]
"""(queue of job ids, free server, now, every server's busy-until time) -> position in the queue
of the job to start on that server, or None to leave the server idle until the next event."""


def dispatch(
    num_servers: int,
    release_s: Sequence[float],
    duration_s: Callable[[int, int], float],
    choose: Choose,
    *,
    horizon_s: float = math.inf,
) -> list[Started]:
    """Run the jobs on the servers; returns every started job in start order (see the module docstring)."""
    order = sorted(range(len(release_s)), key=lambda j: (release_s[j], j))
    busy_until = [0.0] * num_servers
    queue: list[int] = []
    started: list[Started] = []
    completions: list[float] = []  # end times: the next event besides releases
    nxt, now = 0, 0.0
    while now < horizon_s:
        while nxt < len(order) and release_s[order[nxt]] <= now:
            queue.append(order[nxt])
            nxt += 1
        for server in range(num_servers):
            if busy_until[server] > now or not queue:
                continue
            pos = choose(queue, server, now, busy_until)
            if pos is None:
                continue
            job = queue.pop(pos)
            end = now + duration_s(job, server)
            busy_until[server] = end
            started.append(Started(job, server, now, end))
            heapq.heappush(completions, end)
        events = [release_s[order[nxt]]] if nxt < len(order) else []
        if completions:
            events.append(completions[0])
        if not events:
            break
        now = min(events)
        while completions and completions[0] <= now:
            heapq.heappop(completions)
    return started
