"""paraplan's cost models: hardware presets, transformer analytics, model presets, profile
importers, and the one schedule simulator.

Submodules: ``hardware`` (devices and clusters), ``compute`` (per-operation GEMM/roofline/memory
kernel times), ``layer_ops`` (a transformer layer's operations), ``collectives`` (ring/tree/
hierarchical collectives, p2p, overlap), ``memory`` (usable memory, headroom, ZeRO states),
``calibration`` (fitting the compute constants), ``transformer`` (PTD-P Eq. 4.2/4.3 and the layer
profile), ``mtp`` (multi-token-prediction modules folded into the head), ``models`` (model presets), ``profiles`` (profile JSON and PipeDream ``graph.txt``),
``schedules`` and ``simulate``. The public functions below are re-exported on first use, so
``import cost_models`` stays cheap (and never loads torch).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "device_preset": "hardware",
    "cluster_preset": "hardware",
    "list_device_presets": "hardware",
    "list_cluster_presets": "hardware",
    "model_preset": "models",
    "list_model_presets": "models",
    "num_parameters": "transformer",
    "flops_per_iteration": "transformer",
    "model_flops_per_sample": "transformer",
    "transformer_profile": "transformer",
    "allreduce_time_s": "transformer",
    "gemm_time_s": "compute",
    "memory_op_s": "compute",
    "ring_allreduce_s": "collectives",
    "allreduce_s": "collectives",
    "usable_memory_bytes": "memory",
    "load_profile_json": "profiles",
    "load_pipedream_graph": "profiles",
    "parse_pipedream_graph": "profiles",
    "pipedream_profile": "profiles",
    "list_pipedream_profiles": "profiles",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cost_models' has no attribute {name!r}")
    return getattr(import_module(f"cost_models.{module}"), name)
