"""The Python API's outputs of a plan or a model: simulation, timelines, the Chrome/Perfetto trace,
the exports, and a model's size and cost (``model_info``).

``planner.api`` exports every name here under the same name (loaded on first access); each
function imports its cost model or exporter when called.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Literal

from planner.errors import InvalidProblemError

if TYPE_CHECKING:
    from planner.api import ModelSpec
    from planner.schema import Plan, SimResult, TransformerConfig


def _cost_model(name: str) -> Any:
    return importlib.import_module(f"cost_models.{name}")


def simulate(plan: Plan, *, include_events: bool = False) -> SimResult:
    """Simulate a plan with the one schedule simulator (``cost_models.simulate``).

    Raises:
        InvalidProblemError: the plan fails ``planner.validate.validate_plan``.
    """
    from planner.validate import validate_plan

    return _cost_model("simulate").simulate(validate_plan(plan), include_events=include_events)


def resource_timelines(plan: Plan) -> dict[str, list[tuple[str, float, float]]]:
    """Host-link, CPU and BPipe-link rows for the timeline picture (``cost_models.simulate``)."""
    return _cost_model("simulate").resource_timelines(plan)


MAX_CSV_ACTIONS = 10_000_000
"""Largest per-rank action CSV ``export`` writes (about 100 MB)."""


def memory_timelines(plan: Plan, sim: SimResult) -> dict[int, list[tuple[float, float]]]:
    """Memory in use per stage over time (``cost_models.simulate.memory_timelines``)."""
    return _cost_model("simulate").memory_timelines(plan, sim)


def link_timelines(plan: Plan) -> dict[str, list[tuple[str, int, int, float, float]]]:
    """Every point-to-point transfer per directed link (``cost_models.simulate.link_timelines``)."""
    return _cost_model("simulate").link_timelines(plan)


def trace(plan: Plan, sim: SimResult | None = None) -> dict[str, Any]:
    """The plan's simulated iteration as a Chrome/Perfetto trace document (``planner.trace``)."""
    from planner.trace import chrome_trace

    if sim is None or not sim.events:
        sim = simulate(plan, include_events=True)
    return chrome_trace(plan, sim, links=link_timelines(plan), resources=resource_timelines(plan))


def export(plan: Plan, fmt: Literal["megatron", "torch-csv", "torchtitan"], *,
           schedule_csv_path: str = "schedule.csv") -> str:
    """The plan as Megatron-LM arguments, torchtitan arguments, or torch's per-rank action CSV
    (``schedule_csv_path``: where torchtitan's arguments say the CSV is, for non-built-in schedules)."""
    # By name: ``planner.export`` is this function in the package namespace, not the module.
    from planner.export import megatron_args_text, to_torch_csv
    from planner.export_torchtitan import torchtitan_args_text
    from planner.validate import validate_plan

    validate_plan(plan)
    if fmt == "megatron":
        return megatron_args_text(plan)
    if fmt == "torch-csv":
        num_actions = 2 * plan.degrees.pipeline * plan.degrees.virtual * plan.num_microbatches
        if num_actions > MAX_CSV_ACTIONS:
            raise InvalidProblemError(
                f"num_microbatches={plan.num_microbatches}: the torch-csv export lists every action, "
                f"{num_actions:,} here (at most {MAX_CSV_ACTIONS:,}); export with --format megatron, or plan "
                "fewer, larger microbatches"
            )
        return to_torch_csv(plan)
    if fmt == "torchtitan":
        return torchtitan_args_text(plan, schedule_csv_path=schedule_csv_path)
    raise InvalidProblemError(f"unknown export format {fmt!r}; choose from ['megatron', 'torch-csv', 'torchtitan']")


def model_info(model: ModelSpec, *, global_batch_size: int = 1, seq_length: int | None = None) -> dict[str, Any]:
    """Size and cost of a model: parameters (total and active) and FLOPs per iteration (PTD-P Eq. 4.2/4.3)."""
    from planner.api import load_model
    from planner.schema import TransformerConfig

    obj = load_model(model, seq_length=seq_length)
    if isinstance(obj, TransformerConfig):
        return {
            "name": obj.name,
            "kind": "transformer",
            "num_layers": obj.num_layers,
            "hidden_size": obj.hidden_size,
            "num_heads": obj.num_heads,
            "seq_length": obj.seq_length,
            "vocab_size": obj.vocab_size,
            "num_parameters": _cost_model("transformer").num_parameters(obj),
            "num_active_parameters": _cost_model("moe").num_active_parameters(obj),
            **_architecture_info(obj),
            "global_batch_size": global_batch_size,
            "flops_per_iteration": _cost_model("transformer").flops_per_iteration(obj, global_batch_size=global_batch_size),
            "flops_per_iteration_no_recompute": _cost_model("transformer").flops_per_iteration(
                obj, global_batch_size=global_batch_size, recompute=False
            ),
        }
    layer_flops = [layer.flops for layer in obj.layers]
    per_microbatch = sum(f for f in layer_flops if f is not None) if all(f is not None for f in layer_flops) else None
    return {
        "name": obj.name,
        "kind": "profile",
        "num_layers": obj.num_layers,
        "microbatch_size": obj.microbatch_size,
        "num_parameters": None,
        "param_bytes": sum(layer.param_bytes for layer in obj.layers),
        "forward_s_per_microbatch": sum(layer.forward_s for layer in obj.layers),
        "backward_s_per_microbatch": sum(layer.backward_s for layer in obj.layers),
        "global_batch_size": global_batch_size,
        "flops_per_iteration": (
            per_microbatch * global_batch_size / obj.microbatch_size if per_microbatch is not None else None
        ),
    }


def _architecture_info(cfg: TransformerConfig) -> dict[str, Any]:
    """The layer layout (FFN, norm, positions, parallel block) and the settings the exports carry beyond
    the shape (MoE, MLA, RoPE, norm epsilon, sliding windows)."""
    keys = ("num_kv_heads", "head_dim", "rope_theta", "norm_eps", "num_experts", "experts_per_token",
            "moe_ffn_hidden_size", "num_shared_experts", "first_dense_layers", "kv_lora_rank", "q_lora_rank",
            "sliding_window", "global_attention_every", "mtp_layers")
    info: dict[str, Any] = {"mlp": cfg.mlp, "norm": cfg.norm, "position_embedding": cfg.position_embedding}
    info.update({key: getattr(cfg, key) for key in (*keys, "parallel_block") if getattr(cfg, key) not in (None, 0)})
    if cfg.windowed_layers:
        info["windowed_layers"] = cfg.windowed_layers
    if cfg.is_mla or cfg.kv_heads != cfg.num_heads:
        info["kv_cache_elements_per_token_per_layer"] = _cost_model("moe").kv_cache_elements_per_token(cfg)
    return info
