"""Simulator of offloaded training: GPU streams next to host links and CPU optimizer timelines.

Implements the event model of reading shared/design/stage-ilp-spipe-bpipe.md B.6 [REC] for SPipe
(seed 003) and its baselines. Every operation runs on one resource, non-preemptively; a resource
serves the ready operation that can start first (ties: the one created first):

- ``gpu g``: the compute stream; F and B (recompute included) in the plan's fixed order;
- ``h2d`` / ``d2h`` of each host link: parameter prefetch p_i and gradient offload g_i; GPUs behind
  one PCIe switch share a link, and each GPU's copies keep their stream order (seed 003 L224);
- ``cpu`` of each node: optimizer steps o_i (threads sharing the cores, L233);
- point-to-point activations, gradients and checkpoints take latency + bytes / bandwidth and
  delay only their consumer, as in the main simulator.

Dependencies (B.6): f_i^j after f_{i-1}^j and p_i; b_n^j after b_{n+1}^j, its checkpoint c_n^j
(the input of backward stage n, sent as soon as f_i^j finishes, L186-188) and p_n; p of a GPU's v-th stage after its (v-2)-th
stage finished (two buffers, L101) or its (v-1)-th without prefetch; g_n after b_n's last
microbatch; o_n after g_n (SPipe's asynchronous optimizer, L206-212) or after every g (the
synchronous overflow check of Fig. 3, L115-127). The iteration ends with the last operation.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from cost_models.memory import usable_memory_bytes
from cost_models import offload
from planner.errors import InvalidProblemError
from planner.schema import Bubble, Plan, SimResult, StageResult, TimelineEvent

_EPS = 1e-12


class ResourceEvent(NamedTuple):
    """One interval on a host link or a CPU: kind P (prefetch), G (gradient offload), O (step)."""

    resource: str
    gpu: int
    kind: str
    stage: int
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class OffloadResult:
    """The standard ``SimResult`` plus the host-link and CPU timelines of an offloaded plan."""

    sim: SimResult
    transfers: tuple[ResourceEvent, ...]
    cpu: tuple[ResourceEvent, ...]
    gpu_makespan_s: float
    """From the first prefetch to the last gradient offload (the artifact's ``gpu_latency``)."""
    cpu_exposed_s: float
    """Optimizer time not hidden behind the GPUs: iteration - gpu_makespan_s (Fig. 15's CPU bar)."""
    gpu_memory_bytes: tuple[float, ...]
    cpu_memory_bytes: tuple[float, ...]
    """Model states per node."""
    fits_cpu_memory: bool


@dataclass(slots=True)
class _Graph:
    """Operations with a duration, a resource, a stream (order kept) and dependencies."""

    duration: list[float] = field(default_factory=list)
    resource: list[Hashable | None] = field(default_factory=list)
    deps: list[list[int]] = field(default_factory=list)
    meta: list[tuple[Any, ...]] = field(default_factory=list)
    _last: dict[Hashable, int] = field(default_factory=dict)

    def add(self, duration: float, meta: tuple[Any, ...], *, resource: Hashable | None = None,
            stream: Hashable | None = None, deps: Sequence[int] = ()) -> int:
        op = len(self.duration)
        preds = [d for d in deps if d >= 0]
        if stream is not None:
            if stream in self._last:
                preds.append(self._last[stream])
            self._last[stream] = op
        self.duration.append(duration)
        self.resource.append(resource)
        self.deps.append(preds)
        self.meta.append(meta)
        return op


def _schedule(graph: _Graph) -> tuple[list[float], list[float]]:
    """Start and end times: list scheduling, starts popped in nondecreasing order."""
    n = len(graph.duration)
    children: list[list[int]] = [[] for _ in range(n)]
    waiting = [len(d) for d in graph.deps]
    for op, preds in enumerate(graph.deps):
        for p in preds:
            children[p].append(op)
    ready = [0.0] * n
    start, end = [math.nan] * n, [math.nan] * n
    free: dict[Hashable, float] = defaultdict(float)
    heap = [(0.0, op) for op in range(n) if waiting[op] == 0]
    heapq.heapify(heap)
    done = 0
    while heap:
        est, op = heapq.heappop(heap)
        res = graph.resource[op]
        begin = max(ready[op], free[res]) if res is not None else ready[op]
        if begin > est + _EPS:
            heapq.heappush(heap, (begin, op))  # the resource was taken meanwhile
            continue
        start[op], end[op] = begin, begin + graph.duration[op]
        if res is not None:
            free[res] = end[op]
        done += 1
        for child in children[op]:
            ready[child] = max(ready[child], end[op])
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(heap, (ready[child], child))
    assert done == n, "offload graph has a cycle"
    return start, end


# ------------------------------------------------------------------------------------------
# Plan -> graph
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class _Setup:
    plan: Plan
    host: offload.HostSpec
    forward: tuple[tuple[int, int], ...]
    forward_gpus: tuple[int, ...]
    backward: tuple[tuple[int, int], ...]
    backward_gpus: tuple[int, ...]
    num_gpus: int
    async_optimizer: bool
    prefetch: bool
    recompute: str


def offload_options(plan: Plan) -> dict[str, Any]:
    """The plan's ``options['offload']`` section.

    Raises:
        InvalidProblemError: the plan has none.
    """
    section = plan.options.get("offload")
    if not isinstance(section, dict):
        raise InvalidProblemError(
            f"plan of solver {plan.solver!r} has no options['offload'] section; only plans of the "
            "spipe, mobius and zero-offload solvers can be simulated as offloaded pipelines"
        )
    return section


def _setup(plan: Plan) -> _Setup:
    opts = offload_options(plan)
    host = offload.host_spec(plan.cluster, {"host": opts.get("host") or {}})
    g = plan.cluster.num_devices
    forward = tuple(c.layers for c in plan.virtual_stages())
    if opts.get("mode") == "zero-offload":
        per_layer = tuple((i, i + 1) for i in range(plan.model.num_layers))
        forward, backward, fgpus, bgpus = per_layer, per_layer, (0,) * len(per_layer), (0,) * len(per_layer)
    else:
        backward = tuple(tuple(r) for r in opts["backward_stages"])  # type: ignore[misc]
        fgpus = tuple(offload.forward_gpu(i, g) for i in range(len(forward)))
        bgpus = tuple(int(x) for x in opts["backward_gpus"])
        if len(bgpus) != len(backward) or any(not 0 <= x < g for x in bgpus):
            raise InvalidProblemError(
                f"options.offload.backward_gpus={list(bgpus)} must give one GPU in [0, {g}) per backward stage"
            )
    return _Setup(plan=plan, host=host, forward=forward, forward_gpus=fgpus, backward=backward,
                  backward_gpus=bgpus, num_gpus=g, async_optimizer=bool(opts.get("async_optimizer", False)),
                  prefetch=bool(opts.get("prefetch", True)), recompute=str(opts.get("recompute", "full")))


def _range_times(s: _Setup, layers: tuple[int, int]) -> tuple[float, float]:
    model = s.plan.model.layers
    fwd = sum(model[i].forward_s for i in range(*layers))
    bwd = sum(model[i].backward_s + offload.recompute_extra_s(model[i], s.recompute) for i in range(*layers))
    return fwd, bwd


def _p2p_s(s: _Setup, src: int, dst: int, num_bytes: float) -> float:
    if src == dst:
        return 0.0
    bw, latency = s.plan.cluster.link(src, dst)
    return latency + num_bytes / bw


def _link(s: _Setup, gpu: int, direction: str) -> tuple[str, int, int]:
    node = s.plan.cluster.node_of(gpu)
    local = gpu - node * s.plan.cluster.devices_per_node
    return direction, node, offload.host_link_of(local, s.host)


def _fp16_bytes(s: _Setup, layers: tuple[int, int]) -> float:
    return offload.GPU_PARAM_BYTES_PER_PARAM * offload.range_num_params(s.plan.model, layers)


def _prefetch(s: _Setup, graph: _Graph, gpu: int, kind: str, stage: int, layers: tuple[int, int],
              visits: list[int], scale: float = 1.0, extra_s: float = 0.0) -> int:
    """Parameter copy for the GPU's next stage, gated by the buffer it reuses."""
    back = 2 if s.prefetch else 1
    gate = visits[-back] if len(visits) >= back else -1
    dur = offload.transfer_time_s(_fp16_bytes(s, layers) * scale, s.host) + extra_s
    return graph.add(dur, ("P", gpu, kind, stage), resource=_link(s, gpu, "h2d"), stream=("h2d", gpu), deps=[gate])


def _build_pipeline(s: _Setup) -> tuple[_Graph, list[int]]:
    """SPipe / Mobius: AFAB over forward stages, then backward stages in reverse (seed 003 Fig. 2, 8)."""
    graph, m, model = _Graph(), s.plan.num_microbatches, s.plan.model
    visits: dict[int, list[int]] = defaultdict(list)
    prev = [-1] * m
    for i, layers in enumerate(s.forward):
        gpu = s.forward_gpus[i]
        p = _prefetch(s, graph, gpu, "F", i, layers, visits[gpu])
        fwd, _ = _range_times(s, layers)
        hop = _p2p_s(s, s.forward_gpus[i - 1], gpu, model.layers[layers[0] - 1].output_bytes) if i else 0.0
        for j in range(m):
            dep = graph.add(hop, ("A",), deps=[prev[j]]) if hop else prev[j]
            prev[j] = graph.add(fwd, ("F", gpu, i, j), resource=("gpu", gpu), stream=("gpu", gpu), deps=[p, dep])
        visits[gpu].append(prev[m - 1])
    return _add_backward(s, graph, visits)


def _forward_ops(graph: _Graph) -> dict[tuple[int, int], int]:
    return {(meta[2], meta[3]): op for op, meta in enumerate(graph.meta) if meta[0] == "F"}


def _add_backward(s: _Setup, graph: _Graph, visits: dict[int, list[int]]) -> tuple[_Graph, list[int]]:
    m, model = s.plan.num_microbatches, s.plan.model
    forward_of = [next(i for i, (a, b) in enumerate(s.forward) if a <= lo < b) for lo, _ in s.backward]
    fops = _forward_ops(graph)
    grad_ops: dict[int, list[int]] = defaultdict(list)
    offloads: list[int] = []
    prev = [-1] * m
    for n in range(len(s.backward) - 1, -1, -1):
        layers, gpu, i = s.backward[n], s.backward_gpus[n], forward_of[n]
        p = _prefetch(s, graph, gpu, "B", n, layers, visits[gpu])
        _, bwd = _range_times(s, layers)
        ckpt_bytes = offload.stage_checkpoint_bytes(model, layers)  # the stage input only (L174, L186)
        ckpt_s = _p2p_s(s, s.forward_gpus[i], gpu, ckpt_bytes)
        hop = 0.0
        if n + 1 < len(s.backward):
            hop = _p2p_s(s, s.backward_gpus[n + 1], gpu, model.layers[layers[1] - 1].output_bytes)
        buffer_gate = grad_ops[gpu][-2] if len(grad_ops[gpu]) >= 2 else -1
        for j in range(m):
            ck = graph.add(ckpt_s, ("C",), deps=[fops[(i, j)]]) if ckpt_s else fops[(i, j)]
            dep = graph.add(hop, ("A",), deps=[prev[j]]) if hop else prev[j]
            prev[j] = graph.add(bwd, ("B", gpu, n, j), resource=("gpu", gpu), stream=("gpu", gpu),
                                deps=[p, ck, dep, buffer_gate if j == 0 else -1])
        visits[gpu].append(prev[m - 1])
        g_op = graph.add(offload.transfer_time_s(_fp16_bytes(s, layers), s.host), ("G", gpu, "B", n),
                         resource=_link(s, gpu, "d2h"), stream=("d2h", gpu), deps=[prev[m - 1]])
        grad_ops[gpu].append(g_op)
        offloads.append(g_op)
    return graph, offloads


def _add_optimizer(s: _Setup, graph: _Graph, offloads: list[int]) -> None:
    """o_n per backward stage on its node's CPU; async after its own g_n, else after all of them."""
    barrier = -1 if s.async_optimizer else graph.add(0.0, ("S",), deps=offloads)
    for g_op in offloads:
        gpu, n = graph.meta[g_op][1], graph.meta[g_op][3]
        params = offload.range_num_params(s.plan.model, s.backward[n])
        graph.add(offload.optimizer_step_time_s(params, s.host), ("O", gpu, "B", n),
                  resource=("cpu", s.plan.cluster.node_of(gpu)), deps=[g_op if s.async_optimizer else barrier])


def _collective_s(s: _Setup, num_bytes: float) -> float:
    """All-gather or reduce-scatter of ``num_bytes`` over all GPUs: (G-1)/G x bytes / bandwidth."""
    cluster, g = s.plan.cluster, s.num_gpus
    if g == 1:
        return 0.0
    bw = cluster.inter_node_bytes_per_s if cluster.num_nodes > 1 else cluster.intra_node_bytes_per_s
    return (g - 1) / g * num_bytes / float(bw or 1.0)


def _build_zero(s: _Setup) -> tuple[_Graph, list[int]]:
    """ZeRO-3 with CPU offload: every GPU runs every layer on its own microbatches. Each layer's
    parameters are fetched for every pass (1/G from the host, then all-gathered); after the last
    microbatch each layer's gradients are reduce-scattered and 1/G is offloaded."""
    graph, m, g = _Graph(), s.plan.num_microbatches, s.num_gpus
    offloads: list[int] = []
    for gpu in range(g):
        visits: list[int] = []
        last_b: dict[int, int] = {}
        prev = -1
        for j in range(m):
            for kind, order in (("F", s.forward), ("B", tuple(reversed(s.forward)))):
                for layers in order:
                    gather = _collective_s(s, _fp16_bytes(s, layers))
                    p = _prefetch(s, graph, gpu, kind, layers[0], layers, visits, scale=1 / g, extra_s=gather)
                    fwd, bwd = _range_times(s, layers)
                    prev = graph.add(fwd if kind == "F" else bwd, (kind, gpu, layers[0], j), resource=("gpu", gpu),
                                     stream=("gpu", gpu), deps=[p, prev])
                    visits.append(prev)
                    if kind == "B":
                        last_b[layers[0]] = prev
        for layers in reversed(s.forward):
            nbytes = _fp16_bytes(s, layers)
            dur = _collective_s(s, nbytes) + offload.transfer_time_s(nbytes / g, s.host)
            offloads.append(graph.add(dur, ("G", gpu, "B", layers[0]), resource=_link(s, gpu, "d2h"),
                                      stream=("d2h", gpu), deps=[last_b[layers[0]]]))
    barrier = graph.add(0.0, ("S",), deps=offloads)
    total = offload.range_num_params(s.plan.model, (0, s.plan.model.num_layers))
    for node in range(s.plan.cluster.num_nodes):
        graph.add(offload.optimizer_step_time_s(total / s.plan.cluster.num_nodes, s.host),
                  ("O", node * s.plan.cluster.devices_per_node, "all", -1), resource=("cpu", node), deps=[barrier])
    return graph, offloads


# ------------------------------------------------------------------------------------------
# Memory and the result
# ------------------------------------------------------------------------------------------


def _memory(s: _Setup) -> tuple[list[float], list[float]]:
    """Peak GPU memory per GPU (``offload.gpu_memory_bytes``: one checkpoint per backward stage and
    microbatch, the same bytes the checkpoint transfers carry) and model-state bytes per node."""
    model, cluster = s.plan.model, s.plan.cluster
    if offload_options(s.plan).get("mode") == "zero-offload":
        peak = offload.gpu_memory_bytes(model, forward_layers=s.forward, backward_layers=s.forward, num_microbatches=1)
        per_node = offload.cpu_state_bytes(offload.range_num_params(model, (0, model.num_layers))) / cluster.num_nodes
        return [peak] * s.num_gpus, [per_node] * cluster.num_nodes
    gpu_mem, cpu_mem = [], [0.0] * cluster.num_nodes
    for gpu in range(s.num_gpus):
        fwd = [r for r, x in zip(s.forward, s.forward_gpus) if x == gpu]
        bwd = [r for r, x in zip(s.backward, s.backward_gpus) if x == gpu]
        gpu_mem.append(offload.gpu_memory_bytes(model, forward_layers=fwd, backward_layers=bwd,
                                                num_microbatches=s.plan.num_microbatches))
        cpu_mem[cluster.node_of(gpu)] += sum(offload.cpu_state_bytes(offload.range_num_params(model, r)) for r in bwd)
    return gpu_mem, cpu_mem


def simulate_offload(plan: Plan, *, include_events: bool = True) -> OffloadResult:
    """Simulate one iteration of an offloaded plan (spipe, mobius or zero-offload).

    The plan's ``options['offload']`` gives ``mode`` (``pipeline`` or ``zero-offload``),
    ``backward_stages`` (layer ranges in model order), ``backward_gpus``, ``async_optimizer``,
    ``prefetch``, ``recompute`` and ``host`` (``offload.HostSpec`` fields); the forward stages
    are the plan's virtual stages, forward stage i on GPU i mod G.

    Args:
        plan: an offloaded plan.
        include_events: build the compute, transfer and CPU timelines.

    Returns:
        The ``SimResult`` (one stage result per GPU; B events carry the backward stage index) and
        the host-link and CPU timelines, the GPU makespan, the exposed CPU time and the memory.

    Raises:
        InvalidProblemError: the plan has no offload section, a malformed one, or no host link
            bandwidth.
    """
    s = _setup(plan)
    zero = offload_options(plan).get("mode") == "zero-offload"
    graph, offloads = _build_zero(s) if zero else _build_pipeline(s)
    if not zero:
        _add_optimizer(s, graph, offloads)
    start, end = _schedule(graph)
    iteration = max(end)
    gpu_ops = [op for op, meta in enumerate(graph.meta) if meta[0] in ("F", "B", "P", "G")]
    makespan = max(end[op] for op in gpu_ops) - min(start[op] for op in gpu_ops)
    gpu_mem, cpu_mem = _memory(s)
    sim = _sim_result(s, graph, start, end, iteration, gpu_mem, include_events)
    transfers, cpu = _resource_events(graph, start, end) if include_events else ((), ())
    return OffloadResult(sim=sim, transfers=transfers, cpu=cpu, gpu_makespan_s=makespan,
                         cpu_exposed_s=iteration - makespan, gpu_memory_bytes=tuple(gpu_mem),
                         cpu_memory_bytes=tuple(cpu_mem), fits_cpu_memory=max(cpu_mem) <= s.host.cpu_memory_bytes)


def _sim_result(s: _Setup, graph: _Graph, start: list[float], end: list[float], iteration: float,
                gpu_mem: list[float], include_events: bool) -> SimResult:
    capacity = usable_memory_bytes(s.plan.cluster.device)  # type: ignore[arg-type]
    per_gpu: dict[int, list[tuple[float, float]]] = defaultdict(list)
    events: list[TimelineEvent] = []
    for op, meta in enumerate(graph.meta):
        if meta[0] in ("F", "B"):
            per_gpu[meta[1]].append((start[op], end[op]))
            if include_events:
                events.append(TimelineEvent(meta[1], meta[0], meta[2], meta[3], start[op], end[op]))
    stages = []
    for gpu in range(s.num_gpus):
        spans = sorted(per_gpu[gpu])
        busy = sum(b - a for a, b in spans)
        free = max(capacity - gpu_mem[gpu], 0.0)
        bubbles, cursor = [], 0.0
        for a, b in spans + [(iteration, iteration)]:
            if a - cursor > _EPS * max(iteration, 1.0):
                bubbles.append(Bubble(start_s=cursor, end_s=a, free_memory_bytes=free))
            cursor = max(cursor, b)
        stages.append(StageResult(index=gpu, busy_s=busy, idle_s=iteration - busy, peak_memory_bytes=gpu_mem[gpu],
                                  peak_inflight_microbatches=s.plan.num_microbatches, bubbles=tuple(bubbles)))
    idle = sum(st.idle_s for st in stages)
    events.sort(key=lambda e: (e.start_s, e.rank))
    return SimResult(
        iteration_time_s=iteration, bubble_fraction=idle / (iteration * s.num_gpus) if iteration else 0.0,
        throughput_samples_per_s=s.plan.global_batch_size / iteration if iteration else 0.0,
        memory_capacity_bytes=capacity, fits_memory=max(gpu_mem) <= capacity, stages=tuple(stages),
        events=tuple(events),
    )


def _resource_events(graph: _Graph, start: list[float], end: list[float]) -> tuple[tuple[ResourceEvent, ...], ...]:
    transfers, cpu = [], []
    for op, meta in enumerate(graph.meta):
        if meta[0] in ("P", "G", "O"):
            res = graph.resource[op]
            name = ":".join(str(x) for x in res) if isinstance(res, tuple) else str(res)
            event = ResourceEvent(name, meta[1], meta[0], meta[3] if isinstance(meta[3], int) else -1, start[op], end[op])
            (cpu if meta[0] == "O" else transfers).append(event)
    return tuple(transfers), tuple(cpu)
