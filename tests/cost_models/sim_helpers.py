"""Builders of small synthetic plans for the simulator tests."""

from __future__ import annotations

from collections.abc import Sequence

from planner.schema import V_SCHEDULES, Chunk, Cluster, Degrees, Device, LayerProfile, ModelProfile, Plan, Stage


def cluster(
    *,
    memory_bytes: float = 1e12,
    num_nodes: int = 1,
    devices_per_node: int = 64,
    intra_bytes_per_s: float = 1e30,
    inter_bytes_per_s: float = 1e30,
    intra_latency_s: float = 0.0,
    inter_latency_s: float = 0.0,
) -> Cluster:
    return Cluster(
        name="test",
        device=Device(name="gpu", memory_headroom_bytes=0, memory_bytes=memory_bytes, peak_flops=1e12),
        num_nodes=num_nodes,
        devices_per_node=devices_per_node,
        intra_node_bytes_per_s=intra_bytes_per_s,
        inter_node_bytes_per_s=inter_bytes_per_s,
        intra_node_latency_s=intra_latency_s,
        inter_node_latency_s=inter_latency_s,
    )


def plan(
    layers: Sequence[LayerProfile],
    *,
    num_stages: int,
    num_chunks: int = 1,
    num_microbatches: int,
    schedule: str = "1f1b",
    data_parallel: int = 1,
    the_cluster: Cluster | None = None,
    recompute: dict[int, str] | None = None,
    ranks: Sequence[Sequence[int]] | None = None,
    actions: Sequence[Sequence[str]] | None = None,
) -> Plan:
    """One layer run per virtual stage when len(layers) == p v, else an even split."""
    p, v = num_stages, num_chunks
    per = len(layers) // (p * v)
    assert per * p * v == len(layers)
    recompute = recompute or {}
    stages = []
    for x in range(p):
        chunks = []
        for c in range(v):
            k = (x if c == 0 else 2 * p - 1 - x) if schedule in V_SCHEDULES else c * p + x
            first = k * per
            spec: dict[str, tuple[int, ...]] = {}
            for i in range(first, first + per):
                if i in recompute:
                    spec.setdefault(recompute[i], ())
                    spec[recompute[i]] += (i,)
            chunks.append(Chunk(layers=(first, first + per), recompute=spec))
        stage_ranks = tuple(ranks[x]) if ranks is not None else ()
        stages.append(Stage(index=x, replicas=data_parallel, ranks=stage_ranks, chunks=tuple(chunks)))
    return Plan(
        solver="test",
        model=ModelProfile(name="toy", layers=tuple(layers)),
        cluster=the_cluster or cluster(),
        degrees=Degrees(data=data_parallel, pipeline=p, virtual=v),
        schedule=schedule,  # type: ignore[arg-type]
        microbatch_size=1,
        num_microbatches=num_microbatches,
        global_batch_size=num_microbatches * data_parallel,
        stages=tuple(stages),
        actions=None if actions is None else tuple(tuple(r) for r in actions),
    )


def uniform_layers(num: int, forward_s: float, backward_s: float, **kwargs: object) -> list[LayerProfile]:
    return [
        LayerProfile(name=f"l{i}", forward_s=forward_s, backward_s=backward_s, **kwargs)  # type: ignore[arg-type]
        for i in range(num)
    ]
