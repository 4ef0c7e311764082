"""Published measurements on devices other than the A100 (bench/fidelity.py, docs/cost-model.md):
Megatron-LM on V100s and PipeDream-2BW's depth choices. Tolerances are the accuracy reached."""

from __future__ import annotations

import pytest

from tests.bench_loader import load_bench

FIDELITY = load_bench("fidelity", alias="fidelity_devices")


@pytest.fixture(scope="module")
def v100() -> list[dict[str, object]]:
    return FIDELITY.v100_rows()


def test_megatron_v1_single_v100(v100: list[dict[str, object]]) -> None:
    """1.2B GPT on one DGX-2H V100, b = 8: 62.4 TFLOP/s measured (v1.0 kernels), 58.8 predicted
    (-5.8 %), tested within 7 %. Not fitted: the V100 constants are the A100 fit's."""
    row = v100[0]
    assert float(row["predicted"]) == pytest.approx(float(row["published"]), rel=0.07)


def test_megatron_8_way_tensor_parallel_weak_scaling(v100: list[dict[str, object]]) -> None:
    """8.3B with t = 8 on 8 V100s runs at 77 % of the 1.2B baseline per GPU (Shoeybi et al.
    Sec. 5.1); predicted 77.4 % (+0.5 %), tested within 2 %."""
    row = v100[1]
    assert float(row["predicted"]) == pytest.approx(float(row["published"]), rel=0.02)


def test_megatron_512_gpus_with_the_all_reduce_under_the_backward(v100: list[dict[str, object]]) -> None:
    """512 V100s (t = 8, d = 64, batch 512): 76 % measured, 72.4 % predicted (-4.7 %). The 2.1 GB
    per GPU gradient all-reduce over 6.25 GB/s per GPU of InfiniBand runs as 4 bucket collectives on
    the engine, each starting when the backward has produced its gradients (PyTorch DDP's buckets);
    charged after the backward it gave 63.8 % (-16 %). Tested at the accuracy reached (within 6 %)."""
    row = v100[2]
    assert float(row["predicted"]) == pytest.approx(float(row["published"]), rel=0.06)
    assert float(row["predicted"]) < float(row["published"])


def test_two_bw_depth_rows() -> None:
    """The chapter's planner picks 8 deep for GPT 2.2B (8 and 64 V100s) and 16 deep for 3.8B: so
    does ours on the chapter's runtime memory (24 B per parameter with 2BW). Among 2BW
    configurations the chapter's depth wins; with Flush swept too the 3.8B margin is 1 %."""
    rows = FIDELITY.two_bw_rows()
    assert [r["published_depth"] for r in rows] == [8, 8, 16]
    assert [r["predicted_depth"] for r in rows] == [8, 8, 16]
    assert [r["predicted_depth_any"] for r in rows] == [8, 8, 16]
    assert all(float(r["published_depth_relative_rate"]) == 1.0 for r in rows)
    assert [float(r["runner_up_relative_rate"]) for r in rows] == pytest.approx([0.958, 0.906, 0.990], abs=0.005)


def test_torchtitan_rows() -> None:
    """torchtitan's FSDP2 runs (layer times, op-level selective checkpointing, FSDP2's exposed
    collectives, optimizer step), costed with eager PyTorch's unfused elementwise chains (fp32
    RMSNorm and rotary, two-kernel SwiGLU, K/V expanded before SDPA), the compute under FSDP's
    overlapped collectives run on the SMs NCCL's 24 CTAs leave it, and SDPA's FlashAttention-2 as
    one kernel at its family's rate, and full checkpointing as PyTorch's non-reentrant checkpoint
    runs it (the recompute stops before the FFN output projection): the six A100 rows -1.0 to
    +5.8 % (mean |error| 2.6 %; -3.7 to +5.4 %, mean 1.9 %, while full recompute re-ran the whole
    forward; -6.2 to +3.7 %, mean 3.8 %, while the flash core was costed as two GEMMs), tested within
    6 % and at the mean reached. The Grand Teton H100 rows (peak between 835 and 989 TF/s, 2.4 TB/s, FlashAttention-2 at
    35 % of peak): -3.2 and -0.8 % at the NVL end, +9.7 and +12.4 % at the SXM end, so the
    published figures lie inside the 500 W cap's range (H100 GEMM fraction 0.58), tested at the
    accuracy reached."""
    rows = FIDELITY.torchtitan_rows()
    a100 = [float(r["error"]) for r in rows if "a100" in str(r["row"])]
    assert a100 == pytest.approx([-0.010, 0.058, 0.010, 0.003, 0.054, 0.022], abs=0.003)
    assert len(a100) == 6 and all(abs(e) < 0.06 for e in a100)
    assert sum(abs(e) for e in a100) / len(a100) == pytest.approx(0.026, abs=0.003)
    h100 = [r for r in rows if "h100" in str(r["row"])]
    assert [float(r["error"]) for r in h100] == pytest.approx([-0.032, -0.008], abs=0.005)
    assert [float(r["error_high"]) for r in h100] == pytest.approx([0.097, 0.124], abs=0.005)
    assert all(float(r["error"]) < 0 < float(r["error_high"]) for r in h100)


def test_korthikanti_table_5_iteration_times() -> None:
    """Korthikanti et al. Table 5 (A100, t = 8, no data parallelism, backward TP collectives
    overlapped as their Sec. 6.2 says; not fitted on): 8 iteration times, predicted -5.7 to +9.4 %,
    mean |error| 4.0 %; tested per row within 10 % and mean within 4.5 %. Selective recompute + SP
    comes out 34-38 % faster than full recompute (measured 29-32 %): our full-recompute rows are
    the slow ones (docs/cost-model.md, known limits)."""
    rows = FIDELITY.korthikanti_table_5()
    errors = [float(r["error"]) for r in rows]
    assert all(abs(e) < 0.10 for e in errors)
    assert sum(abs(e) for e in errors) / len(errors) < 0.045
    for full, present in zip(rows[::2], rows[1::2]):
        speedup = float(full["predicted"]) / float(present["predicted"]) - 1
        assert 0.33 < speedup < 0.39
