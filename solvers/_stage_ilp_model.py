"""The stage-ILP's cost model in plain Python: layer types, in-flight counts, modelled time.

Implements the recommended formulation of the poster (seed 002, L39-78) given in
shared/design/stage-ilp-spipe-bpipe.md Sec. A.6: layer *types* are maximal runs of identical
layers (A.6.1; embedding, decoder blocks, head), a plan is the count ``l[k][t][r]`` of layers of
type t with recompute strategy r on virtual stage k = c P + x (A.6.2), and the three bubble
terms (A.6.5, A.6.6)

    B_R = (m/P) sum_k R_k,   B_I = m (tau - sum_k T_k / P),
    B_P = sum_x T_x - tau - kappa (P-1)/P sum_x W_x          (C = 1; kappa 0, 2, 3 for
          1F1B, ZB-H1, ZB-H2, at least (P-1)/P sum_x F_x)
    B_P = (P-1) tau_chunk                                    (C > 1)

whose sum is the modelled iteration time minus the constant (m/P) sum_k (F_k + B_k): for C = 1
the 1F1B estimate sum_x T_x + (m-1) max_x T_x (Alpa, DAPPLE), for C > 1 m tau_dev + (P-1) tau_chunk.
The memory of rank x (C2, A.6.4) is checked at every point of its action order: the in-flight
count vectors (per chunk) after each forward of the schedule, the same ones the simulator
walks (activations live from F to B, or to W for the zero-bubble schedules).

This module is the oracle the ILP is tested against (``objective`` by brute force) and the
fast path of the simulator re-ranking (``candidate_costs``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from cost_models.memory import usable_memory_bytes
from cost_models import bpipe
from cost_models.schedules import build_actions
from cost_models.simulate import PipelineCosts
from cost_models.collectives import ranks_allreduce_s
from planner.errors import InvalidProblemError
from planner.schema import LayerProfile, PipelineProblem
from solvers.common import Layout, stage_ranks

# Counts of a plan: counts[k][t][j] = layers of type t with the type's j-th strategy on virtual stage k.
Counts = tuple[tuple[tuple[int, ...], ...], ...]

MAX_MODEL_ACTIONS = 4_000_000
"""Largest action list (2 x virtual stages x microbatches) the stage model builds (seconds of work)."""

SUPPORTED_SCHEDULES = ("1f1b", "flush", "gpipe", "interleaved-1f1b", "zb-h1", "zb-h2")
KAPPA = {"zb-h1": 2, "zb-h2": 3}  # A.6.6: fill/drain (P-1)(F + B - kappa W) with B the whole backward
TERMS = ("dual", "tri")


@dataclass(frozen=True, slots=True)
class LayerType:
    """A maximal run of identical layers [first, first + num_layers)."""

    first: int
    num_layers: int
    strategies: tuple[str, ...]
    forward_s: float
    backward_s: float
    weight_s: float
    static_bytes: float
    param_bytes: float
    output_bytes: float
    activation_bytes: tuple[float, ...]
    """Per strategy (same order as ``strategies``)."""
    extra_s: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class StageModel:
    """Everything the ILP and the re-ranking need about one (problem, p) pair."""

    types: tuple[LayerType, ...]
    num_stages: int
    num_chunks: int
    num_microbatches: int
    schedule: str
    capacity_bytes: float
    inflight: tuple[tuple[tuple[int, ...], ...], ...]
    """Per rank, the Pareto-maximal per-chunk in-flight count vectors of its action order."""
    layout: Layout
    problem: PipelineProblem
    bpipe_split: tuple[tuple[int, int], ...] | None = None
    """With BPipe: per rank, (own, foreign) peak activation-set counts (``bpipe.inflight_split``);
    rank x's memory is then static_x + own_x A_x + foreign_x A_{p-1-x}, A_x its largest chunk's set."""
    bpipe_links: tuple[tuple[int, float, float], ...] = ()
    """With BPipe: (virtual stage, pair-link bytes/s, latency s) of every chunk whose sets an
    evictor moves; each transfer must fit the chunk's forward (seed 004 App. B Eq. 7-9)."""

    @property
    def num_virtual(self) -> int:
        return self.num_stages * self.num_chunks

    @property
    def num_layers(self) -> int:
        return sum(t.num_layers for t in self.types)

    @property
    def kappa(self) -> int:
        return KAPPA.get(self.schedule, 0)


