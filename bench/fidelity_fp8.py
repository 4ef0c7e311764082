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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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
    system: str = "h100"
    """The device preset (DGX-H100: ``h100``, DGX-B200: ``b200``, DGX-GB200: ``gb200``)."""
    mbs: int = 1
    seq: int = 8192
    ep: int = 1
    precision: str = "fp8-cs"
    """``fp8-cs`` (current scaling, NeMo 25.02 on) or ``fp8`` (delayed scaling, NeMo 24.07)."""
    source: str = "megatron-bridge"
    dispatcher: str = "alltoall"
    """ptdp's ``moe_dispatcher``: ``deepep`` where the recipe runs Megatron's flex dispatcher."""


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

BLACKWELL_ROWS = [
    Fp8Row("25.09", "llama3-8b", 8, 128, 1, 1, 1, 1, False, 29994.0, "b200", mbs=2, source="megatron-bridge-blackwell"),
    Fp8Row("25.09", "llama3-405b", 128, 64, 4, 8, 2, 8, False, 664.0, "b200", source="megatron-bridge-blackwell"),
    Fp8Row("25.11", "llama3-8b", 8, 128, 1, 1, 1, 1, False, 30624.0, "b200", mbs=2, source="megatron-bridge-blackwell"),
    Fp8Row("25.11", "llama3-405b", 128, 64, 4, 8, 2, 8, False, 661.0, "b200", source="megatron-bridge-blackwell"),
    Fp8Row("25.09", "llama3-8b", 8, 128, 1, 1, 1, 1, False, 31357.0, "gb200", mbs=2, source="megatron-bridge-blackwell"),
    Fp8Row("25.11", "llama3-8b", 8, 128, 1, 1, 1, 1, False, 31508.0, "gb200", mbs=2, source="megatron-bridge-blackwell"),
]
"""Held out: the DGX-B200 and DGX-GB200 FP8-CS rows of the 25.09 and 25.11 tables [megatron-bridge-perf]
that ptdp can force. Left out: GB200's Llama 3 70B and 405B rows, whose recipes run Megatron-FSDP with
``cpu_offloading_num_layers`` (activations of 40 of the 70B's 80 layers offloaded to Grace memory),
which paraplan does not cost (it would recompute instead: -20 to -27 %)."""

MOE_ROWS = [
    Fp8Row("25.09", "deepseek-v3", 1024, 8192, 2, 8, 1, 4, False, 1297.0, seq=4096, ep=64, dispatcher="deepep",
           source="megatron-bridge-moe"),
]
"""Held out: the DGX-H100 DeepSeek-V3 row of the 25.09 table (dropless, force-balanced routing), FP8
current scaling as the table's headline figure; the recipe (``DEEPSEEK_V3_PRETRAIN_CONFIG_H100_V1``)
runs the flex dispatcher on HybridEP (node-deduplicated: ``deepep``), recompute modules mla_up_proj and
mlp, and v = 4 with the layout 'Et|(tt|)*30mL' (the last virtual stage holds the multi-token-prediction
module and the loss); ptdp's near-even layout of the 61 layers over the 32 virtual stages is 1, 2 x 29,
1, 1."""

