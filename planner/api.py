"""The Python API: load inputs, plan, simulate, export, all in process.

Every function takes and returns the schema types of ``planner.schema``; none needs a file or
a subprocess, so an autotuner can call ``plan`` and ``simulate`` thousands of times::

    from planner import api
    problem = api.make_problem("gpt-1.7b", "a100-80gb:8", num_stages=4, tensor_parallel=2)
    plan = api.plan(problem, solver="even")
    result = api.simulate(plan)
    print(result.iteration_time_s, plan.predicted.throughput_samples_per_s)
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.errors import InfeasibleError, InvalidProblemError, PlannerError

if TYPE_CHECKING:  # loaded on first use (``__getattr__`` below): import planner.api loads no pydantic
    from planner import config_readers, schema_io
    from planner.schema import Cluster, ModelProfile, PipelineProblem, Plan, SimResult, TransformerConfig, _Frozen
    from planner.validate import validate_plan

    ModelSpec = str | Path | ModelProfile | TransformerConfig
    ClusterSpec = str | Path | Cluster

__all__ = [
    "Cluster", "ClusterSpec", "InfeasibleError", "InvalidProblemError", "MAX_CSV_ACTIONS", "ModelProfile", "ModelSpec",
    "OFFLOAD_SOLVERS", "PipelineProblem", "Plan", "PlannerError", "SimResult", "TENSOR_SEARCHING_SOLVERS",
    "TransformerConfig", "cloud_export", "cloud_plan", "cloud_problem", "cloud_replay", "cluster_simulate",
    "default_solver", "export", "fill", "fill_jobs", "fill_options", "fill_scale", "gavel_policies", "gavel_policy",
    "generate_cloud_trace", "link_timelines", "load_cloud_catalogue", "load_cloud_trace", "load_cluster",
    "load_model", "load_plan", "make_problem", "memory_timelines", "model_info", "plan", "resource_timelines",
    "save", "schedule", "simulate", "trace", "validate_plan",
]

# Names this module exports but loads on first access (PEP 562): the schema's types (pydantic),
# the plan validator, the input readers, the solver registry and the logger. The functions
# import what they use when called.
_LAZY_NAMES = {name: "planner.schema" for name in (
    "Cluster", "ModelProfile", "PipelineProblem", "Plan", "SimResult", "TransformerConfig", "_Frozen")}
_LAZY_NAMES["validate_plan"] = "planner.validate"
_LAZY_NAMES.update({name: "planner.api_outputs" for name in (  # simulation, timelines, exports, model info
    "simulate", "resource_timelines", "MAX_CSV_ACTIONS", "memory_timelines", "link_timelines", "trace", "export",
    "model_info")})
_LAZY_NAMES.update({name: "planner.api_jobs" for name in (  # Gavel, PipeFill and the cloud planner
    "gavel_policies", "gavel_policy", "schedule", "cluster_simulate", "fill_options", "fill_jobs", "fill", "fill_scale",
    "load_cloud_catalogue", "load_cloud_trace", "generate_cloud_trace", "cloud_problem", "cloud_plan", "cloud_replay",
    "cloud_export")})
_LAZY_MODULES = {"config_readers": "planner.config_readers", "schema_io": "planner.schema_io", "solvers": "solvers",
                 "logging": "logging"}


def __getattr__(name: str) -> Any:
    """A lazily exported name, loaded and kept on first access (the same object as its module's)."""
    if name in _LAZY_NAMES:
        value = getattr(importlib.import_module(_LAZY_NAMES[name]), name)
    elif name in _LAZY_MODULES:
        value = importlib.import_module(_LAZY_MODULES[name])
    elif name == "log":
        value = importlib.import_module("logging").getLogger(__name__)
    elif name in ("ModelSpec", "ClusterSpec"):
        from planner.schema import Cluster, ModelProfile, TransformerConfig

        value = str | Path | ModelProfile | TransformerConfig if name == "ModelSpec" else str | Path | Cluster
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY_NAMES, *_LAZY_MODULES, "log", "ModelSpec", "ClusterSpec"})


def _cost_model(name: str) -> Any:
    """A ``cost_models`` module, imported on first use: ``import planner.api`` stays cheap."""
    return importlib.import_module(f"cost_models.{name}")