def _signature(layer: LayerProfile, strategies: Sequence[str]) -> tuple[object, ...]:
    opts = layer.strategies()
    return (
        layer.forward_s, layer.backward_s, layer.backward_weight_s, layer.static_bytes, layer.param_bytes,
        layer.output_bytes, tuple((s, opts[s].activation_bytes, opts[s].extra_s) for s in strategies),
    )


def layer_types(layers: Sequence[LayerProfile], allowed: Sequence[str] | None) -> tuple[LayerType, ...]:
    """Group the layer chain into maximal runs of identical layers (A.6.1).

    Args:
        layers: the model's layers in order.
        allowed: recompute strategies the plan may use; a layer keeps those it offers, or
            ``none`` when it offers none of them. None allows every strategy.
    """
    out: list[LayerType] = []
    prev: tuple[object, ...] | None = None
    for i, layer in enumerate(layers):
        opts = layer.strategies()
        names = [s for s in opts if allowed is None or s in allowed] or ["none"]
        names.sort(key=lambda s: (-opts[s].extra_s, s))  # most recompute first (A.6.7, Phase 4)
        sig = _signature(layer, names)
        if sig == prev:
            last = out[-1]
            out[-1] = LayerType(**{**_fields(last), "num_layers": last.num_layers + 1})
            continue
        prev = sig
        out.append(LayerType(
            first=i, num_layers=1, strategies=tuple(names), forward_s=layer.forward_s,
            backward_s=layer.backward_s, weight_s=layer.backward_weight_s or 0.0,
            static_bytes=layer.static_bytes, param_bytes=layer.param_bytes, output_bytes=layer.output_bytes,
            activation_bytes=tuple(opts[s].activation_bytes for s in names), extra_s=tuple(opts[s].extra_s for s in names),
        ))
    return tuple(out)


def _fields(t: LayerType) -> dict[str, object]:
    return {name: getattr(t, name) for name in LayerType.__slots__}


def inflight_vectors(schedule: str, num_stages: int, num_chunks: int, num_microbatches: int) -> tuple[
        tuple[tuple[int, ...], ...], ...]:
    """Per rank, the per-chunk in-flight counts after each forward, Pareto-maximal ones only.

    Walks the schedule's action lists in rank order: F allocates its chunk's activation, B
    (or W when the backward is split) frees it, exactly as the simulator's engine does.
    """
    p, v = num_stages, num_chunks
    actions = build_actions(schedule, num_stages=p, num_chunks=v, num_microbatches=num_microbatches)
    split = any(a.kind == "W" for rank in actions for a in rank)
    out = []
    for rank in actions:
        count = [0] * v
        seen: set[tuple[int, ...]] = set()
        for a in rank:
            c = a.stage // p
            if a.kind == "F":
                count[c] += 1
                seen.add(tuple(count))
            elif a.kind == ("W" if split else "B"):
                count[c] -= 1
        out.append(tuple(sorted(_pareto(seen))))
    return tuple(out)


def _pareto(vectors: set[tuple[int, ...]]) -> list[tuple[int, ...]]:
    def dominated(a: tuple[int, ...]) -> bool:
        return any(b != a and all(y >= x for x, y in zip(a, b)) for b in vectors)
    return [a for a in vectors if not dominated(a)]


