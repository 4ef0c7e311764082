"""Scale check of the stage-ILP (issue 4): 3 layer types x 3 strategies x 4 chunks x 32 stages.

A synthetic profile built for it: three decoder kinds of a LLaMA-175B-like block (seed 002's
model; ``transformer_profile`` on A100-80GB, t = 8), scaled in time and activation memory
(``dense`` x1.0, ``moe`` x1.3 time and x1.2 activations, ``cross`` x0.7 and x0.8), 64 layers
each in three runs (192 layers, 128 virtual stages of 1-2 layers), each offering recompute
``none``, ``selective`` and ``full``. Interleaved 1F1B, p = 32, v = 4, m = 64. Reports the
MILP's size, status, gap and time, the whole solve time, and the speedup over ``even``.

Usage:

    PYTHONPATH=. python bench/stage_ilp_scale.py [--budget-s 9] [--ilp-time-s 6]
"""

from __future__ import annotations

import argparse
import time

from _timing import warm_imports  # bench/ is on sys.path when run as a script
from cost_models.hardware import cluster_preset
from cost_models.models import model_preset
from cost_models.transformer import transformer_profile
from planner.schema import LayerProfile, ModelProfile, PipelineProblem, RecomputeOption
from solvers import _stage_ilp_milp as milp
from solvers import get_solver
from solvers._stage_ilp_model import build_model
from solvers.common import resolve_layout

KINDS = (("dense", 1.0, 1.0), ("moe", 1.3, 1.2), ("cross", 0.7, 0.8))


def _scaled(layer: LayerProfile, kind: str, time_x: float, act_x: float, i: int) -> LayerProfile:
    assert layer.recompute is not None
    recompute = {name: RecomputeOption(activation_bytes=o.activation_bytes * act_x, extra_s=o.extra_s * time_x)
                 for name, o in layer.recompute.items()}
    return layer.model_copy(update={
        "name": f"{kind}{i}", "kind": kind, "forward_s": layer.forward_s * time_x, "backward_s": layer.backward_s * time_x,
        "backward_weight_s": (layer.backward_weight_s or 0.0) * time_x, "activation_bytes": None,
        "recompute": recompute})


def scale_problem(num_per_kind: int = 64) -> PipelineProblem:
    """The synthetic 3-type problem (module docstring)."""
    cluster = cluster_preset("a100-80gb:32x8")
    assert cluster.device is not None
    base = transformer_profile(model_preset("llama-175b"), device=cluster.device, microbatch_size=1, tensor_parallel=8,
                               intra_node_bytes_per_s=cluster.intra_node_bytes_per_s)
    block = next(layer for layer in base.layers if layer.recompute and "full" in layer.recompute)
    layers = [_scaled(block, kind, tx, ax, i) for kind, tx, ax in KINDS for i in range(num_per_kind)]
    return PipelineProblem(model=ModelProfile(name="synthetic-3-kinds", layers=tuple(layers)), cluster=cluster,
                           schedule="interleaved-1f1b", num_stages=32, num_chunks=4, num_microbatches=64,
                           data_parallel=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=9.0)
    parser.add_argument("--ilp-time-s", type=float, default=6.0)
    args = parser.parse_args()
    warm_imports("highspy", "pulp")  # the ILP's libraries, imported before the first solve is timed
    pr = scale_problem()
    model = build_model(pr, resolve_layout(pr, 32), strategies=None)
    form = milp.formulate(model, "tri")
    num_int = sum(form.integer)
    print(f"types {len(model.types)} x strategies {[len(t.strategies) for t in model.types]} x chunks 4 x stages 32: "  # noqa: T201
          f"{len(form.names)} variables ({num_int} integer), {len(form.rows)} rows")
    even = get_solver("even")(pr)
    began = time.perf_counter()
    plan = get_solver("stage-ilp")(pr, options={"budget_s": args.budget_s, "ilp_time_s": args.ilp_time_s})
    wall = time.perf_counter() - began
    assert plan.predicted is not None and even.predicted is not None
    print(f"status {plan.status}; {plan.notes[0]}; whole solve {wall:.1f} s; "  # noqa: T201
          f"speedup over even {even.predicted.iteration_time_s / plan.predicted.iteration_time_s:.3f}x")


if __name__ == "__main__":
    main()