NEMO_ROWS = [
    # NeMo 24.07, DGX-H100, FP8 with delayed scaling (Transformer Engine's recipe of the time)
    Fp8Row("24.07", "gpt3-175b", 128, 256, 4, 8, 1, 6, False, 726.0, seq=2048, precision="fp8", source="nemo"),
    Fp8Row("24.07", "gpt3-175b", 512, 2048, 4, 8, 1, 6, False, 782.0, mbs=2, seq=2048, precision="fp8", source="nemo"),
    Fp8Row("24.07", "llama2-7b", 8, 128, 1, 1, 1, 1, False, 16847.0, seq=4096, precision="fp8", source="nemo"),
    Fp8Row("24.07", "llama2-13b", 16, 128, 1, 4, 1, 10, False, 8646.0, seq=4096, precision="fp8", source="nemo"),
    Fp8Row("24.07", "llama2-70b", 64, 128, 4, 4, 1, 20, False, 1707.0, seq=4096, precision="fp8", source="nemo"),
    Fp8Row("24.07", "llama3-8b", 8, 128, 1, 1, 2, 1, False, 12036.0, precision="fp8", source="nemo"),
    Fp8Row("24.07", "llama3-70b", 64, 128, 4, 4, 2, 5, False, 1533.0, precision="fp8", source="nemo"),
    # NeMo 25.02, DGX-B200, FP8 current scaling
    Fp8Row("25.02", "gpt3-175b", 512, 2048, 4, 4, 1, 6, False, 1600.0, "b200", mbs=2, seq=2048, source="nemo"),
    Fp8Row("25.02", "llama3-8b", 8, 128, 1, 1, 1, 1, False, 26006.0, "b200", mbs=2, source="nemo"),
    Fp8Row("25.02", "llama3-70b", 64, 128, 2, 4, 2, 5, False, 3062.0, "b200", source="nemo"),
    Fp8Row("25.02", "llama3-405b", 128, 64, 4, 8, 2, 8, False, 625.0, "b200", source="nemo"),
    Fp8Row("25.02", "mixtral-8x7b", 64, 256, 1, 1, 1, 1, False, 15457.0, "b200", mbs=2, seq=4096, ep=8, source="nemo"),
    # NeMo 25.04, DGX-GB200, FP8 current scaling
    Fp8Row("25.04", "gpt3-175b", 128, 256, 4, 4, 1, 12, False, 1804.0, "gb200", mbs=2, seq=2048, source="nemo"),
    Fp8Row("25.04", "llama3-8b", 8, 128, 1, 1, 1, 1, False, 33099.0, "gb200", mbs=2, source="nemo"),
    Fp8Row("25.04", "llama3-405b", 128, 64, 4, 8, 2, 8, False, 665.0, "gb200", source="nemo"),
    Fp8Row("25.04", "mixtral-8x7b", 64, 256, 1, 1, 1, 1, False, 19275.0, "gb200", mbs=2, seq=4096, ep=8, source="nemo"),
]
"""Held out: NVIDIA's NeMo Framework performance summaries [nemo-perf-summary], the pre-training rows
of models paraplan has presets for: NeMo 24.07 on DGX-H100 (FP8, delayed scaling), 25.02 on DGX-B200
and 25.04 on DGX-GB200 (FP8 with current scaling, as those pages state). Left out: GPT-3 5B/20B and
Nemotron (no preset), Mixtral 8x22B (its GBS/MBS columns are shifted on the page), GB200's Llama 3 70B
(FSDP without its recipe's activation offload, as ``BLACKWELL_ROWS``)."""

OFFLOAD_ROWS = [
    # NeMo 25.07, DGX-GB200, FP8 current scaling, Megatron-FSDP (the tables' FSDP 1), GA 2 and 1
    Fp8Row("25.07", "llama3-70b", 64, 128, 1, 1, 1, 1, True, 4066.0, "gb200", source="nemo-offload"),
    Fp8Row("25.07", "llama3-405b", 128, 64, 2, 1, 1, 1, True, 706.0, "gb200", source="nemo-offload"),
]
"""Held out: the NeMo 25.07 DGX-GB200 rows [nemo-perf-summary] whose recipes keep activations in
Grace memory (Megatron-FSDP with ``cpu_offloading_num_layers``), forced with activation offloading
among the settings ptdp may take (``offload_rows``); until offloading was costed they could only be
predicted with recompute in its place."""

ASSUMED = ("FP8 with current scaling (fp8-cs) on every row; ZeRO-1 (distributed optimizer) with overlapped "
           "gradient reduce-scatter and parameter all-gather, or ZeRO-3 where FSDP is set (8B); sequence "
           "parallelism with t > 1 and overlapped TP communication; recompute: the cheapest Megatron-Core module "
           "set that fits ptdp's memory model; CUDA graphs and TP comm-GEMM overlap (userbuffers) not costed")


