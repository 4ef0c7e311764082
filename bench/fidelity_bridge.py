"""Held-out fidelity rows from NVIDIA's Megatron-Bridge performance summary [megatron-bridge-perf]:
the BF16 pre-training rows on DGX-H100, DGX-B200 and DGX-GB200 (docs/performance-summary.md and
docs/performance-summary-archive.md, NeMo 25.11 and 26.02 containers) of models paraplan has presets
for. Every dense model of those tables (Llama 3 8B/70B, Llama 3.1 405B) was measured in FP8 or
FP4 only (the DGX-H100 FP8 rows: bench/fidelity_fp8.py), so the BF16 rows are all mixture-of-experts: GPT-OSS 120B
on the three systems, DeepSeek-V3 and Qwen3-235B-A22B on GB200. Each is predicted with the published
degrees, batch, microbatch and sequence forced through the ``ptdp`` solver (as bench/fidelity_heldout.py
forces the Llama 3 405B and BLOOM rows); what the table does not state comes from the recipes of the
same repository (``scripts/performance/configs``) and is listed per row in ``ASSUMED``.

No constant was set on these rows: H100 keeps its constants (A100 fit scaled by the H100 GEMM
fraction fitted on the other held-out H100 runs), B200 and GB200 carry H100's efficiency constants
unfitted (cost_models/data/hardware.json). Table and notes: docs/cost-model.md, "Held-out runs".

Run from the repository root: ``PYTHONPATH=. .venv/bin/python bench/fidelity_bridge.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner import api
from solvers import ptdp


@dataclass(frozen=True, slots=True)
class BridgeRow:
    """One published row: system, container, model preset, GPUs and the table's settings."""

    system: str
    container: str
    model: str
    gpus: int
    cluster: str
    seq: int
    gbs: int
    mbs: int
    tp: int
    pp: int
    vp: int
    ep: int
    tokens: float
    """Published tokens/s/GPU."""
    tflops: float
    """Published model TFLOP/s/GPU (Megatron-Bridge's own FLOP count)."""
    recipe_recompute: str
    """The recipe's ``recompute_modules`` (the rows are given ``none,modules``, the cheapest set that fits
    ptdp's memory model, reported per row; ``recipe_set_rows`` pins the recipe's set instead)."""
    overlap_a2a: bool = False


ROWS = [
    # GPT-OSS 120B, 64 GPUs, TP 1, CP 1, DDP (FSDP 0); recompute from the recipe: layernorm + moe_act
    BridgeRow("DGX-H100", "25.11", "gpt-oss-120b", 64, "h100:64", 4096, 512, 4, 1, 4, 1, 8, 5630.0, 153.0,
              "layernorm+moe_act"),
    BridgeRow("DGX-H100", "26.02", "gpt-oss-120b", 64, "h100:64", 4096, 1280, 1, 1, 4, 1, 8, 5993.0, 163.0,
              "layernorm+moe_act"),
    BridgeRow("DGX-B200", "25.11", "gpt-oss-120b", 64, "b200:64", 4096, 512, 4, 1, 1, 1, 8, 8213.0, 223.0,
              "layernorm+moe_act"),
    BridgeRow("DGX-B200", "26.02", "gpt-oss-120b", 64, "b200:64", 4096, 1280, 4, 1, 1, 1, 64, 8047.0, 219.0,
              "layernorm+moe_act"),
    BridgeRow("DGX-GB200", "25.11", "gpt-oss-120b", 64, "gb200:64", 8192, 1280, 1, 1, 1, 1, 64, 15876.0, 488.0,
              "layernorm+moe_act"),
    BridgeRow("DGX-GB200", "26.02", "gpt-oss-120b", 64, "gb200:64", 4096, 1280, 4, 1, 1, 1, 64, 15784.0, 428.0,
              "layernorm+moe_act", overlap_a2a=True),
    # 256 GPUs: four 64-GPU NVLink domains (an assumption: the table gives no rack layout)
    BridgeRow("DGX-GB200", "25.11", "deepseek-v3", 256, "gb200:4x64", 4096, 4096, 1, 1, 4, 4, 64, 3139.0, 782.0,
              "mla_up_proj"),
    BridgeRow("DGX-GB200", "25.11", "qwen3-235b-a22b", 256, "gb200:4x64", 4096, 8192, 1, 1, 8, 3, 32, 4916.0, 728.0,
              "none"),
]
"""The BF16 rows (25.11: performance-summary-archive.md "25.11 NeMo Container"; 26.02: its "26.02 NeMo
Container" model tables)."""

ASSUMED = ("ZeRO-1 (Megatron's distributed optimizer, the recipes' default) with overlapped gradient "
           "reduce-scatter and parameter all-gather; BF16 gradient reduction (grad_reduce_in_fp32 False); "
           "sequence parallel off at t = 1; recompute: the cheapest module set that fits ptdp's memory model "
           "(the recipes' own set, e.g. layernorm + moe_act, pinned in a second table); "
           "expert all-to-all overlap only where the recipe sets moe_a2a_overlap (GB200 V2); routing "
           "force-balanced as the tables state (load-balance factor 1); CUDA graphs, fused kernels and "
           "HybridEP dispatch not costed separately")


