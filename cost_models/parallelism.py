"""Costs of the parallel dimensions beyond t x p x d: sharded data parallelism (ZeRO-1/2/3, FSDP),
context parallelism (ring attention), expert parallelism (all-to-all, expert TP) and uneven end
stages. Pure functions, one formula each; docs/cost-model.md ("Parallel dimensions") cites them.

Sources (docs/references.md):

- ZeRO (Rajbhandari et al., SC'20) Sec. 3.1 (mixed-precision Adam: 2 + 2 + K bytes per parameter,
  K = 12), Sec. 5.1-5.3 and Fig. 1 (per-rank model states of P_os, P_os+g, P_os+g+p), Sec. 7.2
  (communication: P_os and P_os+g move 2 Psi like data parallelism, P_os+g+p 3 Psi).
- PyTorch FSDP (Zhao et al., VLDB 2023) Sec. 3.3-3.4: per-unit all-gather before forward and
  backward, reduce-scatter after backward, with one unit of prefetch overlapping compute.
- Ring attention (Liu et al., ICLR 2024) Sec. 3 and Megatron-LM context parallelism: each rank
  keeps s/c of the sequence and passes its K/V blocks around a ring of c ranks, overlapping every
  transfer with the attention of the block it holds; activations scale by 1/c.
- GShard (Lepikhin et al., ICLR 2021) Sec. 2.2-3 and Switch Transformer (Fedus et al., JMLR 2022)
  Sec. 2.2: top-k dispatch/combine all-to-all of the routed tokens, expert capacity factor;
  DeepSpeed-MoE (Rajbhandari et al., ICML 2022) Sec. 4-5 and Megatron-Core MoE: expert and expert
  tensor parallelism.
- Uneven end stages: Llama 3 (Llama Team, arXiv:2407.21783) Sec. 3.3.2 removes one layer from the
  first and the last of 16 stages for the embedding and the output head; Megatron-LM expresses it
  as ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``.

Bytes assume the ring collectives of ``cost_models.transformer.allreduce_time_s``: a reduce-scatter
or all-gather of B bytes over n ranks moves (n - 1)/n x B per rank; an all-reduce twice that.
"""

from __future__ import annotations

import math

from cost_models import moe
from planner.errors import InvalidProblemError
from planner.schema import TransformerConfig

ADAM_OPTIMIZER_BYTES_PER_PARAM = 12
"""ZeRO Sec. 3.1, K = 12: fp32 master weights, Adam momentum and variance."""


# ------------------------------------------------------------------------------------------
# Sharded data parallelism (ZeRO-1/2/3, FSDP)
# ------------------------------------------------------------------------------------------


def zero_state_bytes_per_rank(
    num_params: float,
    *,
    data_parallel: int,
    zero_stage: int,
    weight_bytes: int = 2,
    grad_bytes: int = 2,
    optimizer_bytes: int = ADAM_OPTIMIZER_BYTES_PER_PARAM,
) -> float:
    """Model-state bytes on one rank (ZeRO Sec. 5, Fig. 1): stage 0 keeps (2 + 2 + K) Psi;
    1 shards the optimizer states (2 + 2) Psi + K Psi / N; 2 also the gradients 2 Psi + (2 + K) Psi / N;
    3 also the parameters (2 + 2 + K) Psi / N.

    Raises:
        InvalidProblemError: a stage outside 0..3 or a data-parallel degree below 1.
    """
    _check_stage(zero_stage, data_parallel)
    n = data_parallel
    sharded = {
        0: 0,
        1: optimizer_bytes,
        2: optimizer_bytes + grad_bytes,
        3: optimizer_bytes + grad_bytes + weight_bytes,
    }[zero_stage]
    replicated = weight_bytes + grad_bytes + optimizer_bytes - sharded
    return num_params * (replicated + sharded / n)


def zero_comm_bytes_per_rank(num_params: float, *, data_parallel: int, zero_stage: int, weight_bytes: int = 2) -> float:
    """Bytes one rank sends per step for gradient synchronization (ZeRO Sec. 7.2): stages 0-2 move
    2 Psi (N-1)/N (an all-reduce, or a reduce-scatter of gradients plus an all-gather of updated
    parameters); stage 3 moves 3 Psi (N-1)/N (parameters all-gathered in forward and in backward,
    gradients reduce-scattered)."""
    _check_stage(zero_stage, data_parallel)
    n = data_parallel
    rounds = 3 if zero_stage == 3 else 2
    return rounds * weight_bytes * num_params * (n - 1) / n


