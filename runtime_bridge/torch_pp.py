"""The one adapter over torch.distributed.pipelining (torch 2.11 and 2.13).

Built-in schedules go through torch's classes: ``gpipe`` -> ``ScheduleGPipe``, ``1f1b`` and
``flush`` -> ``Schedule1F1B``, ``interleaved-1f1b`` -> ``ScheduleInterleaved1F1B`` (its loop
placement, virtual stage k on rank k % p, is the plan's), ``zb-v`` -> ``ScheduleZBVZeroBubble`` and
``dualpipe-v`` -> ``ScheduleDualPipeV`` (V placement: rank r holds virtual stages r and 2p - 1 - r,
as the plan's ``chunk_of_virtual_stage``; the plan's order equals these classes' own, tested in
tests/cost_models/test_vschedules.py). The zero-bubble schedules ``zb-h1`` /
``zb-h2`` and ``custom`` run the plan's own per-rank action list, the order the simulator
produced (``cost_models.simulate.plan_actions``), through the runtime's custom-schedule path:
``_PipelineScheduleRuntime`` + ``_prepare_schedule_with_comms``, which validates the list, infers
stage -> rank from it and inserts the sends and receives (shared/design/ecosystem.md Sec. 2.5).
Any schedule can be forced down that path (``executor="actions"``) to run exactly the
simulated order.

The private names (``_Action``, ``_PipelineScheduleRuntime``) are confined to this module; only
keyword arguments present in both torch 2.11 and 2.13 are passed (ecosystem.md Sec. 2.1, 2.5:
no ``defer_pp_recv``, ``loss_kwargs``, ``output_grads``, ``get_mesh``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal
from unittest import mock

import torch
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage, Schedule1F1B, ScheduleDualPipeV, ScheduleGPipe, ScheduleInterleaved1F1B, ScheduleZBVZeroBubble,
)
from torch.distributed.pipelining import schedules as _schedules
from torch.distributed.pipelining.schedules import _Action, _PipelineScheduleRuntime

from cost_models.simulate import plan_actions
from planner.errors import InvalidProblemError
from planner.schema import Plan

__all__ = [
    "Executor", "WaitHook", "build_schedule", "executor_for", "install_wait_hook", "lower_offline", "make_stage",
    "torch_actions", "unshard_before_backward",
]

Executor = Literal["auto", "builtin", "actions"]
_BUILTIN = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "flush": Schedule1F1B}
_MULTI = {"interleaved-1f1b": ScheduleInterleaved1F1B, "zb-v": ScheduleZBVZeroBubble, "dualpipe-v": ScheduleDualPipeV}
"""Schedule classes that take a list of stages (several per rank)."""


def executor_for(plan: Plan, executor: Executor = "auto") -> Literal["builtin", "actions"]:
    """Which path a plan takes: torch's schedule class, or the plan's action list.

    Raises:
        InvalidProblemError: ``builtin`` asked for a schedule torch has no class for.
    """
    has_class = plan.schedule in _BUILTIN or plan.schedule in _MULTI
    if executor == "auto":
        return "builtin" if has_class else "actions"
    if executor == "builtin" and not has_class:
        raise InvalidProblemError(
            f"schedule {plan.schedule!r} has no torch schedule class the plan's order maps to; "
            "use executor 'actions' (the plan's own action list)"
        )
    return executor


def torch_actions(plan: Plan) -> dict[int, list[_Action]]:
    """The plan's per-rank compute actions as torch ``_Action`` objects (compute_only format)."""
    return {rank: [_Action.from_str(str(a)) for a in acts] for rank, acts in enumerate(plan_actions(plan))}


def lower_offline(plan: Plan) -> dict[int, list[str]]:
    """Lower the plan's action list with mock stages, no process group: torch validates the list
    and inserts sends/receives exactly as it will at run time (ecosystem.md Sec. 2.5).

    Returns:
        Per rank, the lowered action strings (with SEND/RECV/REDUCE_GRAD).

    Raises:
        InvalidProblemError: torch rejects the list (malformed or deadlocking); its table follows.
    """
    p, v = plan.degrees.pipeline, plan.degrees.virtual
    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod, stage.num_stages = 0, p, None, p * v
    runtime = _PipelineScheduleRuntime([stage] * v, plan.num_microbatches)
    try:
        runtime._prepare_schedule_with_comms(torch_actions(plan))
    except (AssertionError, ValueError, RuntimeError) as e:
        raise InvalidProblemError(f"torch.distributed.pipelining rejects the plan's action list: {e}") from None
    return {rank: [str(a) for a in acts if a is not None] for rank, acts in runtime.pipeline_order_with_comms.items()}