def load_model(spec: ModelSpec, *, seq_length: int | None = None) -> ModelProfile | TransformerConfig:
    """A model from a preset name, ``pipedream:<name>``, ``hf:<config.json>``,
    ``torchtitan:<module>:<flavor>``, ``megatron:<args file>``, or a file (profile JSON,
    transformer JSON, or a PipeDream ``graph.txt``).

    Args:
        spec: the model.
        seq_length: the training sequence length for a transformer (overrides the config's).

    Raises:
        InvalidProblemError: unknown name, unreadable file, malformed content, or a sequence
            length given for a layer profile.
    """
    from planner.schema import TransformerConfig

    model = _load_model(spec, seq_length=seq_length)
    if seq_length is None:
        return model
    if seq_length < 1:
        raise InvalidProblemError(f"seq_length={seq_length} must be at least 1")
    if not isinstance(model, TransformerConfig):
        raise InvalidProblemError(
            f"--seq-length applies to transformer configs; {model.name!r} is a measured layer profile")
    return model if model.seq_length == seq_length else model.model_copy(update={"seq_length": seq_length})


def _load_model(spec: ModelSpec, *, seq_length: int | None) -> ModelProfile | TransformerConfig:
    from planner import config_readers
    from planner.schema import ModelProfile, TransformerConfig

    if isinstance(spec, (ModelProfile, TransformerConfig)):
        return spec
    text = str(spec)
    if text.startswith(config_readers.PREFIXES):
        return config_readers.read_model_config(text, seq_length=seq_length)
    path = Path(text)
    if path.suffix in (".json", ".txt") or path.exists():
        if path.suffix == ".txt":
            return _cost_model("profiles").load_pipedream_graph(path)
        data = _read_json(path, what="model")
        kind = data.get("format") if isinstance(data, dict) else None
        if kind is None and isinstance(data, dict) and ("model_type" in data or "architectures" in data):
            # a Hugging Face config.json given without the hf: prefix
            return config_readers.read_model_config(f"hf:{path}", seq_length=seq_length)
        if kind == "paraplan.transformer/v1" or (kind is None and isinstance(data, dict) and "hidden_size" in data):
            return TransformerConfig.from_dict(data)
        return ModelProfile.from_dict(data)
    if text.startswith("pipedream:"):
        return _cost_model("profiles").pipedream_profile(text.split(":", 1)[1])
    return _cost_model("models").model_preset(text)


def load_cluster(spec: ClusterSpec) -> Cluster:
    """A cluster from a preset spec (``a100-80gb:128``, ``h100:4x8``, ``cpu:2``) or a JSON file."""
    from planner.schema import Cluster

    if isinstance(spec, Cluster):
        return spec
    text = str(spec)
    path = Path(text)
    if path.suffix == ".json" or path.exists():
        return Cluster.from_dict(_read_json(path, what="cluster"))
    return _cost_model("hardware").cluster_preset(text)


def load_plan(source: str | Path | Mapping[str, Any]) -> Plan:
    """A plan from a JSON file path, JSON text, or a decoded mapping, checked by
    ``planner.validate.validate_plan`` (devices, degrees, ranks, batch, BPipe, actions).

    Raises:
        InvalidProblemError: unreadable, malformed or inconsistent plan; the message lists the defects.
    """
    from planner.schema import Plan
    from planner.validate import validate_plan

    if isinstance(source, Mapping):
        return validate_plan(Plan.from_dict(dict(source)))
    text = str(source)
    if text.lstrip().startswith("{"):
        return validate_plan(Plan.from_json(text))
    return validate_plan(Plan.from_dict(_read_json(Path(text), what="plan")))


