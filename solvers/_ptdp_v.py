"""Closed form of the V schedules (ZB-V, DualPipeV) in the ``ptdp`` search.

A V configuration has two chunks per rank of l / (2p) decoder blocks each; rank r holds virtual
stages r and 2p - 1 - r, so rank 0 holds the embedding (in chunk 0) and the output head (in
chunk 1). With per-chunk times F, B (recompute included) and W:

- the larger of m x the slowest rank's work (rank 0: two chunks plus embedding and head) and m x
  the mean rank's work plus the bubble (the other ranks' slack absorbs the bubble up to rank
  0's excess), plus the point-to-point transfers of 2 v boundaries per microbatch, as for
  interleaved 1F1B;
- bubble (p - 1) max(F, B - W) for ZB-V (the simulated makespan for I = B - W >= F; Qi et al.,
  *Zero Bubble Pipeline Parallelism*, arXiv:2401.10241, Sec. 6) and (p - 1)(F&B + B - 3W) for
  DualPipeV (DeepSeek-V3 Technical Report, Sec. 3.2.1, Table 2, with PP = 2p stages), F&B the
  overlapped block of ``cost_models.sim.overlap.fused_block_s``;
- memory of rank 0: its static bytes (blocks, embedding and head) plus the activation sets in
  flight counted on the schedule's own order (``cost_models.vschedules.peak_inflight``: 2p
  chunks for ZB-V, the 1F1B peak, and 2p + 1 for DualPipeV), each with the embedding's or
  the head's share when the set is of that chunk.

The search simulates the best configurations anyway; this only ranks them.
"""

from __future__ import annotations

from typing import Any

from cost_models.sim.overlap import fused_block_s
from cost_models.vschedules import peak_inflight
from planner.schema import TransformerConfig


def chunk_times_s(u: Any, cfg: TransformerConfig, c: Any) -> tuple[float, float, float, float, float]:
    """(F, B with recompute, W, forward comm, backward comm) of one chunk of decoder blocks."""
    dec = u.decoder
    n = cfg.num_layers // (2 * c.pipeline)
    extra = dec.strategies()[c.recompute].extra_s
    return (n * dec.forward_s, n * (dec.backward_s + extra), n * (dec.backward_weight_s or 0.0),
            n * (dec.forward_comm_s or 0.0), n * (dec.backward_comm_s or 0.0))


def pipeline_s(u: Any, cfg: TransformerConfig, c: Any, send_s: float) -> float:
    """Compute, bubble and point-to-point time of one iteration (module docstring)."""
    p, m = c.pipeline, c.num_microbatches
    f, b, w, fx, bx = chunk_times_s(u, cfg, c)
    ends = u.embedding.forward_s + u.embedding.backward_s + u.head.forward_s + u.head.backward_s
    rank0, mean = 2 * (f + b) + ends, 2 * (f + b) + ends / p
    if c.schedule == "zb-v":
        bubble = (p - 1) * max(f, b - w)
    else:
        bubble = (p - 1) * (fused_block_s(f, b, fx, bx) + b - 3 * w)
    # Rank 0 (embedding and head) is the slowest; the other ranks' slack absorbs the bubble up to it.
    return max(m * rank0, m * mean + bubble) + 4 * m * send_s + 2 * (p - 1) * send_s


def rank0_static_bytes(u: Any, cfg: TransformerConfig, c: Any) -> float:
    return cfg.num_layers // c.pipeline * u.decoder.static_bytes + u.embedding.static_bytes + u.head.static_bytes


def peak_memory_bytes(u: Any, cfg: TransformerConfig, c: Any) -> float:
    """Rank 0's static bytes plus its activation sets in flight (module docstring)."""
    total, first, last = peak_inflight(c.schedule, c.pipeline, c.num_microbatches)
    blocks = cfg.num_layers // (2 * c.pipeline)
    chunk_act = blocks * u.decoder.strategies()[c.recompute].activation_bytes
    return (rank0_static_bytes(u, cfg, c) + total * chunk_act + first * (u.embedding.activation_bytes or 0.0)
            + last * (u.head.activation_bytes or 0.0))


def megatron_notes(schedule: str, rows: list[dict[str, Any]]) -> tuple[str, ...]:
    """When the search picked a V schedule: say where it runs and the best Megatron-LM candidate."""
    if schedule not in ("zb-v", "dualpipe-v"):
        return ()
    note = (f"schedule {schedule} runs on torch.distributed.pipelining and torchtitan (V placement); Megatron-LM "
            "cannot run it: plan with --option schedules=1f1b,interleaved-1f1b for a Megatron export")
    megatron = next((r for r in rows if r.get("schedule") in ("1f1b", "interleaved-1f1b") and r.get("fits")), None)
    if megatron is not None:
        note += (f" (best Megatron candidate in the table: {megatron['schedule']} t={megatron.get('t')} "
                 f"p={megatron.get('p')} v={megatron.get('v')}, {megatron['iteration_s']:.4g} s"
                 f"{' simulated' if megatron.get('simulated') else ' closed form'})")
    return (note,)
