"""FP8 fidelity rows: Transformer Engine FP8 training on H100 against the published throughput.

- Fit set: NVIDIA's Megatron-Bridge performance summary [megatron-bridge-perf] (docs/performance-summary.md
  and docs/performance-summary-archive.md), the DGX-H100 dense rows, Llama 3 8B/70B and Llama 3.1
  405B in FP8 with current scaling (``FP8-CS``), containers 25.09, 25.11 and 26.02. The H100
  ``fp8_gemm_max_fraction`` (cost_models/data/hardware.json) was set once on these rows together:
  the value whose mean signed error over them is nearest zero (``fit_fraction``).
- Held out: llm-foundry's "H100 80GB FP8" table [llm-foundry] (``scripts/train/benchmarking/README.md``):
  MPT 1B and 3B on 8 H100, FSDP FULL_SHARD, ``amp_fp8`` (Transformer Engine, delayed scaling),
  through bench/fidelity_heldout.py's MPT path. No constant was set on them.
- Held out: torchtitan's Llama 3.1 8B "FSDP + torch.compile + Float8" rows [torchtitan]
  (docs/performance.md Tables 1 and 3: 8 and 128 Grand Teton H100, torchao Float8 with dynamic
  tensorwise scaling, i.e. current scaling), at both ends of the Grand Teton peak range as
  bench/fidelity.py's BF16 rows, against the same tables' BF16 "FSDP + torch.compile" rows for the
  speedup.

Each Megatron-Bridge row is forced through ``ptdp`` with its published degrees, batch and
microbatch (bench/fidelity_bridge.py's forcing, plus the context-parallel degree and FSDP); what the
table does not state is listed in ``ASSUMED``.

Run from the repository root: ``PYTHONPATH=. .venv/bin/python bench/fidelity_fp8.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner import api
from planner.schema import Cluster, Device
from solvers import ptdp
from fidelity_bridge import forced_options


@dataclass(frozen=True, slots=True)
class Fp8Row:
    """One DGX-H100 FP8-CS row of the Megatron-Bridge tables."""

    container: str
    model: str
    gpus: int
    gbs: int
    tp: int
    pp: int
    cp: int
    vp: int
    fsdp: bool
    tokens: float
    """Published tokens/s/GPU."""


BRIDGE_ROWS = [
    Fp8Row("25.09", "llama3-8b", 8, 128, 1, 1, 1, 1, True, 14079.0),
    Fp8Row("25.09", "llama3-70b", 64, 128, 4, 8, 1, 5, False, 1619.0),
    Fp8Row("25.09", "llama3-405b", 1024, 512, 8, 8, 2, 8, False, 302.0),
    Fp8Row("25.11", "llama3-8b", 8, 128, 1, 1, 1, 1, True, 14451.0),
    Fp8Row("25.11", "llama3-70b", 64, 128, 4, 8, 1, 5, False, 1602.0),
    Fp8Row("25.11", "llama3-405b", 1024, 512, 8, 8, 2, 8, False, 292.0),
    Fp8Row("26.02", "llama3-70b", 64, 256, 4, 8, 1, 5, False, 1621.0),
    Fp8Row("26.02", "llama3-405b", 1024, 1536, 8, 8, 2, 8, False, 311.0),
]
"""Sequence 8,192 and microbatch 1 throughout. 25.09 and 25.11: the "System: DGX-H100" tables (25.09 has no
precision column: its rows are the 25.11 configurations, which the 25.11 table lists as FP8-CS);
26.02: the LLAMA3_70B and LLAMA3.1_405B model tables, DGX-H100 rows ("FP8")."""

ASSUMED = ("FP8 with current scaling (fp8-cs) on every row; ZeRO-1 (distributed optimizer) with overlapped "
           "gradient reduce-scatter and parameter all-gather, or ZeRO-3 where FSDP is set (8B); sequence "
           "parallelism with t > 1 and overlapped TP communication; recompute: the cheapest Megatron-Core module "
           "set that fits ptdp's memory model; CUDA graphs and TP comm-GEMM overlap (userbuffers) not costed")


def bridge_options(row: Fp8Row) -> dict[str, object]:
    """The ptdp options that pin a row's published configuration (bench/fidelity_bridge.py's forcing)."""
    return forced_options(row.model, tp=row.tp, pp=row.pp, vp=row.vp, mbs=1, cp=row.cp,
                          zero_stage=3 if row.fsdp else 1)


def h100(gpus: int, fraction: float | None = None, precision: str = "fp8-cs") -> Cluster:
    """``gpus`` H100 SXM with FP8 linear layers; ``fraction``: another ``fp8_gemm_max_fraction`` (the fit)."""
    from cost_models.compute import compute_constants, with_linear_precision

    cluster = api.load_cluster(f"h100:{gpus}")
    assert cluster.device is not None
    device = with_linear_precision(cluster.device, precision)
    if fraction is not None:
        compute = compute_constants(device).model_copy(update={"fp8_gemm_max_fraction": fraction})
        device = device.model_copy(update={"compute": compute})
    return cluster.model_copy(update={"device": device})


def bridge_row(row: Fp8Row, fraction: float | None = None) -> dict[str, object]:
    problem = api.make_problem(row.model, h100(row.gpus, fraction), global_batch_size=row.gbs, seq_length=8192)
    best = ptdp.solve(problem, options=bridge_options(row)).candidates[0]
    tokens = row.gbs * 8192 / float(best["iteration_s"]) / row.gpus
    return {"row": f"{row.model}, {row.gpus} DGX-H100 ({row.container}; t{row.tp} p{row.pp} c{row.cp} v{row.vp}"
                   f"{' FSDP' if row.fsdp else ''} GBS {row.gbs}), FP8-CS tokens/s/GPU",
            "source": "megatron-bridge", "published": row.tokens, "predicted": tokens,
            "error": tokens / row.tokens - 1, "recompute": str(best["recompute"]),
            "peak_memory_gib": float(best["peak_memory_gib"])}


MPT_FP8_ROWS = [  # (size, s, b, grad accum, activation checkpointing, tokens/s/GPU), 8 H100 each
    ("3b", 32768, 3, 6, True, 5856.0),
    ("3b", 8192, 3, 6, False, 19146.0),
    ("3b", 2048, 10, 6, False, 30586.0),
    ("3b", 512, 40, 6, False, 36527.0),
    ("1b", 32768, 1, 4, False, 12580.0),
    ("1b", 8192, 2, 4, False, 32010.0),
    ("1b", 512, 56, 4, False, 70315.0),
]
"""llm-foundry "H100 80GB FP8": FSDP FULL_SHARD, amp_fp8, mixed precision DEFAULT (fp32 gradient reduction)."""


MPT_BF16_SAME = {("3b", 32768): 5873.0, ("3b", 8192): 16578.0, ("3b", 512): 27965.0, ("1b", 32768): 12025.0,
                 ("1b", 512): 52275.0}
"""llm-foundry's "H100 80GB BF16" rows with the FP8 rows' exact configuration (size, s, b, GA, checkpointing):
their ratio is the published FP8 speedup, which the BF16 model's own error does not touch."""


