"""The ``paraplan`` command line: a thin layer over ``planner.api``.

Exit codes: 0 ok, 1 internal error, 2 invalid input, 3 infeasible. ``--json`` prints one JSON
document on stdout and nothing else there; logs and progress go to stderr.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import math
import os
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from planner import cli_types as T
from planner import report
from planner.errors import InvalidProblemError, PlannerError
from planner.progress import progress

log = logging.getLogger("paraplan")

# Modules adding sub-commands: each has ``add_parsers(sub)`` and imports heavy packages
# (torch, cvxpy) only inside its handlers.
_EXTENSION_MODULES = ("planner.cli_gavel", "planner.cli_runtime", "planner.cli_fill", "planner.cli_cloud",
                      "planner.cli_calibrate")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (the console script exits with it)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse already printed the usage error
        return 0 if e.code == 0 else 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    empty = _empty_flag(parser, args)
    if empty is not None:
        print(f"error: {empty} is empty; give it a value or drop the flag", file=sys.stderr)
        return 2
    try:
        return int(args.handler(args) or 0)
    except PlannerError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in _OPTIONAL_PACKAGES:
            return _internal_error(e)
        package = (e.name or "").split(".")[0]
        print(f"error: paraplan {args.command} needs {package}, which is not installed; install the "
              f"{_OPTIONAL_PACKAGES[package]!r} extra: pip install 'paraplan[{_OPTIONAL_PACKAGES[package]}]' "
              "(on a GPU machine, install the torch build for its CUDA version instead)", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader of stdout went away (e.g. `| head`): not our bug
        _silence_stdout()
        return 0
    except Exception as e:  # a schema type's refusal (exit 2), else an internal bug: short message
        if _is_validation_error(e):
            from planner.schema import format_validation_error

            print(f"error: {format_validation_error(e.title, e)}", file=sys.stderr)  # type: ignore[attr-defined]
            return 2
        return _internal_error(e)


def _empty_flag(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    """The first option given an empty or blank text value (``--solver ''`` would read as not given)."""
    stack, seen = [parser], set()
    while stack:
        p = stack.pop()
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())
            elif action.option_strings and action.dest not in seen:
                value = getattr(args, action.dest, None)
                if isinstance(value, str) and not value.strip() and value != action.default:
                    return action.option_strings[-1]
                seen.add(action.dest)
    return None


def _is_validation_error(e: BaseException) -> bool:
    """A pydantic ValidationError (checked without importing pydantic: if it is not loaded, no
    schema type ran, so ``e`` cannot be one; ``--help`` and ``solvers`` never load it)."""
    core = sys.modules.get("pydantic_core")
    return core is not None and isinstance(e, core.ValidationError)


# Packages of optional extras (pyproject.toml), by import name: extra name.
_OPTIONAL_PACKAGES = {"torch": "torch"}


def _internal_error(e: BaseException) -> int:
    print(f"internal error: {type(e).__name__}: {e}", file=sys.stderr)
    if os.environ.get("PARAPLAN_DEBUG"):
        traceback.print_exception(e)
    else:
        print("(set PARAPLAN_DEBUG=1 for the traceback, and please report it)", file=sys.stderr)
    return 1


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (tests capture it)
        pass


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="paraplan", description="Parallelism and resource planner for DL training")
    parser.add_argument("-v", "--verbose", action="store_true", help="log solver progress to stderr")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="plan a model on a cluster")
    p.add_argument("--model", required=True, help="preset name, pipedream:<name>, hf:<config.json>, torchtitan:<module>:<flavor>, "
                   "megatron:<args file>, or a profile/transformer JSON or graph.txt")
    p.add_argument("--seq-length", type=T.SEQ_LENGTH, help="training sequence length (transformer configs; default: the config's)")
    p.add_argument("--cluster", required=True, help="DEVICE:N (N devices, e.g. a100-80gb:128), DEVICE:NODESxPER_NODE (h100:4x8), DEVICE (one node) or a cluster JSON")
    p.add_argument("--solver", metavar="NAME", help=_solver_help())
    p.add_argument("--schedule", help="pipeline schedule (default: 1f1b, or interleaved-1f1b with --chunks > 1)")
    p.add_argument("--pipeline", type=T.DEVICES, help="pipeline stages p (default: the solver chooses)")
    p.add_argument("--chunks", type=T.LAYERS, default=1, help="model chunks per stage v (interleaved)")
    p.add_argument("--microbatches", type=T.MICROBATCHES, help="microbatches per pipeline replica m")
    p.add_argument("--global-batch", type=T.BATCH, help="global batch size B")
    p.add_argument("--microbatch-size", type=T.BATCH, help="samples per microbatch b (transformer configs)")
    p.add_argument("--tensor-parallel", type=T.DEVICES, help="tensor-parallel degree t (transformer configs)")
    p.add_argument("--data-parallel", type=T.DEVICES, help="data-parallel degree d (default: devices left)")
    p.add_argument("--efficiency", type=T.fraction, help="achieved fraction of peak FLOP/s for analytic layer times")
    p.add_argument("--memory-headroom", metavar="FRACTION|AMOUNT",
                   help="device memory no plan may use: a fraction (0.1) or an amount (6GiB); default "
                        "min(1 GiB, 5%%) + 5%% (docs/cost-model.md, Memory headroom)")
    p.add_argument("--attention", choices=("flash", "unfused"),
                   help="attention kernel of transformer configs (default flash; unfused: the s x s scores are "
                        "computed and kept for the backward, as Megatron-LM ran in 2021-2022)")
    p.add_argument("--kernels", choices=("fused", "eager"),
                   help="memory-bound layer kernels (default fused: Megatron-LM / Transformer Engine, torch.compile; "
                        "eager: PyTorch eager's unfused RMSNorm, rotary and SwiGLU chains, e.g. torchtitan without "
                        "compile; docs/cost-model.md, Eager elementwise kernels)")
    p.add_argument("--full-recompute", choices=("whole", "early-stop"),
                   help="what full recompute re-runs (default whole: a layer's whole forward, as Megatron-LM's and "
                        "Transformer Engine's reentrant checkpoint do; early-stop: PyTorch's non-reentrant "
                        "torch.utils.checkpoint, as torchtitan, FSDP's checkpoint_wrapper and paraplan run use it, "
                        "stops before the FFN output projection; docs/cost-model.md, Full recompute)")
    p.add_argument("--precision", choices=("bf16", "fp8", "fp8-cs"),
                   help="linear-layer GEMMs (default bf16; fp8: Transformer Engine FP8 with delayed scaling, "
                        "fp8-cs: current scaling as Megatron-Bridge's FP8-CS; attention, norms and logits stay "
                        "BF16; docs/cost-model.md, FP8)")
    p.add_argument("--attention-kernel", metavar="FAMILY",
                   help="flash-attention kernel family the stack runs, one the device lists (A100: fa1, fa2; "
                        "H100: fa1, fa2, fa3, cudnn; B200/GB200: fa1, fa2, cudnn, fa4): fa1 FlashAttention and its "
                        "Triton port, fa2 FlashAttention-2 (PyTorch SDPA), fa3 FlashAttention-3 / cuDNN (the H100 "
                        "default), cudnn cuDNN fused attention (the Blackwell default), fa4 FlashAttention-4; "
                        "docs/cost-model.md, Attention core")
    p.add_argument("--activation-offload", action="store_true",
                   help="also offer the 'offload' strategy: a decoder layer's saved activations go to host memory "
                        "over the device's host link and back for its backward, costed by what the copies do not "
                        "hide (ptdp: searched next to its recompute settings; docs/cost-model.md, Activation "
                        "offloading)")
    p.add_argument("--recompute-modules", nargs="?", const="modules", metavar="SETS",
                   help="also offer Megatron-Core's per-module recompute: ptdp searches the sets given "
                        "(comma-separated, layernorm+mlp,core_attn) or, alone, the cheapest set that fits, beside "
                        "its recompute option; the other solvers offer one given set on every decoder layer beside "
                        "none, selective and full (a plan carries one set, as Megatron's --recompute-modules; "
                        "docs/cost-model.md, Per-module recompute)")
    p.add_argument("--bpipe", action="store_true", help="balance activation memory between paired stages")
    p.add_argument("--time-limit", type=T.positive_float(), help="solver time limit in seconds")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="solver option (repeatable)")
    p.add_argument("--no-offload", action="store_true",
                   help="do not fall back to an offloaded (spipe) plan when the model's states exceed all GPU memory")
    p.add_argument("--timings", action="store_true",
                   help="keep the wall-clock solve_time_s in the plan JSON (it then differs between runs)")
    p.add_argument("-o", "--output", help="write the plan JSON here")
    p.add_argument("--json", action="store_true", help="print the plan JSON on stdout")
    p.set_defaults(handler=cmd_plan)

    s = sub.add_parser("simulate", help="simulate a plan")
    s.add_argument("plan")
    s.add_argument("--timeline", help="draw the timeline to a .png or .svg file")
    s.add_argument("--events", action="store_true", help="include every timeline event in --json")
    s.add_argument("--trace", help="write a Chrome/Perfetto trace (.json): a track per stage stream and link")
    s.add_argument("--window", default="auto",
                   help="timeline part to draw: auto (large plans: first and last 4 microbatches), all, or START:END in seconds")
    s.add_argument("--json", action="store_true")
    s.set_defaults(handler=cmd_simulate)

    e = sub.add_parser("export", help="export a plan for a training framework")
    e.add_argument("plan")
    e.add_argument("--format", required=True, choices=["megatron", "torch-csv", "torchtitan"])
    e.add_argument("--schedule-csv",
                   help="torchtitan only: path of the schedule CSV its arguments name, default schedule.csv "
                        "(write it with --format torch-csv)")
    e.add_argument("-o", "--output")
    e.set_defaults(handler=cmd_export)

    m = sub.add_parser("model-info", help="parameters (total, active) and FLOPs of a model (PTD-P Eq. 4.2/4.3)")
    m.add_argument("model")
    m.add_argument("--global-batch", type=T.BATCH, default=1, help="batch for flops_per_iteration (default 1)")
    m.add_argument("--seq-length", type=T.SEQ_LENGTH, help="training sequence length (default: the config's)")
    m.add_argument("--json", action="store_true")
    m.set_defaults(handler=cmd_model_info)

    for module in _EXTENSION_MODULES:
        if importlib.util.find_spec(module) is not None:  # sub-commands of packages being built
            importlib.import_module(module).add_parsers(sub)

    so = sub.add_parser("solvers", help="list the solvers with what they search and the schedules they plan")
    so.add_argument("--json", action="store_true")
    so.add_argument("--options", action="store_true", help="also list each solver's --option keys with types")
    so.set_defaults(handler=cmd_solvers)
    pr = sub.add_parser("presets", help="list device, cluster and model presets")
    pr.add_argument("--json", action="store_true")
    pr.set_defaults(handler=cmd_presets)
    return parser


def _plan_problem(args: argparse.Namespace) -> Any:
    """``make_problem`` from ``paraplan plan``'s arguments."""
    from planner import api

    schedule = args.schedule or ("interleaved-1f1b" if args.chunks > 1 else "1f1b")
    return api.make_problem(
        args.model,
        args.cluster,
        schedule=schedule,
        num_stages=args.pipeline,
        num_chunks=args.chunks,
        num_microbatches=args.microbatches,
        global_batch_size=args.global_batch,
        microbatch_size=args.microbatch_size,
        tensor_parallel=args.tensor_parallel,
        data_parallel=args.data_parallel,
        bpipe=args.bpipe,
        time_limit_s=args.time_limit,
        efficiency=args.efficiency,
        seq_length=args.seq_length,
        memory_headroom=args.memory_headroom,
        attention=args.attention,
        kernels=args.kernels,
        full_recompute=args.full_recompute,
        precision=args.precision,
        attention_kernel=args.attention_kernel,
        activation_offload=args.activation_offload,
        recompute_modules=_profile_module_set(args),
    )


