"""Simulator of offloaded training: GPU streams next to host links and CPU optimizer timelines.

The event model of SPipe (Sec. 3-4) and its baselines, as a graph for the one engine
(``cost_models.sim.engine``). Every operation runs on one stream or shared resource,
non-preemptively; a resource serves the ready operation that can start first (ties: the one
created first):

- ``gpu g``: the compute stream; F and B (recompute included) in the plan's fixed order;
- ``h2d`` / ``d2h`` of each host link: parameter prefetch p_i and gradient offload g_i; GPUs behind
  one PCIe switch share a link, and each GPU's copies keep their stream order (seed 003 L224);
- ``cpu`` of each node: optimizer steps o_i (threads sharing the cores, L233);
- ``link src dst``: point-to-point activations, gradients and checkpoints between two GPUs take
  latency + bytes / bandwidth on the link of that direction, one at a time (a checkpoint and
  an activation bound for the same GPU queue behind each other), as in the pipeline model.

Dependencies (B.6): f_i^j after f_{i-1}^j and p_i; b_n^j after b_{n+1}^j, its checkpoint c_n^j
(the input of backward stage n, sent as soon as f_i^j finishes, L186-188) and p_n; p of a GPU's v-th stage after its (v-2)-th
stage finished (two buffers, L101) or its (v-1)-th without prefetch; g_n after b_n's last
microbatch; o_n after g_n (SPipe's asynchronous optimizer, L206-212) or after every g (the
synchronous overflow check of Fig. 3, L115-127). The iteration ends with the last operation.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from cost_models.memory import usable_memory_bytes
from cost_models import offload
from cost_models.sim import engine
from planner.errors import InvalidProblemError
from planner.schema import Bubble, OffloadSpec, Plan, SimResult, StageResult, TimelineEvent

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
    links: tuple[tuple[str, str, int, int, float, float], ...] = ()
    """GPU peer transfers: (``"link a->b"``, kind A / C, stage, microbatch, start, end)."""


@dataclass(slots=True)
class _Graph:
    """The engine graph with a label per operation: (kind, gpu, ...) as the builders give it."""

    graph: engine.Graph = field(default_factory=engine.Graph)
    meta: list[tuple[Any, ...]] = field(default_factory=list)

    def add(self, duration: float, meta: tuple[Any, ...], *, resource: Hashable | None = None,
            also: Sequence[Hashable] = (), stream: Hashable | None = None, deps: Sequence[int] = ()) -> int:
        self.meta.append(meta)
        return self.graph.add(duration, deps=deps, resource=resource, also=also, stream=stream)

    def resource_name(self, op: int) -> Hashable | None:
        rid = self.graph.resource[op]
        return None if rid < 0 else self.graph.resource_names[rid]


def _schedule(graph: _Graph) -> tuple[list[float], list[float]]:
    """Start and end times from the engine."""
    timed = engine.run(graph.graph)
    assert timed.done, "offload graph has a cycle"
    return timed.start_s, timed.end_s


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


def offload_spec(plan: Plan) -> OffloadSpec:
    """The plan's ``offload`` section.

    Raises:
        InvalidProblemError: the plan has none.
    """
    if plan.offload is None:
        raise InvalidProblemError(
            f"plan of solver {plan.solver!r} has no 'offload' section; only plans of the "
            "spipe, mobius and zero-offload solvers can be simulated as offloaded pipelines"
        )
    return plan.offload


def _setup(plan: Plan) -> _Setup:
    spec = offload_spec(plan)
    host = offload.host_spec(plan.cluster, {"host": spec.host.model_dump()})
    g = plan.cluster.num_devices
    forward = tuple(c.layers for c in plan.virtual_stages())
    if spec.mode == "zero-offload":
        per_layer = tuple((i, i + 1) for i in range(plan.model.num_layers))
        forward, backward, fgpus, bgpus = per_layer, per_layer, (0,) * len(per_layer), (0,) * len(per_layer)
    else:
        backward = tuple((int(a), int(b)) for a, b in spec.backward_stages)
        fgpus = tuple(offload.forward_gpu(i, g) for i in range(len(forward)))
        bgpus = tuple(spec.backward_gpus)
        if len(bgpus) != len(backward) or any(not 0 <= x < g for x in bgpus):
            raise InvalidProblemError(
                f"offload.backward_gpus={list(bgpus)} must give one GPU in [0, {g}) per backward stage"
            )
    return _Setup(plan=plan, host=host, forward=forward, forward_gpus=fgpus, backward=backward,
                  backward_gpus=bgpus, num_gpus=g, async_optimizer=spec.async_optimizer,
                  prefetch=spec.prefetch, recompute=spec.recompute)


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


def _peer(s: _Setup, src: int, dst: int) -> dict[str, Any]:
    """Resources of a GPU peer copy: its own directed link, or both host links (``peer_over_host_link``)."""
    cluster = s.plan.cluster
    if s.host.peer_over_host_link and cluster.node_of(src) == cluster.node_of(dst):
        return {"resource": _link(s, src, "d2h"), "also": (_link(s, dst, "h2d"),)}
    return {"resource": ("link", src, dst)}


def _collective(s: _Setup, graph: _Graph, gpu: int, meta: tuple[Any, ...], num_bytes: float, dep: int) -> int:
    """All-gather / reduce-scatter over the host links of a GPU (``peer_over_host_link``); else -1."""
    if not s.host.peer_over_host_link or s.num_gpus == 1:
        return -1
    return graph.add(_collective_s(s, num_bytes), meta, deps=[dep], resource=_link(s, gpu, "h2d"),
                     also=(_link(s, gpu, "d2h"),))


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
        src = s.forward_gpus[i - 1] if i else gpu
        peer = _peer(s, src, gpu)
        for j in range(m):
            dep = graph.add(hop, ("A", src, i, j), deps=[prev[j]], **peer) if hop else prev[j]
            prev[j] = graph.add(fwd, ("F", gpu, i, j), stream=("gpu", gpu), deps=[p, dep])
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
        src_f, src_b = s.forward_gpus[i], s.backward_gpus[min(n + 1, len(s.backward) - 1)]
        peer_f, peer_b = _peer(s, src_f, gpu), _peer(s, src_b, gpu)
        for j in range(m):
            ck = graph.add(ckpt_s, ("C", src_f, n, j), deps=[fops[(i, j)]], **peer_f) if ckpt_s else fops[(i, j)]
            dep = graph.add(hop, ("A", src_b, n, j), deps=[prev[j]], **peer_b) if hop else prev[j]
            prev[j] = graph.add(bwd, ("B", gpu, n, j), stream=("gpu", gpu),
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
    parameters are fetched for every pass (1/G from the host, then all-gathered). As in DeepSpeed,
    gradients are reduce-scattered and the GPU's 1/G offloaded (and accumulated on the CPU) after
    every microbatch's backward of the layer, not once after the last microbatch: ZeRO-3 keeps
    no full gradient between micro-steps."""
    graph, m, g = _Graph(), s.plan.num_microbatches, s.num_gpus
    offloads: list[int] = []
    for gpu in range(g):
        visits: list[int] = []
        prev = -1
        for j in range(m):
            for kind, order in (("F", s.forward), ("B", tuple(reversed(s.forward)))):
                for layers in order:
                    prev = _zero_pass(s, graph, gpu, kind, layers, j, visits, prev)
                    if kind == "B":
                        offloads.append(_zero_gradients(s, graph, gpu, layers, prev))
    barrier = graph.add(0.0, ("S",), deps=offloads)
    total = offload.range_num_params(s.plan.model, (0, s.plan.model.num_layers))
    for node in range(s.plan.cluster.num_nodes):
        graph.add(offload.optimizer_step_time_s(total / s.plan.cluster.num_nodes, s.host),
                  ("O", node * s.plan.cluster.devices_per_node, "all", -1), resource=("cpu", node), deps=[barrier])
    return graph, offloads


