"""PipeDream's 1F1B-RR with weight stashing: per-stage replication, no flush (seed 001).

A plan whose stages are replicated differently from ``degrees.data`` (PipeDream's DP gives
every stage its own replication factor r_s, dissertation L1184-1190) runs this way:

- round robin (1F1B-RR, L1350-1379): input i goes to replica i mod r_s of stage s, so one
  input's forward and backward run on the same replica;
- each replica runs 1F1B over its own inputs with w_s = ceil(workers of stages s.. / r_s)
  forwards in flight (NOAM per stage, L1311-1348; for the input stage this is the
  dissertation's ceil(workers / input-stage replicas));
- weight stashing (L1389-1409): a replica keeps one weight version per input in flight, so its
  static memory grows by (peak in flight - 1) x its weight bytes;
- the weight all-reduce among a stage's replicas runs after every input and overlaps the
  compute of later inputs (asynchronous, L1168-1180); a replica is throttled to one all-reduce
  per input, so its time per input is max(F + R + B, all-reduce), the same max(.) as the DP's
  T^k (L1237-1245): the simulator stretches the backward to that;
- there is no flush: the iteration is the steady-state time of n = num_microbatches x r_0
  inputs, measured like PipeDream-2BW's (``report.steady_result``) on a run of 2 f + 1
  iterations back to back, f = ceil(workers / n) iterations to fill the pipeline.

Replica classes: with g = gcd(r_s), input i goes to replica i mod r_s, whose index is i mod g
modulo g, so the workers split into g classes (replica j of every stage in class j mod g) that
exchange nothing: class c runs the inputs i = c mod g on links of its own, with the warm-up,
period and fill of the pipeline of r_s / g replicas. All inputs are ready at time 0, so every
class runs the same timeline as that reduced pipeline (class 0's input g i' is its input i').
The simulation runs the reduced pipeline once (1/g of the operations) and maps its result
back: the same iteration time, stage results and replica-0 events (microbatch g i'), the bubble
fraction over g copies of its workers. ``tests/cost_models/test_sim_rr.py`` checks it equals
the simulation of every replica.

The result has one ``StageResult`` per stage: replica 0's busy and idle time and bubbles, the
largest peak memory and in-flight count of the stage's replicas; ``bubble_fraction`` counts
every worker; timeline events are replica 0's. Each worker pair has its own link per direction
(``cost_models.sim.pipeline``), shared by the inputs that cross it one after another.
"""

from __future__ import annotations

import math

from cost_models.sim import pipeline as engine
from cost_models.sim import report
from cost_models.sim.costs import PipelineCosts
from planner.schema import Plan, SimResult, StageResult

FILL_FACTOR = 2

__all__ = ["is_round_robin", "rr_bottleneck_s", "simulate_rr", "warmup_inputs"]


def is_round_robin(plan: Plan) -> bool:
    """True when some stage's replication differs from ``degrees.data`` (PipeDream plans)."""
    return any(stage.replicas != plan.degrees.data for stage in plan.stages)


