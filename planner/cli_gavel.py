"""Sub-commands ``schedule``, ``cluster-sim`` and ``policies`` (Gavel, dissertation ch. 5).

Added to ``paraplan`` by ``planner.cli`` through ``add_parsers``. Handlers import the
solvers (and so cvxpy) only when they run. Also holds the input loaders of the cluster
scheduling formats: jobs (``paraplan.jobs/v1`` JSON or a Gavel trace) and clusters (a cluster
JSON with ``worker_types``, or ``v100:36,p100:36,k80:36``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner import cli_types as T
from planner.errors import InvalidProblemError
from planner.progress import progress

if TYPE_CHECKING:  # the schema's types (pydantic) load in the handlers: building the parser needs none
    from planner.schema_gavel import Allocation, ClusterProblem, ClusterSimResult, JobsFile

def add_parsers(sub: Any) -> None:
    """Register the Gavel sub-commands on the ``paraplan`` sub-parser set."""
    s = sub.add_parser("schedule", help="one Gavel allocation of a cluster among jobs")
    s.add_argument("--jobs", required=True, help="jobs JSON (paraplan.jobs/v1), a Gavel .trace file or a bundled trace name")
    s.add_argument("--cluster", required=True, help="cluster JSON with worker_types, or TYPE:N accelerators per type, e.g. v100:1,k80:1")
    s.add_argument("--policy", required=True, help="policy name (`paraplan policies` lists them)")
    _common_flags(s)
    s.add_argument("--json", action="store_true", help="print the allocation JSON on stdout")
    s.set_defaults(handler=cmd_schedule)

    c = sub.add_parser("cluster-sim", help="simulate a cluster under a Gavel policy with 6-minute rounds")
    c.add_argument("--cluster", required=True, help="cluster JSON with worker_types, or TYPE:N accelerators per type, e.g. v100:36,p100:36,k80:36")
    c.add_argument("--policy", required=True)
    c.add_argument("--trace", help="jobs JSON or Gavel .trace with arrival times, or a bundled trace by name "
                   "(small_test, medium_test, debug, debug_v2, artifact_evaluation)")
    c.add_argument("--jobs", type=T.JOBS, help="number of Poisson-arrival jobs from Gavel's job mix")
    c.add_argument("--rate", type=T.positive_float(), help="arrival rate, jobs per hour")
    c.add_argument("--seed", type=T.SEED, default=0, help="random seed, 0 to 2^32-1")
    c.add_argument("--multi-gpu", action="store_true", help="scale factors 1/2/4/8 (continuous-multiple)")
    c.add_argument("--round", type=T.between(10.0, 86_400.0, "Gavel evaluates rounds of minutes; each round is simulated"), default=360.0, help="round length in seconds (default 360)")
    c.add_argument("--mechanism", choices=("gavel", "paper"), default="gavel",
                   help="round mechanism: Gavel's simulator code (gavel, default) or the chapter's Algorithm 2 (paper)")
    c.add_argument("--measure", help="FIRST:LAST job indices the averages cover (steady state)")
    c.add_argument("--cdf", help="draw the CDF of completion times to a .png or .svg file")
    _common_flags(c)
    c.add_argument("--json", action="store_true", help="print the result JSON on stdout")
    c.set_defaults(handler=cmd_cluster_sim)

    _add_cluster_run(sub)

    p = sub.add_parser("policies", help="list the Gavel policies")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_policies)


def _add_cluster_run(sub: Any) -> None:
    r = sub.add_parser("cluster-run", help="run jobs for real on a Ray cluster with Gavel's rounds; compare with cluster-sim")
    r.add_argument("--engine", choices=("ray",), default="ray", help="the engine that runs the jobs (ray)")
    r.add_argument("--cluster", required=True, help="accelerator counts, e.g. v100:1,p100:1 (Ray custom resources)")
    r.add_argument("--policy", required=True)
    r.add_argument("--trace", required=True, help="jobs JSON or Gavel .trace with arrival times")
    r.add_argument("--round", type=T.positive_float(3600.0, "an hour of wall-clock time per round"), default=1.0,
                   help="round length in wall-clock seconds (default 1)")
    r.add_argument("--mechanism", choices=("gavel", "paper"), default="gavel",
                   help="round mechanism, as cluster-sim's (default gavel)")
    # planner.cluster_run.DECISION_CLOCKS, spelled out so that the parser loads no numpy (tested)
    r.add_argument("--decision-clock", choices=("accelerator", "wall"), default="accelerator",
                   help="what the scheduler books and reads: accelerator time, steps/throughput, so the run takes "
                        "the simulator's decisions (default), or measured wall-clock time, as a deployed scheduler")
    r.add_argument("--time-scale", type=T.positive_float(1e6, "a million times faster than the trace"), default=1.0,
                   help="divide the trace's times by K and multiply throughputs by K (360: a 6-minute round in 1 s)")
    r.add_argument("--checkpoint-dir", help="where job checkpoints go (default: a temporary folder)")
    r.add_argument("--address", help="join a running Ray cluster (it must offer one custom resource per type)")
    r.add_argument("--throughputs", help="a Gavel throughput table JSON (default: the bundled simulation table)")
    r.add_argument("--json", action="store_true", help="print the result JSON on stdout")
    r.set_defaults(handler=cmd_cluster_run, space_sharing=False)


def _common_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--partitions", type=T.JOBS, default=1, help="POP sub-problems k (default 1: the full LP)")
    p.add_argument("--space-sharing", action="store_true", help="add co-location pairs from Gavel's table")
    p.add_argument("--throughputs", help="a Gavel throughput table JSON (default: the bundled simulation table)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="policy option (repeatable)")


def cmd_schedule(args: argparse.Namespace) -> int:
    from planner import api

    workers = load_worker_types(args.cluster)
    _check_table(args)
    problem = load_problem(args.jobs, workers, table=args.throughputs, with_pairs=args.space_sharing)
    with progress(f"solving {args.policy}"):
        allocation = api.schedule(problem, policy=args.policy, options=_options(args))
    print(allocation.model_dump_json(indent=2) if args.json else allocation_table(allocation, problem))
    return 0


def cmd_cluster_sim(args: argparse.Namespace) -> int:
    from planner import api

    from planner.schema_io import check_output_path

    check_output_path(args.cdf, flag="--cdf")
    api.gavel_policy(args.policy)
    workers = load_worker_types(args.cluster)
    _check_table(args)
    jobs = _sim_jobs(args, workers)
    measure = _window(args.measure)
    bar = _Bar(len(jobs.jobs))
    # A live bar on a terminal; in logs, progress() prints one line when it starts and ends.
    with progress(f"simulating {len(jobs.jobs)} jobs under {args.policy}", delay_s=1.0 if not bar.tty else 1e9):
        result = api.cluster_simulate(jobs, worker_types=workers, policy=args.policy, round_s=args.round,
                                      options=_options(args), seed=args.seed, measure=measure, on_round=bar.update,
                                      mechanism=args.mechanism)
    bar.close()
    if args.cdf:
        from solvers.gavel.plots import draw_jct_cdf

        draw_jct_cdf({args.policy: result}, args.cdf)
        print(f"wrote {args.cdf}", file=sys.stderr)
    print(result.model_dump_json(indent=2) if args.json else sim_table(result))
    return 0


def _check_table(args: argparse.Namespace) -> None:
    """Read ``--throughputs`` before any work: a missing or malformed table is refused, not ignored."""
    if args.throughputs is not None:
        from solvers.gavel.throughputs import load_table

        load_table(args.throughputs)


def cmd_cluster_run(args: argparse.Namespace) -> int:
    from planner import api
    from planner.cluster_run import import_ray, run_on_ray

    api.gavel_policy(args.policy)
    if args.round <= 0 or args.time_scale <= 0:
        raise InvalidProblemError(f"--round {args.round} and --time-scale {args.time_scale} must be positive")
    import_ray()
    workers = load_worker_types(args.cluster)
    args.jobs = None
    jobs = scale_time(_sim_jobs(args, workers), args.time_scale)
    with progress(f"running {len(jobs.jobs)} jobs on Ray under {args.policy}", delay_s=1.0):
        result = run_on_ray(jobs, worker_types=workers, policy=args.policy, round_s=args.round,
                            checkpoint_dir=args.checkpoint_dir, address=args.address, mechanism=args.mechanism,
                            decision_clock=args.decision_clock)
    if args.json:
        print(result.model_dump_json(indent=2))
        return 0
    print(f"policy {result.policy} on {result.engine} ({result.mechanism} mechanism, {result.decision_clock} clock): "
          f"{result.num_jobs} jobs, {result.num_rounds} rounds of {result.round_s:g} s "
          f"({result.sim_num_rounds} simulated), {result.num_preemptions} preemptions ({result.sim_num_preemptions} simulated)")
    print(f"average JCT {result.avg_jct_s:.3f} s measured, {result.sim_avg_jct_s:.3f} s simulated; "
          f"makespan {result.makespan_s:.3f} s measured, {result.sim_makespan_s:.3f} s simulated")
    for j in result.jobs:
        print(f"  {j.id:>8s}  JCT {j.jct_s:8.3f} s  sim {j.sim_jct_s:8.3f} s  leases {j.num_leases:3d} (sim {j.sim_num_leases:3d})  loss {j.final_loss:.4g}")
    return 0


def scale_time(jobs: JobsFile, k: float) -> JobsFile:
    """Times divided by k, throughputs multiplied by k: the same schedule, k times faster."""
    if k == 1.0:
        return jobs
    return jobs.model_copy(update={"jobs": tuple(j.model_copy(update={
        "arrival_time_s": j.arrival_time_s / k, "slo_s": None if j.slo_s is None else j.slo_s / k,
        "throughputs": {t: v * k for t, v in (j.throughputs or {}).items()}}) for j in jobs.jobs)})


def cmd_policies(args: argparse.Namespace) -> int:
    from planner import api

    registry = api.gavel_policies()
    if args.json:
        print(json.dumps({info.name: {"description": info.description, "objective": info.objective,
                                      "heterogeneity_aware": info.heterogeneity_aware, "space_sharing": info.packed,
                                      "partitioned_aggregate": info.aggregate, "backends": list(info.backends)}
                          for info in registry}, indent=2))
    else:
        for info in sorted(registry, key=lambda i: i.name):
            traits = ", ".join(t for t, on in (("heterogeneity-aware", info.heterogeneity_aware),
                                                 ("space sharing", info.packed)) if on) or "heterogeneity-agnostic"
            print(f"{info.name:48s} {info.description} [{traits}; objective: {info.objective}]")
    return 0


def load_worker_types(spec: str) -> dict[str, int]:
    """Accelerator counts from a cluster JSON (``worker_types``, or a ``device`` cluster) or
    ``type:count[,type:count...]``.

    Raises:
        InvalidProblemError: unreadable file, malformed spec, or a count below one.
    """
    path = Path(spec)
    if path.suffix == ".json" or path.is_file():
        from planner.schema import Cluster

        cluster = Cluster.from_dict(_read_json(path, "cluster"))
        if cluster.worker_types:
            return dict(cluster.worker_types)
        assert cluster.device is not None
        return {cluster.device.name: cluster.num_devices}
    out: dict[str, int] = {}
    for name, count in map(_worker_count, spec.split(",")):
        out[name] = out.get(name, 0) + count
    from planner.schema_io import MAX_DEVICES, bounded

    bounded("accelerators in cluster " + repr(spec), sum(out.values()), MAX_DEVICES,
            "set above the largest published training clusters")
    total = sum(out.values())
    print(f"cluster {spec} -> " + " + ".join(f"{n} {t}" for t, n in out.items()) + f" = {total} accelerators", file=sys.stderr)
    return out


def _worker_count(part: str) -> tuple[str, int]:
    """``(type, accelerators)`` of one ``type:N`` (N accelerators), ``type:NODESxPER_NODE`` or
    ``type`` (one node of a preset's usual size) part: the shorthand ``plan`` reads."""
    from cost_models.hardware import parse_spec

    try:
        name, count, per_node = parse_spec(part.replace("=", ":"))
    except InvalidProblemError as e:
        raise InvalidProblemError(f"{e}; for the scheduling commands give type:count pairs such as 'v100:36,p100:36,k80:36'") from None
    if count is None:
        return name, _node_size(name)
    return name, count * (per_node or 1)


def _node_size(name: str) -> int:
    from cost_models.hardware import cluster_preset

    try:
        return cluster_preset(name).num_devices
    except InvalidProblemError:
        raise InvalidProblemError(f"cluster type {name!r} has no count and no preset node size; write {name}:N "
                                  "(N accelerators)") from None


def load_jobs(source: str, workers: dict[str, int], *, table: str | None = None, with_pairs: bool = False) -> JobsFile:
    """A jobs file: ``paraplan.jobs/v1`` JSON, or a Gavel trace (10 tab-separated columns)."""
    from solvers.gavel import throughputs

    path = _bundled_trace(source) or Path(source)
    if not path.is_file():
        raise InvalidProblemError(
            f"jobs file {source!r} does not exist (bundled Gavel traces by name: {', '.join(bundled_traces())})"
        )
    if path.suffix != ".json":
        return throughputs.read_trace(path, worker_types=workers, table=throughputs.load_table(table), with_pairs=with_pairs)
    from planner.schema_gavel import JobsFile

    jobs = JobsFile.from_dict(_read_json(path, "jobs"))
    if table is not None and not with_pairs:
        raise InvalidProblemError(
            f"--throughputs {table!r} applies to Gavel traces and --space-sharing; the jobs JSON {source!r} gives "
            "each job's throughputs (or model and batch_size to derive them): drop --throughputs or add --space-sharing"
        )
    if with_pairs and all(j.job_type for j in jobs.jobs):
        pairs = throughputs.table_pairs(throughputs.load_table(table), jobs.jobs, workers)
        jobs = jobs.model_copy(update={"pairs": jobs.pairs + pairs})
    return jobs


def bundled_traces() -> list[str]:
    """Names of the Gavel traces shipped with paraplan (``--trace small_test`` finds them)."""
    from importlib import resources

    root = resources.files("solvers.gavel").joinpath("data/traces")
    return sorted(p.name.removesuffix(".trace") for p in root.iterdir() if p.name.endswith(".trace"))


def _bundled_trace(source: str) -> Path | None:
    """The bundled trace named ``source`` (with or without ``.trace``) unless a file of that name exists."""
    from importlib import resources

    if Path(source).exists() or "/" in source:
        return None
    name = source.removesuffix(".trace")
    if name not in bundled_traces():
        return None
    return Path(str(resources.files("solvers.gavel").joinpath(f"data/traces/{name}.trace")))


def load_problem(source: str, workers: dict[str, int], *, table: str | None = None, with_pairs: bool = False) -> ClusterProblem:
    """The ClusterProblem of a jobs file on a cluster (throughputs derived where missing)."""
    from solvers.gavel.throughputs import resolve_problem

    return resolve_problem(load_jobs(source, workers, table=table, with_pairs=with_pairs), worker_types=workers)


def allocation_table(allocation: Allocation, problem: ClusterProblem) -> str:
    """The allocation as a text table: one row per job, one column per type."""
    types = list(problem.worker_types)
    head = f"{'job':>10}  " + "  ".join(f"{t:>8}" for t in types) + f"  {'steps/s':>10}"
    lines = [f"policy {allocation.policy}: objective {allocation.objective:.6g}, solved in "
             f"{allocation.solve_time_s:.3f} s" + (f", {allocation.num_partitions} partitions" if allocation.num_partitions > 1 else ""),
             head]
    for job_id, row in allocation.allocation.items():
        cells = "  ".join(f"{row.get(t, 0.0):8.4f}" for t in types)
        lines.append(f"{job_id:>10}  {cells}  {allocation.effective_throughputs.get(job_id, 0.0):10.4g}")
    for pair in allocation.pairs:
        fractions = ", ".join(f"{t} {v:.4f}" for t, v in pair.fractions.items() if v > 0)
        lines.append(f"pair {pair.jobs[0]} + {pair.jobs[1]}: {fractions}")
    lines += [f"note: {n}" for n in allocation.notes]
    return "\n".join(lines)


def sim_table(result: ClusterSimResult) -> str:
    util = ", ".join(f"{t} {100 * u:.1f}%" for t, u in result.utilization.items())
    return "\n".join([
        f"policy {result.policy}: {result.num_jobs} jobs, {result.num_rounds} rounds of {result.round_s:g} s, "
        f"{result.num_allocations} allocations, {result.num_preemptions} preemptions",
        f"average JCT {result.avg_jct_s / 3600:.3f} h (p50 {result.p50_jct_s / 3600:.3f}, p95 {result.p95_jct_s / 3600:.3f}, "
        f"p99 {result.p99_jct_s / 3600:.3f}) over {len(result.measured_jobs)} jobs",
        f"makespan {result.makespan_s / 3600:.3f} h; utilization {util}",
        f"finish-time fairness: average {result.avg_ftf:.3f}, max {result.max_ftf:.3f}; cost ${result.total_cost_usd:,.2f}",
    ])


def _sim_jobs(args: argparse.Namespace, workers: dict[str, int]) -> JobsFile:
    from solvers.gavel import throughputs
    from solvers.gavel.workload import generate_jobs

    if (args.trace is None) == (args.jobs is None):
        raise InvalidProblemError("give either --trace FILE or --jobs N --rate R (Poisson arrivals)")
    if args.trace is not None:
        ignored = [flag for flag, on in (("--rate", getattr(args, "rate", None) is not None),
                                         ("--multi-gpu", getattr(args, "multi_gpu", False))) if on]
        if ignored:
            raise InvalidProblemError(f"{', '.join(ignored)} shape generated jobs (--jobs N); the trace "
                                      f"{args.trace!r} gives its own: drop {', '.join(ignored)}")
        jobs = load_jobs(args.trace, workers, table=args.throughputs, with_pairs=args.space_sharing)
        return jobs if all(j.throughputs is not None for j in jobs.jobs) else _resolved(jobs, workers)
    if args.rate is None:
        raise InvalidProblemError("--jobs N needs --rate R (jobs per hour)")
    return generate_jobs(args.jobs, rate_per_hour=args.rate, seed=args.seed, worker_types=workers,
                         multi_gpu=args.multi_gpu, with_pairs=args.space_sharing,
                         table=throughputs.load_table(args.throughputs))


def _resolved(jobs: JobsFile, workers: dict[str, int]) -> JobsFile:
    from solvers.gavel.throughputs import resolve_problem

    problem = resolve_problem(jobs, worker_types=workers)
    return jobs.model_copy(update={"jobs": problem.jobs})


def _window(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    first, sep, last = text.partition(":")
    try:
        return int(first), int(last)
    except ValueError:
        raise InvalidProblemError(f"--measure {text!r} must be FIRST:LAST job indices, e.g. 4000:5000") from None


def _options(args: argparse.Namespace) -> dict[str, Any]:
    from planner.cli import _parse_options

    options = _parse_options(args.option)
    if args.partitions != 1:
        options["num_partitions"] = args.partitions
    return options


class _Bar:
    """A one-line progress bar on stderr (only on a terminal) for long simulations."""

    def __init__(self, total: int) -> None:
        self.total, self.shown = total, -1
        self.tty = sys.stderr.isatty()

    def update(self, done: int, total: int) -> None:
        percent = 100 * done // max(total, 1)
        if self.tty and percent != self.shown:
            self.shown = percent
            filled = percent // 4
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (25 - filled)}] {done}/{total} jobs done")
            sys.stderr.flush()

    def close(self) -> None:
        if self.tty and self.shown >= 0:
            sys.stderr.write("\n")


def _read_json(path: Path, what: str) -> Any:
    from planner.schema_io import load_json

    return load_json(path, what=what)
