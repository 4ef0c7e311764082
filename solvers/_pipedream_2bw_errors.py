"""Input checks and infeasibility messages of the PipeDream-2BW planner (``solvers.pipedream_2bw``).

Every message names the field or option, the value and what would make the problem work: batch
sizes that split, the memory, the workers or the model size that would fit.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from cost_models.memory import usable_memory_bytes
from planner.errors import InfeasibleError, InvalidProblemError
from planner.schema import ModelProfile, PipelineProblem
from solvers import _pipedream_2bw_model as cm
from solvers.common import memory_shortfall_message
from solvers.even import even_bounds

if TYPE_CHECKING:
    from solvers.pipedream_2bw import Candidate, Options

_SOLVER = "pipedream-2bw"
_RECOMPUTE = {"auto": ["none", "full"], "none": ["none"], "full": ["full"]}


def check_problem(problem: PipelineProblem, opts: Options) -> tuple[list[str], list[str]]:
    """The schedules and recompute strategies to sweep.

    The problem's schedule restricts the sweep when it is ``2bw`` or ``flush``; ``1f1b`` (the
    CLI default) leaves it to option ``schedules``, as Flush is 1F1B with a flush.

    Raises:
        InvalidProblemError: a bad option or a problem field the planner cannot honour.
        InfeasibleError: the tensor-parallel degree exceeds the cluster.
    """
    if problem.schedule in ("zb-v", "dualpipe-v"):
        raise InvalidProblemError(
            f"schedule={problem.schedule!r}: solver {_SOLVER!r} plans PipeDream-2BW and PipeDream-Flush "
            "(one chunk per stage); use --schedule 2bw or flush, or solver 'ptdp' or 'even' for V schedules")
    if problem.num_chunks != 1 or problem.bpipe:
        name, value = ("num_chunks", problem.num_chunks) if problem.num_chunks != 1 else ("bpipe", True)
        raise InvalidProblemError(
            f"solver {_SOLVER!r} plans one chunk per stage without BPipe; remove {name}={value} "
            "(use solver 'ptdp' or 'even' for interleaved schedules)")
    schedules = _schedules(problem, opts)
    if opts.runtime_memory not in cm.RUNTIME_MEMORY:
        raise InvalidProblemError(
            f"option runtime_memory={opts.runtime_memory!r} of solver {_SOLVER!r}; "
            f"choose from {list(cm.RUNTIME_MEMORY)}")
    if opts.recompute not in _RECOMPUTE:
        raise InvalidProblemError(
            f"option recompute={opts.recompute!r} of solver {_SOLVER!r}; choose from {list(_RECOMPUTE)}")
    if opts.recompute == "full" and not any("full" in layer.strategies() for layer in problem.model.layers):
        raise InvalidProblemError(
            f"option recompute=full: no layer of {problem.model.name!r} offers a 'full' recompute strategy; "
            "use recompute=none or a profile with recompute options")
    t = problem.model.tensor_parallel
    if problem.cluster.num_devices < t:
        raise InfeasibleError(
            f"tensor_parallel {t} exceeds the {problem.cluster.num_devices} devices of cluster "
            f"{problem.cluster.name!r}; use tensor_parallel <= {problem.cluster.num_devices} or a larger cluster")
    return schedules, _RECOMPUTE[opts.recompute]


def _schedules(problem: PipelineProblem, opts: Options) -> list[str]:
    schedules = [s for s in (x.strip() for x in opts.schedules.split(",")) if s]
    bad = [s for s in schedules if s not in cm.SCHEDULES]
    if bad or not schedules:
        raise InvalidProblemError(
            f"option schedules={opts.schedules!r} of solver {_SOLVER!r}: use a comma-separated subset of "
            f"{list(cm.SCHEDULES)}, e.g. schedules=2bw,flush")
    if problem.schedule in cm.SCHEDULES:
        if problem.schedule not in schedules:
            raise InvalidProblemError(
                f"schedule={problem.schedule!r} conflicts with option schedules={opts.schedules!r}; "
                f"drop one of them")
        return [problem.schedule]
    if problem.schedule != "1f1b":
        raise InvalidProblemError(
            f"solver {_SOLVER!r} plans the '2bw' and 'flush' schedules; schedule={problem.schedule!r} is not "
            "supported, use '2bw', 'flush' or the default '1f1b' (sweeps both)")
    return schedules


def batch_message(
    problem: PipelineProblem, sizes: Sequence[int], schedules: Sequence[str], batch: int | None,
    skipped: dict[str, int],
) -> str:
    """Why no configuration splits the batch, with global batch sizes that would."""
    from solvers.pipedream_2bw import depth_width_pairs

    pairs = depth_width_pairs(problem)
    only_2bw = list(schedules) == ["2bw"]
    m = problem.num_microbatches
    if m is not None and batch is not None:
        products = sorted({m * b * d for _, d in pairs for b in sizes})
        return (f"global_batch_size={batch} != num_microbatches {m} x microbatch size x data parallel for "
                f"every swept configuration (possible: {products[:8]}); give only one of them")
    if m is not None:  # no batch: only 2BW's m >= p can have failed
        return (f"num_microbatches={m} is smaller than every swept pipeline depth "
                f"({sorted(p for p, _ in pairs)}) and 2BW needs m >= p ([narayanan-thesis] Sec. 3.2.1); give "
                f"num_microbatches >= {min(p for p, _ in pairs)} or schedule flush")
    assert batch is not None
    works: set[int] = set()
    for p, d in pairs:
        for b in sizes:
            step = b * d
            least = step * (p if only_2bw else 1)  # 2BW alone needs m >= p
            below = batch // step * step
            works.update({x for x in (below, below + step) if x >= least} | {max(least, below + step)})
    near = sorted(works, key=lambda x: (abs(x - batch), x))[:5]
    reasons = []
    if skipped.get("batch"):
        reasons.append(f"global batch {batch} is not a multiple of b x d for some swept microbatch sizes b "
                       f"{list(sizes)} and widths d {sorted({d for _, d in pairs})}")
    if skipped.get("m<p"):
        reasons.append("2BW needs m = B / (b d) >= p microbatches per batch ([narayanan-thesis] Sec. 3.2.1) and the others have fewer")
    return (f"no configuration splits the global batch: {'; '.join(reasons)}. Global batch sizes that work: "
            f"{sorted(near)}; or allow other microbatch sizes (option microbatch_sizes)"
            + ("" if "flush" in schedules else " or schedule flush"))


def memory_message(
    problem: PipelineProblem, get_profile: Callable[[int, str], ModelProfile], candidates: Sequence[Candidate]
) -> str:
    """Nothing fits: the least memory any configuration needs, and the deeper pipeline (more
    workers) or the smaller model (fewer blocks) that would fit."""
    least = min(candidates, key=lambda c: c.peak_memory_bytes)
    what = f"every swept configuration of {problem.model.name} ({len(candidates)} of them)"
    parts = [memory_shortfall_message(problem, least.peak_memory_bytes, what)]
    model = get_profile(least.microbatch_size, least.schedule)
    deeper = _fitting_depth(problem, model, least)
    if deeper is not None:
        t = model.tensor_parallel
        parts.append(f"a pipeline of {deeper} stages ({deeper * t} devices per pipeline, with microbatch size "
                     f"{least.microbatch_size} and recompute {least.recompute!r}) would fit")
    blocks = _fitting_blocks(problem, model, least)
    if blocks is not None:
        parts.append(f"the model would fit with at most {blocks[0]} of its {blocks[1]} {blocks[2]} layers "
                     f"at the least-memory configuration (p={least.num_stages}, b={least.microbatch_size})")
    return "; ".join(parts)


def _memory(problem: PipelineProblem, model: ModelProfile, c: Any, p: int, m: int) -> float:
    balanced = cm.balanced_bounds(model, p, recompute=c.recompute, schedule=c.schedule, num_microbatches=m,
                                  capacity_bytes=_capacity(problem))
    out = math.inf
    for bounds in (even_bounds(model, p), balanced):
        if bounds is not None:
            terms = cm.stage_terms(model, problem.cluster, bounds, recompute=c.recompute,
                                   data_parallel=1, tensor_parallel=model.tensor_parallel)
            out = min(out, max(cm.stage_memory_bytes(terms, c.schedule, m)))
    return out


def _capacity(problem: PipelineProblem) -> float:
    assert problem.cluster.device is not None  # PipelineProblem requires a device
    return usable_memory_bytes(problem.cluster.device)


def _fitting_depth(problem: PipelineProblem, model: ModelProfile, least: Any) -> int | None:
    """The smallest depth beyond the swept ones whose memory fits (m = p microbatches)."""
    for p in range(least.num_stages + 1, model.num_layers + 1):
        if _memory(problem, model, least, p, p) <= _capacity(problem):
            return p
    return None


def _fitting_blocks(problem: PipelineProblem, model: ModelProfile, least: Any) -> tuple[int, int, str] | None:
    """(blocks that fit, blocks, kind) for a model of repeated blocks at the least-memory config."""
    kinds = [layer.kind for layer in model.layers]
    kind, count = Counter(kinds).most_common(1)[0]
    if 2 * count < len(kinds) or count <= least.num_stages:
        return None
    body = [i for i, k in enumerate(kinds) if k == kind]
    lead, trail = model.layers[: body[0]], model.layers[body[-1] + 1 :]
    block = model.layers[body[0]]
    lo, hi = least.num_stages, count - 1  # binary search: memory grows with the blocks per stage
    if _memory(problem, _with_blocks(model, lead, block, trail, lo), least, least.num_stages,
               least.num_microbatches) > _capacity(problem):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        smaller = _with_blocks(model, lead, block, trail, mid)
        if _memory(problem, smaller, least, least.num_stages, least.num_microbatches) <= _capacity(problem):
            lo = mid
        else:
            hi = mid - 1
    return lo, count, kind


def _with_blocks(model: ModelProfile, lead: Sequence[Any], block: Any, trail: Sequence[Any], n: int) -> ModelProfile:
    layers = (*lead, *(block.model_copy(update={"name": f"{block.name}_{i}"}) for i in range(n)), *trail)
    return model.model_copy(update={"layers": layers})