def _profile_module_set(args: argparse.Namespace) -> str | None:
    """The module set ``--recompute-modules`` adds to the profile: for the solvers that pick strategies per
    stage (ptdp takes it as its own option instead; without --solver the default decides, see cmd_plan)."""
    if not args.recompute_modules or args.solver in (None, "ptdp"):
        return None
    if args.recompute_modules == "modules":
        raise InvalidProblemError(
            f"--recompute-modules without sets lets ptdp pick the cheapest set that fits; solver {args.solver!r} "
            "offers one given set on every layer: --recompute-modules layernorm+mlp (or --solver ptdp)")
    return str(args.recompute_modules)


def cmd_plan(args: argparse.Namespace) -> int:
    from planner import api
    from planner.schema_io import check_output_path

    check_output_path(args.output, flag="-o")
    if args.schedule is None and args.chunks > 1:
        print(f"--chunks {args.chunks}: schedule interleaved-1f1b", file=sys.stderr)
    problem = _plan_problem(args)
    print(report.expansion_line(args.cluster, problem.cluster), file=sys.stderr)
    solver = args.solver or api.default_solver(problem)
    if args.solver is None:
        print(f"solver {solver} (the default for this problem; --solver to choose another)", file=sys.stderr)
        if solver != "ptdp" and args.recompute_modules:  # the default solver picks per stage: build the set in
            args.solver = solver
            problem = _plan_problem(args)
    options = _parse_options(args.option)
    if solver == "ptdp" and args.attention:  # ptdp profiles every (t, b) itself, with its own option
        options.setdefault("attention", args.attention)
    if solver == "ptdp":  # offload and module sets searched next to the recompute settings asked for
        from solvers.ptdp import Options as PtdpOptions

        listed = str(options.get("recompute", PtdpOptions().recompute))
        extra = (["offload"] if args.activation_offload else []) + (
            args.recompute_modules.split(",") if args.recompute_modules else [])
        for item in extra:
            if item.strip() and item.strip() not in listed.split(","):
                listed = f"{listed},{item.strip()}"
        options["recompute"] = listed
    began = time.perf_counter()
    from solvers.budget import listening

    with progress(f"planning with {solver}") as ticker, listening(ticker.update):
        plan = api.plan(problem, solver=solver, options=options,
                        offload_fallback=not args.no_offload, timings=args.timings)
    solve_time_s = time.perf_counter() - began
    if args.output:
        api.save(plan, args.output)
        print(f"wrote {args.output}", file=sys.stderr)
    if args.json:
        print(plan.model_dump_json(indent=2))
    else:
        print(report.plan_table(plan, solve_time_s=solve_time_s))
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from planner import api
    from planner.schema_io import check_output_path

    check_output_path(args.timeline, flag="--timeline")
    check_output_path(args.trace, flag="--trace", create_parent=True)  # write_trace makes the folders
    window = _window(args.window)
    if args.events and not args.json:
        raise InvalidProblemError("--events adds the timeline events to --json output; add --json (or use --timeline)")
    plan = api.load_plan(args.plan)
    with progress("simulating"):
        result = api.simulate(plan, include_events=bool(args.timeline or args.events or args.trace))
    if args.trace:
        from planner.trace import write_trace

        with progress("writing the trace"):
            write_trace(api.trace(plan, result), args.trace)
        print(f"wrote {args.trace} (open it in ui.perfetto.dev)", file=sys.stderr)
    if args.timeline:
        from planner.timeline import draw_timeline

        from planner.trace import stage_labels

        rows = stage_labels(plan) if plan.offload is None else None  # offloaded results have a row per GPU
        with progress("drawing the timeline"):
            draw_timeline(result, args.timeline, title=report.plan_title(plan), resources=api.resource_timelines(plan),
                          row_labels=rows, window=window, memory=api.memory_timelines(plan, result))
        print(f"wrote {args.timeline}", file=sys.stderr)
    if args.json:
        print(result.to_json(include_events=args.events, indent=2))
    else:
        print(report.sim_table(plan, result))
    if not result.fits_memory:
        peak = max(s.peak_memory_bytes for s in result.stages)
        print(f"error: the plan does not fit: peak {peak / 2**30:.1f} GiB per device > usable "
              f"{result.memory_capacity_bytes / 2**30:.1f} GiB; replan with more stages, recompute or "
              "a device with more memory", file=sys.stderr)
        return 3
    from cost_models.activation_offload import plan_host_overflow

    overflow = plan_host_overflow(plan, result)
    if overflow is not None:
        print(f"error: the plan does not fit host memory: {overflow}; replan with more stages or devices, or "
              "without --activation-offload", file=sys.stderr)
        return 3
    return 0


