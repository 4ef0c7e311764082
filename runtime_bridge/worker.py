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
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from planner.schema import Plan, TransformerConfig
from runtime_bridge import model as gpt
from runtime_bridge.stages import build_chunk_modules, local_chunks
from runtime_bridge.torch_pp import build_schedule, make_stage, run_step

log = logging.getLogger(__name__)

FAULT_EXIT_CODE = 17
"""Exit status of a rank killed on purpose by a job's ``fail_rank`` (fault-injection tests)."""


def main(argv: list[str]) -> int:
    """Run every job of ``argv[0]`` on this rank; results go to ``argv[1]``."""
    spec = json.loads(Path(argv[0]).read_text())
    out_dir = Path(argv[1])
    rank = int(os.environ["RANK"])
    try:
        device = _setup(spec)
        records = [_run_job(job, device) for job in spec["jobs"]]
        gathered: list[Any] = [None] * dist.get_world_size() if rank == 0 else []
        dist.gather_object(records, gathered if rank == 0 else None, dst=0)
        if rank == 0:
            torch.save(gathered, out_dir / "results.pt")
        dist.destroy_process_group()
    except BaseException as e:  # every failure must reach the launcher with this rank's message
        (out_dir / f"error-rank{rank}.txt").write_text(f"{type(e).__name__}: {e}\n\n{traceback.format_exc()}")
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


def _groups(plan: Plan, device: torch.device) -> tuple[Any, Any]:
    """(pipeline group, data-parallel group) from a (pp, dp) device mesh in Megatron order
    (rank = stage x d + replica); None when that dimension is 1 (the default group serves)."""
    p, d = plan.degrees.pipeline, plan.degrees.data
    if d == 1:
        return None, None
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (p, d), mesh_dim_names=("pp", "dp"))
    return mesh["pp"].get_group(), mesh["dp"].get_group()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _run_job(job: dict[str, Any], device: torch.device) -> dict[str, Any]:
    plan = Plan.from_dict(job["plan"])
    cfg = TransformerConfig.from_dict(job["config"])
    seed, rank = int(job.get("seed", 0)), dist.get_rank()
    p, d, v = plan.degrees.pipeline, plan.degrees.data, plan.degrees.virtual
    stage_index, replica = rank // d, rank % d
    pp_group, dp_group = _groups(plan, device)
    chunks = local_chunks(plan, stage_index)
    modules = build_chunk_modules(
        chunks, lambda i: gpt.build_layer(cfg, i), device=device,
        init=lambda layer, i: gpt.init_layer(layer, i, seed=seed), dtype=gpt.model_dtype(cfg, device),
    )
    wrapped = [DistributedDataParallel(m, process_group=dp_group) if d > 1 else m for m in modules]
    stages = [make_stage(w, stage_index=c.virtual_stage, num_stages=p * v, device=device, group=pp_group)
              for w, c in zip(wrapped, chunks)]
    schedule = build_schedule(plan, stages, gpt.lm_loss, executor=job.get("executor", "auto"))
    optimizer = torch.optim.SGD([q for m in modules for q in m.parameters()], lr=float(job.get("lr", 0.05)))
    filler = _fill_runner(job, plan, stage_index, stages, device)
    record: dict[str, Any] = {
        "rank": rank, "stage": stage_index, "replica": replica, "virtual_stages": [c.virtual_stage for c in chunks],
        "losses": [], "step_times_s": [], "grads": [], "param_bytes": sum(
            q.numel() * q.element_size() for m in modules for q in m.parameters()),
    }
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    per_replica = plan.num_microbatches * plan.microbatch_size
    rows = slice(replica * per_replica, (replica + 1) * per_replica)
    for step in range(int(job["steps"])):
        if job.get("fail_rank") == rank and step == int(job.get("fail_step", 0)):
            os._exit(FAULT_EXIT_CODE)  # fault injection: die like a crashed host, no cleanup
        tokens, targets = gpt.sample_batch(cfg, batch_size=plan.global_batch_size, step=step, seed=seed)
        dist.barrier()
        start = time.perf_counter()
        if filler is not None:
            filler.start_step()
        losses = run_step(schedule, stages, tokens[rows].to(device), targets[rows].to(device))
        if filler is not None:
            filler.end_step()  # the idle tail is inside the timed step: its fill work counts
        _sync(device)
        compute_s = time.perf_counter() - start
        if job.get("check"):
            record["grads"].append({n: q.grad.detach().float().cpu().clone() for m in modules
                                    for n, q in m.named_parameters() if q.grad is not None})
        start = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _sync(device)
        record["step_times_s"].append(compute_s + time.perf_counter() - start)
        record["losses"].append([float(x) for x in losses])
    record.update(_peak_memory(device))
    if filler is not None:
        filler.detach()
        record["fill"] = filler.record()
    return record


def _fill_runner(job: dict[str, Any], plan: Plan, stage_index: int, stages: list[Any], device: torch.device) -> Any:
    """The job's fill runner attached to this rank's stages (PipeFill's bubble instruction), or None."""
    if not job.get("fill"):
        return None
    from runtime_bridge.fill import FillJob, FillRunner

    runner = FillRunner(FillJob.from_dict(job["fill"]), plan, stage_index, device)
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