def warmup_inputs(replicas: list[int]) -> list[int]:
    """Inputs each replica of stage s admits before its first backward: ceil(sum r_s.. / r_s)."""
    return [-(-sum(replicas[s:]) // r) for s, r in enumerate(replicas)]


def rr_bottleneck_s(costs: PipelineCosts, replicas: list[int]) -> float:
    """Steady-state time per input of the slowest replicated stage: max(compute, all-reduce) / r_s."""
    return max(
        max(costs.forward_s[s] + costs.backward_s[s] + costs.recompute_s[s], costs.allreduce_s[s]) / r
        for s, r in enumerate(replicas)
    )


def simulate_rr(plan: Plan, costs: PipelineCosts, *, include_events: bool = True,
                classes: int | None = None) -> SimResult:
    """Steady-state iteration of a plan with per-stage replication (see the module docstring).

    ``classes``: the replica classes simulated as one (default gcd(r_s), the most that are
    identical; 1 simulates every replica)."""
    full = [stage.replicas for stage in plan.stages]
    g = math.gcd(*full) if classes is None else classes
    if any(r % g for r in full):
        raise ValueError(f"classes={g} must divide every stage's replicas {full}")
    replicas = [r // g for r in full]
    num_workers = sum(replicas)
    n = plan.num_microbatches * replicas[0]
    # The round robin repeats every lcm(r_s) inputs: measure K iterations, a whole period.
    period = math.lcm(*replicas)
    k = period // math.gcd(period, n)
    fill = -(-FILL_FACTOR * num_workers // (n * k))
    total = (2 * fill + 1) * n * k
    ops, owner = _replica_ops(replicas, total)
    rec, fwd, bwd = costs.recompute_s, costs.forward_s, costs.backward_s
    # Throttle each replica to one all-reduce per input: F + B' = max(F + R + B, all-reduce).
    backward = [max(rec[s] + bwd[s], costs.allreduce_s[s] - fwd[s]) for s in range(len(replicas))]
    durations = engine.Durations(
        forward_s=fwd, backward_s=backward, input_s=backward, weight_s=[0.0] * len(replicas),
        activation_bytes=costs.activation_bytes, send_forward_s=costs.send_forward_s,
        send_backward_s=costs.send_backward_s,
    )
    trace = engine.run(ops, num_microbatches=total, durations=durations, trusted=True)  # built here: F before B
    layers = plan.model.layers
    weights = [math.fsum(layers[i].param_bytes for i in range(*stage.chunks[0].layers)) for stage in plan.stages]
    static = [costs.static_bytes[s] + max(0, trace.peak_inflight[w] - 1) * weights[s] for w, s in enumerate(owner)]
    result = report.steady_result(
        trace, num_microbatches=n * k, measured_batch=fill, recompute_s=rec, static_bytes=static,
        allreduce_s=[0.0] * num_workers, capacity_bytes=costs.memory_capacity_bytes,
        samples_per_iteration=float(plan.global_batch_size), include_events=include_events,
    )
    if g > 1:
        result = _all_classes(result, g)
    return _per_stage(result, owner, float(max(costs.allreduce_s, default=0.0)), k)


def _all_classes(result: SimResult, g: int) -> SimResult:
    """The result of g identical replica classes from one: the bubble fraction over g copies of the
    workers (``math.fsum`` is exact, so the order of the copies does not matter), class 0's input
    i' is the plan's input g i'."""
    iteration = result.iteration_time_s
    idle = math.fsum([s.idle_s for s in result.stages] * g)
    bubble = idle / (iteration * len(result.stages) * g) if iteration > 0 else 0.0
    events = tuple(e._replace(microbatch=e.microbatch * g) for e in result.events)
    return result.model_copy(update={"bubble_fraction": bubble, "events": events})


def _replica_ops(replicas: list[int], total: int) -> tuple[list[list[tuple[int, int, int]]], list[int]]:
    """Engine ops per worker (stage-major, replica within stage) and each worker's stage."""
    ops: list[list[tuple[int, int, int]]] = []
    owner: list[int] = []
    for s, (r, warmup) in enumerate(zip(replicas, warmup_inputs(replicas))):
        for j in range(r):
            mine = list(range(j, total, r))
            w = min(warmup, len(mine))
            seq = [(0, s, i) for i in mine[:w]]
            for x, i in enumerate(mine[w:]):
                seq += [(1, s, mine[x]), (0, s, i)]
            seq += [(1, s, i) for i in mine[len(mine) - w:]]
            ops.append(seq)
            owner.append(s)
    return ops, owner


def _per_stage(result: SimResult, owner: list[int], allreduce_s: float, k: int) -> SimResult:
    stages: list[StageResult] = []
    first_worker: dict[int, int] = {}
    for w, s in enumerate(owner):
        first_worker.setdefault(s, w)
    for s, w0 in sorted(first_worker.items()):
        mine = [result.stages[w] for w, o in enumerate(owner) if o == s]
        stages.append(mine[0].model_copy(update={
            "index": s,
            "peak_memory_bytes": max(x.peak_memory_bytes for x in mine),
            "peak_inflight_microbatches": max(x.peak_inflight_microbatches for x in mine),
        }))
    stage_of_first = {w0: s for s, w0 in first_worker.items()}
    events = tuple(e._replace(rank=stage_of_first[e.rank]) for e in result.events if e.rank in stage_of_first)
    if k > 1:
        return _one_iteration(result.model_copy(update={"stages": tuple(stages), "events": events}), k, allreduce_s)
    return result.model_copy(update={"stages": tuple(stages), "events": events, "allreduce_s": allreduce_s})


def _one_iteration(result: SimResult, k: int, allreduce_s: float) -> SimResult:
    """Scale a window of k iterations to one: mean busy and idle, the first iteration's bubbles and events."""
    iteration = result.iteration_time_s / k
    stages = tuple(
        s.model_copy(update={
            "busy_s": s.busy_s / k, "idle_s": s.idle_s / k,
            "bubbles": tuple(b.model_copy(update={"end_s": min(b.end_s, iteration)})
                             for b in s.bubbles if b.start_s < iteration),
        })
        for s in result.stages
    )
    events = tuple(e._replace(end_s=min(e.end_s, iteration)) for e in result.events if e.start_s < iteration)
    return result.model_copy(update={
        "iteration_time_s": iteration, "throughput_samples_per_s": result.throughput_samples_per_s * k,
        "stages": stages, "events": events, "allreduce_s": allreduce_s,
    })
