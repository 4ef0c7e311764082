"""Held-out fidelity rows: published measured runs on models, frameworks and devices the cost
model's constants were never fitted or checked on while they were set (the A100 constants come
from PTD-P Tables 4.1/4.2; bench/fidelity.py). Each is predicted with the published configuration
forced through the ``ptdp`` solver (or, for torchtitan, the same FSDP2 path as bench/fidelity.py).
Sources (docs/references.md; table and notes: docs/cost-model.md, "Held-out runs"):

- BLOOM-176B [bloom]: 384 A100 80 GB (48 nodes of 8 on NVLink, 4 x 100 Gb/s Omni-Path per node),
  one model copy on 48 GPUs (t = 4, p = 12, so d = 8), b = 2, global batch 2,048 sequences of 2,048,
  bf16, ZeRO stage 1, full activation checkpointing, Megatron-DeepSpeed's fused kernels (unfused
  attention); "about 150 TFLOPs" per GPU in Megatron-DeepSpeed's accounting (recompute counted);
- Llama 3 405B [llama3] Table 4: 8,192 and 16,384 H100 SXM (700 W, 80 GB HBM3), t = 8, p = 16
  (126 layers: one fewer in the first and in the last stage), d = 64 and 128, s = 8,192, 16M tokens
  per batch (batch/DP 32 and 16), interleaved schedule; 430 and 400 TFLOP/s per GPU, BF16 MFU 43 %
  and 41 %;
- torchtitan [torchtitan] docs/performance.md Tables 1 and 3, the ``FSDP + torch.compile`` rows:
  Llama 3.1 8B on 8 and 128 Grand Teton H100 (the eager rows' hardware and configuration), 6,667 and
  6,514 tokens/s/GPU: compiled, the elementwise chains run as fused kernels;
- MPT [llm-foundry] ``scripts/train/benchmarking/README.md``: 1B-70B models on A100 80 GB and on
  H100 80 GB in BF16 with FSDP, microbatch, gradient accumulation and checkpointing per row.

Megatron-Bridge's BF16 rows on H100, B200 and GB200 are held out in bench/fidelity_bridge.py.

Run from the repository root: ``PYTHONPATH=. .venv/bin/python bench/fidelity_heldout.py``; with
``--mpt-table``, every BF16 row of llm-foundry's three MPT tables (``bench/data/llm_foundry_mpt.csv``).
"""

from __future__ import annotations

from pathlib import Path

from planner import api
from planner.schema import Cluster, TransformerConfig
from solvers import ptdp

BLOOM_176B = TransformerConfig(name="bloom-176b", hidden_size=14336, num_layers=70, num_heads=112, seq_length=2048,
                               vocab_size=250880, dtype="bf16", position_embedding="alibi")
"""[bloom] Sec. 3: 70 layers, h = 14,336, 112 heads, s = 2,048, vocabulary 250,680
padded to 250,880 for t = 4; GeLU MLP, LayerNorm, tied embeddings, ALiBi (no parameters)."""
BLOOM_TFLOPS = 150.0
LLAMA3_ROWS = [  # (GPUs, d, published TFLOP/s per GPU, published BF16 MFU)
    (8192, 64, 430.0, 0.43),
    (16384, 128, 400.0, 0.41),
]


def jean_zay(num_devices: int) -> Cluster:
    """BLOOM's Jean Zay A100 partition: 8 A100 80 GB per node on NVLink (the a100-80gb node), 4 x
    100 Gb/s Omni-Path per node = 6.25 GB/s per GPU per direction ([bloom] Sec. 3)."""
    return api.load_cluster(f"a100-80gb:{num_devices}").model_copy(update={"inter_node_bytes_per_s": 6.25e9})


