"""``paraplan cloud ...``: the cloud-pricing planner (dissertation ch. 6).

Sub-commands: ``catalogue`` (instance types and prices), ``plan`` (one of the three
formulations), ``trace`` (validate or generate a spot-price trace), ``replay`` (the chapter's
strategies over a trace) and ``export --format skypilot``. Added to ``paraplan`` by
``planner.cli``; handlers import the solver (scipy) only when they run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner import cli_types as T
from planner.errors import InvalidProblemError

if TYPE_CHECKING:  # the schema's types (pydantic) load in the handlers: building the parser needs none
    from planner.schema_cloud import CloudJobsFile, CloudPlan

# planner.schema_cloud.MARKETS, repeated for --markets' help so that the parser loads no pydantic
# (tests/test_imports.py checks that the two agree).
MARKETS = ("on-demand", "reserved", "spot")


def add_parsers(sub: Any) -> None:
    """Register ``paraplan cloud`` and its sub-commands."""
    cloud = sub.add_parser("cloud", help="plan training on cloud instances: spot, on-demand, reserved (ch. 6)")
    cs = cloud.add_subparsers(dest="cloud_command", required=True)

    c = cs.add_parser("catalogue", help="list a catalogue's instance types and prices")
    c.add_argument("--catalogue", default="ch6-2020", help="bundled name or JSON path (default ch6-2020)")
    c.add_argument("--list", action="store_true", help="list the bundled catalogues")
    c.add_argument("--json", action="store_true")
    c.set_defaults(handler=cmd_catalogue)

    p = cs.add_parser("plan", help="allocate jobs to instance types: max-throughput, min-cost, min-makespan")
    p.add_argument("--jobs", required=True, help="cloud jobs JSON (paraplan.cloud-jobs/v1)")
    p.add_argument("--objective", default="min-cost", choices=["max-throughput", "min-cost", "min-makespan"])
    p.add_argument("--catalogue", default="ch6-2020")
    p.add_argument("--markets", default="on-demand,spot", help=f"comma list of {', '.join(MARKETS)}")
    p.add_argument("--clouds", help="comma list of clouds (default: all in the catalogue)")
    p.add_argument("--instances", help="comma list of instance types (cloud/region/name or unique names)")
    p.add_argument("--budget", type=T.positive_float(), help="total dollars (min-makespan; a cap for min-cost)")
    p.add_argument("--budget-per-hour", type=T.positive_float(), help="spending rate in dollars per hour (max-throughput)")
    p.add_argument("--quota", action="append", default=[], metavar="INSTANCE=N", help="instances held at once (repeatable)")
    p.add_argument("--trace", help="price-trace CSV: spot prices become its time-weighted means")
    p.add_argument("--no-preemption", action="store_true", help="do not discount spot throughput by preemptions")
    p.add_argument("-o", "--output", help="write the plan JSON here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_plan)

    t = cs.add_parser("trace", help="check a spot-price trace, or generate one with the chapter's statistics")
    t.add_argument("file", nargs="?", help="trace CSV to check (omit with --generate)")
    t.add_argument("--catalogue", default="ch6-2020")
    t.add_argument("--generate", action="store_true", help="write a seeded synthetic trace")
    t.add_argument("--days", type=T.positive_float(3650.0, "ten years of hourly prices"), default=90.0)
    t.add_argument("--seed", type=T.SEED, default=0)
    t.add_argument("-o", "--output", help="where --generate writes (default stdout)")
    t.add_argument("--json", action="store_true")
    t.set_defaults(handler=cmd_trace)

    r = cs.add_parser("replay", help="replay the chapter's strategies for one job over a price trace")
    r.add_argument("--jobs", required=True, help="cloud jobs JSON; --job picks one (default: the first)")
    r.add_argument("--job")
    r.add_argument("--trace", help="price-trace CSV (default: the generated trace of --seed)")
    r.add_argument("--seed", type=T.SEED, default=0)
    r.add_argument("--catalogue", default="ch6-2020")
    r.add_argument("--strategy", default="all", help="baseline, gpu-type, multi-gpu, multi-cloud, dynamic or all")
    r.add_argument("--rule", default="price-change", choices=["price-change", "chapter"],
                   help="dynamic's decisions: at every price change with 10%% hysteresis (default), or the "
                        "chapter's evaluation: once a day, any saving, no cap on moves")
    r.add_argument("--max-switches", type=T.non_negative_int,
                   help="most moves of the dynamic strategy (default 3; none with --rule chapter)")
    r.add_argument("--start-h", type=T.non_negative_float, default=0.0)
    r.add_argument("--preemptions", action="store_true", help="draw preemptions at the catalogue's rates")
    r.add_argument("--json", action="store_true")
    r.set_defaults(handler=cmd_replay)

    e = cs.add_parser("export", help="export a cloud plan as a SkyPilot task")
    e.add_argument("plan", help="cloud plan JSON (from `paraplan cloud plan -o`)")
    e.add_argument("--format", required=True, choices=["skypilot"])
    e.add_argument("--job", help="job to export (default: every job, one file each with -o DIR)")
    e.add_argument("--run", default=None, help="the task's run command")
    e.add_argument("-o", "--output", help="YAML file (one job) or directory (every job)")
    e.set_defaults(handler=cmd_export)


def cmd_catalogue(args: argparse.Namespace) -> int:
    from planner import api

    if args.list:
        from solvers.cloud.catalogue import bundled_catalogues

        print("\n".join(bundled_catalogues()))
        return 0
    cat = api.load_cloud_catalogue(args.catalogue)
    if args.json:
        print(cat.model_dump_json(indent=2))
        return 0
    print(f"catalogue {cat.name} (prices as of {cat.prices_as_of}, US$ per hour)")
    print(f"{'instance type':44s} {'accel':>10s} {'on-demand':>10s} {'reserved':>9s} {'spot':>8s} {'preempt/h':>9s}")
    for i in cat.instances:
        res = f"{i.reserved_usd_per_h:.4f}" if i.reserved_usd_per_h else "-"
        spot = f"{i.spot_usd_per_h:.4f}" if i.spot_usd_per_h else "-"
        print(f"{i.key:44s} {i.accelerator + 'x' + str(i.num_accelerators):>10s} {i.on_demand_usd_per_h:10.4f} "
              f"{res:>9s} {spot:>8s} {i.preemption_rate_per_h:9.3f}")
    for name, info in cat.clouds.items():
        print(f"{name}: egress ${info.egress_usd_per_gb}/GB, preemption notice {info.preemption_notice_s:g} s, "
              f"spot prices {info.spot_pricing}" + (f", at most {info.max_lifetime_h:g} h" if info.max_lifetime_h else ""))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from planner import api

    from planner.schema_io import check_output_path

    check_output_path(args.output, flag="-o")
    jobs = load_cloud_jobs(args.jobs)
    problem = api.cloud_problem(
        jobs.jobs, objective=args.objective, markets=_split(args.markets, "--markets"),
        clouds=_split(args.clouds, "--clouds"), instances=_split(args.instances, "--instances"),
        budget_usd=args.budget, budget_usd_per_h=args.budget_per_hour,
        quotas=_quotas(args.quota), preemption=not args.no_preemption)
    plan = api.cloud_plan(problem, catalogue=args.catalogue, trace=args.trace)
    if args.output:
        Path(args.output).write_text(plan.model_dump_json(indent=2) + "\n")
        print(f"wrote {args.output}", file=sys.stderr)
    print(plan.model_dump_json(indent=2) if args.json else plan_table(plan))
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    from planner import api
    from solvers.cloud.traces import GeneratorOptions, trace_stats, trace_to_csv

    from planner.schema_io import check_output_path

    check_output_path(args.output, flag="-o")
    cat = api.load_cloud_catalogue(args.catalogue)
    if args.generate:
        if args.days <= 0:
            raise InvalidProblemError(f"--days={args.days} must be positive")
        text = trace_to_csv(api.generate_cloud_trace(cat, seed=args.seed, options=GeneratorOptions(days=args.days)))
        if args.output:
            Path(args.output).write_text(text)
            print(f"wrote {args.output}", file=sys.stderr)
        else:
            sys.stdout.write(text)
        return 0
    if not args.file:
        raise InvalidProblemError("give a trace CSV to check, or --generate")
    stats = trace_stats(api.load_cloud_trace(args.file, catalogue=cat), cat)
    if args.json:
        print(json.dumps(stats, indent=2))
        return 0
    print(f"{'instance type':44s} {'min':>8s} {'mean':>8s} {'max':>8s} {'od/min':>7s} {'chg/day':>8s}")
    for key, s in stats.items():
        print(f"{key:44s} {s['min_usd_per_h']:8.4f} {s['mean_usd_per_h']:8.4f} {s['max_usd_per_h']:8.4f} "
              f"{s['best_reduction']:7.2f} {s['changes_per_day']:8.2f}")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from planner import api
    from solvers.cloud.replay import CHAPTER_RULE, STRATEGIES

    jobs = load_cloud_jobs(args.jobs)
    job = jobs.jobs[0] if args.job is None else _pick(jobs, args.job)
    strategies = list(STRATEGIES) if args.strategy == "all" else [args.strategy]
    rule = dict(CHAPTER_RULE) if args.rule == "chapter" else {"max_switches": 3}
    if args.max_switches is not None:
        rule["max_switches"] = args.max_switches
    results = [api.cloud_replay(job, strategy=s, catalogue=args.catalogue, trace=args.trace, seed=args.seed,
                                start_h=args.start_h, preemptions=args.preemptions, **rule)
               for s in strategies]
    if args.json:
        print(json.dumps([r.model_dump() for r in results], indent=2))
        return 0
    base = results[0].total_usd
    print(f"job {job.id}: {'strategy':12s} {'dollars':>10s} {'x first':>8s} {'hours':>8s} {'switches':>8s} {'preempt':>7s}")
    for r in results:
        print(f"{'':{len(job.id) + 5}s}{r.strategy:12s} {r.total_usd:10.2f} {base / r.total_usd:8.2f} {r.duration_h:8.1f} "
              f"{r.num_switches:8d} {r.num_preemptions:7d}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from planner import api

    plan = load_cloud_plan(args.plan)
    targets = [args.job] if args.job else sorted(plan.jobs)
    kwargs = {"run": args.run} if args.run else {}
    if len(targets) > 1 and not args.output:
        raise InvalidProblemError(f"the plan has jobs {targets}; pick one with --job or give -o DIR for one file each")
    for job in targets:
        text = api.cloud_export(plan, job, fmt=args.format, **kwargs)
        if args.output is None:
            sys.stdout.write(text)
            continue
        out = Path(args.output)
        if len(targets) > 1 or out.is_dir():
            out.mkdir(parents=True, exist_ok=True)
            out = out / f"{job}.yaml"
        out.write_text(text)
        print(f"wrote {out}", file=sys.stderr)
    return 0


def plan_table(plan: CloudPlan) -> str:
    unit = {"max-throughput": " steps/h", "min-cost": " $", "min-makespan": " h"}[plan.objective]
    lines = [f"{plan.objective} over catalogue {plan.catalogue}: objective {plan.objective_value:.6g}{unit}; "
             f"total ${plan.total_usd or 0:,.2f}, makespan {plan.makespan_h or 0:.2f} h"]
    for job_id, job in plan.jobs.items():
        duration = f"{job.duration_h:.2f} h" if job.duration_h is not None else "-"
        lines.append(f"job {job_id}: {duration}, ${(job.compute_usd or 0) + job.egress_usd:,.2f} "
                     f"(egress ${job.egress_usd:,.2f}), {job.throughput_steps_per_s:.4g} steps/s")
        for key, share in sorted(job.fractions.items(), key=lambda kv: -kv[1]):
            lines.append(f"    {100 * share:6.2f}%  {key}  ${plan.options[key].usd_per_h:.4f}/h")
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)


def load_cloud_jobs(path: str) -> CloudJobsFile:
    from planner.schema_cloud import CloudJobsFile

    return CloudJobsFile.from_dict(_read_json(path, "cloud jobs"))


def load_cloud_plan(path: str) -> CloudPlan:
    from planner.schema_cloud import CloudPlan

    return CloudPlan.from_dict(_read_json(path, "cloud plan"))


def _pick(jobs: CloudJobsFile, job_id: str):
    for job in jobs.jobs:
        if job.id == job_id:
            return job
    raise InvalidProblemError(f"--job {job_id!r} is not in the jobs file; its jobs: {[j.id for j in jobs.jobs]}")


def _split(text: str | None, flag: str) -> tuple[str, ...] | None:
    """A comma list; None when the flag was not given, refused when given without one name."""
    if text is None:
        return None
    items = tuple(p.strip() for p in text.split(",") if p.strip())
    if not items:
        example = {"--markets": "on-demand,spot", "--clouds": "aws,azure"}.get(flag, "p3.2xlarge")
        raise InvalidProblemError(f"{flag} {text!r} names nothing; give a comma list (e.g. {flag} {example}) "
                                  "or drop the flag")
    return items


def _quotas(pairs: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for pair in pairs:
        name, sep, count = pair.partition("=")
        try:
            out[name.strip()] = float(count)
        except ValueError:
            raise InvalidProblemError(f"--quota {pair!r} must be INSTANCE=N, e.g. --quota aws/us-east-1/p3.2xlarge=4") from None
        if not sep or out[name.strip()] < 0:
            raise InvalidProblemError(f"--quota {pair!r} must be INSTANCE=N with N >= 0")
    return out


def _read_json(path: str, what: str) -> Any:
    from planner.schema_io import load_json

    return load_json(path, what=what)