def _zero_pass(s: _Setup, graph: _Graph, gpu: int, kind: str, layers: tuple[int, int], j: int,
               visits: list[int], prev: int) -> int:
    """One layer's forward or backward of microbatch j on a GPU, after its parameter fetch."""
    shared, g = s.host.peer_over_host_link, s.num_gpus
    gather = 0.0 if shared else _collective_s(s, _fp16_bytes(s, layers))
    p = _prefetch(s, graph, gpu, kind, layers[0], layers, visits, scale=1 / g, extra_s=gather)
    if shared:
        p = _collective(s, graph, gpu, ("AG", gpu, kind, layers[0]), _fp16_bytes(s, layers), p)
    fwd, bwd = _range_times(s, layers)
    op = graph.add(fwd if kind == "F" else bwd, (kind, gpu, layers[0], j), stream=("gpu", gpu), deps=[p, prev])
    visits.append(op)
    return op


def _zero_gradients(s: _Setup, graph: _Graph, gpu: int, layers: tuple[int, int], backward: int) -> int:
    """Reduce-scatter of one layer's gradients after a backward, then this GPU's 1/G to the host."""
    nbytes, shared = _fp16_bytes(s, layers), s.host.peer_over_host_link
    dep = _collective(s, graph, gpu, ("RS", gpu, "B", layers[0]), nbytes, backward) if shared else -1
    dur = (0.0 if shared else _collective_s(s, nbytes)) + offload.transfer_time_s(nbytes / s.num_gpus, s.host)
    return graph.add(dur, ("G", gpu, "B", layers[0]), resource=_link(s, gpu, "d2h"), stream=("d2h", gpu),
                     deps=[backward, dep])


