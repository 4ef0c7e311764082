"""SPipe runtime: CPU-resident master weights, parameter prefetch, gradient offload, CPU optimizer.

Executes the plans of the ``spipe``, ``mobius`` and ``zero-offload`` solvers (docs/solver-spipe.md)
as SPipe describes them (Ryu et al., seed 003; reading shared/design/stage-ilp-spipe-bpipe.md
Part B): fp32 master weights and optimizer states stay in CPU memory (L105-113); before a stage
runs, its parameters are copied to the GPU that runs it, one stage ahead (the prefetch double
buffer, L101); a forward stage runs every microbatch (AFAB, Fig. 2) and keeps only each layer's
input (per-layer full recompute, artifact arguments.py); a backward stage recomputes each layer
and runs its backward; its accumulated gradients are copied back after its last microbatch and
the CPU optimizer steps that stage at once (asynchronous optimizer, L206-212), or after every
offload (Mobius's synchronous step, Fig. 3). Each layer belongs to one backward stage, and that
stage is its last use in the iteration, so an early step never races a later use.

One process runs the visits (forward stages in order, then backward stages in reverse) in the
plan's order. On CUDA the copies run on their own streams (``h2d`` and ``d2h`` per simulated
GPU, ordered with events) and the optimizer on a CPU thread; on CPU the same code runs with the
stream calls as no-ops and the "device" copies as separate CPU tensors, which is what the tests
check. Simulated GPU g maps to ``cuda:(g mod device_count)``.
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from planner.errors import InvalidProblemError
from planner.schema import Plan, TransformerConfig
from runtime_bridge import model as gpt

__all__ = ["DeviceStreams", "OffloadLayout", "OffloadedTrainer", "StepStats", "Visit", "offload_layout",
           "simulated_devices"]

log = logging.getLogger(__name__)

LayerFactory = Callable[[int], nn.Module]
LayerInit = Callable[[nn.Module, int], None]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]


@dataclass(frozen=True, slots=True)
class Visit:
    """One stage run: all microbatches of a forward (``F``) or backward (``B``) stage on one GPU."""

    kind: str
    stage: int
    layers: tuple[int, int]
    gpu: int


@dataclass(frozen=True, slots=True)
class OffloadLayout:
    """What the runtime needs of an offloaded plan (``plan.offload``)."""

    forward_stages: tuple[tuple[int, int], ...]
    forward_gpus: tuple[int, ...]
    backward_stages: tuple[tuple[int, int], ...]
    backward_gpus: tuple[int, ...]
    num_microbatches: int
    """Microbatches this process runs per step (data x microbatches: one process does all replicas)."""
    async_optimizer: bool

    @property
    def num_layers(self) -> int:
        return self.forward_stages[-1][1]

    @property
    def num_gpus(self) -> int:
        return max(self.forward_gpus + self.backward_gpus) + 1

    def visits(self) -> tuple[Visit, ...]:
        """The plan's order: forward stages first to last, then backward stages last to first."""
        fwd = [Visit("F", i, r, g) for i, (r, g) in enumerate(zip(self.forward_stages, self.forward_gpus))]
        bwd = [Visit("B", n, self.backward_stages[n], self.backward_gpus[n])
               for n in range(len(self.backward_stages) - 1, -1, -1)]
        return tuple(fwd + bwd)

    def backward_stage_of(self, layer: int) -> int:
        return next(n for n, (lo, hi) in enumerate(self.backward_stages) if lo <= layer < hi)