def fsdp_exposed_comm_s(allgather_s: list[float], compute_s: list[float], *, sm_share: float = 0.0) -> float:
    """Communication time FSDP leaves on the critical path of one pass over the units (FSDP Sec. 3.4,
    forward or backward prefetch of one unit): the first unit's all-gather waits, then unit i's
    all-gather overlaps unit i-1's compute: t_ag[0] + sum_i max(0, t_ag[i] - t_compute[i-1]).

    ``sm_share`` s: share of the SMs a running collective holds (``compute.collective_sm_share``).
    The compute under it runs on the other SMs at 1 - s of its speed, so unit i-1's compute c,
    started with unit i's all-gather ag, ends at c + s min(ag, c / (1 - s)) and unit i starts at the
    later of that and ag: each pair adds max(ag - c, s min(ag, c / (1 - s))) (docs/cost-model.md,
    "SM contention"; at s = 0 the formula above).

    Raises:
        InvalidProblemError: lists of different lengths, or ``sm_share`` outside [0, 1).
    """
    if len(allgather_s) != len(compute_s):
        raise InvalidProblemError(f"{len(allgather_s)} all-gather times for {len(compute_s)} units; give one per unit")
    if not 0.0 <= sm_share < 1.0:
        raise InvalidProblemError(f"sm_share={sm_share} must be in [0, 1): the share of SMs a collective holds")
    if not allgather_s:
        return 0.0
    pairs = zip(allgather_s[1:], compute_s[:-1])
    return allgather_s[0] + sum(overlapped_exposed_s(ag, c, sm_share=sm_share) for ag, c in pairs)


def overlapped_exposed_s(comm_s: float, cover_s: float, *, sm_share: float = 0.0) -> float:
    """What a collective of ``comm_s`` started with ``cover_s`` of compute adds to that compute when
    the collective holds ``sm_share`` of the SMs (the compute runs on the rest at 1 - s of its speed):
    max(comm - cover, s min(comm, cover / (1 - s))); at s = 0 the part of the collective the compute
    does not hide (docs/cost-model.md, "SM contention")."""
    return max(comm_s - cover_s, sm_share * min(comm_s, cover_s / (1.0 - sm_share)))


def _check_stage(zero_stage: int, data_parallel: int) -> None:
    if zero_stage not in (0, 1, 2, 3):
        raise InvalidProblemError(f"zero_stage={zero_stage} must be 0, 1, 2 or 3")
    if data_parallel < 1:
        raise InvalidProblemError(f"data_parallel={data_parallel} must be at least 1")


def model_state_bytes_per_rank(
    cfg: TransformerConfig,
    *,
    tensor: int = 1,
    pipeline: int = 1,
    data: int = 1,
    context: int = 1,
    expert: int = 1,
    expert_tensor: int | None = None,
    zero_stage: int = 0,
) -> dict[str, float]:
    """Weights, gradients and Adam states on one rank, dense and expert parts apart (Megatron-Core's
    layout): dense parameters split over t x p and sharded (ZeRO) over the d x c data-parallel ranks;
    expert parameters split over p x e x expert-TP and sharded over the expert data-parallel ranks,
    world / (expert-TP x e x p). Layers are taken as spread evenly over the p stages.

    Raises:
        InvalidProblemError: degrees the model or the world cannot take.
    """
    etp = tensor if expert_tensor is None else expert_tensor
    world = tensor * pipeline * data * context
    experts = _expert_params_total(cfg)
    if experts and (cfg.num_experts or 0) % expert:
        raise InvalidProblemError(f"num_experts={cfg.num_experts} is not divisible by expert={expert}; use a divisor")
    if world % (etp * expert * pipeline):
        raise InvalidProblemError(
            f"world size t x p x d x c = {world} is not divisible by expert_tensor x expert x pipeline = "
            f"{etp * expert * pipeline}; expert-parallel groups are carved out of the t d c / etp ranks of a stage"
        )
    dense = moe.num_parameters(cfg) - experts
    dense_bytes = zero_state_bytes_per_rank(
        dense / (tensor * pipeline), data_parallel=data * context, zero_stage=zero_stage
    )
    expert_bytes = zero_state_bytes_per_rank(
        experts / (pipeline * expert * etp), data_parallel=world // (etp * expert * pipeline), zero_stage=zero_stage
    )
    return {"dense_bytes": dense_bytes, "expert_bytes": expert_bytes, "total_bytes": dense_bytes + expert_bytes}


