"""Recompute granularity per module, as Megatron-Core expresses it (``--recompute-granularity
selective --recompute-modules ...``): for each module, the activation bytes recomputing it frees
and the forward time it re-spends in the backward, per decoder layer, microbatch and device.

Bytes follow the per-tensor accounting of ``transformer.decoder_activation_bytes`` (Korthikanti et
al., MLSys 2023, Sec. 4.1) and ``moe_memory`` (symbols: T = s b tokens, e element bytes, t the
tensor-parallel degree, t_sp = t with sequence parallelism else 1, R the routed rows):

- ``core_attn``: the attention core's own saved tensors (``attention_core_activation_bytes``:
  5as^2b/t unfused, 4asb/t flash) — Megatron's default selective set (Korthikanti Sec. 5);
- ``layernorm``: the outputs of the input and pre-MLP norms, 2 e T h / t_sp (output-discarding
  checkpoint: the norm input is kept, its output re-made);
- ``mlp`` (dense layers): the FFN's hidden tensors, e (2 or 3) T f / t; the checkpoint keeps the
  block input;
- ``moe`` (MoE layers): the whole MoE block but its input and dropout mask: router scores and map,
  dispatched copies, experts' hidden tensors, combine inputs, shared experts;
- ``moe_act``: the routed experts' activation output (FC2's input), e R f_e / t;
- ``shared_experts``: the shared experts' hidden tensors, e T n_s f_e (2 or 3) / t;
- ``mla_up_proj``: MLA's up-projected Q, K and V, e T n_h (2 d_qk + d_v) / t (DeepSeek-V3,
  Liu et al. 2024, Sec. 3.2.3 recomputes exactly these and the norms).

``moe`` contains ``moe_act`` and ``shared_experts``: with it they add nothing. A module a layer
does not have (``mlp`` in an MoE layer, ``moe`` in a dense one) frees nothing and costs nothing,
as in Megatron, where the set applies to every layer. Times come from the per-operation model
(``layer_ops``): the module's forward GEMMs, memory-bound kernels and, for ``mlp``/``moe``, the
tensor-parallel collective of its block; the expert all-to-alls are added at the search's degrees.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import combinations

from cost_models import fp8, moe, moe_memory, moe_ops
from cost_models.compute import gemm_fwd_bwd_s, memory_op_s
from cost_models.layer_ops import OpTimes
from planner.schema import (RECOMPUTE_MODULES, Device, RecomputeOption, TransformerConfig, module_strategy,
                            recompute_modules_of)

_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}
_OUTPUT_DISCARDING = ("moe_act", "layernorm", "mla_up_proj")
"""Megatron-Core checkpoints these by discarding their output; the others by re-running the module."""


def applicable_modules(cfg: TransformerConfig) -> tuple[str, ...]:
    """The modules some layer of ``cfg`` has (Megatron rejects ``mla_up_proj`` without MLA)."""
    out = ["core_attn", "layernorm"]
    if not cfg.is_moe or cfg.first_dense_layers:
        out.append("mlp")
    if cfg.is_moe:
        out += ["moe", "moe_act"] + (["shared_experts"] if cfg.num_shared_experts else [])
    if cfg.is_mla:
        out.append("mla_up_proj")
    return tuple(m for m in RECOMPUTE_MODULES if m in out)


def _acts(cfg: TransformerConfig) -> int:
    return 3 if cfg.gated_mlp else 2


def module_bytes(cfg: TransformerConfig, module: str, *, microbatch_size: int, tensor_parallel: int = 1,
                 sequence_parallel: bool = True, layer_index: int = 0, attention: str = "flash") -> float:
    """Activation bytes recomputing ``module`` frees in decoder layer ``layer_index`` (module docstring)."""
    from cost_models.transformer import attention_core_activation_bytes  # transformer imports this module

    e, t, h = _BYTES[cfg.dtype], tensor_parallel, cfg.hidden_size
    t_sp = t if sequence_parallel else 1
    tokens = cfg.seq_length * microbatch_size
    moe_layer = cfg.is_moe and moe.is_moe_layer(cfg, layer_index)
    width = moe_ops.expert_ffn_width(cfg)
    if module == "core_attn":
        return attention_core_activation_bytes(cfg, microbatch_size=microbatch_size, tensor_parallel=t,
                                               attention=attention)
    if module == "layernorm":
        return 2 * e * tokens * h / t_sp
    if module == "mlp":
        return 0.0 if moe_layer else e * _acts(cfg) * tokens * cfg.ffn_size / t
    if module == "mla_up_proj":
        if not cfg.is_mla:
            return 0.0
        return e * tokens * cfg.num_heads * (2 * moe.qk_head_dim(cfg) + moe.v_head_dim(cfg)) / t
    if not moe_layer:
        return 0.0
    if module == "moe":
        block = moe_memory.moe_mlp_activation_bytes(cfg, microbatch_size=microbatch_size, tensor_parallel=t,
                                                    sequence_parallel=sequence_parallel)
        return block - (e + 1) * tokens * h / t_sp
    if module == "moe_act":
        return e * moe_memory.routed_rows(cfg, tokens) * width / t
    if module == "shared_experts":
        return e * tokens * _acts(cfg) * cfg.num_shared_experts * width / t
    raise ValueError(f"unknown recompute module {module!r}; choose from {list(RECOMPUTE_MODULES)}")


def _gemms_forward_s(gemms: list[moe_ops.Gemm], device: Device) -> float:
    """The GEMMs' forward as the layer runs it (``layer_ops.decoder_op_times``): in the linear layers'
    dtype, FP8 with ``--precision fp8|fp8-cs`` (Transformer Engine re-runs its FP8 forward), each input
    cast again (the weights' cached copies are reused: ``cost_models.fp8``)."""
    dtype = fp8.gemm_dtype(device)
    time = sum(count * gemm_fwd_bwd_s(m, n, k, device, dtype=dtype)[0] for m, n, k, count in gemms)  # type: ignore[arg-type]
    cast_bytes, _, launches, _ = fp8.quantize_bytes(gemms, device)  # type: ignore[arg-type]
    return time + memory_op_s(cast_bytes, device, num_kernels=launches)


def module_forward_s(cfg: TransformerConfig, device: Device, module: str, dec: OpTimes, *, microbatch_size: int,
                     tensor_parallel: int = 1, sequence_parallel: bool = True, layer_index: int = 0) -> float:
    """Forward time recomputing ``module`` re-spends in the backward of decoder layer ``layer_index``
    (per-operation model; ``dec`` is the layer's ``layer_ops.decoder_op_times``)."""
    e, t, h = _BYTES[cfg.dtype], tensor_parallel, cfg.hidden_size
    tokens = cfg.seq_length * microbatch_size
    n_h = tokens * h / (t if sequence_parallel else 1)
    moe_layer = cfg.is_moe and moe.is_moe_layer(cfg, layer_index)
    width, acts = moe_ops.expert_ffn_width(cfg), _acts(cfg)
    block_comm = dec.forward_comm_s / 2  # one of the layer's two tensor-parallel collectives
    if module == "core_attn":
        return dec.selective_s
    if module == "layernorm":
        return memory_op_s(2 * 2 * e * n_h, device, num_kernels=2)  # two norms: read and write T h
    if module == "mlp":
        if moe_layer:
            return 0.0
        gemms = moe_ops.mlp_gemms(cfg, tokens, t, layer_index)
        return _gemms_forward_s(gemms, device) + memory_op_s(acts * e * tokens * cfg.ffn_size / t, device) + block_comm
    if module == "mla_up_proj":
        if not cfg.is_mla:
            return 0.0
        attn = moe_ops.attention_gemms(cfg, tokens, t)  # [q_down, q_up | q], kv_down, kv_up, out
        up = [attn[-2]] + ([attn[1]] if cfg.q_lora_rank else [])
        q_rope, k_rope = moe_ops.rope_widths(cfg)
        return _gemms_forward_s(up, device) + memory_op_s(2 * e * tokens * (q_rope / t + k_rope), device)
    if not moe_layer:
        return 0.0
    rows = moe_memory.routed_rows(cfg, tokens)
    gemms = moe_ops.mlp_gemms(cfg, tokens, t, layer_index)  # router, routed FC1/FC2, shared FC1/FC2
    if module == "moe_act":
        return memory_op_s(acts * e * rows * width / t, device)
    if module == "shared_experts":
        return _gemms_forward_s(gemms[3:], device) + memory_op_s(
            acts * e * tokens * cfg.num_shared_experts * width / t, device)
    if module == "moe":
        route, _ = moe_ops.routing_bytes(cfg, tokens, e, layer_index)
        hidden = acts * e * (rows + tokens * cfg.num_shared_experts) * width / t
        return _gemms_forward_s(gemms, device) + memory_op_s(route + hidden, device, num_kernels=4) + block_comm
    raise ValueError(f"unknown recompute module {module!r}; choose from {list(RECOMPUTE_MODULES)}")


def effective_modules(modules: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The modules that count: ``moe`` re-runs the whole block, so ``moe_act`` and ``shared_experts``
    under it add nothing."""
    if "moe" in modules:
        return tuple(m for m in modules if m not in ("moe_act", "shared_experts"))
    return tuple(modules)


def candidate_sets(cfg: TransformerConfig) -> list[tuple[str, ...]]:
    """Every non-empty set of the applicable modules without a redundant member (``moe`` with
    ``moe_act`` or ``shared_experts``), in canonical order."""
    return [modules for modules, _ in _named_sets(applicable_modules(cfg))]


@lru_cache(maxsize=64)
def _named_sets(mods: tuple[str, ...]) -> tuple[tuple[tuple[str, ...], str], ...]:
    out = []
    for size in range(1, len(mods) + 1):
        for combo in combinations(mods, size):
            if effective_modules(combo) == combo:
                out.append((combo, module_strategy(combo)))
    return tuple(out)


def module_set_options(cfg: TransformerConfig, device: Device, dec: OpTimes, none_bytes: float, *,
                       microbatch_size: int, tensor_parallel: int = 1, sequence_parallel: bool = True,
                       layer_index: int = 0, attention: str = "flash",
                       sets: list[tuple[str, ...]] | None = None,
                       kept_smaller: dict[str, float] | None = None) -> dict[str, RecomputeOption]:
    """One ``RecomputeOption`` per module set (named ``module_strategy(set)``): the layer's
    no-recompute bytes less what the set frees, and the forward time it re-spends. ``kept_smaller``:
    per module, bytes its tensors already take less in ``none_bytes`` than in the layer's dtype (FP8
    linear inputs, ``fp8.module_saving_bytes``), which recomputing it does not free again."""
    kw = {"microbatch_size": microbatch_size, "tensor_parallel": tensor_parallel,
          "sequence_parallel": sequence_parallel, "layer_index": layer_index}
    smaller = kept_smaller or {}
    freed = {m: module_bytes(cfg, m, **kw, attention=attention) - smaller.get(m, 0.0) for m in applicable_modules(cfg)}
    spent = {m: module_forward_s(cfg, device, m, dec, **kw) for m in applicable_modules(cfg)}
    out = {}
    named = _named_sets(applicable_modules(cfg)) if sets is None else [(m, module_strategy(m)) for m in sets]
    for modules, name in named:
        mods = effective_modules(modules)
        # built without validation (up to ~80 per layer in a search): both values are finite and >= 0
        out[name] = RecomputeOption.model_construct(
            activation_bytes=max(0.0, none_bytes - sum(freed.get(m, 0.0) for m in mods)),
            extra_s=sum(spent.get(m, 0.0) for m in mods))
    return out


def parse_module_sets(text: str, cfg: TransformerConfig) -> list[tuple[str, ...]]:
    """Comma-separated module sets (``layernorm+moe_act,moe``) as Megatron-Core module tuples.

    Raises:
        InvalidProblemError: an empty list, a name that is not one of ``RECOMPUTE_MODULES``, or a
            module ``cfg`` does not have.
    """
    from planner.errors import InvalidProblemError

    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise InvalidProblemError(f"recompute_modules={text!r} is empty; give sets such as layernorm+mlp,core_attn")
    have = applicable_modules(cfg)
    out = []
    for item in items:
        modules = tuple(m.strip() for m in item.split("+"))
        bad = [m for m in modules if m not in RECOMPUTE_MODULES]
        if bad:
            raise InvalidProblemError(f"recompute_modules: {bad} in {item!r} are not Megatron-Core's recompute modules; "
                                      f"choose from {list(RECOMPUTE_MODULES)}")
        missing = [m for m in modules if m not in have]
        if missing:
            raise InvalidProblemError(f"recompute_modules: {missing} in {item!r} do not exist in {cfg.name!r}; its "
                                      f"recompute modules are {list(have)}")
        out.append(recompute_modules_of(module_strategy(modules)) or ())
    return list(dict.fromkeys(out))


def frontier(options: dict[str, RecomputeOption]) -> list[str]:
    """Module strategies worth searching: sorted by recompute time, each keeping fewer bytes than every
    cheaper one (a set that costs more time and frees no more memory can never be the cheapest fit)."""
    ranked = sorted(options, key=lambda name: (options[name].extra_s, options[name].activation_bytes, name))
    out: list[str] = []
    for name in ranked:
        if not out or options[name].activation_bytes < options[out[-1]].activation_bytes:
            out.append(name)
    return out
