"""Closed form of the V schedules (ZB-V, DualPipeV) in the ``ptdp`` search.

A V configuration has two chunks per rank; rank r holds virtual stages r and 2p - 1 - r, so rank 0
holds the embedding (in chunk 0) and the output head (in chunk 1). The 2p chunks hold l / (2p)
decoder blocks each, or, where 2p does not divide l, one of ``_ptdp_dims.v_layouts`` (per-rank
totals as even as they go with rank 0 among the lighter, or rank 0 at two floor-sized chunks;
DeepSeek-V3's 61 layers on 16 DualPipe ranks: 2, 3 and 14 x 4). ``solvers._ptdp_model`` sums each
chunk's times and bytes from its dense and MoE blocks and hands them here. With W, F and B with
recompute per chunk:

- the larger of m x the slowest rank's work (its chunks' F + B, rank 0 also the embedding and the
  head) and m x the ranks' pace plus the bubble (the mean rank's work, raised toward the slowest by
  the share of ranks at the slowest pace: the other ranks' slack absorbs the bubble), plus the
  point-to-point transfers of 2 v boundaries per microbatch, as for interleaved 1F1B; with fewer
  microbatches than the warm-up (m < 2p - 1) at least the ramp of one wave through the 2p chunks and
  back (``pipeline_s``);
- bubble (p - 1) max(F, B - W) for ZB-V (the simulated makespan for I = B - W >= F; Qi et al.,
  *Zero Bubble Pipeline Parallelism*, arXiv:2401.10241, Sec. 6) and (p - 1)(F&B + B - 3W) for
  DualPipeV (DeepSeek-V3 Technical Report, Sec. 3.2.1, Table 2, with PP = 2p stages), F&B the
  overlapped block of ``cost_models.sim.overlap.fused_block_s``, all at the heaviest chunk's times
  (the fill and drain run at the slowest chunk's pace);
- memory of the fullest rank: its static bytes (blocks; rank 0 also the embedding and the head)
  plus its activation sets in flight counted on the schedule's own order
  (``cost_models.vschedules.peak_inflight`` on rank 0, ``inflight_total`` on the others: 2p chunks
  for ZB-V once m >= 2p - 1, the 1F1B peak, and 2p + 1 for DualPipeV), each set at the rank's larger
  chunk, plus the embedding's or the head's share on rank 0 when the set is of that chunk.

The search simulates the best configurations anyway; this only ranks them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from cost_models.sim.overlap import fused_block_s
from cost_models.vschedules import inflight_total, peak_inflight

ChunkTimes = tuple[float, float, float, float, float]
"""(F, B with recompute, W, forward communication, backward communication) of one chunk."""


def pipeline_s(schedule: str, p: int, m: int, work: Sequence[float], heaviest: ChunkTimes, send_s: float,
               ends_s: float = 0.0) -> float:
    """Compute, bubble and point-to-point time of one iteration (module docstring); ``work``: each rank's
    compute per microbatch, ``heaviest``: the times of the chunk with the most F + B, ``ends_s``: the
    embedding's and the head's forward and backward (rank 0's, inside ``work[0]``)."""
    f, b, w, fx, bx = heaviest
    if schedule == "zb-v":
        bubble = (p - 1) * max(f, b - w)
    else:
        bubble = (p - 1) * (fused_block_s(f, b, fx, bx) + b - 3 * w)
    # The slowest ranks pay the fill and drain; the others' slack absorbs it up to the slowest one's pace:
    # with one slowest rank (rank 0 with the embedding and the head, even chunks) nearly all of it, with
    # many (unequal chunks: the ranks holding one layer more) only their share of the ranks.
    slowest = max(work)
    mean = math.fsum(work) / p
    heavy = sum(1 for x in work if x >= slowest * (1 - 1e-9)) / p
    paced = mean + (slowest - mean) * heavy
    steady = max(m * slowest, m * paced + bubble) + 4 * m * send_s + 2 * (p - 1) * send_s
    if m >= 2 * p - 1:
        return steady
    # Fewer microbatches than the warm-up (m < 2p - 1): nothing fills the ramp. The forward wave runs
    # through the 2p chunks, the turning rank (p - 1) taking both of its chunks for every microbatch
    # (2p - 2 + 2m chunk forwards end to end), the input-gradient wave back the same way, the last
    # weight gradient after it; the embedding, the head and the 2(2p - 1) boundary transfers lie on
    # that path.
    ramp = (2 * p - 2 + 2 * m) * (f + b - w) + w + ends_s + 2 * (2 * p - 1) * send_s
    return max(steady, ramp)


def activation_bytes(schedule: str, p: int, m: int, rank: int, chunk_bytes: Sequence[float],
                     ends_bytes: tuple[float, float] | None = None) -> float:
    """A rank's peak activation bytes: its sets in flight (module docstring) at its larger chunk
    (``chunk_bytes``: its chunk 0 and chunk 1), plus the embedding's and the head's (``ends_bytes``,
    rank 0) per set of their chunk."""
    if ends_bytes is None:
        return inflight_total(schedule, p, m, rank) * max(chunk_bytes)
    total, first, last = peak_inflight(schedule, p, m, rank)
    return total * max(chunk_bytes) + first * ends_bytes[0] + last * ends_bytes[1]


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