def bloom_row() -> dict[str, object]:
    """BLOOM-176B as trained: the solver with t, p, d, b, recompute, ZeRO-1 and the 5-6-...-6-5
    layer split of Megatron-DeepSpeed's ``type:transformer`` partition (70 layers on 12 stages)."""
    problem = api.make_problem(BLOOM_176B, jean_zay(384), global_batch_size=2048, num_stages=12, data_parallel=8)
    plan = ptdp.solve(problem, options={"tensor_parallel": 4, "microbatch_size": 2, "recompute": "full",
                                        "attention": "unfused", "sequence_parallel": False, "zero_stage": 1,
                                        "schedules": "1f1b", "first_stage_layers": 5, "last_stage_layers": 5,
                                        "optimizer": "deepspeed-bf16", "num_simulated": 1})
    best = plan.candidates[0]
    got = float(best["hardware_tflops_per_gpu"])
    return {"row": "BLOOM-176B, 384 A100 (t=4, p=12, d=8, b=2, full recompute), TFLOP/s/GPU",
            "published": BLOOM_TFLOPS, "predicted": got, "error": got / BLOOM_TFLOPS - 1,
            "peak_memory_gib": float(best["peak_memory_gib"])}


def unbounded_h100(num_devices: int) -> Cluster:
    """H100 SXM nodes with the memory limit lifted: the paper trains without activation
    checkpointing thanks to its own interleaved schedule (a tunable number of microbatches in
    flight) and early deallocation of stage inputs and outputs ([llama3] Sec. 3.3.2), which
    Megatron's schedule, the one we cost, does not do (its peak is reported next to the row).
    Attention runs at FlashAttention-2's H100 rate (35 % of peak, [fa3] Sec. 1): the pre-training
    ran in the first half of 2024, before FlashAttention-3 was published (July 2024, with the
    Llama 3 paper); the preset's default is FA3 (75 %)."""
    from cost_models.compute import compute_constants

    cluster = api.load_cluster(f"h100:{num_devices}")
    assert cluster.device is not None
    compute = compute_constants(cluster.device).model_copy(update={"attention_kernel": "fa2"})
    return cluster.model_copy(update={"device": cluster.device.model_copy(update={"memory_bytes": 2 ** 40,
                                                                                 "compute": compute})})


def llama3_rows(virtual: int | None = None) -> list[dict[str, object]]:
    """Llama 3 405B pre-training (Table 4, CP = 1 rows): t = 8, p = 16 with 7-layer end stages,
    b = 1, no activation checkpointing ([llama3] Sec. 3.3.2), ZeRO-1-like sharding,
    interleaved 1F1B with the chunk count searched, tensor-parallel and data-parallel
    communication overlapped. MFU compared with the published BF16 MFU. ``virtual``: fix the
    interleave depth (not published; default: the planner's fastest)."""
    out = []
    for gpus, d, _tflops, mfu in LLAMA3_ROWS:
        problem = api.make_problem("llama3-405b", unbounded_h100(gpus), global_batch_size=2048, num_stages=16,
                                   data_parallel=d)
        plan = ptdp.solve(problem, options={"tensor_parallel": 8, "microbatch_size": 1, "recompute": "none",
                                            "schedules": "interleaved-1f1b", "context_parallel": 1, "zero_stage": 1,
                                            "overlap_tp_comm": True, "overlap_grad_reduce": True, "num_simulated": 1,
                                            "virtual_pipeline": virtual})
        best = plan.candidates[0]
        got = float(best["mfu"])
        out.append({"row": f"Llama 3 405B, {gpus} H100 (t=8, p=16, d={d}, v={best['v']}, end stages "
                           f"{best['first_stage_layers']}), BF16 MFU",
                    "published": mfu, "predicted": got, "error": got / mfu - 1,
                    "peak_memory_gib": float(best["peak_memory_gib"])})
    return out


TORCHTITAN_COMPILED = [(8, 6667.0, 5762.0), (128, 6514.0, 5605.0)]
"""(GPUs, FSDP + torch.compile, FSDP eager) tokens/s/GPU, Llama 3.1 8B, b = 2, selective AC."""