# ------------------------------------------------------------------------------------------
# Memory and the result
# ------------------------------------------------------------------------------------------


def _memory(s: _Setup) -> tuple[list[float], list[float]]:
    """Peak GPU memory per GPU (``offload.gpu_memory_bytes``: one checkpoint per backward stage and
    microbatch, the same bytes the checkpoint transfers carry) and model-state bytes per node."""
    model, cluster = s.plan.model, s.plan.cluster
    if offload_spec(s.plan).mode == "zero-offload":
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


def simulate_offload(plan: Plan, *, include_events: bool = True, include_bubbles: bool = True) -> OffloadResult:
    """Simulate one iteration of an offloaded plan (spipe, mobius or zero-offload).

    The plan's ``offload`` (``planner.schema.OffloadSpec``) gives ``mode`` (``pipeline`` or ``zero-offload``),
    ``backward_stages`` (layer ranges in model order), ``backward_gpus``, ``async_optimizer``,
    ``prefetch``, ``recompute`` and ``host`` (``offload.HostSpec`` fields); the forward stages
    are the plan's virtual stages, forward stage i on GPU i mod G.

    Args:
        plan: an offloaded plan.
        include_events: build the compute, transfer and CPU timelines.
        include_bubbles: list each GPU's idle gaps in its stage result (a sweep that keeps only
            the prediction skips them: tens of thousands on deep pipelines).

    Returns:
        The ``SimResult`` (one stage result per GPU; B events carry the backward stage index) and
        the host-link and CPU timelines, the GPU makespan, the exposed CPU time and the memory.

    Raises:
        InvalidProblemError: the plan has no offload section, a malformed one, or no host link
            bandwidth.
    """
    s = _setup(plan)
    zero = offload_spec(plan).mode == "zero-offload"
    graph, offloads = _build_zero(s) if zero else _build_pipeline(s)
    if not zero:
        _add_optimizer(s, graph, offloads)
    start, end = _schedule(graph)
    iteration = max(end)
    gpu_ops = [op for op, meta in enumerate(graph.meta) if meta[0] in ("F", "B", "P", "G")]
    makespan = max(end[op] for op in gpu_ops) - min(start[op] for op in gpu_ops)
    gpu_mem, cpu_mem = _memory(s)
    sim = _sim_result(s, graph, start, end, iteration, gpu_mem, include_events, include_bubbles)
    transfers, cpu = _resource_events(graph, start, end) if include_events else ((), ())
    links = _link_events(graph, start, end) if include_events else ()
    return OffloadResult(sim=sim, transfers=transfers, cpu=cpu, gpu_makespan_s=makespan,
                         cpu_exposed_s=iteration - makespan, gpu_memory_bytes=tuple(gpu_mem),
                         cpu_memory_bytes=tuple(cpu_mem), fits_cpu_memory=max(cpu_mem) <= s.host.cpu_memory_bytes,
                         links=links)


def _sim_result(s: _Setup, graph: _Graph, start: list[float], end: list[float], iteration: float,
                gpu_mem: list[float], include_events: bool, include_bubbles: bool = True) -> SimResult:
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
        for a, b in spans + [(iteration, iteration)] if include_bubbles else ():
            if a - cursor > _EPS * max(iteration, 1.0):
                # computed finite floats: construct without re-validating (thousands per GPU on deep models)
                bubbles.append(Bubble.model_construct(start_s=cursor, end_s=a, free_memory_bytes=free))
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


def _link_events(graph: _Graph, start: list[float], end: list[float]) -> tuple[tuple[str, str, int, int, float, float], ...]:
    out = []
    for op, meta in enumerate(graph.meta):
        if meta[0] in ("A", "C"):
            label = f"link {meta[1]}->{_gpu_of(graph, op)}"
            out.append((label, meta[0], meta[2], meta[3], start[op], end[op]))
    return tuple(out)


def _gpu_of(graph: _Graph, op: int) -> int:
    """The GPU a peer transfer delivers to: the GPU of the operation that waits for it."""
    child = graph.graph.children[op][0]
    return int(graph.meta[child][1])


def _resource_events(graph: _Graph, start: list[float], end: list[float]) -> tuple[tuple[ResourceEvent, ...], ...]:
    transfers, cpu = [], []
    for op, meta in enumerate(graph.meta):
        if meta[0] in ("P", "G", "O"):
            res = graph.resource_name(op)
            name = ":".join(str(x) for x in res) if isinstance(res, tuple) else str(res)
            event = ResourceEvent(name, meta[1], meta[0], meta[3] if isinstance(meta[3], int) else -1, start[op], end[op])
            (cpu if meta[0] == "O" else transfers).append(event)
    return tuple(transfers), tuple(cpu)
