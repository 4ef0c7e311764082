"""DualPipe's overlapped forward-and-backward blocks on the engine.

DeepSeek-V3's DualPipe (DeepSeek-AI, *DeepSeek-V3 Technical Report*, 2024, Sec. 3.2.1) runs the
forward chunk of one microbatch together with the backward chunk of another: each chunk is cut
into attention, all-to-all dispatch, MLP and all-to-all combine (the backward also into input
and weight parts), and the pieces are interleaved so that one chunk's communication runs
while the other computes (the SMs are split between the two). Compute does not overlap
compute, so a block of forward F (compute F_c, communication F_x) and backward B (B_c, B_x,
recompute included in B_c) takes

    T_F&B = max(F_c + B_c, F_x + B_x)

instead of F + B: the communication is hidden as long as the other chunk computes for longer
(``fused_block_s``). Without a communication split in the profile (``LayerProfile.
forward_comm_s`` / ``backward_comm_s`` unset) the block costs F + B.

In the simulation the pair is one block on the rank's compute stream: it starts when the rank
is free and both the forward's activation and the backward's gradient have arrived, and both
outputs leave when it ends. On the engine the F operation carries the block's time and also
waits for the backward's incoming gradient; the B operation that follows takes no time. The
trace then splits the block's interval between F and B in proportion to their stand-alone times.
"""

from __future__ import annotations

from collections.abc import Sequence

from cost_models.sim.pipeline import PipelineGraph, Trace

__all__ = ["fuse_blocks", "fused_block_s", "split_fused_trace"]


def fused_block_s(forward_s: float, backward_s: float, forward_comm_s: float, backward_comm_s: float) -> float:
    """T_F&B = max(F_c + B_c, F_x + B_x) with F_c = F - F_x and B_c = B - B_x (module docstring)."""
    compute = (forward_s - forward_comm_s) + (backward_s - backward_comm_s)
    return max(compute, forward_comm_s + backward_comm_s)


def fuse_blocks(
    built: PipelineGraph,
    overlapped: Sequence[Sequence[int]],
    *,
    forward_comm_s: Sequence[float] | None,
    backward_comm_s: Sequence[float] | None,
) -> None:
    """Turn each marked (F, B) pair of ``built`` into one overlapped block (module docstring).

    Args:
        built: a pipeline graph from ``pipeline.build`` (not yet run).
        overlapped: per rank, positions j whose actions j (F) and j + 1 (B) form a block.
        forward_comm_s, backward_comm_s: per virtual stage, the hideable communication (None: 0).
    """
    graph, d = built.graph, built.durations
    graph.num_deps = list(graph.num_deps)  # the topology may be shared with other runs
    graph.transfer_child = list(graph.transfer_child)
    incoming: dict[int, int] = {}
    for t, child in enumerate(graph.transfer_child):
        incoming.setdefault(child, t)
    for r, positions in enumerate(overlapped):
        base = built.rank_base[r]
        for j in positions:
            f_op, b_op = base + j, base + j + 1
            (f_code, f_stage, _), (b_code, b_stage, _) = built.ops[r][j], built.ops[r][j + 1]
            assert (f_code, b_code) == (0, 1), "an overlapped block is an F followed by a B"
            graph.duration_s[f_op] = fused_block_s(
                d.forward_s[f_stage], d.backward_s[b_stage],
                forward_comm_s[f_stage] if forward_comm_s else 0.0,
                backward_comm_s[b_stage] if backward_comm_s else 0.0)
            graph.duration_s[b_op] = 0.0
            t = incoming.get(b_op)
            if t is not None:  # the block also waits for the backward's gradient
                graph.transfer_child[t] = f_op
                graph.num_deps[f_op] += 1
                graph.num_deps[b_op] -= 1


def split_fused_trace(trace: Trace, built: PipelineGraph, overlapped: Sequence[Sequence[int]]) -> None:
    """Show each block as F then B, sharing the block's interval in proportion to F and B alone."""
    d = built.durations
    for r, positions in enumerate(overlapped):
        starts, ends = trace.starts[r], trace.ends[r]
        for j in positions:
            _, f_stage, _ = built.ops[r][j]
            _, b_stage, _ = built.ops[r][j + 1]
            f_s, b_s = d.forward_s[f_stage], d.backward_s[b_stage]
            start, end = starts[j], ends[j]
            cut = start + (end - start) * (f_s / (f_s + b_s) if f_s + b_s > 0 else 0.5)
            ends[j], starts[j + 1], ends[j + 1] = cut, cut, end
