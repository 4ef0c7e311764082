"""The profiler: measured per-layer costs of the bundled model, written as a layer profile.

It measures what ``cost_models.transformer.transformer_profile`` estimates, with the same layer
structure (embedding, one layer per decoder block, head with the loss) and the same fields, so
that every solver reads the result (``paraplan plan --model profile.json``) and the plan runs on
the bundled model without edits (the profile keeps the model's name; see ``validate.resolve_config``).

Methods (shared/design/ecosystem.md Sec. 4):

- time: median of ``repeats`` runs after ``warmup`` runs, ``perf_counter`` around the call with a
  CUDA synchronise on GPU; forward, the whole backward, and the runtime's own split into
  backward-input and backward-weight (``stage_backward_input`` / ``stage_backward_weight``, the
  functions the zero-bubble schedules call; Sec. 3.5 item 8: on CPU I + W is not B, so
  ``backward_weight_s`` is B scaled by the measured share W / (I + W));
- activation bytes: the storages autograd saves for backward (``saved_tensors_hooks``, parameters
  excluded, Sec. 4.2), measured with the recompute the runtime applies: none; the attention core
  checkpointed (``selective``: the checkpoint keeps Q, K, V, which the hook sees); the whole block
  checkpointed (``full``: only the block input is kept). Recompute ``extra_s`` is the measured
  forward of the attention core (selective) or of the block (full);
- FLOPs with ``FlopCounterMode``; ``static_bytes`` = weights + gradients (+ optimizer state bytes
  per parameter, 0 for the bridge's plain SGD); ``param_bytes`` = the gradient bytes DDP reduces.

Decoder blocks are identical, so one block is measured and its costs repeated (as the analytic
profile does).

What a step costs (docs/runtime-bridge.md, "Measured versus predicted"): layers timed alone
missed 20 to 30% of a one-stage step. A short chain (embedding, min(N, 2) blocks, head) is run
as a one-stage run does it (torch's ``ScheduleGPipe`` over m microbatches, SGD step,
``zero_grad``) in rounds paired with its layers timed alone; the medians give a forward factor
and a backward factor (the latter carrying the schedule's per-microbatch work), applied to each
layer kind's alone time. Each layer's once-per-step work (``scale_grads``, the SGD step,
``zero_grad``) is timed on its parameters and charged as 1/m per microbatch to its backward.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.distributed.pipelining import ScheduleGPipe
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from planner.errors import InvalidProblemError
from planner.schema import LayerProfile, ModelProfile, RecomputeOption, TransformerConfig
from runtime_bridge import model as gpt
from runtime_bridge.torch_pp import make_stage

__all__ = ["profile_model"]

log = logging.getLogger(__name__)


def _device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise InvalidProblemError("--device cuda but torch sees no CUDA device; use --device cpu")
    if name not in ("cpu", "cuda"):
        raise InvalidProblemError(f"--device {name!r}: choose 'cpu' or 'cuda'")
    return torch.device(name)


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
"""``wall``: elapsed time (what a step costs). ``cpu``: this process's CPU time, which other jobs
on a shared host do not inflate; compare it with ``run``'s ``step_cpu_time_s`` (CPU only)."""
_clock: Callable[[], float] = time.perf_counter


@contextmanager
def _using_clock(name: str) -> Iterator[None]:
    global _clock
    if name not in CLOCKS:
        raise InvalidProblemError(f"clock {name!r}: choose one of {sorted(CLOCKS)}")
    previous, _clock = _clock, CLOCKS[name]
    try:
        yield
    finally:
        _clock = previous


