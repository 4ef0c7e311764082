"""The per-rank program ``torchrun`` starts: ``python -m runtime_bridge.worker JOBS.json OUT_DIR``.

One process group serves every job in the file (several plans in one launch: this is how the
tests reuse one spawn for many checks, shared/design/ecosystem.md Sec. 3.5 item 9). Each job
builds this rank's stages, the schedule, runs ``steps`` training steps with plain SGD on
synthetic data and measures them; rank 0 gathers every rank's record and writes
``OUT_DIR/results.pt``. A rank that fails writes ``OUT_DIR/error-rank<r>.txt`` and exits non-zero;
the process-group timeout turns a missing peer into an error within seconds instead of a hang
(ecosystem.md Sec. 3.5 item 3).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import resource
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from planner.schema import Plan, TransformerConfig
from runtime_bridge import model as gpt
from runtime_bridge.context_parallel import context_parallel_layer
from runtime_bridge.expert_parallel import expert_parallel_layer
from runtime_bridge.grad_sync import ExpertGradScale, GradSync, needs_explicit_sync
from runtime_bridge.parallel import (
    RankMesh,
    build_mesh,
    full_grads,
    make_optimizer,
    shard_data_parallel,
    tensor_parallel_layer,
)
from runtime_bridge.stages import LocalChunk, build_chunk_modules, local_chunks
from runtime_bridge.torch_pp import build_schedule, make_stage, run_step, unshard_before_backward
from runtime_bridge.validate import splits_backward

log = logging.getLogger(__name__)

FAULT_EXIT_CODE = 17
"""Exit status of a rank killed on purpose by a job's ``fail_rank`` (fault-injection tests)."""


class StoppedByLauncher(Exception):
    """torchrun sent this rank SIGTERM: it stops the surviving ranks once one rank has failed."""