def _mpt_rate(size: str, seq: int, b: int, ga: int, ckpt: bool, precision: str, fraction: float | None) -> float:
    import fidelity_heldout

    cluster = fidelity_heldout.with_mpt_attention(h100(8, fraction, precision=precision))
    return fidelity_heldout.mpt_rate(cluster, size, seq, b, ga, ckpt, reduce_bytes=4)


def mpt_fp8_rows(fraction: float | None = None) -> list[dict[str, object]]:
    """The llm-foundry FP8 rows through bench/fidelity.py's FSDP path (as bench/fidelity_heldout.py's
    BF16 MPT rows: fused kernels, the Triton FlashAttention ``fa1``), TE delayed scaling; where llm-foundry
    publishes the same configuration in BF16, ``speedup_error``: predicted over published FP8/BF16 ratio - 1."""
    out = []
    for size, seq, b, ga, ckpt, published in MPT_FP8_ROWS:
        got = _mpt_rate(size, seq, b, ga, ckpt, "fp8", fraction)
        row: dict[str, object] = {
            "row": f"MPT-{size}, 8 h100, s={seq}, b={b}, GA={ga}{', AC' if ckpt else ''}, FP8 tokens/s/GPU",
            "source": "llm-foundry", "published": published, "predicted": got, "error": got / published - 1}
        bf16 = MPT_BF16_SAME.get((size, seq))
        if bf16 is not None:
            predicted_speedup = got / _mpt_rate(size, seq, b, ga, ckpt, "bf16", fraction)
            row.update(bf16_published=bf16, speedup_error=predicted_speedup / (published / bf16) - 1)
        out.append(row)
    return out


TORCHTITAN_FP8 = [(8, 8532.0, 6667.0), (128, 8380.0, 6514.0)]
"""(GPUs, FSDP + torch.compile + Float8, FSDP + torch.compile) tokens/s/GPU: Llama 3.1 8B, b = 2,
s = 8,192, selective (op) checkpointing ([torchtitan] docs/performance.md Tables 1 and 3)."""


