"""`paraplan cluster-run --engine ray`: Gavel's rounds driving real training jobs on a local Ray head.

The Ray test starts its own head node (one logical CPU per accelerator, one custom resource per
type), runs five jobs over several 1-second rounds and compares every measured JCT with the
cluster simulator's for the same trace. Under the default accelerator decision clock the run
takes the simulator's decisions exactly (same rounds, same leases per job), so a job can finish
no earlier than simulated and the difference is the system's own overhead: on this 2-core box
1.01-1.04x (dispatch, checkpoint save/load and pacing per round); the upper bounds leave room
for a loaded CI machine. (Decisions on the wall clock let millisecond jitter break an exact
priority tie the other way; a job then finished 0.8x its simulated JCT in CI.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from planner.cli import main
from planner.cluster_job import train_lease

JOBS = {"format": "paraplan.jobs/v1", "jobs": [
    {"id": "a", "throughputs": {"v100": 40.0, "p100": 20.0}, "num_steps": 60, "arrival_time_s": 0.0},
    {"id": "b", "throughputs": {"v100": 30.0, "p100": 24.0}, "num_steps": 90, "arrival_time_s": 0.0},
    {"id": "c", "throughputs": {"v100": 50.0, "p100": 10.0}, "num_steps": 80, "arrival_time_s": 0.0},
    {"id": "d", "throughputs": {"v100": 20.0, "p100": 18.0}, "num_steps": 30, "arrival_time_s": 1.5},
    {"id": "e", "throughputs": {"v100": 40.0, "p100": 30.0}, "num_steps": 40, "arrival_time_s": 2.5},
]}


def test_lease_resumes_exactly_from_its_checkpoint(tmp_path: Path) -> None:
    # Two leases of 7 + 5 steps end in the same weights as one lease of 12: the checkpoint holds
    # the whole state and batches are a function of (seed, step).
    split, whole = tmp_path / "split.npz", tmp_path / "whole.npz"
    first = train_lease(str(split), seed=3, max_steps=7, steps_per_s=1e6)
    second = train_lease(str(split), seed=3, max_steps=5, steps_per_s=1e6)
    once = train_lease(str(whole), seed=3, max_steps=12, steps_per_s=1e6)
    assert (first["step"], second["step"], once["step"]) == (7, 12, 12)
    with np.load(split) as a, np.load(whole) as b:
        np.testing.assert_array_equal(a["weights"], b["weights"])
    assert second["loss"] == once["loss"] < first["loss"]


def test_lease_is_paced_to_the_throughput(tmp_path: Path) -> None:
    res = train_lease(str(tmp_path / "p.npz"), seed=0, max_steps=10, steps_per_s=100.0)
    assert res["end"] - res["start"] >= 10 / 100.0


@pytest.fixture(scope="module")
def ray_head() -> Iterator[None]:
    """One local head for the module's runs (cluster-run joins a started Ray and leaves it up)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, resources={"v100": 1, "p100": 1}, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    yield
    ray.shutdown()