def make_problem(
    model: ModelSpec,
    cluster: ClusterSpec,
    *,
    schedule: str = "1f1b",
    num_stages: int | None = None,
    num_chunks: int = 1,
    num_microbatches: int | None = None,
    global_batch_size: int | None = None,
    microbatch_size: int | None = None,
    tensor_parallel: int | None = None,
    data_parallel: int | None = None,
    bpipe: bool = False,
    time_limit_s: float | None = None,
    efficiency: float | None = None,
    seq_length: int | None = None,
    memory_headroom: str | float | None = None,
    attention: str | None = None,
    kernels: str | None = None,
    full_recompute: str | None = None,
    precision: str | None = None,
    attention_kernel: str | None = None,
    activation_offload: bool = False,
    recompute_modules: str | None = None,
) -> PipelineProblem:
    """Build a validated PipelineProblem.

    A transformer config is turned into a layer profile for the cluster's device at the given
    microbatch size and tensor-parallel degree (defaults 1). A layer profile already fixes both:
    asking for other values is an error (profile again at those values instead). ``attention``
    (``flash``, the default, or ``unfused``: the s x s scores are materialised and saved, as in
    2021-2022 Megatron-LM) sets the attention core's kernels and activation bytes. ``kernels``
    (``fused``, the device's default, or ``eager``: PyTorch eager's unfused norm, rotary and SwiGLU
    chains) sets how the memory-bound layer kernels are costed (``ComputeModel.elementwise_kernels``).
    ``full_recompute`` (``whole``, the default: Megatron-LM's reentrant checkpoint re-runs a layer's
    whole forward, or ``early-stop``: PyTorch's non-reentrant ``torch.utils.checkpoint``, as
    torchtitan, FSDP and ``paraplan run`` use it, stops before the layer's FFN output projection)
    sets what full recompute re-runs (``ComputeModel.full_recompute``).
    ``precision`` (``bf16``, the default, ``fp8`` or ``fp8-cs``: Transformer Engine FP8 linear layers
    with delayed or current scaling) sets ``ComputeModel.linear_precision`` (``cost_models.fp8``).
    ``attention_kernel`` (``fa1``, ``fa2``, ``fa3``, ``cudnn``, ``fa4``: a family the device lists) sets the flash-attention
    kernel family whose rate the attention core runs at (``ComputeModel.attention_kernel``).
    ``activation_offload`` adds the ``offload`` strategy to every decoder layer (its activations to
    host memory and back, ``cost_models.activation_offload``) for the solvers that pick strategies.
    ``recompute_modules`` adds one Megatron-Core per-module recompute set (``layernorm+mlp``) as a
    strategy of every decoder layer, beside ``none``, ``selective`` and ``full``, for the solvers that
    pick strategies per layer or stage (a plan carries one set: Megatron's ``--recompute-modules``
    applies to every layer; ``ptdp`` searches sets itself, its option ``recompute``). Per-operation
    model only.

    Raises:
        InvalidProblemError: inconsistent arguments; the message names the argument and the fix.
    """
    from planner.schema import PipelineProblem, TransformerConfig

    model_obj = load_model(model, seq_length=seq_length)
    cluster_obj = load_cluster(cluster)
    if cluster_obj.device is None:
        raise InvalidProblemError(
            f"cluster {cluster_obj.name!r} gives only worker_types; pipeline planning needs a 'device'"
        )
    memory, compute = _cost_model("memory"), _cost_model("compute")
    # the device settings of --memory-headroom, --kernels, --full-recompute, --precision and
    # --attention-kernel, each validated by the cost model that owns it
    for setter, value in ((memory.with_headroom, memory_headroom), (compute.with_elementwise_kernels, kernels),
                          (compute.with_full_recompute, full_recompute),
                          (compute.with_linear_precision, precision), (compute.with_attention_kernel, attention_kernel)):
        if value is not None:
            cluster_obj = cluster_obj.model_copy(update={"device": setter(cluster_obj.device, value)})
    config: TransformerConfig | None = None
    if isinstance(model_obj, TransformerConfig):
        config = model_obj
        kwargs: dict[str, Any] = {}
        if efficiency is not None:
            kwargs["efficiency"] = efficiency
        if attention is not None:
            kwargs["attention"] = attention
        if recompute_modules:
            kwargs["recompute_modules"] = _module_sets(recompute_modules, config, cluster_obj.device, efficiency)
        profile = _cost_model("transformer").transformer_profile(
            config,
            device=cluster_obj.device,
            microbatch_size=microbatch_size or 1,
            tensor_parallel=tensor_parallel or 1,
            intra_node_bytes_per_s=cluster_obj.intra_node_bytes_per_s,
            activation_offload=activation_offload,
            **kwargs,
        )
    else:
        profile = model_obj
        for name, asked, fixed in (
            ("microbatch_size", microbatch_size, profile.microbatch_size),
            ("tensor_parallel", tensor_parallel, profile.tensor_parallel),
        ):
            if asked is not None and asked != fixed:
                raise InvalidProblemError(
                    f"{name}={asked} but the layer profile {profile.name!r} was measured at {name}={fixed}; "
                    f"profile the model again at {name}={asked} or use a transformer config"
                )
        if efficiency is not None or attention is not None:
            raise InvalidProblemError("efficiency and attention apply to transformer configs only, not to measured "
                                      "profiles")
        if recompute_modules:
            raise InvalidProblemError("recompute_modules applies to transformer configs only (a measured profile "
                                      "offers the strategies it was profiled with)")
        if activation_offload:
            offload = _cost_model("activation_offload")
            profile = profile.model_copy(update={"layers": offload.with_offload(profile.layers, cluster_obj.device)})
    return PipelineProblem.from_dict(
        {
            "model": profile.model_dump(),
            "cluster": cluster_obj.model_dump(),
            "transformer": config.model_dump() if config else None,
            "schedule": schedule,
            "num_stages": num_stages,
            "num_chunks": num_chunks,
            "num_microbatches": num_microbatches,
            "global_batch_size": global_batch_size,
            "data_parallel": data_parallel,
            "bpipe": bpipe,
            "time_limit_s": time_limit_s,
        }
    )