def bridge_options(row: Fp8Row) -> dict[str, object]:
    """The ptdp options that pin a row's published configuration (bench/fidelity_bridge.py's forcing)."""
    return {**forced_options(row.model, tp=row.tp, pp=row.pp, vp=row.vp, mbs=row.mbs, cp=row.cp, ep=row.ep,
                             zero_stage=3 if row.fsdp else 1), "moe_dispatcher": row.dispatcher}


def fp8_cluster(system: str, gpus: int, fraction: float | None = None, precision: str = "fp8-cs") -> Cluster:
    """``gpus`` devices of preset ``system`` with FP8 linear layers (GB200: 64-GPU NVLink domains past one
    rack's 72, as bench/fidelity_bridge.py assumes); ``fraction``: another ``fp8_gemm_max_fraction``."""
    from cost_models.compute import compute_constants, with_linear_precision

    spec = f"{system}:{gpus // 64}x64" if system == "gb200" and gpus > 72 else f"{system}:{gpus}"
    cluster = api.load_cluster(spec)
    assert cluster.device is not None
    device = with_linear_precision(cluster.device, precision)
    if fraction is not None:
        compute = compute_constants(device).model_copy(update={"fp8_gemm_max_fraction": fraction})
        device = device.model_copy(update={"compute": compute})
    return cluster.model_copy(update={"device": device})