def torchtitan_compiled_rows() -> list[dict[str, object]]:
    """The compiled torchtitan rows at the NVL end of the Grand Teton peak (as bench/fidelity.py's
    eager rows), with fused elementwise kernels; ``ratio``: eager over compiled throughput,
    predicted (both at the same peak, so its uncertainty cancels) against measured."""
    import fidelity

    out = []
    for gpus, compiled, eager_published in TORCHTITAN_COMPILED:
        device = fidelity.grand_teton_h100(fidelity.GRAND_TETON_PEAKS[0])
        cluster = fidelity._with_device(f"h100:{gpus}", device)
        fused = fidelity._torchtitan_rate("llama3-8b", cluster, 2, "selective", 8192, kernels="fused")
        eager = fidelity._torchtitan_rate("llama3-8b", cluster, 2, "selective", 8192, kernels="eager")
        out.append({"row": f"torchtitan llama3-8b + torch.compile, {gpus} grand-teton-h100, tokens/s/GPU",
                    "published": compiled, "predicted": fused, "error": fused / compiled - 1,
                    "ratio_published": eager_published / compiled, "ratio_predicted": eager / fused})
    return out


MPT_SHAPES = {"125m": (768, 12, 12), "350m": (1024, 16, 24), "760m": (1536, 12, 24), "1b": (2048, 16, 24),
              "3b": (2560, 20, 32), "7b": (4096, 32, 32), "13b": (5120, 40, 40),
              "30b": (7168, 56, 48), "70b": (8192, 64, 80)}
"""(d_model, n_heads, n_layers) of llm-foundry's MPT configs ([llm-foundry] ``scripts/train/yamls``):
expansion ratio 4, vocabulary 50,368, biases, LayerNorm, GeLU, learned positions, tied embeddings
(these reproduce the benchmark tables' NumParams exactly, e.g. 6,658,859,008 for 7b at s = 2048)."""
MPT_ROWS = [  # (device, size, GPUs, s, b, grad accum, activation checkpointing, reduce bytes, tokens/s/GPU)
    ("a100-80gb", "1b", 8, 2048, 14, 4, False, 4, 20513.0),
    ("a100-80gb", "3b", 8, 2048, 10, 2, False, 4, 10811.0),
    ("a100-80gb", "7b", 8, 2048, 6, 2, False, 4, 4641.0),
    ("a100-80gb", "13b", 8, 2048, 2, 3, False, 4, 2262.0),
    ("a100-80gb", "30b", 8, 2048, 3, 21, True, 4, 916.0),
    ("a100-80gb", "70b", 64, 2048, 8, 4, True, 2, 410.0),
    ("a100-80gb", "7b", 8, 8192, 8, 2, True, 4, 3206.0),
    ("a100-80gb", "7b", 8, 32768, 2, 2, True, 4, 1672.0),
    ("h100", "1b", 8, 2048, 14, 1, False, 4, 45455.0),
    ("h100", "7b", 8, 2048, 6, 1, False, 4, 10643.0),
    ("h100", "13b", 8, 2048, 2, 1, False, 4, 4792.0),
    ("h100", "30b", 8, 2048, 3, 21, True, 4, 2002.0),
    ("h100", "70b", 64, 2048, 8, 4, True, 4, 1039.0),
    ("h100", "7b", 8, 8192, 8, 2, True, 4, 6935.0),
]
"""llm-foundry's MPT benchmark tables ([llm-foundry] ``scripts/train/benchmarking/README.md``: "H100
80GB BF16" and "A100 80GB with 1600 Gbps node-node interconnect (RoCE)"): FSDP FULL_SHARD, amp_bf16
(fp32 reduction; the 70B A100 row runs PURE bf16, bf16 reduction), flash attention."""


def mpt_config(size: str, seq: int) -> TransformerConfig:
    h, heads, layers = MPT_SHAPES[size]
    return TransformerConfig(name=f"mpt-{size}", hidden_size=h, num_layers=layers, num_heads=heads, seq_length=seq,
                             vocab_size=50368, ffn_hidden_size=4 * h, dtype="bf16")


def with_mpt_attention(cluster: Cluster, kernel: str = "fa1") -> Cluster:
    """The cluster running llm-foundry's benchmark attention kernel: the Triton FlashAttention
    (``attn_impl: triton``, the default of its benchmark submission script), a FlashAttention-1-class
    kernel (``fa1``; ``kernel`` another family, for comparison)."""
    from cost_models.compute import with_attention_kernel

    assert cluster.device is not None
    return cluster.model_copy(update={"device": with_attention_kernel(cluster.device, kernel)})