def _expert_params_total(cfg: TransformerConfig) -> int:
    """Routed-expert weights of the whole model, multi-token-prediction blocks included (router and
    shared experts count as dense)."""
    if not cfg.is_moe:
        return 0
    num_moe_layers = sum(1 for i in range(cfg.num_layers) if moe.is_moe_layer(cfg, i))
    num_moe_layers += cfg.mtp_layers if moe.is_moe_layer(cfg, cfg.num_layers - 1) else 0
    return num_moe_layers * int(cfg.num_experts or 0) * moe.expert_params(cfg)


# ------------------------------------------------------------------------------------------
# Context parallelism (ring attention)
# ------------------------------------------------------------------------------------------


def ring_attention_kv_bytes_per_rank(
    *,
    microbatch_size: int,
    seq_length: int,
    kv_width: int,
    context_parallel: int,
    element_bytes: int = 2,
) -> tuple[float, float]:
    """(forward, backward) bytes one rank sends per attention layer and microbatch: c - 1 ring steps
    each pass on one K and one V block of s/c tokens x ``kv_width`` (the mean of the K and V widths
    of ``moe.attention_kv_widths``: n_kv d; MLA: the expanded heads); the backward passes K/V again
    and returns their gradients, twice the forward.

    Raises:
        InvalidProblemError: a sequence the context degree does not split into 2c balanced chunks.
    """
    c = context_parallel
    check_context_split(seq_length, c)
    forward = (c - 1) * 2 * microbatch_size * (seq_length // c) * kv_width * element_bytes
    return float(forward), 2.0 * forward


def ring_attention_exposed_s(*, block_compute_s: float, block_transfer_s: float, context_parallel: int) -> float:
    """Time the ring adds to one attention pass: each of the c - 1 transfers overlaps the attention of
    the block already held, so only max(0, transfer - compute) per step shows (Ring Attention Sec. 3)."""
    return (context_parallel - 1) * max(0.0, block_transfer_s - block_compute_s)


def context_parallel_activation_bytes(activation_bytes_full_sequence: float, *, context_parallel: int) -> float:
    """Activations of one layer on one rank: every saved tensor is per token, so s/c tokens keep 1/c."""
    return activation_bytes_full_sequence / context_parallel


def check_context_split(seq_length: int, context_parallel: int) -> None:
    """Megatron's load-balanced causal CP gives each rank chunks i and 2c-1-i of 2c equal chunks.

    Raises:
        InvalidProblemError: seq_length not divisible by 2c (names the field and the fix).
    """
    c = context_parallel
    if c < 1:
        raise InvalidProblemError(f"context_parallel={c} must be at least 1")
    if c > 1 and seq_length % (2 * c):
        raise InvalidProblemError(
            f"seq_length={seq_length} is not divisible by 2 x context_parallel = {2 * c}; pad the sequence to a "
            f"multiple of {2 * c} or use a context degree c with seq_length divisible by 2c"
        )


# ------------------------------------------------------------------------------------------
# Expert parallelism
# ------------------------------------------------------------------------------------------


def expert_alltoall_bytes_per_rank(
    *,
    tokens_per_rank: int,
    hidden_size: int,
    experts_per_token: int,
    expert_parallel: int,
    element_bytes: int = 2,
) -> float:
    """Bytes one rank sends in one dispatch all-to-all of an MoE layer (GShard Sec. 3): each token goes
    to k experts, a fraction (e-1)/e of them on other ranks under uniform routing. Combine sends the
    same back; the backward repeats both, so a layer moves 4 x this per microbatch."""
    e = expert_parallel
    return tokens_per_rank * experts_per_token * hidden_size * element_bytes * (e - 1) / e


def expected_nodes_per_token(*, num_experts: int, experts_per_token: int, nodes: int,
                             router_groups: int | None = None, router_group_topk: int | None = None) -> float:
    """Distinct nodes one token's k experts sit on, on average, with the E experts spread evenly over
    the nodes of the expert-parallel group (E / N each) and uniform routing: N (1 - C(E - E/N, k) / C(E, k)).
    Group-limited routing (DeepSeek-V3: the k experts come from ``router_group_topk`` of
    ``router_groups`` contiguous groups, Sec. 2.1.2 of its report) caps it at the nodes those groups
    cover, N (1 - C(G - G/N, g) / C(G, g)) when the groups split evenly over the nodes."""
    if nodes <= 1:
        return 1.0
    per = num_experts // nodes
    k = min(experts_per_token, num_experts)
    untouched = math.comb(num_experts - per, k) / math.comb(num_experts, k) if num_experts - per >= k else 0.0
    out = nodes * (1 - untouched)
    groups, g = router_groups, router_group_topk
    if groups and g and groups % nodes == 0 and g <= groups:
        per_group = groups // nodes
        none = math.comb(groups - per_group, g) / math.comb(groups, g) if groups - per_group >= g else 0.0
        out = min(out, nodes * (1 - none))
    return out


def deduplicated_alltoall_bytes_per_rank(
    *,
    tokens_per_rank: int,
    hidden_size: int,
    experts_per_token: int,
    expert_parallel: int,
    ranks_per_node: int,
    nodes_per_token: float,
    element_bytes: int = 2,
) -> tuple[float, float]:
    """(NVLink bytes, network bytes) one rank sends in one dispatch of a node-deduplicating dispatcher
    (DeepEP's normal kernels, Megatron's flex dispatcher with its deepep/hybridep backends): a token
    crosses the network once per distinct remote node holding one of its experts, to the GPU of the
    same local index there, which forwards it over NVLink to the GPUs holding its experts; copies for
    the sender's own node go over NVLink directly. Per rank: network tokens x D (N - 1) / N x h,
    NVLink tokens x k x (G - 1) / G x h with G ranks per node (e when the group fits one node:
    (e - 1) / e, the plain all-to-all's share). Combine sends the same back."""
    e, g = expert_parallel, max(1, min(ranks_per_node, expert_parallel))
    nodes = max(1, e // g)
    row = tokens_per_rank * hidden_size * element_bytes
    nvlink = row * experts_per_token * (g - 1) / g
    network = row * nodes_per_token * (nodes - 1) / nodes if nodes > 1 else 0.0
    return nvlink, network


def expert_load_time_factor(*, load_balance_factor: float, capacity_factor: float | None = None) -> float:
    """Slowdown of the expert computation from routing imbalance: the busiest expert's tokens over the
    mean (>= 1). With a capacity factor C (Switch Sec. 2.2) the busiest expert processes at most C x
    the mean (the rest are dropped), and padded capacity costs C x the mean even when balanced.

    Raises:
        InvalidProblemError: a load-balance factor below 1 or a capacity factor not above 0.
    """
    if load_balance_factor < 1:
        raise InvalidProblemError(f"load_balance_factor={load_balance_factor} must be at least 1 (max over mean load)")
    if capacity_factor is None:
        return load_balance_factor
    if capacity_factor <= 0:
        raise InvalidProblemError(f"capacity_factor={capacity_factor} must be positive")
    return capacity_factor


def expert_params_per_rank(
    *,
    num_experts: int,
    params_per_expert: float,
    expert_parallel: int,
    expert_tensor_parallel: int = 1,
) -> float:
    """Expert weights one rank holds in an MoE layer: E/e experts, each split over the expert-TP ranks.

    Raises:
        InvalidProblemError: an expert count the expert-parallel degree does not divide.
    """
    if num_experts % expert_parallel:
        raise InvalidProblemError(
            f"num_experts={num_experts} is not divisible by expert_parallel={expert_parallel}; use a divisor "
            f"of {num_experts}"
        )
    return num_experts // expert_parallel * params_per_expert / expert_tensor_parallel


def expert_tensor_parallel_bytes_per_rank(
    *,
    routed_tokens_per_rank: int,
    hidden_size: int,
    expert_tensor_parallel: int,
    element_bytes: int = 2,
) -> float:
    """Per MoE layer and direction, the expert-TP collectives of a row/column-split FFN (Megatron TP
    applied to each expert): one all-reduce of the routed tokens' h-wide output among the etp ranks,
    2 (etp-1)/etp x tokens x h elements per rank."""
    n = expert_tensor_parallel
    return 2 * routed_tokens_per_rank * hidden_size * element_bytes * (n - 1) / n


# ------------------------------------------------------------------------------------------
# Uneven end stages
# ------------------------------------------------------------------------------------------


def end_stage_layers(num_layers: int, num_stages: int, *, first: int, last: int) -> list[int]:
    """Decoder layers per stage when the first and last stages hold ``first`` and ``last`` and the
    middle stages split the rest evenly (Megatron's --decoder-first/last-pipeline-num-layers).

    Raises:
        InvalidProblemError: counts that do not leave an even split for the middle stages.
    """
    if num_stages == 1:
        if first + last and first != num_layers:
            raise InvalidProblemError(f"one stage holds all {num_layers} layers; first={first} does not fit")
        return [num_layers]
    middle_total = num_layers - first - last
    middle = num_stages - 2
    if middle_total < 0 or (middle and middle_total % middle) or (not middle and middle_total):
        raise InvalidProblemError(
            f"first={first} and last={last} leave {middle_total} layers for {middle} middle stages; Megatron needs "
            f"num_layers - first - last divisible by num_stages - 2"
        )
    per = middle_total // middle if middle else 0
    return [first, *([per] * middle), last]


def balanced_end_stage_layers(
    num_layers: int,
    num_stages: int,
    *,
    embedding_layers: float,
    head_layers: float,
) -> list[int]:
    """The first/last counts minimising the busiest stage when the embedding costs
    ``embedding_layers`` decoder layers and the output head ``head_layers`` (ties: most even split,
    then the fewest first-stage layers). Llama 3 405B (126 layers, 16 stages, about one layer each)
    gives 7, 8 x 14, 7 (Sec. 3.3.2).

    Over the middle stages' count ``per`` (which fixes first + last), the key (busiest load, spread
    of the counts, first, last) is minimised exactly in O(L): for a given ``per`` both the busiest
    load and the spread are convex piecewise-linear in ``first``, so the integer minimiser lies next
    to one of their breakpoints (or an end); a ``per`` whose load bound max(per, (rest + E + H) / 2)
    exceeds the best load found cannot win, and once ``per`` alone exceeds it no larger ``per`` can."""
    if num_stages == 1:
        return [num_layers]
    emb, head = embedding_layers, head_layers
    middle = num_stages - 2
    if not middle:
        best = _best_ends(num_layers, 0, 0, emb, head, None)
    else:
        # Distinct ``per`` give distinct (first, last), so the minimum does not depend on the order
        # ``per`` is tried in: start near the balanced count, then only where the bound can still win.
        top = num_layers // middle
        guess = min(top, max(0, round((num_layers + emb + head) / num_stages)))
        best = _best_ends(num_layers, middle, guess, emb, head, None)
        low = max(0, int(math.floor((num_layers + emb + head - 2 * (best[0] + 1e-9)) / middle)) - 1)
        for per in range(low, top + 1):
            if per > best[0]:
                break
            if max(per, (num_layers - middle * per + emb + head) / 2) > best[0] + 1e-9:
                continue
            best = _best_ends(num_layers, middle, per, emb, head, best)
    return [best[2], *([best[4]] * middle), best[3]]


def _best_ends(num_layers: int, middle: int, per: int, emb: float, head: float,
               best: tuple[float, int, int, int, int] | None) -> tuple[float, int, int, int, int]:
    """The better of ``best`` and the best (first, last) for ``per`` layers on each middle stage: the
    busiest load and the spread are convex piecewise-linear in ``first``, so only the integers next to
    their breakpoints (and the ends) are tried."""
    rest = num_layers - middle * per
    points = (0.0, float(rest), (rest + head - emb) / 2, per - emb, rest + head - per, rest / 2, per, rest - per)
    for first in sorted({min(rest, max(0, int(math.floor(x)) + k)) for x in points for k in (-1, 0, 1, 2)}):
        last = rest - first
        sizes = (first, last, per) if middle else (first, last)
        key = (max(first + emb, last + head, float(per)), max(sizes) - min(sizes), first, last)
        if best is None or key < best[:4]:
            best = (*key, per)
    assert best is not None
    return best


def layers_equivalent(cost: float, decoder_layer_cost: float) -> float:
    """A cost (time or FLOPs) in decoder-layer units, for ``balanced_end_stage_layers``."""
    return cost / decoder_layer_cost if decoder_layer_cost > 0 else math.inf