def _module_sets(value: str, config: Any, device: Any, efficiency: float | None) -> list[tuple[str, ...]]:
    """``make_problem``'s ``recompute_modules`` as ``transformer_profile`` takes it: one module set, checked
    against the model and the compute model.

    Raises:
        InvalidProblemError: not exactly one set, a bad set (``cost_models.recompute.parse_module_sets``),
            or the flat model (``efficiency``, or a device without compute constants), which has no
            per-module times.
    """
    if efficiency is not None or not _cost_model("compute").has_constants(device):
        raise InvalidProblemError(
            "recompute_modules needs the per-operation cost model; drop efficiency (--efficiency) or use a device "
            f"with compute constants (device {device.name!r})")
    if not isinstance(value, str):
        raise InvalidProblemError(f"recompute_modules={value!r} must be one module set such as 'layernorm+mlp'")
    sets = _cost_model("recompute").parse_module_sets(value, config)
    if len(sets) != 1:
        raise InvalidProblemError(
            f"recompute_modules={value!r} gives {len(sets)} sets; a plan carries one (Megatron's --recompute-modules "
            "applies to every layer): give one set, or plan with solver ptdp, which searches sets (its option "
            "recompute=modules or a list of sets)")
    return sets


# Solvers that search the tensor-parallel degree themselves (the others keep the problem's t).
TENSOR_SEARCHING_SOLVERS = ("ptdp",)


def default_solver(problem: PipelineProblem) -> str:
    """``ptdp`` for a transformer config with a global batch and no fixed shape (it searches t,
    p, d and b: PTD-P, [ptdp] Sec. 3), else ``even``."""
    fixed = (problem.num_stages, problem.data_parallel, problem.num_microbatches)
    free = all(v is None for v in fixed) and problem.num_chunks == 1 and not problem.bpipe
    searchable = problem.transformer is not None and problem.model.tensor_parallel == 1
    if searchable and free and problem.global_batch_size is not None and problem.schedule == "1f1b":
        return "ptdp"
    return "even"


def _tensor_note(problem: PipelineProblem, plan: Plan, solver: str) -> Plan:
    """Say so when a transformer was planned at t = 1 by a solver that does not search t."""
    if problem.transformer is None or solver in TENSOR_SEARCHING_SOLVERS or plan.degrees.tensor != 1:
        return plan
    note = (f"tensor parallelism fixed at t=1: solver {plan.solver!r} does not search it; give "
            "--tensor-parallel T, or use --solver ptdp with --global-batch B, which searches t")
    return plan.model_copy(update={"notes": (*plan.notes, note)})


# Solvers whose plans keep every model state in GPU memory fall back to SPipe (offload) when
# the states cannot fit even spread over every GPU (issue 8: only when no GPU-resident plan fits).
OFFLOAD_SOLVERS = ("spipe", "mobius", "zero-offload")


