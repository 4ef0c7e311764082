"""Node-deduplicated expert dispatch (DeepEP; Megatron's flex dispatcher): the expected distinct nodes
a token reaches, against brute force over every routing choice, and the bytes each link carries."""

from __future__ import annotations

import itertools
from statistics import mean

import pytest

from cost_models.parallelism import (
    deduplicated_alltoall_bytes_per_rank,
    expected_nodes_per_token,
    expert_alltoall_bytes_per_rank,
)


@pytest.mark.parametrize(("experts", "k", "nodes"), [(8, 2, 4), (8, 3, 2), (12, 4, 3), (16, 8, 8), (6, 6, 3)])
def test_expected_nodes_against_every_routing_choice(experts: int, k: int, nodes: int) -> None:
    """Every k-subset of E experts equally likely (uniform routing), experts [j E/N, (j+1) E/N) on node j."""
    per = experts // nodes
    brute = mean(len({x // per for x in choice}) for choice in itertools.combinations(range(experts), k))
    assert expected_nodes_per_token(num_experts=experts, experts_per_token=k, nodes=nodes) == pytest.approx(brute)


def test_group_limited_routing_caps_the_nodes() -> None:
    """DeepSeek-V3's 256 experts in 8 groups, 4 groups per token, over 8 nodes (a group per node): at
    most 4 nodes; brute force over the group choices for 8 groups on 4 nodes (2 groups each), 3 chosen."""
    assert expected_nodes_per_token(num_experts=256, experts_per_token=8, nodes=8, router_groups=8,
                                    router_group_topk=4) == pytest.approx(4.0)
    brute = mean(len({g // 2 for g in choice}) for choice in itertools.combinations(range(8), 3))
    got = expected_nodes_per_token(num_experts=64, experts_per_token=8, nodes=4, router_groups=8, router_group_topk=3)
    assert got == pytest.approx(brute)
    assert expected_nodes_per_token(num_experts=64, experts_per_token=8, nodes=1) == 1.0


def test_bytes_per_link() -> None:
    """One node: the NVLink bytes are the plain all-to-all's; 8 nodes of 8: the network carries each
    token to D (N - 1) / N remote nodes, the rest of its k copies cross NVLink."""
    kw = {"tokens_per_rank": 2048, "hidden_size": 7168, "experts_per_token": 8, "element_bytes": 2}
    plain = expert_alltoall_bytes_per_rank(expert_parallel=8, **kw)
    assert deduplicated_alltoall_bytes_per_rank(expert_parallel=8, ranks_per_node=8, nodes_per_token=1.0,
                                                **kw) == (pytest.approx(plain), 0.0)
    nvlink, network = deduplicated_alltoall_bytes_per_rank(expert_parallel=64, ranks_per_node=8, nodes_per_token=4.0,
                                                           **kw)
    row = 2048 * 7168 * 2
    assert network == pytest.approx(row * 4.0 * 7 / 8) and nvlink == pytest.approx(row * 8 * 7 / 8)
    assert network < expert_alltoall_bytes_per_rank(expert_parallel=64, **kw) * 56 / 63