def mpt_cluster(device: str, gpus: int, h100_gemm_fraction: float | None = None, kernel: str = "fa1") -> Cluster:
    """``gpus`` of llm-foundry's ``device`` with its benchmarks' attention kernel (``with_mpt_attention``).
    ``h100_gemm_fraction``: the H100 GEMM fraction instead of the preset's (the ratio check and the
    fit of docs/cost-model.md)."""
    from cost_models.compute import compute_constants

    cluster = with_mpt_attention(api.load_cluster(f"{device}:{gpus}"), kernel)
    if device != "h100" or h100_gemm_fraction is None:
        return cluster
    assert cluster.device is not None
    compute = compute_constants(cluster.device).model_copy(update={"gemm_max_fraction": h100_gemm_fraction})
    return cluster.model_copy(update={"device": cluster.device.model_copy(update={"compute": compute})})


def mpt_rate(cluster: Cluster, size: str, seq: int, b: int, ga: int, ckpt: bool, reduce_bytes: int,
             sharding: str = "FULL_SHARD") -> float:
    """Predicted tokens/s/GPU of an llm-foundry MPT run through bench/fidelity.py's FSDP path: fused
    kernels (LayerNorm and GeLU are single PyTorch kernels), full block checkpointing where the table
    says so (non-reentrant, as its benchmark script sets: the recompute stops before the FFN output
    projection), one set of FSDP gathers and reduce-scatters per microbatch, ``ga`` microbatches per
    step, gradients reduced in ``reduce_bytes`` bytes (4: FSDP's DEFAULT mixed precision, 2: PURE);
    ``sharding`` ``SHARD_GRAD_OP`` keeps the forward's gathered weights for the backward."""
    import fidelity

    return fidelity._torchtitan_rate(mpt_config(size, seq), cluster, b, "full" if ckpt else "none", seq,
                                     kernels="fused", grad_accum=ga, reduce_bytes=reduce_bytes,
                                     regather=sharding == "FULL_SHARD")


def mpt_rows(h100_gemm_fraction: float | None = None) -> list[dict[str, object]]:
    """The hand-picked MPT rows on A100 80 GB and H100 SXM (700 W) (``mpt_rate`` on ``mpt_cluster``).
    ``h100_gemm_fraction``: the H100 rows with that ``gemm_max_fraction`` instead of the preset's
    (the ratio check of the docs)."""
    out = []
    for device, size, gpus, seq, b, ga, ckpt, reduce_bytes, published in MPT_ROWS:
        got = mpt_rate(mpt_cluster(device, gpus, h100_gemm_fraction), size, seq, b, ga, ckpt, reduce_bytes)
        out.append({"row": f"MPT-{size}, {gpus} {device}, s={seq}, b={b}, GA={ga}{', AC' if ckpt else ''}, "
                           f"tokens/s/GPU", "published": published, "predicted": got, "error": got / published - 1,
                    "key": (size, seq, device)})
    return out


MPT_TABLE = Path(__file__).resolve().parent / "data" / "llm_foundry_mpt.csv"
"""Every BF16 row of llm-foundry's four MPT tables (H100 80 GB at 128-512 GPUs and at 8-64, A100
80 GB, A100 40 GB): 209 runs of 125M-70B models at s = 512-65,536 on 8-512 GPUs."""