def _window(text: str) -> str | tuple[float, float]:
    """--window: auto, all, or START:END seconds (exit 2 with the fix otherwise)."""
    if text in ("auto", "all"):
        return text
    try:
        lo, hi = (float(x) for x in text.split(":"))
    except ValueError:
        raise InvalidProblemError(f"--window {text!r} is not auto, all or START:END in seconds (e.g. 0:2.5)") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 <= lo < hi):
        raise InvalidProblemError(f"--window {text!r}: START and END must be finite seconds with 0 <= START < END")
    return (lo, hi)


def cmd_export(args: argparse.Namespace) -> int:
    from planner import api

    from planner.schema_io import check_output_path

    check_output_path(args.output, flag="-o")
    if args.schedule_csv is not None and args.format != "torchtitan":
        raise InvalidProblemError(f"--schedule-csv applies to --format torchtitan only (--format {args.format} "
                                  "writes no reference to a schedule file); drop it")
    text = api.export(api.load_plan(args.plan), args.format, schedule_csv_path=args.schedule_csv or "schedule.csv")
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def cmd_model_info(args: argparse.Namespace) -> int:
    from planner import api

    info = api.model_info(args.model, global_batch_size=args.global_batch, seq_length=args.seq_length)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(report.model_info_table(info))
    return 0


def _solver_help() -> str:
    """``--solver`` help from the solver registry (no solver module is imported)."""
    import solvers

    names = ", ".join(info.name + ("*" if info.searches_tensor_parallelism else "") for info in solvers.REGISTRY)
    return (f"pipeline solver: {names} (* searches tensor parallelism; see 'paraplan solvers'); default: ptdp "
            "for a transformer with --global-batch and no fixed shape, else even")


def cmd_solvers(args: argparse.Namespace) -> int:
    import solvers

    if getattr(args, "json", False):
        print(json.dumps([{"name": i.name, "description": i.description, "searches": list(i.searches),
                           "schedules": list(i.schedules), "offload": i.offload, "options": i.option_fields()}
                          for i in solvers.REGISTRY], indent=2))
        return 0
    for info in solvers.REGISTRY:
        print(f"{info.name:16s} {solvers.describe(info, options=args.options)}")
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    presets = report.presets()
    if args.json:
        print(json.dumps(presets, indent=2))
    else:
        print(report.presets_text(presets))
    return 0


def _parse_options(pairs: Sequence[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidProblemError(f"--option {pair!r} must be KEY=VALUE, e.g. --option recompute=full")
        options[key.strip()] = value
    return options


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