def _once(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    """Seconds of one call of ``fn`` (CUDA synchronised) and its result."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = _clock()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return _clock() - start, out


def _timed(fn: Callable[..., Any], device: torch.device, *, setup: Callable[[], Any] | None, warmup: int,
           repeats: int) -> float:
    """Median seconds of ``fn(setup())`` (or ``fn()``); ``setup`` is not timed."""
    samples = []
    for _ in range(warmup + repeats):
        arg = setup() if setup else None
        samples.append(_once((lambda: fn(arg)) if setup else fn, device)[0])
    return statistics.median(samples[warmup:])


def _saved_bytes(fn: Callable[[], Any], params: list[torch.Tensor]) -> tuple[Any, int]:
    """Run ``fn`` and count the bytes of distinct storages autograd saves, parameters excluded."""
    skip = {p.untyped_storage()._cdata for p in params}
    seen: set[int] = set()
    total = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage()._cdata
        if key not in seen and key not in skip:
            seen.add(key)
            total[0] += t.untyped_storage().nbytes()
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, total[0]


class _LayerBench:
    """Forward/backward closures of one layer with fixed inputs."""

    def __init__(self, layer: nn.Module, make_inputs: Callable[[], tuple[torch.Tensor, ...]],
                 forward: Callable[..., torch.Tensor], grad_input: bool) -> None:
        self.layer, self.make_inputs, self.forward_fn = layer, make_inputs, forward
        self.params = list(layer.parameters())
        self.grad_input = grad_input

    def forward(self) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        inputs = self.make_inputs()
        return self.forward_fn(*inputs), inputs

    def output_grad(self, out: torch.Tensor) -> torch.Tensor | None:
        return None if out.dim() == 0 else torch.ones_like(out)

    def backward(self, fwd: tuple[torch.Tensor, tuple[torch.Tensor, ...]]) -> None:
        out, _ = fwd
        out.backward(self.output_grad(out))
        self.zero()

    def backward_input(self, fwd: tuple[torch.Tensor, tuple[torch.Tensor, ...]]) -> list[dict[str, Any]]:
        out, inputs = fwd
        grads = None if out.dim() == 0 else [self.output_grad(out)]
        values = [x for x in inputs if x.requires_grad]
        _, groups = stage_backward_input([out], grads, values, iter(self.params))
        return groups

    def zero(self) -> None:
        for p in self.params:
            p.grad = None


def _bench_layer(bench: _LayerBench, device: torch.device, warmup: int, repeats: int) -> dict[str, float]:
    t = {"forward_s": _timed(lambda: bench.forward(), device, setup=None, warmup=warmup, repeats=repeats)}
    t["backward_s"] = _timed(bench.backward, device, setup=bench.forward, warmup=warmup, repeats=repeats)
    t["input_s"] = _timed(bench.backward_input, device, setup=bench.forward, warmup=warmup, repeats=repeats)

    def weight(groups: list[dict[str, Any]]) -> None:
        stage_backward_weight(iter(bench.params), groups)
        bench.zero()

    t["weight_s"] = _timed(weight, device, setup=lambda: bench.backward_input(bench.forward()),
                           warmup=warmup, repeats=repeats)
    return t


def _flops(bench: _LayerBench) -> float:
    with FlopCounterMode(display=False) as counter:
        out, _ = bench.forward()
        out.backward(bench.output_grad(out))
    bench.zero()
    return float(counter.get_total_flops())


def _layer_profile(name: str, kind: str, bench: _LayerBench, device: torch.device, *, warmup: int,
                   repeats: int, optimizer_bytes_per_param: float) -> tuple[LayerProfile, dict[str, float]]:
    t = _bench_layer(bench, device, warmup, repeats)
    (out, _), saved = _saved_bytes(bench.forward, bench.params)
    weight_share = t["weight_s"] / (t["input_s"] + t["weight_s"])
    param_bytes = sum(p.numel() * p.element_size() for p in bench.params)
    numel = sum(p.numel() for p in bench.params)
    profile = LayerProfile(
        name=name, kind=kind, forward_s=t["forward_s"], backward_s=t["backward_s"],
        backward_weight_s=t["backward_s"] * min(weight_share, 0.99),
        activation_bytes=float(saved), static_bytes=2.0 * param_bytes + optimizer_bytes_per_param * numel,
        output_bytes=0.0 if out.dim() == 0 else float(out.numel() * out.element_size()),
        param_bytes=float(param_bytes), flops=_flops(bench),
    )
    return profile, t


def _block_recompute(cfg: TransformerConfig, block: gpt.Block, bench: _LayerBench, profile: LayerProfile,
                     device: torch.device, dtype: torch.dtype, b: int, warmup: int, repeats: int
                     ) -> dict[str, RecomputeOption]:
    """none / selective / full options of a decoder block (Korthikanti et al. Sec. 5)."""
    block.selective_recompute = True
    _, selective_saved = _saved_bytes(bench.forward, bench.params)
    block.selective_recompute = False
    _, full_saved = _saved_bytes(
        lambda: checkpoint(block, bench.make_inputs()[0], use_reentrant=False), bench.params)
    head_dim = gpt.head_dim(cfg)
    q = torch.randn((b, cfg.num_heads, cfg.seq_length, head_dim), device=device, dtype=dtype, requires_grad=True)
    k, v = (torch.randn((b, cfg.kv_heads, cfg.seq_length, head_dim), device=device, dtype=dtype,
                        requires_grad=True) for _ in range(2))
    core_s = _timed(lambda: gpt.attention_core(q, k, v), device, setup=None, warmup=warmup, repeats=repeats)
    tail_s = 0.0  # the non-reentrant checkpoint stops before a dense FFN's output projection (w2)
    if isinstance(block.feed_forward, gpt.FeedForward):
        w2 = block.feed_forward.w2
        hidden = torch.randn((b, cfg.seq_length, w2.in_features), device=device, dtype=dtype)
        with torch.no_grad():
            tail_s = _timed(lambda: w2(hidden), device, setup=None, warmup=warmup, repeats=repeats)
    return {
        "none": RecomputeOption(activation_bytes=float(profile.activation_bytes or 0.0)),
        "selective": RecomputeOption(activation_bytes=float(selective_saved), extra_s=core_s),
        "full": RecomputeOption(activation_bytes=float(full_saved), extra_s=max(0.0, profile.forward_s - tail_s)),
    }


def profile_model(
    cfg: TransformerConfig,
    *,
    device: str = "cpu",
    microbatch_size: int = 1,
    warmup: int = 2,
    repeats: int = 5,
    optimizer_bytes_per_param: float = 0.0,
    seed: int = 0,
    num_threads: int | None = 1,
    num_microbatches: int = 4,
    clock: str = "wall",
) -> ModelProfile:
    """Measure the bundled model's layers on this machine.

    Args:
        cfg: the transformer (a preset or config; any size that fits one device).
        device: ``cpu`` or ``cuda``.
        microbatch_size: samples per microbatch the costs are measured for.
        warmup: untimed runs before timing.
        repeats: timed runs; the median is kept.
        optimizer_bytes_per_param: optimizer state added to ``static_bytes`` (8 for fp32 Adam).
        seed: weights and inputs.
        num_threads: torch CPU threads while measuring; 1 matches the bridge's CPU ranks (and
            avoids OpenMP stalls when another process shares the cores); None leaves it as is.
        num_microbatches: microbatches per iteration that each layer's once-per-step work
            (gradient scaling by 1/m, the SGD step, zero_grad) is spread over; use the plan's m.
        clock: ``wall`` (default) or ``cpu`` (process CPU time, for a shared CPU host; see ``CLOCKS``).

    Returns:
        A profile of ``cfg.num_layers + 2`` layers named after ``cfg`` (``source="profiler"``).

    Raises:
        InvalidProblemError: an unknown device, no CUDA device, or a microbatch size below 1.
    """
    dev = _device(device)
    if microbatch_size < 1 or repeats < 1 or warmup < 0 or num_microbatches < 1:
        raise InvalidProblemError(
            f"microbatch_size={microbatch_size}, repeats={repeats}, warmup={warmup}, num_microbatches="
            f"{num_microbatches}: need b >= 1, repeats >= 1, warmup >= 0, m >= 1"
        )
    from runtime_bridge.validate import check_buildable

    check_buildable(cfg)
    if cfg.num_experts is not None and 0 < cfg.first_dense_layers < cfg.num_layers:
        raise InvalidProblemError(
            f"first_dense_layers={cfg.first_dense_layers} of {cfg.num_layers}: the profiler measures one block and "
            "copies it, so it profiles all-dense or all-MoE models only; profile with first_dense_layers=0 (every "
            "block MoE) or use the analytic profile (paraplan plan --model CONFIG)"
        )
    previous_threads = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    if clock != "wall" and dev.type == "cuda":
        raise InvalidProblemError("clock 'cpu' measures CPU work; on CUDA use the default clock 'wall'")
    try:
        with torch.enable_grad(), _using_clock(clock):
            profile = _profile(cfg, dev, microbatch_size, warmup, repeats, optimizer_bytes_per_param, seed)
            return _step_costs(profile, cfg, dev, num_microbatches, warmup, repeats, seed)
    finally:
        torch.set_num_threads(previous_threads)


def _profile(cfg: TransformerConfig, dev: torch.device, microbatch_size: int, warmup: int, repeats: int,
             optimizer_bytes_per_param: float, seed: int) -> ModelProfile:
    dtype, b = gpt.model_dtype(cfg, dev), microbatch_size
    tokens, targets = gpt.sample_batch(cfg, batch_size=b, step=0, seed=seed)
    tokens, targets = tokens.to(dev), targets.to(dev)
    hidden = torch.randn(b, cfg.seq_length, cfg.hidden_size, generator=torch.Generator().manual_seed(seed))
    hidden = hidden.to(device=dev, dtype=dtype)
    layers = {i: gpt.build_layer(cfg, i).to(device=dev, dtype=dtype) for i in (0, 1, cfg.num_layers + 1)}
    for i, layer in layers.items():
        gpt.init_layer(layer, i, seed=seed)
    fresh = lambda: (hidden.detach().requires_grad_(True),)  # noqa: E731
    benches = {
        "embedding": _LayerBench(layers[0], lambda: (tokens,), layers[0], grad_input=False),
        "decoder": _LayerBench(layers[1], fresh, layers[1], grad_input=True),
        "head": _LayerBench(layers[cfg.num_layers + 1], fresh,
                            lambda x: gpt.lm_loss(layers[cfg.num_layers + 1](x), targets), grad_input=True),
    }
    kw = {"warmup": warmup, "repeats": repeats, "optimizer_bytes_per_param": optimizer_bytes_per_param}
    emb, _ = _layer_profile("embedding", "embedding", benches["embedding"], dev, **kw)
    block, _ = _layer_profile("decoder0", "decoder", benches["decoder"], dev, **kw)
    options = _block_recompute(cfg, layers[1], benches["decoder"], block, dev, dtype, b, warmup, repeats)
    block = block.model_copy(update={"activation_bytes": None, "recompute": options})
    head, _ = _layer_profile("head", "head", benches["head"], dev, **kw)
    decoders = [block.model_copy(update={"name": f"decoder{i}"}) for i in range(cfg.num_layers)]
    device_name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    return ModelProfile(
        name=cfg.name, layers=(emb, *decoders, head), microbatch_size=b, tensor_parallel=1,
        tokens_per_sample=cfg.seq_length, device=device_name, source="profiler",
    )


def _chain(cfg: TransformerConfig, dev: torch.device, dtype: torch.dtype, seed: int) -> list[nn.Module]:
    """Embedding, min(N, 2) blocks and the head: a short model that runs its layers in sequence."""
    layers = []
    for i in (0, *range(1, min(cfg.num_layers, 2) + 1), cfg.num_layers + 1):
        layer = gpt.build_layer(cfg, i).to(device=dev, dtype=dtype)
        gpt.init_layer(layer, i, seed=seed)
        layers.append(layer)
    return layers


@contextmanager
def _one_rank_group() -> Iterator[bool]:
    """A private one-rank gloo group on an in-memory store, for torch's schedule; yields False (and
    creates nothing) when a process group already exists (profiling inside a distributed job)."""
    own = dist.is_available() and not dist.is_initialized()
    if own:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield own
    finally:
        if own:
            dist.destroy_process_group()


def _chain_step(chain: list[nn.Module], tokens: torch.Tensor, targets: torch.Tensor, num_microbatches: int,
                dev: torch.device, use_schedule: bool) -> Callable[[], None]:
    """One training step of ``chain`` as a one-stage run does it: torch's ``ScheduleGPipe`` over m
    microbatches (all forwards with the loss, all backwards, ``scale_grads``), the SGD step and
    ``zero_grad``; without a private process group, the same order as a plain loop."""
    model = nn.Sequential(*chain)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the worker's optimizer; lr 0 keeps the weights
    m = num_microbatches
    if use_schedule:
        schedule = ScheduleGPipe(make_stage(model, stage_index=0, num_stages=1, device=dev), m, loss_fn=gpt.lm_loss)
        run = lambda: schedule.step(tokens, target=targets)  # noqa: E731
    else:
        log.info("a process group exists: the chain runs without torch's schedule")

        def run() -> None:
            losses = [gpt.lm_loss(model(x), y) for x, y in zip(tokens.chunk(m), targets.chunk(m))]
            for loss in losses:
                (loss / m).backward()

    def step() -> None:
        run()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _sequence_round(benches: list[_LayerBench], chain_forward: Callable[[], Any], step: Callable[[], None],
                    dev: torch.device) -> tuple[list[float], list[float], float, float]:
    """One round, back to back so that its figures share one machine load: each chain layer alone
    (forward, backward), the chain's forward in sequence, one training step."""
    alone_f, alone_b = [], []
    for bench in benches:
        seconds, fwd = _once(bench.forward, dev)
        alone_f.append(seconds)
        alone_b.append(_once(lambda: bench.backward(fwd), dev)[0])
    return alone_f, alone_b, _once(chain_forward, dev)[0], _once(step, dev)[0]