def mpt_table_rows(kernel: str = "fa1") -> list[dict[str, object]]:
    """Predicted vs published tokens/s/GPU for every row of ``MPT_TABLE`` (as ``mpt_rows``; PURE rows
    reduce gradients in bf16, DEFAULT rows in fp32); ``kernel``: the attention family costed."""
    import csv

    with MPT_TABLE.open() as f:
        table = list(csv.DictReader(line for line in f if not line.startswith("#")))
    out = []
    for r in table:
        device, size, seq, gpus = r["device"], r["model"], int(r["seq"]), int(r["gpus"])
        b, ga, ckpt = int(r["microbatch"]), int(r["grad_accum"]), r["checkpointing"] == "1"
        got = mpt_rate(mpt_cluster(device, gpus, kernel=kernel), size, seq, b, ga, ckpt,
                       2 if r["mp_mode"] == "PURE" else 4, r["sharding"])
        published = float(r["tokens_per_s_per_gpu"])
        out.append({"device": device, "row": f"MPT-{size}, {gpus} {device}, s={seq}, b={b}, GA={ga}"
                                             f"{', AC' if ckpt else ''}, tokens/s/GPU",
                    "published": published, "predicted": got, "error": got / published - 1, "checkpointing": ckpt})
    return out


def table_summary(rows: list[dict[str, object]]) -> dict[str, dict[str, float]]:
    """Per device: rows, mean, median and max |error|, mean signed error, and the share of rows
    within 5 % and within 10 %."""
    import statistics

    out = {}
    for device in dict.fromkeys(str(r["device"]) for r in rows):
        errors = [float(r["error"]) for r in rows if r["device"] == device]
        size = [abs(e) for e in errors]
        out[device] = {"rows": len(errors), "mean": statistics.mean(size), "median": statistics.median(size),
                       "max": max(size), "bias": statistics.mean(errors),
                       "within_5": sum(e <= 0.05 for e in size) / len(size),
                       "within_10": sum(e <= 0.10 for e in size) / len(size)}
    return out


def mpt_ratio_errors(rows: list[dict[str, object]]) -> list[float]:
    """Predicted over measured H100/A100 throughput ratio of every MPT configuration run on both."""
    by_key = {r["key"]: r for r in rows}
    out = []
    for (size, seq, device), r in by_key.items():
        a100 = by_key.get((size, seq, "a100-80gb"))
        if device == "h100" and a100 is not None:
            predicted = float(r["predicted"]) / float(a100["predicted"])
            out.append(predicted / (float(r["published"]) / float(a100["published"])))
    return out


def heldout_rows() -> list[dict[str, object]]:
    return [bloom_row(), *llama3_rows(), *torchtitan_compiled_rows(), *mpt_rows()]


def device_summary(rows: list[dict[str, object]]) -> dict[str, tuple[float, float, int]]:
    """(mean |error|, max |error|, rows) of the held-out throughput rows by device (A100, H100)."""
    out = {}
    for device in ("a100", "h100"):
        errors = [abs(float(r["error"])) for r in rows if device in str(r["row"]).lower()]
        out[device] = (sum(errors) / len(errors), max(errors), len(errors))
    return out


def main() -> None:
    import sys

    if "--mpt-table" in sys.argv:
        table = mpt_table_rows()
        for device, m in table_summary(table).items():
            print(f"llm-foundry {device}: {m['rows']:.0f} rows, mean |error| {100 * m['mean']:.1f}%, median "
                  f"{100 * m['median']:.1f}%, max {100 * m['max']:.1f}%, mean error {100 * m['bias']:+.1f}%, within 5% "
                  f"{100 * m['within_5']:.0f}% of rows, within 10% {100 * m['within_10']:.0f}%")
        for r in table:
            print(f"{r['row']}: published {float(r['published']):.0f}, predicted {float(r['predicted']):.0f} "
                  f"({100 * float(r['error']):+.1f}%)")
        return
    rows = heldout_rows()
    for device, (mean, worst, n) in device_summary(rows).items():
        print(f"held-out {device.upper()} rows: {n}, mean |error| {100 * mean:.1f}%, max {100 * worst:.1f}%")
    for r in rows:
        extra = ""
        if "ratio_predicted" in r:
            extra = f", eager/compiled {r['ratio_predicted']:.3f} vs {r['ratio_published']:.3f}"
        elif "peak_memory_gib" in r:
            extra = f", peak {float(r['peak_memory_gib']):.1f} GiB"
        print(f"held-out {r['row']}: published {float(r['published']):.3g}, predicted "
              f"{float(r['predicted']):.3g} ({100 * float(r['error']):+.1f}%){extra}")


if __name__ == "__main__":
    main()
