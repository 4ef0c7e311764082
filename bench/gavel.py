"""Gavel benchmarks: policy solve time vs jobs (full and POP-partitioned), and simulations.

Usage::

    PYTHONPATH=. python bench/gavel.py scale [--max-jobs 4096] [--policies a,b] [--space-sharing]
    PYTHONPATH=. python bench/gavel.py lp [--jobs 256,1024] [--repeats 15]
    PYTHONPATH=. python bench/gavel.py sim [--jobs 300] [--rate 3.0] [--seeds 0,1,2]
    PYTHONPATH=. python bench/gavel.py traces [--cluster v100:4,p100:4,k80:4] [--round 360]
    PYTHONPATH=. python bench/gavel.py parity [--mechanism gavel] [--lp-solver ecos|highs]
    PYTHONPATH=. python bench/gavel.py ray [--repeats 3] [--round 1.0]   (needs ray)
    PYTHONPATH=. python bench/gavel.py chapter [--jobs 5000] [--rate 5.6] [--seeds 0] [--mechanism gavel]

``scale`` prints (best of 3, imports warmed up first), per policy and job count (64 to 4096; cluster of equal V100/P100/K80
counts growing with the jobs, as in the chapter's Fig. 5.14), the full LP's solve time, the
partitioned solve time with k = jobs/256 sub-problems (at least 2), and the partitioned
objective relative to the full one. Full solves above ``--max-full`` jobs are skipped.
``lp`` splits the max-min fairness solve into its steps (formulation, LP arrays, HiGHS, repair,
Allocation; wall and CPU) beside Gavel's formulation on cvxpy + ECOS in the same process.
``sim`` runs each policy family agnostic and heterogeneity-aware on the same Poisson traces
and prints the average JCT (the chapter's Figs. 5.9-5.11 comparison). ``traces`` runs every
bundled Gavel trace (the physical-cluster traces) under each policy and prints the average
JCT and makespan per (trace, policy), with the agnostic/aware JCT ratio per family. ``parity``
prints the same cells beside Gavel's own simulator's (tests/data/gavel_reference) as a
Markdown table with the ratios, marking the cells more than 5% off (``--lp-solver ecos``, the
default, solves the LP policies as Gavel's code with ECOS, as its simulator did; needs the
``ecos`` extra). ``ray``
runs five real training jobs on a local Ray head (``paraplan cluster-run``'s engine) and prints
each job's measured JCT over the simulator's. ``chapter`` runs LAS agnostic and aware at
the setting of the chapter's Fig. 5.8 (continuous-single, 36 of each type, jobs 4000-5000).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

import solvers.gavel as gavel
from planner.schema_gavel import ClusterProblem, JobPair, JobsFile
from solvers.gavel.simulator import simulate
from solvers.gavel.throughputs import load_table, read_trace
from solvers.gavel.workload import generate_jobs

SCALE_POLICIES = ("max_min_fairness_perf", "min_total_duration_perf", "fifo_perf", "finish_time_fairness_perf")


def sampled_pairs(jobs: JobsFile, workers: dict[str, int], *, partners: int, seed: int) -> tuple[JobPair, ...]:
    """Up to ``partners`` co-location candidates per job (from Gavel's pair table) that beat
    time slicing; all O(n^2) pairs would dwarf the LP at thousands of jobs."""
    table = load_table()
    rng = np.random.default_rng(seed)
    by_id = {j.id: j for j in jobs.jobs}
    out: dict[tuple[str, str], JobPair] = {}
    ids = [j.id for j in jobs.jobs if j.scale_factor == 1]
    for a in ids:
        for b in rng.choice(ids, size=min(partners, len(ids)), replace=False):
            first, second = sorted((by_id[a], by_id[str(b)]), key=lambda j: (j.job_type or "", j.id))
            if first.id == second.id or (first.id, second.id) in out:
                continue
            entry = table.pairs.get((first.job_type or "", second.job_type or "", 1), {})
            kept = {t: v for t, v in entry.items() if t in workers and _helps(first, second, t, v)}
            if kept:
                out[(first.id, second.id)] = JobPair(jobs=(first.id, second.id), throughputs=kept)
    return tuple(out.values())


def _helps(a, b, t, v) -> bool:  # type: ignore[no-untyped-def]
    ta, tb = a.throughputs.get(t, 0.0), b.throughputs.get(t, 0.0)
    return ta > 0 and tb > 0 and v[0] / ta + v[1] / tb > 1.0


def scale_problem(num_jobs: int, *, space_sharing: bool, seed: int = 0) -> ClusterProblem:
    per_type = max(1, num_jobs // 4)
    workers = {"v100": per_type, "p100": per_type, "k80": per_type}
    jobs = generate_jobs(num_jobs, rate_per_hour=1.0, seed=seed, worker_types=workers, multi_gpu=True)
    pairs = sampled_pairs(jobs, workers, partners=2, seed=seed) if space_sharing else ()
    return ClusterProblem(jobs=jobs.jobs, worker_types=workers, pairs=pairs)


_WARM: set[str] = set()


def _timed(problem: ClusterProblem, policy: str, options: dict, repeats: int = 3) -> tuple[float, float]:
    """Best of ``repeats`` solves, after one warm-up solve of a small problem per policy, so that
    the first ``import cvxpy``/``highspy`` (0.5-1 s) is not counted as solve time."""
    if policy not in _WARM:
        gavel.solve(scale_problem(16, space_sharing="packed" in policy), policy=policy)
        _WARM.add(policy)
    best, objective = float("inf"), 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        allocation = gavel.solve(problem, policy=policy, options=options)
        best, objective = min(best, time.perf_counter() - start), float(allocation.objective or 0.0)
    return best, objective


def run_scale(args: argparse.Namespace) -> None:
    sizes = [n for n in (64, 128, 256, 512, 1024, 2048, 4096) if n <= args.max_jobs]
    print(f"{'policy':34s} {'SS':>3} {'jobs':>5} {'full s':>8} {'k':>3} {'POP s':>8} {'POP/full':>9}")
    for policy in args.policies.split(","):
        ss_policy = policy.replace("_perf", "_packed") if args.space_sharing else policy
        for n in sizes:
            problem = scale_problem(n, space_sharing=args.space_sharing)
            k = max(2, n // 256)
            full_s, full_obj = _timed(problem, ss_policy, {}) if n <= args.max_full else (float("nan"), float("nan"))
            pop_s, pop_obj = _timed(problem, ss_policy, {"num_partitions": k})
            ratio = pop_obj / full_obj if full_obj == full_obj and full_obj else float("nan")
            print(f"{ss_policy:34s} {'yes' if args.space_sharing else 'no':>3} {n:>5} {full_s:8.3f} {k:>3} {pop_s:8.3f} {ratio:9.4f}",
                  flush=True)


def run_sim(args: argparse.Namespace) -> None:
    workers = {"v100": args.per_type, "p100": args.per_type, "k80": args.per_type}
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"{args.jobs} jobs, {args.rate} jobs/h, cluster {workers}, multi-GPU {args.multi_gpu}, seeds {seeds}")
    print(f"{'policy':30s} {'avg JCT h':>10} {'std':>6} {'p95 h':>8} {'makespan h':>11} {'avg FTF':>8}")
    rows = [(p, p, {}) for family in ("max_min_fairness", "fifo", "finish_time_fairness") for p in (family, f"{family}_perf")]
    rows.insert(4, ("fifo_perf, option fifo=lp", "fifo_perf", {"fifo": "lp"}))  # the chapter's LP, not Gavel's greedy
    for name, policy, options in rows if not args.only else [r for r in rows if r[0] == args.only]:
        runs = []
        for seed in seeds:
            jobs = generate_jobs(args.jobs, rate_per_hour=args.rate, seed=seed, worker_types=workers,
                                 multi_gpu=args.multi_gpu)
            runs.append(simulate(jobs, worker_types=workers, policy=policy, seed=seed, options=options))
        jct = np.array([r.avg_jct_s / 3600 for r in runs])
        print(f"{name:30s} {jct.mean():10.2f} {jct.std():6.2f} {np.mean([r.p95_jct_s for r in runs]) / 3600:8.1f} "
              f"{np.mean([r.makespan_s for r in runs]) / 3600:11.1f} {np.mean([r.avg_ftf for r in runs]):8.2f}", flush=True)


TRACE_POLICIES = ("max_min_fairness", "max_min_fairness_perf", "fifo", "fifo_perf", "finish_time_fairness",
                  "finish_time_fairness_perf", "min_total_duration", "min_total_duration_perf")
TRACES = ("artifact_evaluation", "debug", "debug_v2", "medium_test", "small_test")


def trace_path(name: str) -> str:
    return str(Path(gavel.__file__).parent / "data" / "traces" / f"{name}.trace")


def run_traces(args: argparse.Namespace) -> None:
    workers = {t: int(n) for t, n in (part.split(":") for part in args.cluster.split(","))}
    print(f"cluster {workers}, {args.round:.0f} s rounds, {args.mechanism} mechanism; avg JCT and makespan in hours")
    print(f"{'trace':20s} {'policy':28s} {'avg JCT h':>10} {'makespan h':>11} {'rounds':>7}")
    for name in args.traces.split(","):
        jobs = read_trace(trace_path(name), worker_types=workers)
        jct: dict[str, float] = {}
        for policy in args.policies.split(","):
            r = simulate(jobs, worker_types=workers, policy=policy, round_s=args.round, mechanism=args.mechanism, seed=0)
            jct[policy] = r.avg_jct_s
            print(f"{name:20s} {policy:28s} {r.avg_jct_s / 3600:10.4f} {r.makespan_s / 3600:11.4f} {r.num_rounds:7d}",
                  flush=True)
        gains = [f"{p}: {jct[p] / jct[p + '_perf']:.3f}" for p in jct if p + "_perf" in jct]
        print(f"{name:20s} agnostic/aware avg JCT  " + ", ".join(gains), flush=True)


PARITY_POLICIES = {  # Gavel's name -> paraplan's (Gavel's makespan policy is heterogeneity-aware)
    "max_min_fairness": "max_min_fairness", "max_min_fairness_perf": "max_min_fairness_perf",
    "finish_time_fairness": "finish_time_fairness", "finish_time_fairness_perf": "finish_time_fairness_perf",
    "min_total_duration": "min_total_duration_perf", "fifo": "fifo", "fifo_perf": "fifo_perf",
}


def run_parity(args: argparse.Namespace) -> None:
    import json

    ref_file = Path(__file__).resolve().parents[1] / "tests" / "data" / "gavel_reference" / "physical_cluster_traces.json"
    cells = {(c["trace"], c["policy"]): c for c in json.loads(ref_file.read_text())["cells"]}
    workers = {"v100": 4, "p100": 4, "k80": 4}
    options = {"lp_solver": args.lp_solver}
    print(f"4 V100 + 4 P100 + 4 K80, 360 s rounds, seed 0, {args.mechanism} mechanism, lp_solver={args.lp_solver}; hours")
    print("| trace | policy (Gavel's name) | avg JCT, Gavel | avg JCT, paraplan | ratio | makespan, Gavel "
          "| makespan, paraplan | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    within = total = 0
    for name in TRACES:
        jobs = read_trace(trace_path(name), worker_types=workers)
        for gavel_name, ours in PARITY_POLICIES.items():
            ref = cells[name, gavel_name]
            r = simulate(jobs, worker_types=workers, policy=ours, round_s=360.0, mechanism=args.mechanism, seed=0,
                         options=options)
            jct, span = r.avg_jct_s / ref["avg_jct_s"], r.makespan_s / ref["makespan_s"]
            if gavel_name != "fifo":
                total += 2
                within += sum(abs(v - 1) <= 0.05 for v in (jct, span))
            mark = [f"**{v:.3f}**" if abs(v - 1) > 0.05 else f"{v:.3f}" for v in (jct, span)]
            print(f"| {name} | `{gavel_name}` | {ref['avg_jct_s'] / 3600:.4f} | {r.avg_jct_s / 3600:.4f} | {mark[0]} "
                  f"| {ref['makespan_s'] / 3600:.4f} | {r.makespan_s / 3600:.4f} | {mark[1]} |", flush=True)
    print(f"\nwithin 5%, agnostic FIFO excepted: {within} of {total} values (average JCT and makespan)")


def run_chapter(args: argparse.Namespace) -> None:
    workers = {"v100": 36, "p100": 36, "k80": 36}
    lo = args.jobs * 4 // 5
    print(f"{args.jobs} one-GPU jobs at {args.rate} jobs/h on {workers}, {args.mechanism} mechanism, "
          f"average JCT of jobs {lo}-{args.jobs}")
    for seed in (int(x) for x in args.seeds.split(",")):
        jobs = generate_jobs(args.jobs, rate_per_hour=args.rate, seed=seed, worker_types=workers)
        runs = [simulate(jobs, worker_types=workers, policy=p, seed=seed, measure=(lo, args.jobs),
                         mechanism=args.mechanism) for p in ("max_min_fairness", "max_min_fairness_perf")]
        jct = [r.avg_jct_s / 3600 for r in runs]
        print(f"seed {seed}: max_min_fairness {jct[0]:.2f} h, max_min_fairness_perf {jct[1]:.2f} h, "
              f"agnostic/aware {jct[0] / jct[1]:.2f}x, allocations {runs[0].num_allocations:,} / "
              f"{runs[1].num_allocations:,}", flush=True)


GAVEL_REPORTED_S = {256: 0.014, 1024: 0.027}
"""Gavel's figures for its max-min fairness LP (issue 16: 256 and 1,024 jobs); not re-run here."""


def _best_wall_cpu(fn, repeats: int):  # type: ignore[no-untyped-def]
    """(smallest wall time, smallest CPU time, last result) of ``repeats`` calls."""
    wall = cpu = float("inf")
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        result = fn()
        wall, cpu = min(wall, time.perf_counter() - w), min(cpu, time.process_time() - c)
    return wall, cpu, result


def run_lp(args: argparse.Namespace) -> None:
    """The max-min fairness LP (``max_min_fairness_perf``, no space sharing) step by step, best of
    ``--repeats`` after warm-up solves (imports done), wall and CPU milliseconds; beside it, Gavel's
    formulation solved as its code does (cvxpy + ECOS, two LPs: X^iso, then the level) in the same
    process, when ``ecos`` is installed."""

    from solvers.gavel import common, max_min_fairness as mmf

    policy = "max_min_fairness_perf"
    try:
        import ecos  # noqa: F401
        ecos_opts: dict | None = {"lp_solver": "ecos"}
    except ImportError:
        ecos_opts = None
    warm = scale_problem(16, space_sharing=False)
    for options in ({}, ecos_opts):
        if options is not None:
            gavel.solve(warm, policy=policy, options=options)
    print(f"load average {os.getloadavg()[0]:.1f}; best of {args.repeats}; wall / CPU ms")
    print("| jobs | formulation | LP arrays | HiGHS IPM | repair | Allocation | whole `gavel.solve` "
          "| Gavel's formulation, cvxpy + ECOS | Gavel's reported |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.jobs.split(",")):
        p = scale_problem(n, space_sharing=False)
        steps = [_best_wall_cpu(lambda: common.build(p), args.repeats)]
        f = steps[0][2]
        steps.append(_best_wall_cpu(lambda: mmf.direct_lp(f), args.repeats))
        steps.append(_best_wall_cpu(lambda: mmf.highs_ipm(*steps[1][2], policy=policy), args.repeats))
        x = steps[2][2][: f.num_combos * len(f.types)].reshape((f.num_combos, len(f.types)), order="F")
        steps.append(_best_wall_cpu(lambda: common.repair(f, x), args.repeats))
        steps.append(_best_wall_cpu(lambda: common.to_allocation(f, steps[3][2], policy=policy, start_s=0.0,
                                                                 objective=0.0), args.repeats))
        steps.append(_best_wall_cpu(lambda: gavel.solve(p, policy=policy), args.repeats))
        if ecos_opts is not None:
            steps.append(_best_wall_cpu(lambda: gavel.solve(p, policy=policy, options=ecos_opts), max(1, args.repeats // 3)))
        cells = [f"{w * 1e3:.1f} / {c * 1e3:.1f}" for w, c, _ in steps] + ["-"] * (ecos_opts is None)
        reported = GAVEL_REPORTED_S.get(n)
        print(f"| {n} | " + " | ".join(cells) + f" | {f'{reported * 1e3:.0f}' if reported else '-'} |", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}")


RAY_JOBS = [("a", 40.0, 20.0, 60, 0.0), ("b", 30.0, 24.0, 90, 0.0), ("c", 50.0, 10.0, 80, 0.0),
            ("d", 20.0, 18.0, 30, 1.5), ("e", 40.0, 30.0, 40, 2.5)]


def run_ray(args: argparse.Namespace) -> None:
    from planner.cluster_run import run_on_ray

    jobs = JobsFile.model_validate({"jobs": [
        {"id": i, "throughputs": {"v100": v, "p100": p}, "num_steps": n, "arrival_time_s": t * args.round}
        for i, v, p, n, t in RAY_JOBS]})
    print(f"5 jobs on v100:1,p100:1, max_min_fairness_perf, {args.round:g} s rounds: measured / simulated JCT")
    for rep in range(args.repeats):
        mechanism = ("gavel", "paper")[rep % 2]
        for clock in ("accelerator", "wall"):
            r = run_on_ray(jobs, worker_types={"v100": 1, "p100": 1}, policy="max_min_fairness_perf",
                           round_s=args.round, mechanism=mechanism, decision_clock=clock)
            ratios = [j.jct_s / j.sim_jct_s for j in r.jobs]
            same = all(j.num_leases == j.sim_num_leases for j in r.jobs)
            print(f"run {rep} ({mechanism}, {clock} clock): avg JCT {r.avg_jct_s / r.sim_avg_jct_s:.3f}, "
                  f"per job {min(ratios):.3f}-{max(ratios):.3f}, {r.num_rounds} rounds ({r.sim_num_rounds} simulated), "
                  f"{r.num_preemptions} preemptions, leases {'as' if same else 'unlike'} the simulator's, "
                  f"load average {os.getloadavg()[0]:.1f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    s = sub.add_parser("scale")
    s.add_argument("--max-jobs", type=int, default=4096)
    s.add_argument("--max-full", type=int, default=4096)
    s.add_argument("--policies", default=",".join(SCALE_POLICIES))
    s.add_argument("--space-sharing", action="store_true")
    m = sub.add_parser("sim")
    m.add_argument("--jobs", type=int, default=300)
    m.add_argument("--rate", type=float, default=3.0)
    m.add_argument("--per-type", type=int, default=12)
    m.add_argument("--seeds", default="0,1,2")
    m.add_argument("--multi-gpu", action="store_true")
    m.add_argument("--only", help="run one row (its printed name)")
    t = sub.add_parser("traces")
    t.add_argument("--cluster", default="v100:4,p100:4,k80:4")
    t.add_argument("--round", type=float, default=360.0)
    t.add_argument("--traces", default=",".join(TRACES))
    t.add_argument("--policies", default=",".join(TRACE_POLICIES))
    t.add_argument("--mechanism", choices=("gavel", "paper"), default="gavel")
    q = sub.add_parser("parity")
    q.add_argument("--mechanism", choices=("gavel", "paper"), default="gavel")
    q.add_argument("--lp-solver", choices=("ecos", "highs"), default="ecos",
                   help="ecos (needs the ecos extra): the LP policies as Gavel's simulator solved them")
    y = sub.add_parser("ray")
    y.add_argument("--repeats", type=int, default=3)
    y.add_argument("--round", type=float, default=1.0)
    c = sub.add_parser("chapter")
    c.add_argument("--jobs", type=int, default=5000)
    c.add_argument("--rate", type=float, default=5.6)
    c.add_argument("--seeds", default="0")
    c.add_argument("--mechanism", choices=("gavel", "paper"), default="gavel")
    lp = sub.add_parser("lp")
    lp.add_argument("--jobs", default="256,1024")
    lp.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    {"lp": run_lp, "scale": run_scale, "sim": run_sim, "traces": run_traces, "parity": run_parity, "ray": run_ray, "chapter": run_chapter}[args.what](args)


if __name__ == "__main__":
    main()
