"""The simulator's engine and the models that run on it (the public API of ``cost_models.sim``).

- ``engine``: the one discrete-event engine: operations with durations and dependencies,
  streams that keep program order, shared resources (links, host links, CPUs) with FIFO
  sharing. Every simulation below builds an ``engine.Graph`` and calls ``engine.run``.
- ``pipeline``: per-rank action lists (every built-in schedule, ``custom``, 2BW and PipeDream's
  1F1B-RR replicas) as compute chains plus point-to-point link transfers;
- ``bpipe``: BPipe's activation evictions and loads on the pair links;
- ``offload``: SPipe / Mobius / ZeRO-Offload: host-link prefetch and gradient offload, CPU
  optimizer steps, collectives;
- ``sync``: each rank's data-parallel gradient synchronisation as collectives on its
  communication stream, holding the NICs they cross (shared with the pipeline's sends);
- ``fill``: PipeFill's fill pieces on each GPU's compute stream in the main job's bubbles;
- ``dispatch``: the engine's dispatch mode: released jobs list-scheduled onto servers by a
  policy (PipeFill's fill-job scheduler);
- ``costs``, ``report``, ``rr``: the costs a plan implies, the output contract, 1F1B-RR.

``cost_models.simulate`` is the entry point that picks the model from the plan's types.
"""

from __future__ import annotations

from cost_models.sim.engine import Graph, Schedule, run

__all__ = ["Graph", "Schedule", "run"]