def bridge_row(row: Fp8Row, fraction: float | None = None) -> dict[str, object]:
    """One FP8 row forced through ptdp; ``fraction`` is applied to the H100 rows only (the fit)."""
    cluster = fp8_cluster(row.system, row.gpus, fraction if row.system == "h100" else None, row.precision)
    problem = api.make_problem(row.model, cluster, global_batch_size=row.gbs, seq_length=row.seq)
    best = ptdp.solve(problem, options=bridge_options(row)).candidates[0]
    tokens = row.gbs * row.seq / float(best["iteration_s"]) / row.gpus
    label = "FP8-CS" if row.precision == "fp8-cs" else "FP8 (delayed scaling)"
    shape = f"t{row.tp} p{row.pp} c{row.cp} v{row.vp}" + (f" e{row.ep}" if row.ep > 1 else "")
    return {"row": f"{row.model}, {row.gpus} DGX-{row.system.upper()} ({row.container}; {shape}"
                   f"{' FSDP' if row.fsdp else ''} b{row.mbs} GBS {row.gbs} s{row.seq}), {label} tokens/s/GPU",
            "source": row.source, "system": row.system, "published": row.tokens, "predicted": tokens,
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

    cluster = fidelity_heldout.with_mpt_attention(fp8_cluster("h100", 8, fraction, precision))
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


TORCHTITAN_H200 = [(32, 10938.0), (64, 10753.0)]
"""(GPUs, tokens/s/GPU): Llama 3.1 8B with torch.compile and Float8 (tensorwise, FSDP Float8
all-gather), b = 2, s = 8,192, the 8B config's selective (op) checkpointing, on 4 and 8 nodes of 8 H200
(700 W) with 400 Gb/s per GPU ([torchtitan] ``benchmarks/llama3_8b_h200_2025-06_torchtitan.md``, June 2025)."""


def torchtitan_h200_rows(fraction: float | None = None) -> list[dict[str, object]]:
    """torchtitan's H200 Float8 rows through bench/fidelity.py's FSDP path (fused kernels, SDPA's
    FlashAttention-2, current scaling) on the ``h200`` preset: held out; no BF16 row was published
    with them, so no speedup is compared."""
    import fidelity
    from cost_models.compute import with_attention_kernel

    out = []
    for gpus, published in TORCHTITAN_H200:
        cluster = fp8_cluster("h200", gpus, fraction)
        assert cluster.device is not None
        sdpa = cluster.model_copy(update={"device": with_attention_kernel(cluster.device, "fa2")})
        got = fidelity._torchtitan_rate("llama3-8b", sdpa, 2, "selective", 8192, kernels="fused")
        out.append({"row": f"torchtitan llama3-8b + compile + Float8, {gpus} h200, tokens/s/GPU",
                    "source": "torchtitan-h200", "published": published, "predicted": got,
                    "error": got / published - 1})
    return out


def fp8_rows(fraction: float | None = None) -> list[dict[str, object]]:
    return ([bridge_row(r, fraction) for r in BRIDGE_ROWS] + mpt_fp8_rows(fraction) + torchtitan_fp8_rows(fraction)
            + torchtitan_h200_rows(fraction))


def moe_rows() -> list[dict[str, object]]:
    """The held-out Megatron-Bridge MoE FP8 rows."""
    return [bridge_row(r) for r in MOE_ROWS]


DEEPSEEK_H800 = {"gpus": 2048, "gbs": 15360, "seq": 4096, "pp": 16, "ep": 64,
                 "gpu_hours_per_trillion_tokens": 180_000.0}
"""DeepSeek-V3's pre-training [deepseek-v3]: 2,048 H800 (Sec. 3.1), 16-way pipeline (DualPipe), 64-way
expert parallelism over 8 nodes, ZeRO-1 data parallelism, no tensor parallelism (Sec. 3.2), FP8 mixed
precision (Sec. 3.3), 4,096-token sequences and a batch of 15,360 sequences after its ramp
(Sec. 4.2), 180K H800 GPU hours per trillion tokens (Sec. 1): 1,543 tokens/s/GPU."""


def deepseek_h800_row() -> dict[str, object]:
    """DeepSeek-V3 on 2,048 H800 forced through ptdp as the paper ran it: t 1, p 16, e 64, b 1, DualPipe
    as its V variant DualPipeV (Sec. 3.2.1; the 61 layers in ptdp's V layouts), the expert all-to-all
    node-deduplicated (``deepep``: node-limited routing, each token to at most 4 nodes, Sec. 2.1.2) and
    overlapped with computation as DualPipe overlaps it, the paper's recompute set pinned: RMSNorm and
    the MLA up-projections (Sec. 3.2.3; ``layernorm+mla_up_proj``), FP8 linear inputs kept at 1 B
    (``cost_models.fp8.saving_parts``), its multi-token-prediction module with the head on rank 0 (the
    preset's ``mtp_layers``). Not modelled: DualPipe's second model copy (DualPipeV keeps one), DeepSeek's
    tile-wise FP8 scaling and its own activation formats (costed as Transformer Engine's current scaling)."""
    row = DEEPSEEK_H800
    published = 1e12 / (row["gpu_hours_per_trillion_tokens"] * 3600.0)
    problem = api.make_problem("deepseek-v3", fp8_cluster("h800", int(row["gpus"])), global_batch_size=int(row["gbs"]),
                               seq_length=int(row["seq"]))
    options = {**forced_options("deepseek-v3", tp=1, pp=int(row["pp"]), vp=1, mbs=1, ep=int(row["ep"]), zero_stage=1,
                                overlap_a2a=True), "moe_dispatcher": "deepep", "schedules": "dualpipe-v",
               "recompute": "layernorm+mla_up_proj"}
    options.pop("virtual_pipeline")
    best = ptdp.solve(problem, options=options).candidates[0]
    tokens = row["gbs"] * row["seq"] / float(best["iteration_s"]) / row["gpus"]
    return {"row": "deepseek-v3, 2,048 H800 (t1 p16 e64 DualPipeV, GBS 15,360, s 4,096; FP8), tokens/s/GPU",
            "source": "deepseek-v3", "system": "h800", "published": published, "predicted": tokens,
            "error": tokens / published - 1, "recompute": str(best["recompute"]),
            "peak_memory_gib": float(best["peak_memory_gib"])}


def offload_rows() -> list[dict[str, object]]:
    """``OFFLOAD_ROWS`` with ``offload`` searched next to the module sets and full recompute (the row's
    ``recompute`` says what was taken); ``no_offload_error``: the same row without offloading."""
    out = []
    for row in OFFLOAD_ROWS:
        cluster = fp8_cluster(row.system, row.gpus, None, row.precision)
        problem = api.make_problem(row.model, cluster, global_batch_size=row.gbs, seq_length=row.seq)
        result = bridge_row(row)  # the forced configuration without offloading
        best = ptdp.solve(problem, options={**bridge_options(row), "recompute": "none,modules,full,offload"}).candidates[0]
        tokens = row.gbs * row.seq / float(best["iteration_s"]) / row.gpus
        out.append({**result, "predicted": tokens, "error": tokens / row.tokens - 1, "recompute": str(best["recompute"]),
                    "peak_memory_gib": float(best["peak_memory_gib"]), "no_offload_error": result["error"]})
    return out


def blackwell_and_nemo_rows() -> list[dict[str, object]]:
    """The held-out Megatron-Bridge Blackwell rows and the NeMo performance-summary rows."""
    return [bridge_row(r) for r in BLACKWELL_ROWS + NEMO_ROWS]


def _grouped(rows: list[dict[str, object]], key: Callable[[dict[str, object]], Any]) -> dict[Any, tuple[float, float, float, int]]:
    """(mean signed error, mean |error|, max |error|, rows) of the rows grouped by ``key``."""
    groups: dict[Any, list[float]] = {}
    for r in rows:
        groups.setdefault(key(r), []).append(float(r["error"]))
    return {k: (sum(e) / len(e), sum(map(abs, e)) / len(e), max(map(abs, e)), len(e)) for k, e in groups.items()}


def system_summary(rows: list[dict[str, object]]) -> dict[tuple[str, str], tuple[float, float, float, int]]:
    """(mean signed error, mean |error|, max |error|, rows) by (source, system)."""
    return _grouped(rows, lambda r: (str(r["source"]), str(r["system"])))


def summary(rows: list[dict[str, object]]) -> dict[str, tuple[float, float, float, int]]:
    """(mean signed error, mean |error|, max |error|, rows) by source."""
    return _grouped(rows, lambda r: str(r["source"]))


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
    rows, held = fp8_rows(), blackwell_and_nemo_rows() + moe_rows() + offload_rows() + [deepseek_h800_row()]
    print(f"assumed where the tables are silent: {ASSUMED}")
    for source, (mean, mean_abs, worst, n) in summary(rows).items():
        print(f"{source}: {n} rows, mean error {100 * mean:+.1f}%, mean |error| {100 * mean_abs:.1f}%, "
              f"max {100 * worst:.1f}%")
    for (source, system), (mean, mean_abs, worst, n) in system_summary(held).items():
        print(f"{source} {system}: {n} rows, mean error {100 * mean:+.1f}%, mean |error| {100 * mean_abs:.1f}%, "
              f"max {100 * worst:.1f}%")
    for r in rows + held:
        extra = f"; recompute {r['recompute']}, peak {float(r['peak_memory_gib']):.1f} GiB" if "recompute" in r else ""
        if "error_high" in r:
            extra = f"; {100 * float(r['error_high']):+.1f}% at the SXM end"
        if "no_offload_error" in r:
            extra += f"; without offloading {100 * float(r['no_offload_error']):+.1f}%"
        if "speedup_error" in r:
            published_speedup, error = float(r["published"]) / float(r["bf16_published"]), float(r["speedup_error"])
            extra += (f"; FP8/BF16 speedup published {published_speedup:.3f}, predicted "
                      f"{(1 + error) * published_speedup:.3f} ({100 * error:+.1f}%)")
        print(f"{r['row']}: published {float(r['published']):.0f}, predicted {float(r['predicted']):.0f} "
              f"({100 * float(r['error']):+.1f}%){extra}")


if __name__ == "__main__":
    main()
