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
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from planner.errors import InvalidProblemError
from planner.schema import LayerProfile, ModelProfile, RecomputeOption, TransformerConfig
from runtime_bridge import model as gpt

__all__ = ["profile_model"]


def _device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise InvalidProblemError("--device cuda but torch sees no CUDA device; use --device cpu")
    if name not in ("cpu", "cuda"):
        raise InvalidProblemError(f"--device {name!r}: choose 'cpu' or 'cuda'")
    return torch.device(name)


def _timed(fn: Callable[[], Any], device: torch.device, *, setup: Callable[[], Any] | None, warmup: int,
           repeats: int) -> float:
    """Median seconds of ``fn(setup())`` (or ``fn()``); ``setup`` is not timed."""
    samples = []
    for i in range(warmup + repeats):
        arg = setup() if setup else None
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn(arg) if setup else fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= warmup:
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)


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
    head_dim = cfg.hidden_size // cfg.num_heads
    q = torch.randn((b, cfg.num_heads, cfg.seq_length, head_dim), device=device, dtype=dtype, requires_grad=True)
    k, v = (torch.randn((b, cfg.kv_heads, cfg.seq_length, head_dim), device=device, dtype=dtype,
                        requires_grad=True) for _ in range(2))
    core_s = _timed(lambda: gpt.attention_core(q, k, v), device, setup=None, warmup=warmup, repeats=repeats)
    return {
        "none": RecomputeOption(activation_bytes=float(profile.activation_bytes or 0.0)),
        "selective": RecomputeOption(activation_bytes=float(selective_saved), extra_s=core_s),
        "full": RecomputeOption(activation_bytes=float(full_saved), extra_s=profile.forward_s),
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

    Returns:
        A profile of ``cfg.num_layers + 2`` layers named after ``cfg`` (``source="profiler"``).

    Raises:
        InvalidProblemError: an unknown device, no CUDA device, or a microbatch size below 1.
    """
    dev = _device(device)
    if microbatch_size < 1 or repeats < 1 or warmup < 0:
        raise InvalidProblemError(
            f"microbatch_size={microbatch_size}, repeats={repeats}, warmup={warmup}: need b >= 1, repeats >= 1, warmup >= 0"
        )
    previous_threads = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        with torch.enable_grad():
            return _profile(cfg, dev, microbatch_size, warmup, repeats, optimizer_bytes_per_param, seed)
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