def _stop_on_sigterm(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the error report below must not be cut short
    if sys.exc_info()[1] is not None:
        return  # already handling this rank's own failure (writing its report): let it finish
    raise StoppedByLauncher("torchrun stopped this rank (SIGTERM), usually because another rank failed first")


def main(argv: list[str]) -> int:
    """Run every job of ``argv[0]`` on this rank; results go to ``argv[1]``."""
    spec = json.loads(Path(argv[0]).read_text())
    out_dir = Path(argv[1])
    rank = int(os.environ["RANK"])
    # Without a handler SIGTERM ends the process at once, before it reports why it was waiting;
    # raised as an exception, the rank still writes its error file (its own failure if it had one).
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        device = _setup(spec)
        records = [_run_job(job, device, out_dir / "progress.log") for job in spec["jobs"]]
        gathered: list[Any] = [None] * dist.get_world_size() if rank == 0 else []
        dist.gather_object(records, gathered if rank == 0 else None, dst=0)
        if rank == 0:
            torch.save(gathered, out_dir / "results.pt")
        dist.destroy_process_group()
    except BaseException as e:  # every failure must reach the launcher with this rank's message
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a SIGTERM now would cut the report short
        error_file = out_dir / f"error-rank{rank}.txt"
        if not (isinstance(e, StoppedByLauncher) and error_file.exists()):
            error_file.write_text(f"{type(e).__name__}: {e}\n\n{traceback.format_exc()}")
        raise
    return 0


def _setup(spec: dict[str, Any]) -> torch.device:
    torch.set_num_threads(int(spec.get("num_threads", 1)))  # ranks share the host's cores
    timeout = datetime.timedelta(seconds=float(spec["timeout_s"]))
    if spec["device"] == "cuda":
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
        return device
    dist.init_process_group("gloo", timeout=timeout)
    return torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _build(job: dict[str, Any], plan: Plan, cfg: TransformerConfig, device: torch.device, mesh: RankMesh
           ) -> tuple[list[LocalChunk], list[nn.Module], list[Any]]:
    """This rank's chunks: built, tensor-parallelised, wrapped for data parallelism, as stages."""
    seed = int(job.get("seed", 0))
    chunks = local_chunks(plan, mesh.stage)
    hooks = _layer_hooks(plan, cfg, mesh, device)

    def parallelize(layer: nn.Module, index: int) -> nn.Module:
        for hook in hooks:
            layer = hook(layer, index)
        return layer

    modules = build_chunk_modules(
        chunks, lambda i: gpt.build_layer(cfg, i), device=device,
        init=lambda layer, i: gpt.init_layer(layer, i, seed=seed), dtype=gpt.model_dtype(cfg, device),
        parallelize=parallelize if hooks else None,
    )
    explicit = needs_explicit_sync(plan)
    wrapped = [shard_data_parallel(m, plan.zero_stage, mesh, explicit_sync=explicit) for m in modules]
    num_stages = plan.degrees.pipeline * plan.degrees.virtual
    stages = [make_stage(w, stage_index=c.virtual_stage, num_stages=num_stages, device=device, group=mesh.pp_group)
              for w, c in zip(wrapped, chunks)]
    if plan.zero_stage == 3 and mesh.dp_mesh is not None and splits_backward(plan):
        for stage in stages:
            unshard_before_backward(stage)
    return chunks, wrapped, stages


def _layer_hooks(plan: Plan, cfg: TransformerConfig, mesh: RankMesh, device: torch.device) -> list[Any]:
    """What each initialised layer goes through, in order: expert parallelism (keep this rank's
    experts), tensor parallelism (every kept expert split too; with sequence parallelism the MoE
    block gathers the sequence before routing), then the context shard."""
    hooks: list[Any] = []
    if mesh.ep_group is not None:
        hooks.append(lambda layer, i: expert_parallel_layer(
            layer, ep_rank=mesh.ep_rank, ep_size=plan.degrees.expert, group=mesh.ep_group))
    if mesh.tp_mesh is not None:
        hooks.append(lambda layer, i: tensor_parallel_layer(layer, i, cfg, mesh.tp_mesh, plan.sequence_parallel))
    if mesh.cp_group is not None:
        shard = _context_shard(plan, cfg, mesh, device)
        hooks.append(lambda layer, i: context_parallel_layer(layer, shard))
    return hooks


def _run_job(job: dict[str, Any], device: torch.device, progress_path: Path) -> dict[str, Any]:
    plan = Plan.from_dict(job["plan"])
    cfg = TransformerConfig.from_dict(job["config"])
    mesh = build_mesh(plan, dist.get_rank(), device, explicit_sync=needs_explicit_sync(plan))
    chunks, modules, stages = _build(job, plan, cfg, device, mesh)
    progress = progress_path if _writes_progress(plan, mesh.stage) else None
    sync = _grad_sync(plan, mesh)
    schedule = build_schedule(plan, stages, gpt.lm_loss, executor=job.get("executor", "auto"))
    named = [(n, q) for m in modules for n, q in m.named_parameters()]
    split = mesh.ep_group is not None  # expert-parallel experts differ per replica: their own ZeRO-1 group
    optimizer = make_optimizer([q for n, q in named if not (split and ".experts." in n)], plan.zero_stage, mesh,
                               lr=float(job.get("lr", 0.05)),
                               expert_params=[q for n, q in named if split and ".experts." in n])
    filler = _fill_runner(job, plan, mesh.stage, stages, device)
    record: dict[str, Any] = {
        "rank": dist.get_rank(), "stage": mesh.stage, "replica": mesh.replica, "tp_rank": mesh.tp_rank,
        "virtual_stages": [c.virtual_stage for c in chunks], "losses": [], "step_times_s": [], "step_cpu_times_s": [], "grads": [],
        "param_bytes": sum(_local(q).numel() * q.element_size() for m in modules for q in m.parameters()),
        "data_parallel": type(modules[0]).__name__, "optimizer": type(optimizer).__name__,
    }
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if progress is not None:
        d = plan.degrees
        with progress.open("a") as fh:
            extra = "".join(f" x {k} {v}" for k, v in (("context", d.context), ("expert", d.expert)) if v > 1)
            fh.write(f"{job.get('name') or 'run'}: ranks ready (pipeline {d.pipeline} x data {d.data} x tensor "
                     f"{d.tensor}{extra}); step 1 also infers the stages' shapes\n")
    per_replica = plan.num_microbatches * plan.microbatch_size
    rows = slice(mesh.replica * per_replica, (mesh.replica + 1) * per_replica)
    shard = _context_shard(plan, cfg, mesh, device)
    columns = shard.index if shard is not None else slice(None)  # context parallelism: the positions held
    for step in range(int(job["steps"])):
        if job.get("fail_rank") == record["rank"] and step == int(job.get("fail_step", 0)):
            os._exit(FAULT_EXIT_CODE)  # fault injection: die like a crashed host, no cleanup
        tokens, targets = gpt.sample_batch(cfg, batch_size=plan.global_batch_size, step=step, seed=int(job.get("seed", 0)))
        _train_step(job, record, (schedule, stages, modules, optimizer, filler, sync, mesh), tokens[rows][:, columns],
                    targets[rows][:, columns], device)
        if progress is not None and record["losses"][-1]:
            _report_progress(progress, job, step, record, plan.global_batch_size * cfg.seq_length)
    record.update(_peak_memory(device))
    if filler is not None:
        filler.detach()
        record["fill"] = filler.record()
    return record


def _writes_progress(plan: Plan, stage: int) -> bool:
    """The highest rank of the pipeline stage holding the last virtual stage writes the progress
    lines (its losses are the model's; under a V schedule that stage is pipeline rank 0)."""
    if stage != plan.stage_ranks()[-1]:
        return False
    ranks = plan.stages[stage].ranks
    return dist.get_rank() == (max(ranks) if ranks else dist.get_world_size() - 1)


def _train_step(job: dict[str, Any], record: dict[str, Any], parts: tuple[Any, ...], tokens: torch.Tensor,
                targets: torch.Tensor, device: torch.device) -> None:
    """One timed step: the pipeline schedule (with fill work in its bubbles), the whole gradients
    for ``--check``, the SGD step; appends the step time (wall, and this process's CPU time, which
    other jobs on a shared host do not inflate) and this rank's microbatch losses."""
    schedule, stages, modules, optimizer, filler, sync, mesh = parts
    dist.barrier()
    start, cpu_start = time.perf_counter(), time.process_time()
    if filler is not None:
        filler.start_step()
    losses = run_step(schedule, stages, tokens.to(device), targets.to(device))
    if filler is not None:
        filler.end_step()  # the idle tail is inside the timed step: its fill work counts
    if sync is not None:  # after every W action: the data-parallel reduction DDP would have done
        sync.reduce(modules)
    if mesh.cp_group is not None:  # each context rank's loss is its tokens' mean
        from runtime_bridge.context_parallel import average_losses

        losses = average_losses(losses, mesh.cp_group, dist.get_world_size(mesh.cp_group))
    _sync(device)
    compute_s, compute_cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    if job.get("check"):  # untimed: gathering shards is not part of training
        record["grads"].append({n: g for m in modules for n, g in full_grads(m).items()})
    start, cpu_start = time.perf_counter(), time.process_time()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    _sync(device)
    record["step_times_s"].append(compute_s + time.perf_counter() - start)
    record["step_cpu_times_s"].append(compute_cpu_s + time.process_time() - cpu_start)
    record["losses"].append([float(x) for x in losses])


def _grad_sync(plan: Plan, mesh: RankMesh) -> GradSync | ExpertGradScale | None:
    """The explicit gradient reduction of zero-bubble, expert- or context-parallel data parallelism
    (or the experts' extra 1 / e under FSDP2), or None."""
    if mesh.ep_group is not None and plan.zero_stage > 1:
        return ExpertGradScale(plan.degrees.expert)
    if not needs_explicit_sync(plan):
        return None
    return GradSync(mesh.dp_group, plan.degrees.data * plan.degrees.context, expert_parallel=mesh.ep_group is not None,
                    expert_group=mesh.edp_group)


def _context_shard(plan: Plan, cfg: TransformerConfig, mesh: RankMesh, device: torch.device) -> Any:
    """This rank's share of the sequence (None without context parallelism)."""
    if mesh.cp_group is None:
        return None
    from runtime_bridge.context_parallel import ContextShard

    return ContextShard(cfg.seq_length, size=plan.degrees.context, rank=mesh.cp_rank, group=mesh.cp_group,
                        device=device)


def _local(param: torch.Tensor) -> torch.Tensor:
    """The part of a parameter this rank holds (a DTensor's local shard)."""
    return param.to_local() if isinstance(param, DTensor) else param


def _report_progress(path: Path, job: dict[str, Any], step: int, record: dict[str, Any], tokens: int) -> None:
    """One line per step for the launcher to relay on stderr (the last rank: it holds a loss)."""
    step_s = record["step_times_s"][-1]
    loss = sum(record["losses"][-1]) / len(record["losses"][-1])
    with path.open("a") as fh:
        fh.write(f"{job.get('name') or 'run'}: step {step + 1}/{job['steps']} loss {loss:.4f} "
                 f"step {step_s:.4g} s {tokens / step_s:.4g} tokens/s\n")


def _fill_runner(job: dict[str, Any], plan: Plan, stage_index: int, stages: list[Any], device: torch.device) -> Any:
    """The job's fill runner attached to this rank's stages (PipeFill's bubble instruction), or None."""
    if not job.get("fill"):
        return None
    from runtime_bridge.fill import FillTask, FillRunner

    runner = FillRunner(FillTask.from_dict(job["fill"]), plan, stage_index, device)
    runner.attach(stages)
    return runner


def _peak_memory(device: torch.device) -> dict[str, Any]:
    """CUDA: the allocator's peak; CPU: the process's peak resident set (includes the runtime)."""
    if device.type == "cuda":
        return {"peak_memory_bytes": int(torch.cuda.max_memory_allocated(device)), "memory_kind": "cuda_allocated"}
    return {"peak_memory_bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024,
            "memory_kind": "cpu_peak_rss"}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