def forced_options(model: str, *, tp: int, pp: int, vp: int, mbs: int, cp: int = 1, ep: int = 1,
                   zero_stage: int = 1, overlap_a2a: bool = False) -> dict[str, object]:
    """The ptdp options that pin a Megatron-Bridge row's published degrees, with the recipes'
    settings the tables do not state (``ASSUMED``); bench/fidelity_fp8.py forces its rows with it too."""
    return {"tensor_parallel": tp, "pipeline_parallel": pp, "virtual_pipeline": vp,
            "context_parallel": cp, "expert_parallel": ep, "microbatch_size": mbs, "zero_stage": zero_stage,
            "recompute": "none,modules", "overlap_grad_reduce": True, "overlap_param_gather": True,
            "overlap_tp_comm": True, "overlap_moe_alltoall": overlap_a2a, "num_simulated": 1,
            "schedules": "interleaved-1f1b" if vp > 1 else "1f1b",
            "uneven_stages": api.load_model(model).num_layers % (pp * vp) != 0}


def row_options(row: BridgeRow) -> dict[str, object]:
    """The ptdp options that pin a row's published configuration."""
    return forced_options(row.model, tp=row.tp, pp=row.pp, vp=row.vp, mbs=row.mbs, ep=row.ep,
                          overlap_a2a=row.overlap_a2a)


def predict(row: BridgeRow) -> dict[str, object]:
    """Predicted tokens/s/GPU and model TFLOP/s/GPU of one row against the published ones."""
    problem = api.make_problem(row.model, row.cluster, global_batch_size=row.gbs, seq_length=row.seq)
    plan = ptdp.solve(problem, options=row_options(row))
    best = plan.candidates[0]
    tokens = row.gbs * row.seq / float(best["iteration_s"]) / row.gpus
    tflops = float(best["model_tflops_per_gpu"])
    return {"row": f"{row.model}, {row.gpus} {row.system} ({row.container}; t{row.tp} p{row.pp} v{row.vp} "
                   f"e{row.ep} b{row.mbs} GBS {row.gbs} s{row.seq}), tokens/s/GPU",
            "system": row.system, "published": row.tokens, "predicted": tokens, "error": tokens / row.tokens - 1,
            "published_tflops": row.tflops, "predicted_tflops": tflops, "tflops_error": tflops / row.tflops - 1,
            "recompute": str(best["recompute"]), "recipe_recompute": row.recipe_recompute, "peak_memory_gib": float(best["peak_memory_gib"])}


def recipe_set_rows() -> list[dict[str, object]]:
    """Each row with the recipe's own recompute set pinned (ptdp ``recompute=moe_act+layernorm``): its
    tokens/s/GPU error, or None where ptdp's memory model does not fit that set at the row's settings."""
    from planner.errors import InfeasibleError

    out = []
    for row in ROWS:
        problem = api.make_problem(row.model, row.cluster, global_batch_size=row.gbs, seq_length=row.seq)
        options = {**row_options(row), "recompute": row.recipe_recompute}
        try:
            best = ptdp.solve(problem, options=options).candidates[0]
        except InfeasibleError:
            out.append({"row": row, "error": None})
            continue
        tokens = row.gbs * row.seq / float(best["iteration_s"]) / row.gpus
        out.append({"row": row, "error": tokens / row.tokens - 1, "peak_memory_gib": float(best["peak_memory_gib"])})
    return out


def bridge_rows() -> list[dict[str, object]]:
    return [predict(row) for row in ROWS]


def system_summary(rows: list[dict[str, object]]) -> dict[str, tuple[float, float, int]]:
    """(mean |error|, max |error|, rows) of the tokens/s/GPU errors by system."""
    out = {}
    for system in dict.fromkeys(str(r["system"]) for r in rows):
        errors = [abs(float(r["error"])) for r in rows if r["system"] == system]
        out[system] = (sum(errors) / len(errors), max(errors), len(errors))
    return out


def main() -> None:
    rows = bridge_rows()
    print(f"assumed where the table is silent: {ASSUMED}")
    for system, (mean, worst, n) in system_summary(rows).items():
        print(f"Megatron-Bridge {system} rows: {n}, mean |error| {100 * mean:.1f}%, max {100 * worst:.1f}%")
    for r in rows:
        print(f"{r['row']}: published {float(r['published']):.0f}, predicted {float(r['predicted']):.0f} "
              f"({100 * float(r['error']):+.1f}%); model TFLOP/s/GPU {float(r['published_tflops']):.0f} vs "
              f"{float(r['predicted_tflops']):.0f} ({100 * float(r['tflops_error']):+.1f}%); recompute "
              f"{r['recompute']} (recipe {r['recipe_recompute']}), peak {float(r['peak_memory_gib']):.1f} GiB")
    print("with the recipe's recompute set pinned:")
    for r in recipe_set_rows():
        row = r["row"]
        assert isinstance(row, BridgeRow)
        got = "does not fit ptdp's memory model" if r["error"] is None else \
            f"{100 * float(r['error']):+.1f}% (peak {float(r['peak_memory_gib']):.1f} GiB)"  # type: ignore[arg-type]
        print(f"  {row.model}, {row.system} {row.container} ({row.recipe_recompute}): {got}")


if __name__ == "__main__":
    main()