def _chain_benches(chain: list[nn.Module], tokens: torch.Tensor, targets: torch.Tensor, hidden: torch.Tensor
                   ) -> list[_LayerBench]:
    """The chain's layers one at a time, as ``_profile`` times them."""
    fresh = lambda: (hidden.detach().requires_grad_(True),)  # noqa: E731
    benches = [_LayerBench(chain[0], lambda: (tokens,), chain[0], grad_input=False)]
    benches += [_LayerBench(x, fresh, x, grad_input=True) for x in chain[1:-1]]
    benches.append(_LayerBench(chain[-1], fresh, lambda x: gpt.lm_loss(chain[-1](x), targets), grad_input=True))
    return benches


def _sequence_factors(chain: list[nn.Module], tokens: torch.Tensor, targets: torch.Tensor, hidden: torch.Tensor,
                      num_microbatches: int, per_step_s: float, dev: torch.device, warmup: int, repeats: int
                      ) -> tuple[float, float, dict[str, tuple[float, float]]]:
    """Medians over paired rounds: (forward factor, backward factor, per kind the (forward, backward)
    seconds of a layer alone in those rounds). Forward factor: the chain's forward over its layers'
    forwards alone. Backward factor: what is left of a microbatch's share of the step once the
    forward and the per-step work (``per_step_s``, charged separately) are taken out, over the
    layers' backwards alone; it carries the schedule's per-microbatch work and the in-sequence
    effects of the backward."""
    b, m = hidden.shape[0], num_microbatches
    benches = _chain_benches(chain, tokens[:b], targets[:b], hidden)

    def chain_forward() -> torch.Tensor:
        x = tokens[:b]
        for layer in chain[:-1]:
            x = layer(x)
        return gpt.lm_loss(chain[-1](x), targets[:b])

    with _one_rank_group() as own:
        step = _chain_step(chain, tokens, targets, m, dev, use_schedule=own)
        rounds = [_sequence_round(benches, chain_forward, step, dev) for _ in range(max(warmup, 1) + repeats)]
    rounds = rounds[max(warmup, 1):]  # the first step infers shapes
    forward = statistics.median(fwd / sum(f) for f, _, fwd, _ in rounds)
    backward = statistics.median(((s - per_step_s) / m - fwd) / sum(bw) for _, bw, fwd, s in rounds)
    if backward <= 0.1:  # only under extreme noise: one factor for both
        backward = forward = statistics.median((s - per_step_s) / m / (sum(f) + sum(bw)) for f, bw, _, s in rounds)
    kinds = {"embedding": [0], "decoder": list(range(1, len(chain) - 1)), "head": [len(chain) - 1]}
    alone = {kind: (statistics.median(r[0][i] for r in rounds for i in idx),
                    statistics.median(r[1][i] for r in rounds for i in idx)) for kind, idx in kinds.items()}
    log.info("in-sequence factors: forward %.3f, backward %.3f (median step %.3g s); layers alone %s",
             forward, backward, statistics.median(r[3] for r in rounds), alone)
    return forward, backward, alone


