"""The simulator with ``mechanism="gavel"`` against Gavel's own simulator, cell by cell.

The reference numbers (tests/data/gavel_reference/physical_cluster_traces.json) are Gavel's
simulator run on its physical-cluster traces, 4 V100 + 4 P100 + 4 K80, 360 s rounds, seed 0,
solved with ECOS; the file records how they were produced. The agnostic FIFO is excepted
(Gavel's assigns every job to the V100s; paraplan's is the chapter's LP:
docs/gavel-simulator.md). With ``lp_solver="ecos"`` (Gavel's formulations on ECOS) every other
cell is checked, most to 1e-6; with the default HiGHS the cells whose optimum is unique.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from solvers.gavel.simulator import simulate
from solvers.gavel.throughputs import read_trace

ROOT = Path(__file__).resolve().parents[3]
REFERENCE = json.loads((ROOT / "tests" / "data" / "gavel_reference" / "physical_cluster_traces.json").read_text())
CELLS = {(c["trace"], c["policy"]): c for c in REFERENCE["cells"]}
WORKERS = {"v100": 4, "p100": 4, "k80": 4}
OURS = {"min_total_duration": "min_total_duration_perf"}  # Gavel's makespan policy is heterogeneity-aware
POLICIES = ("max_min_fairness", "max_min_fairness_perf", "finish_time_fairness", "finish_time_fairness_perf",
            "min_total_duration")


TRACES = ("artifact_evaluation", "debug", "debug_v2", "medium_test", "small_test")
# |ours / Gavel's - 1| reached with lp_solver="ecos" where it is not ~0 (average JCT, makespan): the
# agnostic LAS/FTF on artifact_evaluation 0.031/0.000 and 0.016/0.003, LAS on medium_test
# 0.0008/0.0044 and 0.0018/0.0000 (docs/gavel-simulator.md, "What remains").
NEAR = {("artifact_evaluation", "max_min_fairness"): (0.035, 1e-4),
        ("artifact_evaluation", "finish_time_fairness"): (0.02, 0.005),
        ("medium_test", "max_min_fairness"): (0.002, 0.006),
        ("medium_test", "max_min_fairness_perf"): (0.003, 1e-6)}


@functools.lru_cache(maxsize=None)
def _run(trace: str, policy: str, lp_solver: str = "highs"):  # type: ignore[no-untyped-def]
    jobs = read_trace(str(ROOT / "solvers" / "gavel" / "data" / "traces" / f"{trace}.trace"), worker_types=WORKERS)
    return simulate(jobs, worker_types=WORKERS, policy=OURS.get(policy, policy), round_s=360.0, mechanism="gavel", seed=0,
                    options={"lp_solver": lp_solver})


@pytest.mark.parametrize("trace", TRACES)
@pytest.mark.parametrize("policy", (*POLICIES, "fifo_perf"))
def test_every_non_fifo_cell_within_5_percent_with_ecos(trace: str, policy: str) -> None:
    # Gavel's formulations on Gavel's solver pick the same optimal allocations: 26 of the 30 cells
    # agree to 1e-6 (bit for bit here), the other four within the NEAR tolerances (all within 5%).
    pytest.importorskip("ecos", reason="lp_solver='ecos' needs the ecos extra")
    ref, r = CELLS[trace, policy], _run(trace, policy, "ecos")
    jct_tol, span_tol = NEAR.get((trace, policy), (1e-6, 1e-6))
    assert r.avg_jct_s == pytest.approx(ref["avg_jct_s"], rel=jct_tol)
    assert r.makespan_s == pytest.approx(ref["makespan_s"], rel=span_tol)


@pytest.mark.parametrize("policy", (*POLICIES, "fifo_perf"))
def test_small_test_matches_gavel_job_by_job_with_ecos(policy: str) -> None:
    pytest.importorskip("ecos", reason="lp_solver='ecos' needs the ecos extra")
    ref, r = CELLS["small_test", policy], _run("small_test", policy, "ecos")
    assert [j.jct_s for j in r.jobs] == pytest.approx(ref["jcts_s"], rel=1e-6)


@pytest.mark.parametrize("trace", ["medium_test", "debug"])
@pytest.mark.parametrize("policy", POLICIES)
def test_average_jct_and_makespan_within_5_percent_of_gavels(trace: str, policy: str) -> None:
    # the default HiGHS: another point of the optimal face where it is not unique (24 of 30 cells)
    ref, r = CELLS[trace, policy], _run(trace, policy)
    assert r.avg_jct_s == pytest.approx(ref["avg_jct_s"], rel=0.05)
    assert r.makespan_s == pytest.approx(ref["makespan_s"], rel=0.05)


@pytest.mark.parametrize("trace", ["small_test", "debug"])
def test_greedy_fifo_perf_equals_gavels(trace: str) -> None:
    # Gavel's greedy fifo_perf, and on small_test the round in which nothing can run (the last job
    # is unallocated at 572 s): Gavel re-allocates at once instead of idling a round.
    ref, r = CELLS[trace, "fifo_perf"], _run(trace, "fifo_perf")
    assert (r.avg_jct_s, r.makespan_s) == (pytest.approx(ref["avg_jct_s"], rel=1e-6), pytest.approx(ref["makespan_s"], rel=1e-6))


def test_makespan_bisection_equals_gavels_on_small_test() -> None:
    # Gavel's 5% bisection and an interior point of its feasible set (the exact LP: 0.941 JCT)
    ref, r = CELLS["small_test", "min_total_duration"], _run("small_test", "min_total_duration")
    assert r.avg_jct_s == pytest.approx(ref["avg_jct_s"], rel=1e-3)


def test_small_test_las_matches_gavel_job_by_job() -> None:
    # Gavel's normalizer (thr under X^iso) and its ordering of ties reproduce every job's JCT.
    ref, r = CELLS["small_test", "max_min_fairness_perf"], _run("small_test", "max_min_fairness_perf")
    assert [j.jct_s for j in r.jobs] == pytest.approx(ref["jcts_s"], rel=1e-6)
