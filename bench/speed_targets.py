"""Speed targets that used to be wall-clock assertions in tests (tests assert outcomes only).

Run ``python bench/speed_targets.py``; it prints one row per target: the best of three wall
times, the target and whether it was met on this machine. Figures in the docs name the machine
("2-core CPU container, shared/loaded").
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._timing import best_of  # noqa: E402


def _ptdp_gpt_1t() -> object:
    from planner import api
    from solvers import ptdp

    return ptdp.solve(api.make_problem("gpt-1t", "a100-80gb:3072", global_batch_size=3072))


def _pipedream_branchy() -> object:
    from planner import api

    return api.plan(api.make_problem("pipedream:inception_v3", "v100:2x8"), solver="pipedream")


def _load_branchy_graph() -> object:
    from cost_models import profiles

    return profiles.pipedream_profile("nasnetalarge")


def _timeline_65k_events() -> object:
    from planner import api
    from planner.timeline import draw_timeline

    plan = api.plan(api.make_problem("gpt-1.7b", "a100-80gb:16", num_stages=16, num_microbatches=2048))
    result = api.simulate(plan, include_events=True)
    with tempfile.TemporaryDirectory() as folder:
        return draw_timeline(result, Path(folder) / "huge.png")


def _stage_ilp_llama_175b() -> object:
    from cost_models.hardware import cluster_preset
    from cost_models.models import model_preset
    from cost_models.transformer import transformer_profile
    from planner.schema import PipelineProblem
    from solvers.stage_ilp import solve

    cl = cluster_preset("ascend-910:128")
    prof = transformer_profile(model_preset("llama-175b"), device=cl.device, microbatch_size=1, tensor_parallel=8)
    return solve(PipelineProblem(model=prof, cluster=cl, num_stages=16, num_microbatches=64, data_parallel=1,
                                 time_limit_s=1.0), options={"rerank": 20})


TARGETS: tuple[tuple[str, Callable[[], object], float], ...] = (
    ("ptdp search, gpt-1t on 3,072 GPUs", _ptdp_gpt_1t, 10.0),
    ("pipedream, inception_v3 on 16 GPUs", _pipedream_branchy, 2.0),
    ("load graph.txt, nasnetalarge", _load_branchy_graph, 1.0),
    ("timeline picture, 65,536 events", _timeline_65k_events, 20.0),
    ("stage-ilp, llama-175b, time limit 1 s", _stage_ilp_llama_175b, 10.0),
)


def main() -> None:
    print(f"{'target':42s} {'best of 3 (s)':>14s} {'target (s)':>11s}  met")
    for name, fn, target_s in TARGETS:
        seconds, _ = best_of(fn, repeats=3)
        print(f"{name:42s} {seconds:14.3f} {target_s:11.1f}  {'yes' if seconds <= target_s else 'NO'}")


if __name__ == "__main__":
    main()