def _iteration_s(layer: nn.Module, num_microbatches: int, dev: torch.device, warmup: int, repeats: int) -> float:
    """Once-per-step work on the layer's parameters as the bridge's step does it: torch's
    ``scale_grads`` (every gradient divided by m), the SGD step and ``zero_grad``."""
    params = list(layer.parameters())
    optimizer = torch.optim.SGD(params, lr=0.0)  # the worker's optimizer; lr 0 keeps the weights

    def setup() -> None:
        for p in params:
            p.grad = torch.ones_like(p)

    def step(_: None) -> None:
        with torch.no_grad():
            for p in params:
                p.grad.div_(num_microbatches)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return _timed(step, dev, setup=setup, warmup=warmup, repeats=repeats)


def _scaled(layer: LayerProfile, forward_factor: float, backward_factor: float, per_microbatch_s: float
            ) -> LayerProfile:
    """The layer's times as a step pays them: scaled to the in-sequence run, plus its share of the
    once-per-step work, charged to the weight-gradient part of the backward (both are per-parameter
    work after the weight gradients exist)."""
    recompute = None if layer.recompute is None else {
        k: o.model_copy(update={"extra_s": o.extra_s * forward_factor}) for k, o in layer.recompute.items()}
    weight_s = None if layer.backward_weight_s is None else layer.backward_weight_s * backward_factor + per_microbatch_s
    return layer.model_copy(update={
        "forward_s": layer.forward_s * forward_factor,
        "backward_s": layer.backward_s * backward_factor + per_microbatch_s,
        "backward_weight_s": weight_s, "recompute": recompute,
    })