def build_model(problem: PipelineProblem, layout: Layout, *, strategies: Sequence[str] | None,
                inflight: tuple[tuple[tuple[int, ...], ...], ...] | None = None,
                bpipe_on: bool | None = None) -> StageModel:
    """The stage model of a problem at a resolved layout.

    Args:
        bpipe_on: plan with BPipe's balanced counts (default ``problem.bpipe``); below 4 stages
            BPipe moves nothing (seed 004 L100) and the plain counts are used.

    Raises:
        InvalidProblemError: the schedule is not one the ILP models, or not one BPipe balances.
    """
    if problem.schedule not in SUPPORTED_SCHEDULES:
        raise InvalidProblemError(
            f"schedule={problem.schedule!r}: the stage ILP (solvers 'stage-ilp', 'merak', 'adapipe') models "
            f"{list(SUPPORTED_SCHEDULES)}; use one of them (2bw and custom action lists have no modelled bubble "
            "terms; V schedules place chunks outside its loop placement: use solver 'ptdp' or 'even' for them)"
        )
    p, v, m = layout.num_stages, layout.num_chunks, layout.num_microbatches
    if 2 * p * v * m > MAX_MODEL_ACTIONS:
        raise InvalidProblemError(
            f"num_microbatches={m}: the stage model walks the schedule's {2 * p * v * m:,} actions per iteration "
            f"(at most {MAX_MODEL_ACTIONS:,}, i.e. {MAX_MODEL_ACTIONS // (2 * p * v):,} microbatches on {p} stages x "
            f"{v} chunks); use fewer, larger microbatches, or solver 'even', whose simulation extrapolates the steady state"
        )
    assert problem.cluster.device is not None  # PipelineProblem requires a device
    split, links = None, ()
    if (problem.bpipe if bpipe_on is None else bpipe_on) and p >= 4:
        if problem.schedule not in bpipe.SUPPORTED_SCHEDULES:
            raise InvalidProblemError(
                f"bpipe balances the 1F1B and interleaved 1F1B schedules; schedule {problem.schedule!r} is not "
                f"supported: use one of {list(bpipe.SUPPORTED_SCHEDULES)}, or drop bpipe")
        split = tuple(bpipe.inflight_split(p, m, schedule=problem.schedule, num_chunks=v))
        links = _bpipe_links(problem, layout)
    return StageModel(
        types=layer_types(problem.model.layers, strategies), num_stages=p, num_chunks=v, num_microbatches=m,
        schedule=problem.schedule, capacity_bytes=usable_memory_bytes(problem.cluster.device),
        inflight=inflight or inflight_vectors(problem.schedule, p, v, m), layout=layout, problem=problem,
        bpipe_split=split, bpipe_links=links,
    )


def _bpipe_links(problem: PipelineProblem, layout: Layout) -> tuple[tuple[int, float, float], ...]:
    """(virtual stage, bandwidth, latency) of every chunk an evictor moves, on its pair link
    between pair-adjacent ranks (``bpipe.pair_adjacent_ranks``)."""
    p, v, m = layout.num_stages, layout.num_chunks, layout.num_microbatches
    ranks = bpipe.pair_adjacent_ranks(p, data_parallel=layout.data_parallel, tensor_parallel=layout.tensor_parallel)
    actions = build_actions(problem.schedule, num_stages=p, num_chunks=v, num_microbatches=m)
    out = []
    for evictor, acceptor in bpipe.pairs(p):
        moved = {t.stage for t in bpipe.schedule_transfers(actions[evictor], bpipe.optimal_inflight(p, num_chunks=v))}
        bandwidth, latency = problem.cluster.link(ranks[evictor][0], ranks[acceptor][0])
        out.extend((k, bandwidth, latency) for k in sorted(moved))
    return tuple(out)


def links_fit(model: StageModel, counts: Counts) -> bool:
    """BPipe's strict link bound: every moved set's transfer fits its chunk's forward."""
    for k, bandwidth, latency in model.bpipe_links:
        per_type = counts[k]
        act = math.fsum(nj * lt.activation_bytes[j] for n, lt in zip(per_type, model.types) for j, nj in enumerate(n))
        forward = math.fsum(sum(n) * lt.forward_s for n, lt in zip(per_type, model.types))
        if latency + act / bandwidth > forward * (1 + 1e-9):
            return False
    return True