def offload_layout(plan: Plan) -> OffloadLayout:
    """Read and check the stage split of an offloaded plan.

    Raises:
        InvalidProblemError: no ``plan.offload``, a recompute mode other than ``full``, or
            backward stages that do not tile the model's layers in order.
    """
    if plan.offload is None:
        raise InvalidProblemError(
            f"plan of solver {plan.solver!r} has no 'offload' section; the offload runtime runs "
            "plans of the spipe, mobius and zero-offload solvers"
        )
    section = plan.offload.model_dump()
    if section.get("recompute", "full") != "full":
        raise InvalidProblemError(
            f"offload.recompute={section.get('recompute')!r}: the offload runtime keeps only layer "
            "inputs between forward and backward, so it runs recompute 'full' only; re-plan with it"
        )
    num_layers = plan.model.num_layers
    m = plan.degrees.data * plan.num_microbatches
    if section.get("mode") == "zero-offload":
        per_layer = tuple((i, i + 1) for i in range(num_layers))
        zeros = (0,) * num_layers
        return OffloadLayout(per_layer, zeros, per_layer, zeros, m, bool(section.get("async_optimizer", False)))
    g = plan.cluster.num_devices
    forward = tuple(c.layers for c in plan.virtual_stages())
    backward = tuple((int(a), int(b)) for a, b in section["backward_stages"])
    gpus = tuple(int(x) for x in section["backward_gpus"])
    if [b[0] for b in backward] != [0, *[b[1] for b in backward[:-1]]] or backward[-1][1] != num_layers:
        raise InvalidProblemError(
            f"offload.backward_stages={[list(b) for b in backward]} must tile layers [0, {num_layers}) in order"
        )
    if len(gpus) != len(backward) or any(not 0 <= x < g for x in gpus):
        raise InvalidProblemError(
            f"offload.backward_gpus={list(gpus)} must give one GPU in [0, {g}) per backward stage"
        )
    return OffloadLayout(forward, tuple(i % g for i in range(len(forward))), backward, gpus, m,
                         bool(section.get("async_optimizer", False)))


def simulated_devices(num_gpus: int, device: torch.device) -> tuple[torch.device, ...]:
    """Device of each simulated GPU: all ``cpu`` on CPU, ``cuda:(g mod count)`` on CUDA."""
    if device.type != "cuda":
        return (device,) * num_gpus
    count = torch.cuda.device_count()
    return tuple(torch.device("cuda", g % count) for g in range(num_gpus))


