"""The run report: measured step time, tokens/s, MFU and memory beside the plan's predictions.

No torch here (the records are plain data) and nothing from the CLI: the CLI formats this
dictionary, not the other way round.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from cost_models import transformer
from planner.schema import Plan, TransformerConfig

__all__ = ["mfu", "summarize"]


def _num_devices(plan: Plan) -> int:
    return plan.degrees.tensor * plan.degrees.context * sum(stage.replicas for stage in plan.stages)


def mfu(plan: Plan, cfg: TransformerConfig, step_s: float) -> float | None:
    """Model FLOPs utilisation: model FLOPs per iteration / (time x devices x device peak).

    The FLOPs are the plan's layers' (per microbatch and tensor rank, times the microbatches of
    the global batch), else the transformer's forward and backward FLOPs per iteration
    (Narayanan et al., *Efficient Large-Scale Language Model Training on GPU Clusters Using
    Megatron-LM*, SC 2021, Eq. 3 without recompute).
    """
    if plan.cluster.device is None or step_s <= 0:
        return None
    flops = [layer.flops for layer in plan.model.layers]
    if all(f is not None for f in flops):
        per_iteration = sum(flops) * plan.degrees.tensor * plan.global_batch_size / plan.microbatch_size  # type: ignore[arg-type]
    else:
        per_iteration = transformer.flops_per_iteration(cfg, global_batch_size=plan.global_batch_size, recompute=False)
    return per_iteration / (step_s * _num_devices(plan) * plan.cluster.device.peak_flops)


def summarize(job: Any, records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Measured numbers beside the plan's predictions, with measured / predicted ratios.

    Args:
        job: the ``launch.RunJob`` that produced the records.
        records: every rank's record, in rank order.
    """
    plan, cfg = job.plan, job.config
    per_step = [max(rec["step_times_s"][s] for rec in records) for s in range(job.steps)]
    timed = per_step[1:] if len(per_step) > 1 else per_step  # step 0 infers shapes
    step_s = statistics.median(timed)
    tokens = plan.global_batch_size * cfg.seq_length
    last = [rec for rec in records if rec["losses"] and rec["losses"][0] and rec.get("tp_rank", 0) == 0]
    report: dict[str, Any] = {
        "plan": {"solver": plan.solver, "schedule": plan.schedule, "degrees": plan.degrees.model_dump(),
                 "num_microbatches": plan.num_microbatches, "microbatch_size": plan.microbatch_size,
                 "global_batch_size": plan.global_batch_size, "model": cfg.name, "zero_stage": plan.zero_stage,
                 "sequence_parallel": plan.sequence_parallel},
        "steps": job.steps, "step_times_s": per_step, "step_time_s": step_s,
        "step_cpu_time_s": _median_slowest(records, "step_cpu_times_s", job.steps),
        "tokens_per_s": tokens / step_s, "mfu": mfu(plan, cfg, step_s),
        "peak_memory_bytes": [rec["peak_memory_bytes"] for rec in records],
        "rank_stage": [rec["stage"] for rec in records],
        "rank_virtual_stages": [rec.get("virtual_stages", []) for rec in records],
        "rank_param_bytes": [rec.get("param_bytes", 0) for rec in records],
        "memory_kind": records[0]["memory_kind"],
        "loss": [statistics.fmean(x for rec in last for x in rec["losses"][s]) for s in range(job.steps)],
    }
    if plan.predicted is not None:
        report.update(_predicted(plan, cfg, step_s, records))
    if job.check:
        from runtime_bridge.check import TOLERANCE, compare, reference_run

        ref_losses, ref_grads = reference_run(plan, cfg, steps=job.steps, seed=job.seed, lr=job.lr)
        diffs = compare(plan, records, ref_losses, ref_grads)
        report.update(diffs)
        report["tolerance"] = TOLERANCE
        report["check_passed"] = (not diffs["check_failures"]
                                  and max(diffs["max_loss_diff"], diffs["max_grad_diff"]) <= TOLERANCE)
    if job.fill is not None:
        from runtime_bridge.fill import summarize_fill

        report["fill"] = summarize_fill(job.fill, [rec["fill"] for rec in records])
    return report


def _median_slowest(records: Sequence[dict[str, Any]], key: str, steps: int) -> float | None:
    """Median over the timed steps (after the first) of the slowest rank's figure."""
    if not all(key in rec for rec in records):
        return None
    per_step = [max(rec[key][s] for rec in records) for s in range(steps)]
    return statistics.median(per_step[1:] if len(per_step) > 1 else per_step)


def _predicted(plan: Plan, cfg: TransformerConfig, step_s: float, records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    predicted = plan.predicted
    assert predicted is not None
    stage_peak = predicted.peak_memory_bytes
    cpu_s = _median_slowest(records, "step_cpu_times_s", len(records[0]["step_times_s"]))
    return {
        "predicted": {
            "iteration_time_s": predicted.iteration_time_s,
            "tokens_per_s": predicted.throughput_samples_per_s * cfg.seq_length,
            "peak_memory_bytes": list(stage_peak),
            "mfu": mfu(plan, cfg, predicted.iteration_time_s),
        },
        "ratio": {
            "step_time": step_s / predicted.iteration_time_s if predicted.iteration_time_s else None,
            "step_cpu_time": cpu_s / predicted.iteration_time_s if cpu_s and predicted.iteration_time_s else None,
            # A CPU process's peak RSS includes the interpreter and torch: no ratio for it.
            "peak_memory": [rec["peak_memory_bytes"] / stage_peak[rec["stage"]]
                            if stage_peak[rec["stage"]] and rec["memory_kind"] != "cpu_peak_rss" else None
                            for rec in records],
        },
    }
