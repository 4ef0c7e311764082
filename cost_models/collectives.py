"""Collective and point-to-point communication times, as NCCL runs them. Pure functions.

Alpha-beta costs (Thakur, Rabenseifner and Gropp, IJHPCA 2005; Patarasuk and Yuan, JPDC 2009):
each of n ranks of a ring sends (n-1)/n of the buffer per phase in n-1 steps.

- all-gather / reduce-scatter of S bytes (the full buffer): (n-1)/n S / B + (n-1) alpha;
- all-reduce (ring) = reduce-scatter + all-gather: 2 (n-1)/n S / B + 2 (n-1) alpha;
- all-reduce (tree, double binary tree in NCCL >= 2.4): 2 S / B + 2 log2(n) alpha; it wins for
  small messages on many ranks (``allreduce_s`` takes the faster);
- hierarchical all-reduce over nodes of g ranks: reduce-scatter inside the node, all-reduce of
  S/g across nodes on each of the g rails, all-gather inside the node;
- p2p send of S bytes: S / B + alpha.

B is the bandwidth each rank gets for the collective: ``link x fraction`` with the device's
``collective_bandwidth_fraction`` (NCCL reaches 75-85 % of the link as bus bandwidth). Across
nodes one NIC per rank pair is the slowest hop: the ``num_rails`` ranks of a node that belong to
one ring each drive their own NIC (one 200 Gb/s HCA per GPU on DGX A100).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from planner.schema import Cluster


def _fraction(cluster: Cluster) -> float:
    from cost_models.compute import compute_constants, has_constants  # lazy: keeps this module light

    device = cluster.device
    return compute_constants(device).collective_bandwidth_fraction if device and has_constants(device) else 1.0


def ring_allgather_s(num_bytes: float, num_ranks: int, bytes_per_s: float, latency_s: float = 0.0) -> float:
    """All-gather (or reduce-scatter) of a ``num_bytes`` buffer over a ring of ``num_ranks``."""
    if num_ranks <= 1 or num_bytes <= 0:
        return 0.0
    return (num_ranks - 1) / num_ranks * num_bytes / bytes_per_s + (num_ranks - 1) * latency_s


ring_reduce_scatter_s = ring_allgather_s


def ring_allreduce_s(num_bytes: float, num_ranks: int, bytes_per_s: float, latency_s: float = 0.0) -> float:
    """Ring all-reduce: reduce-scatter then all-gather."""
    return 2 * ring_allgather_s(num_bytes, num_ranks, bytes_per_s, latency_s)


def tree_allreduce_s(num_bytes: float, num_ranks: int, bytes_per_s: float, latency_s: float = 0.0) -> float:
    """Double-binary-tree all-reduce: full bandwidth term, logarithmic latency."""
    if num_ranks <= 1 or num_bytes <= 0:
        return 0.0
    return 2 * num_bytes / bytes_per_s + 2 * math.ceil(math.log2(num_ranks)) * latency_s


def allreduce_s(num_bytes: float, num_ranks: int, bytes_per_s: float, latency_s: float = 0.0) -> float:
    """The faster of ring and tree (NCCL picks by message size and rank count)."""
    return min(ring_allreduce_s(num_bytes, num_ranks, bytes_per_s, latency_s),
               tree_allreduce_s(num_bytes, num_ranks, bytes_per_s, latency_s))


def hierarchical_allreduce_s(num_bytes: float, ranks_per_node: int, num_nodes: int, intra_bytes_per_s: float,
                             inter_bytes_per_s: float, intra_latency_s: float = 0.0,
                             inter_latency_s: float = 0.0) -> float:
    """Reduce-scatter in the node, all-reduce of 1/g across nodes (g rails in parallel), all-gather."""
    g = ranks_per_node
    inside = 2 * ring_allgather_s(num_bytes, g, intra_bytes_per_s, intra_latency_s)
    return inside + allreduce_s(num_bytes / g, num_nodes, inter_bytes_per_s, inter_latency_s)


def p2p_s(num_bytes: float, bytes_per_s: float, latency_s: float = 0.0) -> float:
    """One point-to-point transfer."""
    return num_bytes / bytes_per_s + latency_s if num_bytes > 0 else 0.0


def group_link(cluster: Cluster, num_ranks: int, stride: int = 1) -> tuple[float, float, int, int]:
    """(intra bytes/s, inter bytes/s, ranks per node, nodes) of a group of ``num_ranks`` ranks
    ``stride`` apart, with the collective fraction applied. Across nodes each node's members of
    the group drive one NIC each (rails), so the inter-node share per member is the per-device
    inter-node bandwidth."""
    fraction = _fraction(cluster)
    intra = float(cluster.intra_node_bytes_per_s or 0.0) * fraction
    inter = float(cluster.inter_node_bytes_per_s or 0.0) * fraction
    per_node = max(1, min(num_ranks, cluster.devices_per_node // max(1, stride)))
    return intra, inter, per_node, math.ceil(num_ranks / per_node)


def group_allreduce_s(cluster: Cluster, num_bytes: float, num_ranks: int, stride: int = 1) -> float:
    """All-reduce among ``num_ranks`` ranks ``stride`` apart in Megatron's rank order: inside a
    node over NVLink, otherwise hierarchical (NCCL's ring crosses each node once per rail)."""
    if num_ranks <= 1:
        return 0.0
    intra, inter, per_node, nodes = group_link(cluster, num_ranks, stride)
    if nodes == 1:
        return allreduce_s(num_bytes, num_ranks, intra, cluster.intra_node_latency_s)
    return hierarchical_allreduce_s(num_bytes, per_node, nodes, intra, inter, cluster.intra_node_latency_s,
                                    cluster.inter_node_latency_s)


def ranks_allreduce_s(cluster: Cluster, num_bytes: float, ranks: Sequence[int]) -> float:
    """All-reduce among the given global ranks (one per member): ``group_allreduce_s`` with the
    members per node and the nodes counted from the ranks themselves (the first rank's node sets
    the members per node), so any placement works. This is the data-parallel gradient all-reduce
    of the simulator and of the ptdp closed form (docs/cost-model.md, section 10)."""
    n = len(ranks)
    if n <= 1 or num_bytes <= 0:
        return 0.0
    nodes = [cluster.node_of(r) for r in ranks]
    fraction = _fraction(cluster)
    intra = float(cluster.intra_node_bytes_per_s or 0.0) * fraction
    inter = float(cluster.inter_node_bytes_per_s or 0.0) * fraction
    num_nodes = len(set(nodes))
    if num_nodes == 1:
        return allreduce_s(num_bytes, n, intra or inter, cluster.intra_node_latency_s)
    return hierarchical_allreduce_s(num_bytes, nodes.count(nodes[0]), num_nodes, intra or inter, inter or intra,
                                    cluster.intra_node_latency_s, cluster.inter_node_latency_s)


def group_allgather_s(cluster: Cluster, num_bytes: float, num_ranks: int, stride: int = 1) -> float:
    """All-gather (= reduce-scatter) of a ``num_bytes`` buffer among ``num_ranks`` ranks ``stride``
    apart (``nodes_allgather_s`` on the group's links)."""
    if num_ranks <= 1:
        return 0.0
    intra, inter, per_node, nodes = group_link(cluster, num_ranks, stride)
    return nodes_allgather_s(num_bytes, num_ranks, per_node, nodes, intra, inter, cluster.intra_node_latency_s,
                             cluster.inter_node_latency_s)


def nodes_allgather_s(num_bytes: float, num_ranks: int, ranks_per_node: int, num_nodes: int,
                      intra_bytes_per_s: float, inter_bytes_per_s: float, intra_latency_s: float,
                      inter_latency_s: float) -> float:
    """All-gather (= reduce-scatter) of ``num_bytes`` among ``num_ranks`` ranks on ``num_nodes``
    nodes of ``ranks_per_node``. Inside one node, a ring. Across nodes NCCL runs one flat ring over
    all the ranks (it has no hierarchical all-gather): its bytes move as the two-level split (each
    rail carries its node's share across the nodes), but its latency is that of n - 1 ring steps,
    nodes - 1 of them crossing a node boundary and n - nodes inside a node ([nccl-tuning]). At large
    n that latency grows linearly with the ranks: 127 steps at 128 GPUs, which a two-level count
    (per_node - 1 + nodes - 1 = 22) misses."""
    if num_ranks <= 1 or num_bytes <= 0:
        return 0.0
    if num_nodes <= 1:
        return ring_allgather_s(num_bytes, num_ranks, intra_bytes_per_s, intra_latency_s)
    moved = (ring_allgather_s(num_bytes / num_nodes, ranks_per_node, intra_bytes_per_s)
             + ring_allgather_s(num_bytes / ranks_per_node, num_nodes, inter_bytes_per_s))
    return moved + (num_ranks - num_nodes) * intra_latency_s + (num_nodes - 1) * inter_latency_s


DP_NUM_BUCKETS = 4
"""Gradient buckets of an overlapped data-parallel reduction, in the closed forms and the simulator
(``cost_models.sim.sync``) alike."""


def exposed_dp_allreduce_s(allreduce_total_s: float, overlappable_backward_s: float, *,
                           num_buckets: int = DP_NUM_BUCKETS,
                           overlap: bool = True) -> float:
    """Data-parallel gradient reduction left on the critical path.

    Without overlap the whole all-reduce runs after the last backward. With bucketed overlap
    (PyTorch DDP, Megatron's ``--overlap-grad-reduce``) bucket k is reduced while the backward of
    the layers before it runs: only the last bucket (1/num_buckets of the time) plus whatever
    does not fit under the overlappable backward is exposed."""
    if not overlap or allreduce_total_s <= 0:
        return allreduce_total_s
    last = allreduce_total_s / num_buckets
    hidden = allreduce_total_s - last
    return last + max(0.0, hidden - overlappable_backward_s)


def alltoall_s(num_bytes: float, num_ranks: int, ranks_per_node: int, intra_bytes_per_s: float,
               inter_bytes_per_s: float, intra_latency_s: float = 0.0, inter_latency_s: float = 0.0) -> float:
    """All-to-all of a ``num_bytes`` buffer per rank spread evenly over ``num_ranks`` ranks, of which
    ``ranks_per_node`` share a node: each rank keeps 1/n, sends (g-1)/n over the intra-node link and
    (n-g)/n over its own NIC, both at once (NCCL's grouped sends), so the slower part sets the time."""
    n, g = num_ranks, max(1, min(ranks_per_node, num_ranks))
    if n <= 1 or num_bytes <= 0:
        return 0.0
    inside = (g - 1) / n * num_bytes / intra_bytes_per_s + intra_latency_s if g > 1 else 0.0
    across = (n - g) / n * num_bytes / inter_bytes_per_s + inter_latency_s if n > g else 0.0
    return max(inside, across)


def deepspeed_bf16_sync_s(allreduce_16bit_s: float, zero_stage: int) -> float:
    """Data-parallel synchronisation of DeepSpeed's BF16 optimizer under its pipeline engine
    ([deepspeed-bf16] ``runtime/pipe/engine.py`` ``_exec_reduce_grads``, ``runtime/bf16_optimizer.py``),
    given the time of a 16-bit all-reduce of the same gradients: the fp32 gradients are all-reduced
    after the last microbatch (``buffered_allreduce_fallback`` on ``get_grads_for_reduction``: twice
    the bytes, nothing overlapped) and, at ZeRO-1 (the optimizer's own partitioning), the updated
    16-bit weights are all-gathered over the same ranks (half an all-reduce)."""
    return 2.0 * allreduce_16bit_s + (allreduce_16bit_s / 2 if zero_stage >= 1 else 0.0)