def test_cluster_run_matches_the_simulator(tmp_path: Path, capsys: pytest.CaptureFixture[str], ray_head: None) -> None:
    trace = tmp_path / "jobs.json"
    trace.write_text(json.dumps(JOBS))
    rc = main(["cluster-run", "--engine", "ray", "--cluster", "v100:1,p100:1", "--trace", str(trace),
               "--policy", "max_min_fairness_perf", "--round", "1.0", "--checkpoint-dir", str(tmp_path / "ckpt"), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["engine"] == "ray" and out["num_jobs"] == 5 and out["decision_clock"] == "accelerator"
    assert (out["num_rounds"], out["num_preemptions"]) == (out["sim_num_rounds"], out["sim_num_preemptions"])
    assert out["sim_avg_jct_s"] <= out["avg_jct_s"] <= out["sim_avg_jct_s"] * 1.15
    for job in out["jobs"]:
        assert job["steps_done"] == job["num_steps"] and job["num_leases"] == job["sim_num_leases"], job
        assert job["sim_jct_s"] <= job["jct_s"] <= job["sim_jct_s"] * 1.3 + 0.3, job
        assert job["final_loss"] < 10.0  # from about 32 (|w*|^2) at step 0: the model trained
    assert max(job["num_leases"] for job in out["jobs"]) > 1  # preempted at a boundary and resumed
    assert out["num_preemptions"] > 0
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("job-*.npz")) == [f"job-{m}.npz" for m in range(5)]


def test_cluster_run_on_the_wall_clock(tmp_path: Path, capsys: pytest.CaptureFixture[str], ray_head: None) -> None:
    # Decisions on measured time may differ from the simulator's; the jobs still run to the end, and
    # none finishes faster than it could alone on its fastest type from its arrival.
    trace = tmp_path / "jobs.json"
    trace.write_text(json.dumps(JOBS))
    rc = main(["cluster-run", "--cluster", "v100:1,p100:1", "--trace", str(trace), "--policy", "max_min_fairness_perf",
               "--round", "1.0", "--decision-clock", "wall"])
    text = capsys.readouterr().out
    assert rc == 0 and "wall clock" in text
    jcts = {line.split()[0]: float(line.split()[2]) for line in text.splitlines() if line.startswith("  ")}
    assert sorted(jcts) == [j["id"] for j in JOBS["jobs"]]
    for job in JOBS["jobs"]:
        assert jcts[job["id"]] >= job["num_steps"] / max(job["throughputs"].values())


def test_cluster_run_rejects_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "jobs.json"
    trace.write_text(json.dumps(JOBS))
    rc = main(["cluster-run", "--cluster", "v100:1", "--trace", str(trace), "--policy", "fifo_perf", "--round", "0"])
    assert rc == 2 and "--round" in capsys.readouterr().err


def test_time_scale_keeps_the_schedule() -> None:
    from planner.cli_gavel import scale_time
    from planner.schema_gavel import JobsFile

    jobs = JobsFile.model_validate(JOBS)
    fast = scale_time(jobs, 360.0)
    assert fast.jobs[3].arrival_time_s == pytest.approx(1.5 / 360)
    assert fast.jobs[0].throughputs == {"v100": 40.0 * 360, "p100": 20.0 * 360}
    assert [j.num_steps for j in fast.jobs] == [j.num_steps for j in jobs.jobs]


def test_pairs_and_missing_throughputs_are_refused() -> None:
    from planner.cluster_run import check_jobs
    from planner.errors import InvalidProblemError
    from planner.schema_gavel import JobsFile

    paired = JobsFile.model_validate({**JOBS, "pairs": [{"jobs": ["a", "b"], "throughputs": {"v100": [20.0, 15.0]}}]})
    with pytest.raises(InvalidProblemError, match="co-located pairs"):
        check_jobs(paired, {"v100": 1, "p100": 1})
    with pytest.raises(InvalidProblemError, match="zero throughput on every type"):
        check_jobs(JobsFile.model_validate(JOBS), {"k80": 1})


def test_a_cluster_without_the_resources_is_refused() -> None:
    from planner.cluster_run import _check_resources
    from planner.errors import InvalidProblemError

    _check_resources({"CPU": 2.0, "v100": 1.0, "p100": 2.0}, {"v100": 1, "p100": 1})
    with pytest.raises(InvalidProblemError, match="start its nodes with --resources"):
        _check_resources({"CPU": 2.0, "v100": 1.0}, {"v100": 1, "p100": 1})


def test_an_address_without_a_head_is_refused_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Ray waits about a minute for a head that is not there; the probe answers in milliseconds.
    import socket

    from planner.cluster_run import check_address
    from planner.errors import InvalidProblemError

    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(InvalidProblemError, match="no Ray head node answers"):
        check_address(f"127.0.0.1:{port}")
    for bad in ("x:y", ":80", "host:70000"):
        with pytest.raises(InvalidProblemError, match="is not HOST:PORT"):
            check_address(bad)
    check_address("auto")  # Ray's own lookup: not probed
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        check_address(f"ray://127.0.0.1:{listening.getsockname()[1]}")


def test_the_cli_offers_the_engines_decision_clocks() -> None:
    # The parser spells them out so that building it loads no numpy or solver: keep them in step.
    import argparse

    from planner.cli import build_parser
    from planner.cluster_run import DECISION_CLOCKS

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    flag = next(a for a in sub.choices["cluster-run"]._actions if "--decision-clock" in a.option_strings)
    assert tuple(flag.choices) == DECISION_CLOCKS and flag.default == DECISION_CLOCKS[0]
