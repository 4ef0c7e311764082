"""Human-readable tables for the CLI (the JSON forms come straight from the schema types)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the CLI's --help and solvers list load no pydantic
    from planner.schema import Cluster, Plan, SimResult

_GIB = 2.0**30


def _distinct(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows that differ from every earlier row in something other than their rank."""
    seen: set[str] = set()
    out = []
    for row in rows:
        key = repr(sorted((k, v) for k, v in row.items() if k != "rank"))
        if key not in seen:
            seen.add(key)
            out.append(row)
    return out


def cluster_expansion(cluster: Cluster) -> str:
    """What a cluster spec expanded to: ``2 nodes x 8 a100-80gb = 16 devices``."""
    if cluster.device is None:
        return ", ".join(f"{n} {t}" for t, n in (cluster.worker_types or {}).items()) + f" = {cluster.num_devices} devices"
    nodes = f"{cluster.num_nodes} node{'s' if cluster.num_nodes > 1 else ''}"
    return f"{nodes} x {cluster.devices_per_node} {cluster.device.name} = {cluster.num_devices} devices"


def expansion_line(spec: object, cluster: Cluster) -> str:
    """The stderr line every command prints for ``--cluster``: ``cluster a100-80gb:64 -> 8 nodes x 8 a100-80gb = 64 devices``."""
    return f"cluster {spec} -> {cluster_expansion(cluster)}"


def plan_devices(plan: Plan) -> int:
    """The devices a plan uses (its stages' replicas x tensor x context), which may be fewer
    than its cluster's: the count every command prints for a plan."""
    d = plan.degrees
    return sum(stage.replicas for stage in plan.stages) * d.tensor * d.context


def devices_line(plan: Plan) -> str:
    """How many of the cluster's devices the plan uses, and how they split."""
    d = plan.degrees
    used = plan_devices(plan)
    total = plan.cluster.num_devices
    split = f"{d.pipeline} stages x {d.data} replicas x {d.tensor} tensor" + (f" x {d.context} context" if d.context > 1 else "")
    if used == total:
        return f"devices: all {total} ({split})"
    return f"devices: {used} of the cluster's {total} ({split}); {total - used} idle"


def plan_title(plan: Plan) -> str:
    d = plan.degrees
    return (
        f"{plan.model.name} on {plan.cluster.name}: {plan.solver}, {plan.schedule}, "
        f"t={d.tensor} p={d.pipeline} d={d.data} v={d.virtual}, b={plan.microbatch_size} m={plan.num_microbatches}"
    )


def mfu(plan: Plan, iteration_time_s: float) -> float | None:
    """Model FLOPs utilization: model FLOPs per iteration / (time x devices x peak)."""
    flops = [layer.flops for layer in plan.model.layers]
    if any(f is None for f in flops) or plan.cluster.device is None or iteration_time_s <= 0:
        return None
    t = plan.degrees.tensor
    # Per microbatch per tensor rank, times the microbatches of the whole global batch; devices
    # from the stages' replicas (PipeDream plans replicate stages unequally).
    per_iteration = sum(flops) * t * plan.global_batch_size / plan.microbatch_size  # type: ignore[arg-type]
    devices = t * sum(stage.replicas for stage in plan.stages)
    return per_iteration / (iteration_time_s * devices * plan.cluster.device.peak_flops)


def _peak_note(plan: Plan, *, alone: bool = False) -> str:
    """Where the linear layers run in FP8, MFU is still of the 16-bit peak (the convention of
    published FP8 runs): say so."""
    device = plan.cluster.device
    compute = device.compute if device is not None else None
    if compute is None or compute.linear_precision == "bf16":
        return ""
    note = f"of the BF16 peak; linear layers in {compute.linear_precision}"
    return f" ({note})" if alone else f"; {note}"


