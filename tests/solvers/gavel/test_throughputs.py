"""Gavel's throughput table and traces, and throughputs derived from paraplan's planner."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.errors import InvalidProblemError
from solvers.gavel.throughputs import derive_throughputs, load_table, read_trace

TRACES = Path(__file__).resolve().parents[3] / "solvers" / "gavel" / "data" / "traces"


def test_table_has_the_published_job_types() -> None:
    table = load_table()
    assert len(table.job_types) == 26
    assert len(table.isolated) == 83  # 26 at scale 1 + 19 distributed x (2, 4, 8)
    row = table.isolated[("ResNet-18 (batch size 16)", 1)]
    assert row["v100"] == pytest.approx(32.353, abs=1e-3)
    # Not viable: K80 ResNet-50 batch 128 on 2 GPUs (README sec. 3).
    assert table.isolated[("ResNet-50 (batch size 128)", 2)]["k80"] == 0.0


def test_trace_reads_ten_columns() -> None:
    jobs = read_trace(TRACES / "small_test.trace", worker_types={"v100": 1, "p100": 1, "k80": 1}, with_pairs=True)
    assert len(jobs.jobs) == 20
    first = jobs.jobs[0]
    assert (first.id, first.job_type, first.num_steps, first.scale_factor) == ("0", "Transformer (batch size 128)", 346, 2)
    assert jobs.pairs and all(len(p.jobs) == 2 for p in jobs.pairs)


def test_bad_trace_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.trace"
    bad.write_text("A3C\tcmd\tdir\t-n\t1\t100\n")
    with pytest.raises(InvalidProblemError, match="line 1 has 6 tab-separated columns"):
        read_trace(bad, worker_types={"v100": 1})


def test_derived_throughputs_rank_the_devices() -> None:
    thr = derive_throughputs("gpt-1.7b", 8, worker_types={"a100-80gb": 1, "v100": 1, "k80": 1}, scale_factor=4)
    assert thr["a100-80gb"] > thr["v100"] > thr["k80"] > 0


def test_derived_throughput_is_zero_when_the_model_does_not_fit() -> None:
    thr = derive_throughputs("gpt-18.4b", 8, worker_types={"k80": 1, "a100-80gb": 1}, scale_factor=1)
    assert thr["k80"] == 0.0


def test_derived_throughputs_need_hardware_presets() -> None:
    with pytest.raises(InvalidProblemError, match="'tpu-x': it is not a hardware preset"):
        derive_throughputs("gpt-tiny", 8, worker_types={"tpu-x": 1})
