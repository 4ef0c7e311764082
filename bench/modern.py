"""Today's models on H100 clusters of their published sizes: the published recipe beside paraplan's
own plan, both simulated (issue 15 item 6; the table and notes are in docs/modern-models.md).

For every recipe of bench/data/modern_recipes.json:

- ``recipe``: the published degrees and recompute pinned through ptdp's options (built directly,
  ``bench.modern_recipes.recipe_plan``, where ptdp cannot take them or counts them over memory)
  and simulated:
  step time, tokens/s per GPU, MFU (model FLOPs, no recompute, of the BF16 dense peak), the
  busiest rank's peak memory against the usable memory;
- ``ours``: the ptdp search on the same model, cluster, batch and sequence (``planner.api.plan``),
  its simulated step, tokens/s, MFU, memory and the search's wall time;
- ``measured``: where the publisher gives a measured throughput for the recipe, measured vs
  predicted (at the measured batch) - a cost-model validation row, not tuned to. Most published
  H100 rows ran in FP8; we predict BF16, so those ratios carry the precision difference and are
  marked.

Run from the repository root (search times depend on the machine; docs/modern-models.md gives the
machine its figures came from):

    PYTHONPATH=. .venv/bin/python bench/modern.py [--json] [--only NAME ...] [--no-search]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from bench.modern_recipes import Recipe, load_recipes, recipe_plan
from cost_models.memory import usable_memory_bytes
from cost_models.simulate import simulate
from cost_models.transformer import model_flops_per_sample
from planner import api
from planner.errors import InfeasibleError, InvalidProblemError
from planner.schema import Plan
from planner.validate import validate_plan

GIB = 2.0**30
PINNED_OPTIONS = ("tensor_parallel", "pipeline_parallel", "virtual_pipeline", "context_parallel", "expert_parallel",
                  "zero_stage", "microbatch_size")


def metrics(plan: Plan) -> dict[str, Any]:
    """Simulated step, tokens/s per GPU, MFU and the busiest rank's peak memory of a plan."""
    sim = simulate(plan, include_events=False, include_bubbles=False)
    cfg, cluster = plan.transformer, plan.cluster
    assert cfg is not None and cluster.device is not None
    gpus = plan.degrees.data * plan.degrees.tensor * plan.degrees.pipeline * plan.degrees.context
    step = sim.iteration_time_s
    peak = max(s.peak_memory_bytes for s in sim.stages)
    return {
        "degrees": _degrees(plan), "step_s": step, "gpus": gpus,
        "tokens_per_s_per_gpu": plan.global_batch_size * cfg.seq_length / step / gpus,
        "mfu": model_flops_per_sample(cfg) * plan.global_batch_size / step / gpus / cluster.device.peak_flops,
        "peak_gib": peak / GIB, "fits": peak <= usable_memory_bytes(cluster.device),
        "bubble": sim.bubble_fraction,
    }


def _degrees(plan: Plan) -> str:
    d = plan.degrees
    return (f"t{d.tensor} p{d.pipeline} v{d.virtual} c{d.context} e{d.expert} d{d.data} z{plan.zero_stage} "
            f"b{plan.microbatch_size} {plan.schedule}")


