"""Notes and infeasibility messages of the ``ptdp`` search (solvers/ptdp.py): what was searched, which
global batch sizes would split, and how much memory is missing with what would make it fit."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from cost_models.memory import usable_memory_bytes
from cost_models.transformer import ADAM_BYTES_PER_PARAM, num_parameters
from planner.schema import V_SCHEDULES
from solvers import _ptdp_dims as dims_mod
from solvers import _ptdp_model as model
from solvers._ptdp_enum import chunk_counts, fixed_chunks, searched_schedules, tensor_degrees
from solvers.common import format_bytes, memory_shortfall_message

if TYPE_CHECKING:
    from solvers._ptdp_rank import Ranking
    from solvers.ptdp import Options, Search, Simulated

def notes(search: Search, opts: Options, ranking: Ranking, simulated: Simulated) -> tuple[str, ...]:
    fitting = sum(1 for _, est in ranking.entries if est.fits)
    eff = (f"efficiency by microbatch {search.efficiencies}" if search.efficiencies
           else f"flat efficiency {search.efficiency:.3g} of peak" if search.efficiency
           else f"per-operation compute model ({search.settings.attention} attention)")
    costed = (f"{fitting} fit memory by the closed form" if ranking.complete else
              f"{len(ranking.entries)} costed in full, {fitting} of which fit memory by the closed form (every "
              f"other one takes longer than the best {ranking.keep} that fit, or cannot fit by a lower bound on "
              "its memory)")
    return (
        f"searched {ranking.searched} configurations (t, p, c, d, e, etp, ZeRO stage, v, b, end stages, "
        f"recompute), {costed}; simulated the best {len(simulated)} and kept the fastest in simulation",
        f"{eff}; scatter/gather {'on' if opts.scatter_gather else 'off'}; uniform recompute; even layer split or "
        f"Megatron's uneven end stages; ZeRO stages {opts.zero_stages if opts.zero_stage is None else opts.zero_stage}",
    )


def _pinned_conflict(search: Search, opts: Options) -> str | None:
    """A pinned expert or context degree no (t, p) leaves room for, named with the fix."""
    cfg, n = search.cfg, search.problem.cluster.num_devices
    e, c = opts.expert_parallel, opts.context_parallel or 1
    pipelines = [opts.pipeline_parallel or search.problem.num_stages or 1]
    rooms = {(n // (t * p), n // (p * etp)) for t in tensor_degrees(search, opts) for p in pipelines
             if n % (t * p) == 0 for etp in dims_mod.expert_tensor_degrees(cfg, t, opts.expert_tensor_parallel)}
    if e is not None and e > 1 and not any(expert % e == 0 and data % c == 0 for data, expert in rooms):
        room = sorted({expert for _, expert in rooms})
        return (f"option expert_parallel={e} must divide the ranks the expert layers spread over, t d c / etp = "
                f"n / (p etp): the data x context ranks, and the tensor ranks too when the experts are not "
                f"tensor-split (expert_tensor_parallel=1, Megatron-Core's MoE parallel folding); they are {room} "
                f"under the pinned degrees (tensor_parallel={opts.tensor_parallel}, pipeline_parallel={pipelines[0]}, "
                f"expert_tensor_parallel={opts.expert_tensor_parallel}) on {n} devices of {cfg.name!r}; lower "
                f"pipeline_parallel or expert_tensor_parallel, or use an expert degree dividing "
                f"{room[-1] if room else 1}")
    return None


def no_layout_message(search: Search, opts: Options) -> str:
    """No (t, p, d, b) splits the batch: say which global batch sizes would."""
    conflict = _pinned_conflict(search, opts)
    if conflict is not None:
        return conflict
    problem, cfg, n = search.problem, search.cfg, search.problem.cluster.num_devices
    b_batch = search.global_batch_size
    pinned = opts.pipeline_parallel or problem.num_stages
    # the pipeline degrees the search tries: the pinned one, else those whose stages take whole layers
    # (any degree up to the layer count with uneven stages)
    depths = [pinned] if pinned else [p for p in range(1, cfg.num_layers + 1)
                                      if opts.uneven_stages or cfg.num_layers % p == 0]
    degrees = sorted({n // (t * p) for t in tensor_degrees(search, opts) for p in depths
                      if n % (t * p) == 0 and (not problem.data_parallel or problem.data_parallel * t * p == n)})
    if not degrees:
        return (f"no tensor x pipeline degree fits {n} devices with {cfg.num_layers} layers and "
                f"{cfg.num_heads} heads under the fixed values (num_stages={problem.num_stages}, "
                f"data_parallel={problem.data_parallel}, tensor_parallel={opts.tensor_parallel}); use a cluster "
                f"size that is a multiple of a divisor of the layer count, or drop the fixed values")
    if pinned and (opts.tensor_parallel or problem.data_parallel):
        t = opts.tensor_parallel or n // (pinned * problem.data_parallel)
        layout = _layout_conflict(cfg.num_layers, pinned, fixed_chunks(search, opts), n, t, b_batch,
                                  opts.microbatch_size or 1, searched_schedules(search, opts),
                                  uneven=bool(opts.uneven_stages))
        if layout is not None:
            return layout
    d = degrees[0]
    lo, hi = b_batch // d * d, (b_batch // d + 1) * d
    near = [x for x in (lo, hi) if x > 0]
    return (f"global_batch_size={b_batch} cannot be split: it must be a multiple of b x d with d in "
            f"{degrees} (and for interleaved 1F1B, m a multiple of p; for ZB-V and DualPipeV, layers divisible "
            f"by 2p, and for DualPipeV m >= 2p), and also match num_microbatches="
            f"{problem.num_microbatches} when given. Batch sizes that work: {near} (multiples of d={d})")


def _layout_conflict(layers: int, p: int, v: int, n: int, t: int, batch: int, b: int, schedules: tuple[str, ...], *,
                     uneven: bool) -> str | None:
    """With t and p pinned, a batch that does split (b x d divides it, m a multiple of p) fails only
    on the layer layout: say so, with the virtual degrees whose layout exists. The search's own rules
    decide: the interleaving depths it enumerates (``chunk_counts``) and their layouts, near-even
    ones included for a pinned depth (``_ptdp_enum._layouts``)."""
    if n % (t * p):
        return None
    d = n // (t * p)
    m = batch // (b * d) if batch % (b * d) == 0 else 0
    interleaved_only = not any(s in V_SCHEDULES for s in schedules)  # V schedules need no m % p
    if not m or (v > 1 and m % p and interleaved_only):
        return None

    def laid_out(k_v: int) -> bool:
        entries = chunk_counts(layers, p, m, schedules, k_v, uneven=uneven)
        if any(k == k_v and vs for k, vs in entries):
            return True  # a V schedule's even or near-even chunks (``chunk_counts`` enumerates only those)
        enumerated = (k_v, "") in entries
        return enumerated and bool(dims_mod.stage_layouts(layers, p, k_v, embedding_layers=1.0, head_layers=1.0,
                                                          uneven=uneven, near_even=k_v > 1))

    if laid_out(v):
        return None
    working = [k for k in range(1, dims_mod.MAX_UNEVEN_CHUNKS + 1) if k * p <= layers and laid_out(k)]
    fix = ("set uneven_stages (lighter end stages or a near-even split, Megatron's "
           "--pipeline-model-parallel-layout)" if not uneven else "use another pipeline degree")
    return (f"no layer layout of {layers} decoder layers over pipeline_parallel={p} x virtual_pipeline={v} = "
            f"{p * v} virtual stages: each virtual stage needs a layer (v at most {layers // p}) and an even "
            f"split needs the layers divisible by p x v"
            f"{' and uneven_stages is off' if not uneven else ''}; global_batch_size={batch} itself splits "
            f"(b={b}, d={d}). {fix[0].upper() + fix[1:]}"
            + (f", or virtual_pipeline in {working}" if working else ""))


def memory_message(search: Search, scored: list[tuple[model.Config, model.Estimate]]) -> str:
    problem, cfg = search.problem, search.cfg
    assert problem.cluster.device is not None
    least = min(scored, key=lambda item: item[1].peak_memory_bytes)
    static_total = ADAM_BYTES_PER_PARAM * num_parameters(cfg)
    devices = math.ceil(static_total / usable_memory_bytes(problem.cluster.device))
    c = least[0]
    what = (f"{cfg.name} (best try t={c.tensor} p={c.pipeline} c={c.context} e={c.expert} v={c.virtual} "
            f"b={c.microbatch_size} recompute={c.recompute} zero_stage={c.zero_stage})")
    return (memory_shortfall_message(problem, least[1].peak_memory_bytes, what)
            + f". The weights and optimizer state alone are {format_bytes(static_total)}: at least {devices} "
            f"model-parallel devices of {format_bytes(usable_memory_bytes(problem.cluster.device))} usable "
            f"(t x p >= {devices}), or as many devices in all with ZeRO-3 (option zero_stages with 3) or "
            "expert parallelism sharding the states")