@dataclass(frozen=True, slots=True)
class StageTimes:
    forward_s: list[float]
    backward_s: list[float]
    weight_s: list[float]
    recompute_s: list[float]

    def total(self, k: int) -> float:
        return self.forward_s[k] + self.backward_s[k] + self.recompute_s[k]


def stage_times(model: StageModel, counts: Counts) -> StageTimes:
    """Per virtual stage F, B (whole backward), W and R of a plan."""
    f, b, w, r = [], [], [], []
    for per_type in counts:
        n = [sum(c) for c in per_type]
        f.append(math.fsum(n[t] * lt.forward_s for t, lt in enumerate(model.types)))
        b.append(math.fsum(n[t] * lt.backward_s for t, lt in enumerate(model.types)))
        w.append(math.fsum(n[t] * lt.weight_s for t, lt in enumerate(model.types)))
        r.append(math.fsum(c * lt.extra_s[j] for t, lt in enumerate(model.types) for j, c in enumerate(per_type[t])))
    return StageTimes(f, b, w, r)


def bubble_terms(model: StageModel, counts: Counts) -> tuple[float, float, float]:
    """(B_R, B_I, B_P) of a plan (module docstring; A.6.5 and A.6.6)."""
    p, v, m = model.num_stages, model.num_chunks, model.num_microbatches
    st = stage_times(model, counts)
    device = [math.fsum(st.total(c * p + x) for c in range(v)) for x in range(p)]
    total = math.fsum(device)
    b_r = m / p * math.fsum(st.recompute_s)
    b_i = m * (max(device) - total / p)
    if v == 1:
        kappa = model.kappa
        b_p = total - max(device) - kappa * (p - 1) / p * math.fsum(st.weight_s)
        if kappa:
            b_p = max(b_p, (p - 1) / p * math.fsum(st.forward_s))
    else:
        b_p = (p - 1) * max(st.total(k) for k in range(p * v))
    return b_r, b_i, b_p


def objective(model: StageModel, counts: Counts, terms: str) -> float:
    """What the ILP minimizes: B_R + B_I (``dual``) or B_R + B_I + B_P (``tri``)."""
    b_r, b_i, b_p = bubble_terms(model, counts)
    return b_r + b_i + (b_p if terms == "tri" else 0.0)


def model_constant(model: StageModel) -> float:
    """(m/P) sum_k (F_k + B_k): plan-independent, modelled time = tri objective + this."""
    total = math.fsum(t.num_layers * (t.forward_s + t.backward_s) for t in model.types)
    return model.num_microbatches / model.num_stages * total


def modelled_time_s(model: StageModel, counts: Counts) -> float:
    """The modelled iteration time: sum of the three bubble terms plus the constant."""
    return objective(model, counts, "tri") + model_constant(model)


def rank_memory_bytes(model: StageModel, counts: Counts) -> list[float]:
    """Peak memory of each rank: static bytes plus the worst in-flight vector's activations
    (with BPipe: own sets of the rank's largest chunk plus foreign sets of its partner's)."""
    p, v = model.num_stages, model.num_chunks
    static, act = [], []
    for x in range(p):
        static.append(math.fsum(sum(n) * lt.static_bytes for c in range(v)
                                for n, lt in zip(counts[c * p + x], model.types)))
        act.append([math.fsum(nj * lt.activation_bytes[j] for n, lt in zip(counts[c * p + x], model.types)
                              for j, nj in enumerate(n)) for c in range(v)])
    if model.bpipe_split is not None:
        return [static[x] + own * max(act[x]) + foreign * max(act[p - 1 - x])
                for x, (own, foreign) in enumerate(model.bpipe_split)]
    return [static[x] + max(math.fsum(vec[c] * act[x][c] for c in range(v)) for vec in model.inflight[x])
            for x in range(p)]