class DeviceStreams:
    """Compute, host-to-device and device-to-host streams of one device; no-ops on CPU, where
    every copy is synchronous and ordering holds without events."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.streams: dict[str, Any] = {}
        if self.cuda:
            self.streams = {"compute": torch.cuda.current_stream(device), "h2d": torch.cuda.Stream(device),
                            "d2h": torch.cuda.Stream(device)}

    def on(self, which: str) -> contextlib.AbstractContextManager[Any]:
        """Make ``which`` the current stream (a no-op on CPU)."""
        return torch.cuda.stream(self.streams[which]) if self.cuda else contextlib.nullcontext()

    def record(self, which: str) -> Any:
        """An event marking the work queued so far on ``which`` (None on CPU)."""
        return self.streams[which].record_event() if self.cuda else None

    def wait(self, which: str, event: Any) -> None:
        """Make stream ``which`` wait for ``event`` without blocking the host."""
        if self.cuda and event is not None:
            self.streams[which].wait_event(event)

    def keep_alive(self, tensor: torch.Tensor, which: str) -> None:
        """Tell the caching allocator that ``which`` still uses a tensor allocated on another stream."""
        if self.cuda:
            tensor.record_stream(self.streams[which])


@dataclass(slots=True)
class _HostLayer:
    module: nn.Module
    """fp32 master weights on the CPU; also the code run with the working copies (functional_call)."""
    transfer: dict[str, torch.Tensor]
    """Working-dtype copy the h2d stream reads (pinned on CUDA), refreshed after each step."""
    grads: dict[str, torch.Tensor]
    """Working-dtype gradients the d2h stream writes (pinned on CUDA)."""
    has_grad: dict[str, bool] = field(default_factory=dict)


@dataclass(slots=True)
class _Working:
    visit: Visit
    params: dict[int, dict[str, torch.Tensor]]
    ready: Any


@dataclass(slots=True)
class StepStats:
    """Measurements of one step (compare ``step_time_s`` with ``plan.predicted.iteration_time_s``)."""

    step_time_s: float
    h2d_bytes: int
    d2h_bytes: int
    optimizer_wait_s: float
    """Time the step waited for CPU optimizer steps: the optimizer time not hidden by the GPU work."""
    peak_working_params: int
    """Most working-copy parameter elements alive at once, over all simulated GPUs."""


class OffloadedTrainer:
    """Training of a layered model with CPU-resident states, following an offloaded plan.

    Args:
        layout: from ``offload_layout``.
        layer_factory: model layer index -> a new module (called under the meta device).
        init: ``init(module, index)`` fills a layer's master weights deterministically.
        loss_fn: ``loss_fn(last layer output, targets)``, mean over the microbatch.
        optimizer_factory: builds one CPU optimizer over a backward stage's master parameters; it
            must act per parameter (SGD, Adam, AdamW: no global gradient norm).
        device: ``cpu`` (devices simulated) or ``cuda``.
        dtype: dtype of the working copies and of the transferred gradients.
    """

    def __init__(self, layout: OffloadLayout, layer_factory: LayerFactory, *, init: LayerInit, loss_fn: LossFn,
                 optimizer_factory: OptimizerFactory, device: torch.device = torch.device("cpu"),
                 dtype: torch.dtype = torch.float32) -> None:
        self.layout, self.loss_fn, self.dtype = layout, loss_fn, dtype
        self.devices = simulated_devices(layout.num_gpus, device)
        self.streams = tuple(DeviceStreams(d) for d in self.devices)
        pin = device.type == "cuda"
        self.host = [self._host_layer(layer_factory, init, i, pin) for i in range(layout.num_layers)]
        self.optimizers = [optimizer_factory([p for i in range(*r) for p in self.host[i].module.parameters()])
                           for r in layout.backward_stages]
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="paraplan-cpu-optimizer")
        self._steps: dict[int, Future[float]] = {}
        self._pending_events: dict[int, Any] = {}
        """Gradient-copy events of stages whose step waits for the last offload (synchronous mode)."""
        self._live: list[weakref.WeakSet[torch.Tensor]] = [weakref.WeakSet() for _ in self.devices]
        self.trace: list[tuple[str, int]] = []
        """Main-thread events of the last step: (P|F|B|G|O, stage) = prefetch, forward, backward,
        gradient offload, optimizer step submitted."""
        self.optimizer_busy_s = 0.0
        """CPU optimizer time so far (added when each step is collected)."""

    def _host_layer(self, factory: LayerFactory, init: LayerInit, index: int, pin: bool) -> _HostLayer:
        with torch.device("meta"):
            module = factory(index)
        module = module.to_empty(device="cpu").float()
        init(module, index)
        if any(True for _ in module.buffers()):
            raise InvalidProblemError(
                f"layer {index} ({type(module).__name__}) has buffers; the offload runtime streams parameters "
                "only: compute such values in forward (as runtime_bridge.model does for RoPE)"
            )
        params = dict(module.named_parameters())
        transfer = {n: torch.empty(p.shape, dtype=self.dtype, pin_memory=pin) for n, p in params.items()}
        grads = {n: torch.empty(p.shape, dtype=self.dtype, pin_memory=pin) for n, p in params.items()}
        with torch.no_grad():
            for n, p in params.items():
                transfer[n].copy_(p)
        return _HostLayer(module, transfer, grads)

    @classmethod
    def for_gpt(cls, plan: Plan, cfg: TransformerConfig, *, seed: int, optimizer_factory: OptimizerFactory,
                device: torch.device = torch.device("cpu"), dtype: torch.dtype = torch.float32) -> OffloadedTrainer:
        """The bundled GPT (runtime_bridge.model) with the plan's stage split."""
        return cls(offload_layout(plan), lambda i: gpt.build_layer(cfg, i),
                   init=lambda layer, i: gpt.init_layer(layer, i, seed=seed), loss_fn=gpt.lm_loss,
                   optimizer_factory=optimizer_factory, device=device, dtype=dtype)

    def __enter__(self) -> OffloadedTrainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
    def close(self) -> None:
        """Finish pending optimizer steps and stop the optimizer thread."""
        self.synchronize()
        self._executor.shutdown(wait=True)

    def synchronize(self) -> float:
        """Wait for every pending optimizer step; returns the seconds waited."""
        return self._collect(list(self._steps))

    def master_state(self) -> dict[str, torch.Tensor]:
        """Master weights named as ``stages.full_model`` names them (``layers.<i>.<name>``), after all steps."""
        self.synchronize()
        return {f"layers.{i}.{n}": p.detach() for i, h in enumerate(self.host) for n, p in h.module.named_parameters()}

    def live_working_params(self) -> int:
        """Parameter elements of working copies still alive (0 between steps when nothing leaks)."""
        return sum(t.numel() for live in self._live for t in live)

    def train_step(self, tokens: torch.Tensor, targets: torch.Tensor) -> tuple[list[float], StepStats]:
        """One iteration on a global batch: returns the loss of each microbatch and the step's stats.

        Raises:
            InvalidProblemError: the batch does not split into the layout's microbatches.
        """
        m = self.layout.num_microbatches
        if tokens.shape[0] % m:
            raise InvalidProblemError(f"batch of {tokens.shape[0]} samples does not split into {m} microbatches")
        start, self.trace = time.perf_counter(), []
        xs, ys = tokens.chunk(m), targets.chunk(m)
        acts: list[Any] = list(xs)
        grads: list[Any] = [None] * m
        ckpt: dict[tuple[int, int], torch.Tensor] = {}
        losses: list[torch.Tensor] = []
        counters = {"h2d": 0, "d2h": 0, "peak": 0, "wait_s": 0.0}
        visits = self.layout.visits()
        upcoming = self._prefetch(visits[0], counters)
        for k, visit in enumerate(visits):
            work = upcoming
            # Double buffering (L101): the next stage's copy overlaps this stage's compute.
            upcoming = self._prefetch(visits[k + 1], counters) if k + 1 < len(visits) else None
            if visit.kind == "F":
                self._forward(work, xs, ys, acts, ckpt, losses)
            else:
                self._backward(work, ys, grads, ckpt)
                self._offload(work, counters)
            del work
        if not self.layout.async_optimizer:
            for n in range(len(self.layout.backward_stages) - 1, -1, -1):
                self._submit(n, self._pending_events.pop(n))
        assert not ckpt, "every checkpoint is consumed by its backward"
        log.debug("offloaded step: %d visits, %.3f s waited for the CPU optimizer", len(visits), counters["wait_s"])
        stats = StepStats(time.perf_counter() - start, counters["h2d"], counters["d2h"], counters["wait_s"],
                          int(counters["peak"]))
        return [float(x) for x in losses], stats

    # -- transfers -------------------------------------------------------------------------

    def _prefetch(self, visit: Visit, counters: dict[str, Any]) -> _Working:
        counters["wait_s"] += self._collect([self.layout.backward_stage_of(i) for i in range(*visit.layers)])
        streams, device = self.streams[visit.gpu], self.devices[visit.gpu]
        params: dict[int, dict[str, torch.Tensor]] = {}
        with streams.on("h2d"):
            for i in range(*visit.layers):
                params[i] = {}
                for name, src in self.host[i].transfer.items():
                    work = torch.empty(src.shape, dtype=self.dtype, device=device)
                    work.copy_(src, non_blocking=True)
                    params[i][name] = work.requires_grad_(visit.kind == "B")
                    self._live[visit.gpu].add(work)
                    counters["h2d"] += src.numel() * src.element_size()
            ready = streams.record("h2d")
        counters["peak"] = max(counters["peak"], self.live_working_params())
        self.trace.append(("P", visit.stage) if visit.kind == "F" else ("P", -1 - visit.stage))
        return _Working(visit, params, ready)

    def _offload(self, work: _Working, counters: dict[str, Any]) -> None:
        """Gradients of a finished backward stage to the host, then free the working copy."""
        streams = self.streams[work.visit.gpu]
        streams.wait("d2h", streams.record("compute"))
        with streams.on("d2h"):
            for i, params in work.params.items():
                host = self.host[i]
                for name, w in params.items():
                    host.has_grad[name] = w.grad is not None
                    if w.grad is not None:
                        host.grads[name].copy_(w.grad, non_blocking=True)
                        streams.keep_alive(w.grad, "d2h")
                        counters["d2h"] += w.grad.numel() * w.grad.element_size()
            done = streams.record("d2h")
        self._release(work)
        self.trace.append(("G", work.visit.stage))
        if self.layout.async_optimizer:
            self._submit(work.visit.stage, done)  # SPipe: step as soon as this stage's gradients land
        else:
            self._pending_events[work.visit.stage] = done  # Mobius: step after every offload

    def _release(self, work: _Working) -> None:
        streams = self.streams[work.visit.gpu]
        for params in work.params.values():
            for w in params.values():
                streams.keep_alive(w, "compute")
        work.params.clear()

    # -- compute ---------------------------------------------------------------------------

    def _run_layer(self, index: int, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return functional_call(self.host[index].module, params, (x,))

    def _forward(self, work: _Working, xs: Sequence[torch.Tensor], ys: Sequence[torch.Tensor], acts: list[Any],
                 ckpt: dict[tuple[int, int], torch.Tensor], losses: list[torch.Tensor]) -> None:
        """All microbatches through a forward stage, keeping each layer's input for its backward GPU."""
        visit, device = work.visit, self.devices[work.visit.gpu]
        self.streams[visit.gpu].wait("compute", work.ready)
        last = self.layout.num_layers - 1
        with torch.no_grad():
            for j in range(len(xs)):
                x = acts[j].to(device)
                for i in range(*visit.layers):
                    gpu = self.layout.backward_gpus[self.layout.backward_stage_of(i)]
                    ckpt[(i, j)] = x.to(self.devices[gpu])  # sent as soon as it exists (L186-188)
                    x = self._run_layer(i, work.params[i], x)
                    if i == last:
                        losses.append(self.loss_fn(x, ys[j].to(device)))
                acts[j] = x
        self._release(work)
        self.trace.append(("F", visit.stage))

    def _backward(self, work: _Working, ys: Sequence[torch.Tensor], grads: list[Any],
                  ckpt: dict[tuple[int, int], torch.Tensor]) -> None:
        """Recompute and backward of every layer of a backward stage, for all microbatches.

        ``grads[j]`` carries the gradient of microbatch j's activation between stages; the last
        layer seeds it with d(loss_j / m), so the parameters receive the gradient of the mean loss.
        """
        visit, device = work.visit, self.devices[work.visit.gpu]
        self.streams[visit.gpu].wait("compute", work.ready)
        m, last = len(ys), self.layout.num_layers - 1
        for j in range(m):
            grad = grads[j] if visit.layers[1] <= last else None
            for i in range(visit.layers[1] - 1, visit.layers[0] - 1, -1):
                x = ckpt.pop((i, j))
                if x.is_floating_point():
                    x = x.detach().requires_grad_(True)
                with torch.enable_grad():
                    y = self._run_layer(i, work.params[i], x)
                    if i == last:
                        (self.loss_fn(y, ys[j].to(device)) / m).backward()
                    else:
                        y.backward(grad.to(device))
                grad = x.grad
            grads[j] = grad
        self.trace.append(("B", visit.stage))

    # -- CPU optimizer ---------------------------------------------------------------------

    def _submit(self, stage: int, done: Any) -> None:
        self._steps[stage] = self._executor.submit(self._step, stage, done)
        self.trace.append(("O", stage))

    def _step(self, stage: int, done: Any) -> float:
        """Runs on the optimizer thread: wait for the gradient copy, step, refresh the transfer copy."""
        if done is not None:
            done.synchronize()
        start = time.perf_counter()
        layers = [self.host[i] for i in range(*self.layout.backward_stages[stage])]
        for host in layers:
            for name, p in host.module.named_parameters():
                p.grad = host.grads[name].float().clone() if host.has_grad.get(name) else None
        self.optimizers[stage].step()
        with torch.no_grad():
            for host in layers:
                for name, p in host.module.named_parameters():
                    host.transfer[name].copy_(p)
                    p.grad = None
        return time.perf_counter() - start

    def _collect(self, stages: Sequence[int]) -> float:
        """Wait for the optimizer steps of these backward stages; returns the seconds waited."""
        start = time.perf_counter()
        for n in stages:
            future = self._steps.pop(n, None)
            if future is not None:
                self.optimizer_busy_s += future.result()
        return time.perf_counter() - start