def plan_table(plan: Plan, *, max_candidates: int = 10, solve_time_s: float | None = None) -> str:
    """The plan as text; ``solve_time_s`` is the wall-clock time measured by the caller."""
    solved = plan.solve_time_s if solve_time_s is None else solve_time_s
    lines = [plan_title(plan), f"status {plan.status}" + (f", solved in {solved:.3f} s" if solved is not None else "")]
    pred = plan.predicted
    if pred is not None:
        util = mfu(plan, pred.iteration_time_s)
        lines.append(
            f"iteration {pred.iteration_time_s:.4g} s, {pred.throughput_samples_per_s:.4g} samples/s, "
            f"bubble {100 * pred.bubble_fraction:.1f}%, bottleneck {pred.bottleneck_s:.4g} s/microbatch"
            + (f", MFU {100 * util:.1f}% (model FLOPs, no recompute{_peak_note(plan)})" if util is not None else "")
        )
        device = plan.cluster.device
        if device is not None and pred.peak_memory_bytes:
            from cost_models.memory import usable_memory_bytes

            lines.append(f"memory per device: peak {max(pred.peak_memory_bytes) / _GIB:.1f} GiB, usable "
                         f"{usable_memory_bytes(device) / _GIB:.1f} GiB, total {device.memory_bytes / _GIB:.1f} GiB "
                         "(usable = total - headroom, --memory-headroom)")
    replicas = [stage.replicas for stage in plan.stages]
    lines.append(devices_line(plan))
    if len(set(replicas)) > 1 or replicas[0] != plan.degrees.data:
        lines.append(f"global batch {plan.global_batch_size} = {plan.num_microbatches} microbatches x "
                     f"{plan.microbatch_size} x {replicas[0]} input-stage replicas; replicas per stage "
                     f"{'-'.join(map(str, replicas))} (1F1B-RR)")
    else:
        lines.append(f"global batch {plan.global_batch_size} = {plan.num_microbatches} microbatches x "
                     f"{plan.microbatch_size} x {plan.degrees.data} replicas")
    lines.append("")
    lines.append(f"{'stage':>5}  {'ranks':>11}  {'layers':<24}  {'recompute':<22}  {'peak GiB':>8}")
    for stage in plan.stages:
        ranks = f"{stage.ranks[0]}-{stage.ranks[-1]}" if len(stage.ranks) > 1 else (str(stage.ranks[0]) if stage.ranks else "-")
        layers = " ".join(f"[{c.layers[0]},{c.layers[1]})" for c in stage.chunks)
        strategies: dict[str, int] = {}
        for chunk in stage.chunks:
            for s in chunk.layer_strategies():
                strategies[s] = strategies.get(s, 0) + 1
        recompute = ", ".join(f"{k} {v}" for k, v in strategies.items())
        peak = f"{pred.peak_memory_bytes[stage.index] / _GIB:8.2f}" if pred else "       -"
        lines.append(f"{stage.index:>5}  {ranks:>11}  {layers:<24}  {recompute:<22}  {peak}")
    for note in plan.notes:
        lines.append(f"note: {note}")
    if plan.candidates:
        distinct = _distinct(plan.candidates)
        shown = distinct[:max_candidates]
        hidden = len(plan.candidates) - len(distinct)
        lines += ["", f"top {len(shown)} of {len(plan.candidates)} configurations"
                  + (f" ({hidden} repeating an earlier row not shown)" if hidden else "") + " (--json has them all):"]
        lines.append(table(shown))
    return "\n".join(lines)


def table(rows: Sequence[dict[str, Any]]) -> str:
    """Rows of scalars as an aligned text table, columns in the first row's key order."""
    if not rows:
        return ""
    keys = list(rows[0])
    cells = [[_cell(row.get(k)) for k in keys] for row in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    out = ["  ".join(k.rjust(w) for k, w in zip(keys, widths))]
    out += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(out)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _host_memory_line(plan: Plan, result: SimResult) -> list[str]:
    """The host memory offloaded activations take (``offload`` layers), when the plan offloads."""
    from cost_models import activation_offload, compute

    if not activation_offload.plan_offloads(plan):
        return []
    peak = max(need for _, _, need in activation_offload.plan_host_bytes(plan, result))
    capacity = compute.host_memory_bytes(plan.cluster.device) if plan.cluster.device else None
    held = (f" of {capacity / _GIB:.2f} GiB, " + ("fits" if peak <= capacity else "DOES NOT FIT")
            if capacity is not None else " (host memory not stated: unchecked)")
    return [f"host memory (offloaded activations): up to {peak / _GIB:.2f} GiB per device{held}"]


def sim_table(plan: Plan, result: SimResult) -> str:
    util = mfu(plan, result.iteration_time_s)
    lines = [
        plan_title(plan),
        f"iteration {result.iteration_time_s:.6g} s, bubble {100 * result.bubble_fraction:.2f}%, "
        f"{result.throughput_samples_per_s:.4g} samples/s"
        + (f", MFU {100 * util:.1f}%{_peak_note(plan, alone=True)}" if util is not None else "")
        + (f", all-reduce {result.allreduce_s:.4g} s" if result.allreduce_s else ""),
        f"memory: capacity {result.memory_capacity_bytes / _GIB:.2f} GiB per device, "
        + ("fits" if result.fits_memory else "DOES NOT FIT"),
        *_host_memory_line(plan, result),
        "",
        f"{'stage':>5}  {'busy s':>10}  {'idle s':>10}  {'peak GiB':>8}  {'in-flight':>9}  {'bubbles':>7}",
    ]
    for s in result.stages:
        lines.append(
            f"{s.index:>5}  {s.busy_s:>10.4g}  {s.idle_s:>10.4g}  {s.peak_memory_bytes / _GIB:>8.2f}  "
            f"{s.peak_inflight_microbatches:>9}  {len(s.bubbles):>7}"
        )
    return "\n".join(lines)


def model_info_table(info: dict[str, Any]) -> str:
    rows = []
    for key, value in info.items():
        if isinstance(value, float) and value is not None:
            shown = f"{value:.6g}"
        elif isinstance(value, int) and not isinstance(value, bool) and value >= 10**6:
            shown = f"{value:,} ({value / 1e9:.2f} B)" if key.endswith("num_parameters") or key == "num_active_parameters" else f"{value:,}"
        else:
            shown = str(value)
        rows.append(f"{key:<34} {shown}")
    return "\n".join(rows)


def presets() -> dict[str, Any]:
    from cost_models import hardware, models, profiles

    return {
        "devices": hardware.list_device_presets(),
        "clusters": hardware.list_cluster_presets(),
        "models": models.list_model_presets(),
        "pipedream_profiles": [f"pipedream:{n}" for n in profiles.list_pipedream_profiles()],
    }


def presets_text(data: dict[str, Any]) -> str:
    lines: list[str] = []
    for section, items in data.items():
        lines.append(f"{section}:")
        if isinstance(items, dict):
            for name, desc in items.items():
                lines.append(f"  {name:<22} {desc if isinstance(desc, str) else _describe(desc)}")
        else:
            lines.extend(f"  {name}" for name in items)
        lines.append("")
    return "\n".join(lines).rstrip()


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return str(value)