def fits(model: StageModel, counts: Counts) -> bool:
    """Memory of every rank within capacity (and, with BPipe, transfers within a forward)."""
    return all(mem <= model.capacity_bytes for mem in rank_memory_bytes(model, counts)) and links_fit(model, counts)


def plan_layers(model: StageModel, counts: Counts) -> tuple[list[int], list[str]]:
    """Virtual-stage boundaries and the per-layer strategy list of a plan (for ``build_plan``)."""
    bounds, strategies = [0], []
    for per_type in counts:
        for t, n in enumerate(per_type):
            for j, nj in enumerate(n):
                strategies.extend([model.types[t].strategies[j]] * nj)
        bounds.append(len(strategies))
    return bounds, strategies


def counts_from_plan(model: StageModel, bounds: Sequence[int], strategies: Sequence[str]) -> Counts | None:
    """The counts of a plan given as boundaries and per-layer strategies; None if a layer's
    strategy is not one the model allows (a baseline using a strategy the ILP excludes)."""
    out = []
    for k in range(len(bounds) - 1):
        per_type = []
        for lt in model.types:
            n = [0] * len(lt.strategies)
            for i in range(max(bounds[k], lt.first), min(bounds[k + 1], lt.first + lt.num_layers)):
                if strategies[i] not in lt.strategies:
                    return None
                n[lt.strategies.index(strategies[i])] += 1
            per_type.append(tuple(n))
        out.append(tuple(per_type))
    return tuple(out)


def candidate_costs(model: StageModel, counts: Counts) -> PipelineCosts:
    """``PipelineCosts`` of a plan without building it (equals ``pipeline_costs(plan)``, tested)."""
    problem, lay = model.problem, model.layout
    p, d, tp = model.num_stages, lay.data_parallel, lay.tensor_parallel
    st = stage_times(model, counts)
    act, last_out, static, params = [], [], [0.0] * p, [0.0] * p
    for k, per_type in enumerate(counts):
        act.append(math.fsum(nj * lt.activation_bytes[j] for n, lt in zip(per_type, model.types) for j, nj in enumerate(n)))
        last_out.append(next(lt.output_bytes for n, lt in reversed(list(zip(per_type, model.types))) if sum(n)))
        static[k % p] += math.fsum(sum(n) * lt.static_bytes for n, lt in zip(per_type, model.types))
        params[k % p] += math.fsum(sum(n) * lt.param_bytes for n, lt in zip(per_type, model.types))
    first = [stage_ranks(x, data_parallel=d, tensor_parallel=tp)[0] for x in range(p)]
    send = []
    for k in range(len(counts) - 1):
        if k % p == (k + 1) % p:
            send.append(0.0)
            continue
        bandwidth, latency = problem.cluster.link(first[k % p], first[(k + 1) % p])
        send.append(latency + last_out[k] / bandwidth)
    allreduce = []
    for x in range(p):
        if d > 1 and params[x] > 0:
            # the simulator's collective over the d replicas (tensor rank 0 of each, tp apart)
            allreduce.append(ranks_allreduce_s(problem.cluster, params[x], [first[x] + j * tp for j in range(d)]))
        else:
            allreduce.append(0.0)
    has_weight = all(layer.backward_weight_s is not None for layer in problem.model.layers)
    return PipelineCosts(
        forward_s=tuple(st.forward_s), backward_s=tuple(st.backward_s),
        backward_weight_s=tuple(st.weight_s) if has_weight else None, recompute_s=tuple(st.recompute_s),
        activation_bytes=tuple(act), send_forward_s=tuple(send), send_backward_s=tuple(send),
        static_bytes=tuple(static), allreduce_s=tuple(allreduce), memory_capacity_bytes=model.capacity_bytes,
    )