def plan(
    problem: PipelineProblem,
    *,
    solver: str | None = None,
    options: Any = None,
    offload_fallback: bool = True,
    timings: bool = False,
) -> Plan:
    """Run a registered solver (``solvers.SOLVERS``); the plan's ``predicted`` comes from the simulator.

    ``solver=None`` takes ``default_solver(problem)``, as ``paraplan plan`` without ``--solver`` does:
    ``ptdp`` for a transformer with a global batch and nothing else fixed, else ``even``.

    When a GPU-resident solver finds nothing that fits and the model's static state (weights,
    gradients, optimizer) exceeds the cluster's aggregate GPU memory, so that no GPU-resident
    plan can fit, the ``spipe`` solver plans a GPU/CPU offloaded pipeline instead and the plan's
    notes say so. ``offload_fallback=False`` (CLI ``--no-offload``) keeps the original error.

    ``options`` is a mapping of option names to values (strings are converted) or the solver's
    own ``Options`` dataclass. The plan is a function of the problem, solver and options only:
    the same input gives byte-identical JSON. ``timings=True`` keeps the wall-clock
    ``solve_time_s`` in the plan (it differs between runs).

    Raises:
        InfeasibleError: nothing fits (and the fallback is off, does not apply or fails too).
    """
    began = time.perf_counter()
    solver = solver or default_solver(problem)
    found = _solve_or_offload(problem, solver=solver, options=options, offload_fallback=offload_fallback,
                              began=began)
    found = _tensor_note(problem, found, solver)
    overflow = _host_overflow(found)
    if overflow is not None:  # the per-layer solvers do not check host memory (ptdp does): plan without offload
        offload = _cost_model("activation_offload")
        layers = tuple(offload.without_offload(layer) for layer in problem.model.layers)
        try:
            found = _solve_or_offload(problem.model_copy(update={"model": problem.model.model_copy(
                update={"layers": layers})}), solver=solver, options=options, offload_fallback=offload_fallback,
                began=began)
        except InfeasibleError as e:
            raise InfeasibleError(f"{e}; with activation offload the {solver} plan did not fit host memory "
                                  f"either: {overflow}") from None
        found = _tensor_note(problem, found, solver)
        found = found.model_copy(update={"notes": (*found.notes, f"activation offload dropped: {overflow}")})
    return found.model_copy(update={"solve_time_s": time.perf_counter() - began if timings else None})


def _host_overflow(found: Plan) -> str | None:
    """What a plan that offloads activations (``offload``) lacks of host memory, or None."""
    offload = _cost_model("activation_offload")
    if not offload.plan_offloads(found):
        return None
    from planner.api_outputs import simulate

    return offload.plan_host_overflow(found, simulate(found))


def _solve_or_offload(problem: PipelineProblem, *, solver: str, options: Any, offload_fallback: bool,
                      began: float) -> Plan:
    """The solver's plan, or spipe's within what is left of ``problem.time_limit_s`` (see ``plan``)."""
    import logging

    import solvers

    try:
        return solvers.solve(problem, solver=solver, options=options)
    except InfeasibleError as error:
        state, aggregate = _states_vs_gpu_memory(problem)
        if not offload_fallback or solver in OFFLOAD_SOLVERS or state <= aggregate:
            raise
        left_s = None if problem.time_limit_s is None else problem.time_limit_s - (time.perf_counter() - began)
        if left_s is not None and left_s <= 0:
            raise InfeasibleError(f"{error}\nthe offloaded fallback (solver spipe) was not tried: time_limit_s="
                                  f"{problem.time_limit_s} was spent") from None
        try:
            # SPipe chooses the stages and places them on every GPU itself, within what is left of the budget
            free = problem.model_copy(update={"num_stages": None, "data_parallel": None, "num_chunks": 1,
                                              "bpipe": False, "schedule": "1f1b", "time_limit_s": left_s})
            fallback = solvers.solve(free, solver="spipe")
        except PlannerError as offload_error:
            raise InfeasibleError(f"{error}\nthe offloaded fallback (solver spipe) failed too: {offload_error}") from None
    note = (
        f"solver {solver!r} found no GPU-resident plan: the model's states need {state / 2**30:.1f} GiB but the "
        f"cluster's GPUs hold {aggregate / 2**30:.1f} GiB usable in all; planned with 'spipe' (parameters, gradients and "
        "optimizer in CPU memory, streamed to the GPUs)"
    )
    logging.getLogger(__name__).warning(note)
    return fallback.model_copy(update={"notes": (note, *fallback.notes)})


def _states_vs_gpu_memory(problem: PipelineProblem) -> tuple[float, float]:
    """(model static bytes over all tensor ranks, total usable GPU memory of the cluster)."""
    device = problem.cluster.device
    assert device is not None  # PipelineProblem requires a device
    state = sum(layer.static_bytes for layer in problem.model.layers) * problem.model.tensor_parallel
    return state, _cost_model("memory").usable_memory_bytes(device) * problem.cluster.num_devices


def save(obj: _Frozen, path: str | Path) -> Path:
    """Write any schema object as indented JSON."""
    out = Path(path)
    out.write_text(obj.model_dump_json(indent=2) + "\n")
    return out


def _read_json(path: Path, *, what: str) -> Any:
    from planner import schema_io

    return schema_io.load_json(path, what=what)
