"""CLI sub-commands ``run`` and ``profile`` (architecture.md CLI contract), over ``runtime_bridge``.

torch is imported only inside the handlers: ``import planner`` (and ``planner.cli``, which adds
these parsers) must not load torch. The plan is checked against the model before torch is
imported or any process starts, so a mismatch exits 2 at once.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from planner import cli_types as T

__all__ = ["add_parsers"]

_GIB = 2.0**30


def add_parsers(sub: Any) -> None:
    """Add ``run`` and ``profile`` to the ``paraplan`` sub-command parser."""
    r = sub.add_parser("run", help="execute a plan under torchrun: pipeline (torch.distributed.pipelining) x "
                                   "data (DDP/FSDP2) x tensor/sequence parallel (DTensor)")
    r.add_argument("plan")
    r.add_argument("--steps", type=T.count(10_000, "a check run, not a training job"), default=3, help="training steps (the first is not timed)")
    r.add_argument("--check", action="store_true", help="compare losses and gradients with one process")
    r.add_argument("--json", action="store_true")
    r.add_argument("--model", help="transformer to build: a preset, a transformer JSON or anything `paraplan plan --model` reads (default: the plan's, or the preset named like it)")
    r.add_argument("--seq-length", type=T.SEQ_LENGTH, help="training sequence length of --model (default: the config's)")
    r.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    r.add_argument("--executor", choices=["auto", "builtin", "actions"], default="auto",
                   help="torch's schedule class, or the plan's own action list (default: class if any)")
    r.add_argument("--timeout", type=T.positive_float(), default=30.0, help="process-group timeout in seconds")
    r.add_argument("--seed", type=T.SEED, default=0, help="random seed, 0 to 2^32-1")
    r.add_argument("--nproc-per-node", type=T.count(1024, "processes on one node"), help="ranks on this node (default: all the plan's)")
    r.add_argument("--nnodes", type=T.DEVICES, default=1)
    r.add_argument("--node-rank", type=T.non_negative_int, default=0)
    r.add_argument("--rdzv-endpoint", help="host:port of the rendezvous (several nodes)")
    r.add_argument("--rdzv-id", default="paraplan", help="rendezvous id, the same on every node of one run")
    r.add_argument("--rdzv-backend", default="c10d", help="torchrun rendezvous backend (several nodes)")
    r.add_argument("--rdzv-conf", help="torchrun --rdzv-conf, e.g. join_timeout=600 (several nodes)")
    r.add_argument("--fill", metavar="JOB",
                   help="PipeFill: run a fill job in each rank's bubbles (preset tiny-mlp, tiny-mlp-recv, or a JSON "
                        "file of fill-job fields); the plan also runs without it to compare losses and step time")
    r.set_defaults(handler=cmd_run)

    p = sub.add_parser("profile", help="measure the bundled model's per-layer costs (a layer profile)")
    p.add_argument("--model", required=True, help="transformer to measure: a preset, a transformer JSON, hf:config.json or anything `paraplan plan --model` reads")
    p.add_argument("--seq-length", type=T.SEQ_LENGTH, help="training sequence length (default: the config's)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--microbatch-size", type=T.BATCH, default=1)
    p.add_argument("--repeats", type=T.count(10_000, "timing repeats per layer"), default=5)
    p.add_argument("--num-microbatches", type=T.MICROBATCHES, default=4,
                   help="microbatches per step the per-step work (optimizer, zero_grad) is spread over")
    p.add_argument("--optimizer-bytes-per-param", type=T.non_negative_float, default=0.0,
                   help="optimizer state in static_bytes (0: the bridge's SGD; 8: fp32 Adam)")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="wall: elapsed time (default); cpu: process CPU time, not inflated by other jobs on a shared "
                        "CPU host (compare with run's step_cpu_time_s)")
    p.add_argument("-o", "--output", help="write the profile JSON here (default: stdout)")
    p.set_defaults(handler=cmd_profile)


def cmd_run(args: argparse.Namespace) -> int:
    from planner import api
    from planner.errors import InvalidProblemError
    from planner.schema import TransformerConfig
    from runtime_bridge.validate import check_plan, resolve_config

    plan = api.load_plan(args.plan)
    model = None
    if args.model:
        model = api.load_model(args.model, seq_length=args.seq_length)
        if not isinstance(model, TransformerConfig):
            raise InvalidProblemError(f"--model {args.model!r} is a layer profile; give a transformer config or preset")
    cfg = resolve_config(plan, model)
    if args.node_rank >= args.nnodes:
        raise InvalidProblemError(f"--node-rank={args.node_rank} must be below --nnodes={args.nnodes} (ranks count from 0)")
    world = args.nproc_per_node * args.nnodes if args.nproc_per_node else None
    check_plan(plan, cfg, world_size=world)  # before torch is even imported
    from runtime_bridge.fill import load_fill_job

    fill = load_fill_job(args.fill) if args.fill else None
    from runtime_bridge.launch import LaunchOptions, run_plan

    options = LaunchOptions(device=args.device, nproc_per_node=args.nproc_per_node, nnodes=args.nnodes,
                            node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id,
                            rdzv_backend=args.rdzv_backend, rdzv_conf=args.rdzv_conf, timeout_s=args.timeout)
    report = run_plan(plan, model=cfg, steps=args.steps, check=args.check, seed=args.seed,
                      executor=args.executor, options=options, fill=fill)
    if report is None:
        print(f"node {args.node_rank}: its ranks finished; the node holding global rank 0 prints the report",
              file=sys.stderr)
        return 0
    print(json.dumps(report, indent=2) if args.json else run_table(report))
    return 1 if report.get("check_passed") is False else 0


def run_table(report: dict[str, Any]) -> str:
    """Measured beside predicted, one line per quantity."""
    plan, pred, ratio = report["plan"], report.get("predicted"), report.get("ratio", {})
    d = plan["degrees"]
    extras = (f" zero={plan['zero_stage']}" if plan.get("zero_stage") else "") + (" sp" if plan.get("sequence_parallel") else "")
    lines = [f"{plan['model']}: {plan['schedule']} p={d['pipeline']} d={d['data']} t={d['tensor']} v={d['virtual']} "
             f"m={plan['num_microbatches']} b={plan['microbatch_size']}{extras}, {report['steps']} steps",
             f"{'':18s} {'measured':>12s} {'predicted':>12s} {'ratio':>8s}"]

    def row(name: str, measured: float, predicted: float | None, r: float | None, fmt: str) -> None:
        p = format(predicted, fmt) if predicted is not None else "-"
        lines.append(f"{name:18s} {format(measured, fmt):>12s} {p:>12s} {(f'{r:.3g}' if r else '-'):>8s}")

    row("step time (s)", report["step_time_s"], pred and pred["iteration_time_s"], ratio.get("step_time"), ".4g")
    tok_pred = pred and pred["tokens_per_s"]
    row("tokens/s", report["tokens_per_s"], tok_pred, tok_pred and report["tokens_per_s"] / tok_pred, ".4g")
    if report.get("mfu") is not None:
        row("MFU", report["mfu"], pred and pred.get("mfu"), None, ".3g")
    for rank, peak in enumerate(report["peak_memory_bytes"]):
        mem_ratio = (ratio.get("peak_memory") or [None] * (rank + 1))[rank]
        stage_pred = pred and pred["peak_memory_bytes"][report["rank_stage"][rank]]
        row(f"rank {rank} peak GiB", peak / _GIB, stage_pred and stage_pred / _GIB, mem_ratio, ".4g")
    lines.append(f"(peak memory: {report['memory_kind']}); loss per step: "
                 + ", ".join(f"{x:.4f}" for x in report["loss"]))
    if "fill" in report:
        lines.append(_fill_line(report["fill"]))
    if "max_grad_diff" in report:
        verdict = "passed" if report["check_passed"] else "FAILED"
        lines += [f"check failure: {failure}" for failure in report.get("check_failures", [])]
        lines.append(f"check {verdict}: max_loss_diff {report['max_loss_diff']:.3g}, "
                     f"max_grad_diff {report['max_grad_diff']:.3g}")
    return "\n".join(lines)


def _fill_line(fill: dict[str, Any]) -> str:
    """One line on the fill job: work done, time used, and its effect on the main job."""
    text = (f"fill {fill['job']} ({fill['points']}): {fill['steps']} steps, {fill['samples']} samples in "
            f"{fill['bubbles_filled']}/{fill['bubbles_visited']} bubbles, {fill['fill_time_s']:.3g} s of "
            f"{fill['budget_s']:.3g} s budget")
    if "max_main_loss_diff" in fill:
        text += (f"; main job: max loss diff {fill['max_main_loss_diff']:.3g} vs no fill, "
                 f"slowdown {100 * fill['main_job_slowdown']:+.1f}%")
    return text


def cmd_profile(args: argparse.Namespace) -> int:
    from planner import api
    from planner.errors import InvalidProblemError
    from planner.schema import TransformerConfig

    from planner.schema_io import check_output_path

    check_output_path(args.output, flag="-o")
    cfg = api.load_model(args.model, seq_length=args.seq_length)
    if not isinstance(cfg, TransformerConfig):
        raise InvalidProblemError(f"--model {args.model!r} is a layer profile already; give a transformer config or preset")
    from planner.progress import progress
    from runtime_bridge.profile import profile_model

    with progress(f"profiling {cfg.name}'s layers on {args.device} ({args.repeats} repeats)"):
        profile = profile_model(cfg, device=args.device, microbatch_size=args.microbatch_size, repeats=args.repeats,
                                optimizer_bytes_per_param=args.optimizer_bytes_per_param,
                                num_microbatches=args.num_microbatches, clock=args.clock)
    T.write_or_print(profile.model_dump_json(indent=2), args.output)
    return 0