def _step_costs(profile: ModelProfile, cfg: TransformerConfig, dev: torch.device, num_microbatches: int,
                warmup: int, repeats: int, seed: int) -> ModelProfile:
    """Turn the layers-alone times into what a training step costs (docs/runtime-bridge.md,
    "Measured versus predicted"): the in-sequence factors and the per-step work spread over m."""
    dtype, b, m = gpt.model_dtype(cfg, dev), profile.microbatch_size, num_microbatches
    chain = _chain(cfg, dev, dtype, seed)
    by_kind = {"embedding": chain[0], "decoder": chain[1], "head": chain[-1]}
    per_step = {kind: _iteration_s(layer, m, dev, warmup, repeats) for kind, layer in by_kind.items()}
    log.info("per-step work (scale_grads, SGD step, zero_grad) per layer kind: %s s", per_step)
    tokens, targets = gpt.sample_batch(cfg, batch_size=b * m, step=0, seed=seed)
    hidden = torch.randn(b, cfg.seq_length, cfg.hidden_size, generator=torch.Generator().manual_seed(seed))
    chain_per_step_s = per_step["embedding"] + (len(chain) - 2) * per_step["decoder"] + per_step["head"]
    hidden = hidden.to(device=dev, dtype=dtype)
    forward, backward, alone = _sequence_factors(chain, tokens.to(dev), targets.to(dev), hidden, m, chain_per_step_s,
                                                 dev, warmup, repeats)
    by_name = {x.kind: x for x in (profile.layers[0], profile.layers[1], profile.layers[-1])}
    factors = {kind: (forward * f / by_name[kind].forward_s, backward * bw / by_name[kind].backward_s)
               for kind, (f, bw) in alone.items()}
    layers = tuple(_scaled(x, *factors[x.kind], per_step[x.kind] / m) for x in profile.layers)
    return profile.model_copy(update={"layers": layers})