def make_stage(module: nn.Module, *, stage_index: int, num_stages: int, device: torch.device,
               group: Any = None) -> PipelineStage:
    """A manual-frontend stage (dynamic shape inference on the first step); ``group`` by keyword,
    the one spelling torch 2.11 and 2.13 share."""
    return PipelineStage(module, stage_index, num_stages, device, group=group)


def unshard_before_backward(stage: PipelineStage) -> None:
    """FSDP2 with ``reshard_after_forward=True`` (ZeRO-3) under an I/W split: torch's input pass
    collects the stage's parameters (``submod.parameters()``) before autograd's pre-backward hooks
    gather them, so it sees the sharded parameters, not the gathered ones the graph used, and
    their weight gradients are lost. Gather every FSDP unit of the stage before each backward
    (I, B or W); torch's ``REDUCE_GRAD`` after the last W reduce-scatters and reshards."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in stage.submod.modules() if isinstance(m, FSDPModule)]
    passes = {"backward_one_chunk": stage.backward_one_chunk, "backward_weight_one_chunk": stage.backward_weight_one_chunk}

    def gathered(run: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            for unit in units:
                unit.unshard()
            return run(*args, **kwargs)
        return call

    for name, run in passes.items():
        setattr(stage, name, gathered(run))


def build_schedule(
    plan: Plan,
    stages: Sequence[PipelineStage],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    executor: Executor = "auto",
) -> Any:
    """The schedule object that runs this rank's stages.

    Args:
        plan: the plan (schedule, microbatches, actions).
        stages: this rank's stages, ordered by virtual stage.
        loss_fn: mean-reduced per-microbatch loss (``scale_grads=True`` divides by m).
        executor: ``auto`` (torch's class where the plan's schedule has one), ``builtin`` or
            ``actions`` (the plan's own order through the custom-schedule runtime).

    Returns:
        A torch schedule with ``step(...)``.
    """
    path = executor_for(plan, executor)
    m = plan.num_microbatches
    if path == "builtin":
        if plan.schedule in _MULTI:
            return _MULTI[plan.schedule](list(stages), m, loss_fn=loss_fn)
        (stage,) = stages
        return _BUILTIN[plan.schedule](stage, m, loss_fn=loss_fn)
    runtime = _PipelineScheduleRuntime(list(stages), m, loss_fn=loss_fn)
    runtime._prepare_schedule_with_comms(torch_actions(plan))
    return runtime


def run_step(schedule: Any, stages: Sequence[PipelineStage], inputs: torch.Tensor,
             targets: torch.Tensor) -> list[torch.Tensor]:
    """One training step of the pipeline on this rank; returns the per-microbatch losses this rank
    computed (empty unless it holds the last stage)."""
    losses: list[torch.Tensor] = []
    args = (inputs,) if any(s.is_first for s in stages) else ()
    kwargs: dict[str, Any] = {"target": targets, "losses": losses} if any(s.is_last for s in stages) else {}
    schedule.step(*args, **kwargs)
    return losses


WaitHook = Callable[[list[Any], Callable[[], None]], None]
"""``hook(ops, wait)``: the P2P ops a schedule is about to block on, and the blocking wait itself."""


def install_wait_hook(hook: WaitHook) -> Callable[[], None]:
    """Route every blocking wait of torch's pipelining schedules on point-to-point work through
    ``hook`` (PipeFill's bubble instruction, runtime_bridge.fill): both the schedule classes and
    the custom-schedule runtime post their sends and receives with ``_batch_p2p`` and block in
    ``_wait_batch_p2p``, so the hook sees the ops of each wait at the moment the rank goes idle.
    The hook must call ``wait()`` exactly once.

    Returns:
        A function that restores torch's originals.
    """
    batch_p2p, wait_batch_p2p = _schedules._batch_p2p, _schedules._wait_batch_p2p
    ops_of: dict[int, tuple[Any, list[Any]]] = {}  # id(work) -> (work, the ops of its batch)

    def batch(p2p_ops: list[Any], *args: Any, **kwargs: Any) -> list[Any]:
        works = batch_p2p(p2p_ops, *args, **kwargs)
        for work in works:
            ops_of[id(work)] = (work, list(p2p_ops))  # the work is kept alive: its id stays unique
        return works

    def wait(works: list[Any]) -> None:
        ops = [op for w in works for op in ops_of.pop(id(w), (None, []))[1]]
        hook(ops, lambda: wait_batch_p2p(works))

    _schedules._batch_p2p, _schedules._wait_batch_p2p = batch, wait

    def uninstall() -> None:
        _schedules._batch_p2p, _schedules._wait_batch_p2p = batch_p2p, wait_batch_p2p

    return uninstall
