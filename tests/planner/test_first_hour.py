"""First-hour friction (issue 14): candidate tables list distinct candidates; the GPU count a
command prints is the plan's."""

from __future__ import annotations

import json
from pathlib import Path

from planner import api
from planner.report import plan_devices
from tests.planner.contract_helpers import run_cli


def test_stage_ilp_candidate_table_lists_distinct_rows() -> None:
    outcome = run_cli(["plan", "--model", "gpt-1.7b", "--cluster", "a100-80gb:8", "--pipeline", "4",
                       "--solver", "stage-ilp", "--global-batch", "32"])
    assert outcome.code == 0, outcome.err
    lines = outcome.out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("top "))
    rows = [line.split(None, 1)[1] for line in lines[start + 2:] if line.strip()]  # without the rank column
    assert len(rows) >= 3 and len(set(rows)) == len(rows), rows


def test_fill_prints_the_plans_gpu_count_not_the_clusters(tmp_path: Path) -> None:
    # 4 stages x 1 replica on a cluster of 8: the plan uses 4 GPUs
    plan = api.plan(api.make_problem("gpt-1.7b", "a100-80gb:8", schedule="gpipe", num_stages=4, data_parallel=1,
                                     global_batch_size=16), solver="even")
    assert plan_devices(plan) == 4 and plan.cluster.num_devices == 8
    path = tmp_path / "plan.json"
    path.write_text(plan.model_dump_json())
    outcome = run_cli(["fill", str(path), "--fill-jobs", "bert-large-inference"])
    assert outcome.code == 0, outcome.err
    first = outcome.out.splitlines()[0]
    assert ", 4 GPUs" in first and "8 GPUs" not in outcome.out, first
    whole = api.plan(api.make_problem("gpt-1.7b", "a100-80gb:8", schedule="gpipe", num_stages=4,
                                      global_batch_size=16), solver="even")
    assert plan_devices(whole) == 8 and json.loads(whole.model_dump_json())["degrees"]["data"] == 2


def test_transformer_default_is_ptdp_and_t1_solvers_say_so() -> None:
    problem = api.make_problem("gpt-1.7b", "a100-80gb:16", global_batch_size=64)
    assert api.default_solver(problem) == "ptdp"
    outcome = run_cli(["plan", "--model", "gpt-1.7b", "--cluster", "a100-80gb:16", "--global-batch", "64"])
    assert outcome.code == 0 and "solver ptdp (the default" in outcome.err, outcome.err
    fixed = api.plan(api.make_problem("gpt-1.7b", "a100-80gb:16", num_stages=4, global_batch_size=64), solver="even")
    assert fixed.degrees.tensor == 1
    assert any(note.startswith("tensor parallelism fixed at t=1: solver 'even' does not search it") for note in fixed.notes)
    searched = api.plan(problem, solver=api.default_solver(problem))
    assert not any("fixed at t=1" in note for note in searched.notes)