def _problem(recipe: Recipe, global_batch_size: int | None = None):  # type: ignore[no-untyped-def]
    nodes = max(1, recipe.num_gpus // 8)
    return api.make_problem(recipe.model, f"h100:{nodes}x{min(8, recipe.num_gpus)}",
                            global_batch_size=global_batch_size or recipe.global_batch_size,
                            seq_length=recipe.seq_length)


def pinned_plan(recipe: Recipe, global_batch_size: int | None = None) -> tuple[Plan, str]:
    """The recipe's plan through ptdp with every degree pinned (the same cost model as ``ours``): with
    the published recompute; built directly when ptdp cannot take it or counts it over memory."""
    values = (recipe.tensor, recipe.pipeline, recipe.virtual, recipe.context, recipe.expert, recipe.zero_stage,
              recipe.microbatch_size)
    extra = {"overlap_param_gather": recipe.overlap_param_gather, "overlap_moe_alltoall": recipe.overlap_moe_alltoall}
    options = dict(zip(PINNED_OPTIONS, values)) | {"recompute": recipe.recompute,
                                                   "overlap_grad_reduce": recipe.overlap_grad_reduce}
    if recipe.schedule:
        options["schedules"] = recipe.schedule
    try:
        plan = api.plan(_problem(recipe, global_batch_size), solver="ptdp", options=options)
    except (InvalidProblemError, InfeasibleError):
        return validate_plan(recipe_plan(recipe, global_batch_size=global_batch_size)), "built"
    return plan.model_copy(update={"options": {**plan.options, **extra}}), f"ptdp pinned, {recipe.recompute}"


def ours(recipe: Recipe) -> dict[str, Any]:
    """ptdp's own plan for the recipe's model, cluster, batch and sequence, with its search time."""
    start = time.perf_counter()
    try:
        plan = api.plan(_problem(recipe), solver="ptdp")
    except (InvalidProblemError, InfeasibleError) as err:
        return {"error": str(err).splitlines()[0], "search_s": time.perf_counter() - start}
    elapsed = time.perf_counter() - start
    return metrics(plan) | {"search_s": elapsed}


def measured_row(recipe: Recipe) -> dict[str, Any] | None:
    """Published measured throughput vs our prediction of the same recipe at the measured batch."""
    published = recipe.measured
    if not published:
        return None
    plan, _ = pinned_plan(recipe, published.get("global_batch_size"))
    predicted = metrics(plan)
    row: dict[str, Any] = {"precision": published["precision"], "source": published["source"]}
    if "tokens_per_s_per_gpu" in published:
        row["measured_tokens"] = published["tokens_per_s_per_gpu"]
        row["predicted_tokens"] = predicted["tokens_per_s_per_gpu"]
        row["ratio"] = predicted["tokens_per_s_per_gpu"] / published["tokens_per_s_per_gpu"]
    else:  # model TFLOP/s per GPU only (Llama 3 Table 4): compare MFU-equivalent throughput
        row["measured_tflops"] = published["model_tflops_per_gpu"]
        row["predicted_tflops"] = predicted["mfu"] * plan.cluster.device.peak_flops / 1e12  # type: ignore[union-attr]
        row["ratio"] = row["predicted_tflops"] / published["model_tflops_per_gpu"]
    return row


def run(names: list[str] | None, search: bool) -> list[dict[str, Any]]:
    rows = []
    for recipe in load_recipes():
        if names and recipe.name not in names:
            continue
        plan, how = pinned_plan(recipe)
        built = metrics(validate_plan(recipe_plan(recipe)))
        row = {"name": recipe.name, "model": recipe.model, "gpus": recipe.num_gpus, "recipe_from": how,
               "recipe": metrics(plan), "built": built,
               "measured": measured_row(recipe)}
        if search:
            row["ours"] = ours(recipe)
        rows.append(row)
        print(f"done {recipe.name}", file=sys.stderr)
    return rows


def _fmt(m: dict[str, Any]) -> str:
    if "error" in m:
        return f"no plan ({m['error'][:70]})"
    fits = "" if m["fits"] else " (over)"
    return (f"{m['degrees']:<44} {m['step_s']:8.2f} s {m['tokens_per_s_per_gpu']:8.0f} tok/s/GPU "
            f"MFU {100 * m['mfu']:4.1f}% {m['peak_gib']:6.1f} GiB{fits}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--no-search", action="store_true")
    args = parser.parse_args(argv)
    rows = run(args.only, search=not args.no_search)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for row in rows:
        print(f"{row['name']} ({row['gpus']} H100)")
        print(f"  recipe [{row['recipe_from']}] {_fmt(row['recipe'])}")
        print(f"  built  [as published]  {_fmt(row['built'])}")
        if "ours" in row:
            print(f"  ours   {_fmt(row['ours'])}  search {row['ours']['search_s']:.1f} s")
        m = row["measured"]
        if m:
            what = ("tokens/s/GPU", m.get("measured_tokens"), m.get("predicted_tokens")) if "measured_tokens" in m \
                else ("model TFLOP/s/GPU", m["measured_tflops"], m["predicted_tflops"])
            print(f"  measured {what[0]} {what[1]:.0f} ({m['precision']}) vs predicted {what[2]:.0f}: "
                  f"x{m['ratio']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