def torchtitan_fp8_rows(fraction: float | None = None) -> list[dict[str, object]]:
    """torchtitan's Float8 rows through bench/fidelity.py's FSDP path, fused kernels (torch.compile),
    SDPA's FlashAttention-2, current scaling (torchao's dynamic tensorwise scales); the Grand Teton
    part's FP8 peak is twice its BF16 peak at both ends of the range (the clocks set both).
    ``error``: at the NVL end (as the BF16 rows), ``error_high``: at the SXM end; ``speedup_error``:
    predicted over published Float8/BF16 ratio - 1 (the peak cancels)."""
    import fidelity
    from cost_models.compute import compute_constants, with_linear_precision

    def grand_teton(peak: float, precision: str) -> Device:
        device = fidelity.grand_teton_h100(peak)
        c = compute_constants(device)
        update: dict[str, object] = {"peak_flops_by_dtype": {**c.peak_flops_by_dtype, "fp8": 2 * peak}}
        if fraction is not None:
            update["fp8_gemm_max_fraction"] = fraction
        return with_linear_precision(device.model_copy(update={"compute": c.model_copy(update=update)}), precision)

    def rate(gpus: int, peak: float, precision: str) -> float:
        cluster = fidelity._with_device(f"h100:{gpus}", grand_teton(peak, precision))
        return fidelity._torchtitan_rate("llama3-8b", cluster, 2, "selective", 8192, kernels="fused")

    out = []
    nvl, sxm = fidelity.GRAND_TETON_PEAKS
    for gpus, published, bf16 in TORCHTITAN_FP8:
        low, high, low_base = rate(gpus, nvl, "fp8-cs"), rate(gpus, sxm, "fp8-cs"), rate(gpus, nvl, "bf16")
        out.append({"row": f"torchtitan llama3-8b + compile + Float8, {gpus} grand-teton-h100, tokens/s/GPU",
                    "source": "torchtitan", "published": published, "predicted": low, "predicted_high": high,
                    "error": low / published - 1, "error_high": high / published - 1, "bf16_published": bf16,
                    "speedup_error": (low / low_base) / (published / bf16) - 1})
    return out


def fp8_rows(fraction: float | None = None) -> list[dict[str, object]]:
    return [bridge_row(r, fraction) for r in BRIDGE_ROWS] + mpt_fp8_rows(fraction) + torchtitan_fp8_rows(fraction)


def summary(rows: list[dict[str, object]]) -> dict[str, tuple[float, float, float, int]]:
    """(mean signed error, mean |error|, max |error|, rows) by source."""
    out = {}
    for source in dict.fromkeys(str(r["source"]) for r in rows):
        errors = [float(r["error"]) for r in rows if r["source"] == source]
        out[source] = (sum(errors) / len(errors), sum(map(abs, errors)) / len(errors), max(map(abs, errors)),
                       len(errors))
    return out


def fit_fraction(lo: float = 0.3, hi: float = 0.9, steps: int = 12) -> float:
    """The ``fp8_gemm_max_fraction`` whose mean signed error over the Megatron-Bridge rows is nearest
    zero (bisection: the error grows with the fraction). How the preset's value was set."""
    for _ in range(steps):
        mid = (lo + hi) / 2
        errors = [float(bridge_row(r, mid)["error"]) for r in BRIDGE_ROWS]
        lo, hi = (mid, hi) if sum(errors) < 0 else (lo, mid)
    return round((lo + hi) / 2, 3)


def main() -> None:
    import sys

    if "--fit" in sys.argv:
        print(f"fitted fp8_gemm_max_fraction on the Megatron-Bridge rows: {fit_fraction()}")
        return
    rows = fp8_rows()
    print(f"assumed where the tables are silent: {ASSUMED}")
    for source, (mean, mean_abs, worst, n) in summary(rows).items():
        print(f"{source}: {n} rows, mean error {100 * mean:+.1f}%, mean |error| {100 * mean_abs:.1f}%, "
              f"max {100 * worst:.1f}%")
    for r in rows:
        extra = f"; recompute {r['recompute']}, peak {float(r['peak_memory_gib']):.1f} GiB" if "recompute" in r else ""
        if "error_high" in r:
            extra = f"; {100 * float(r['error_high']):+.1f}% at the SXM end"
        if "speedup_error" in r:
            published_speedup, error = float(r["published"]) / float(r["bf16_published"]), float(r["speedup_error"])
            extra += (f"; FP8/BF16 speedup published {published_speedup:.3f}, predicted "
                      f"{(1 + error) * published_speedup:.3f} ({100 * error:+.1f}%)")
        print(f"{r['row']}: published {float(r['published']):.0f}, predicted {float(r['predicted']):.0f} "
              f"({100 * float(r['error']):+.1f}%){extra}")


if __name__ == "__main__":
    main()
