"""Gavel benchmarks: policy solve time vs jobs (full and POP-partitioned), and simulations.

Usage::

    PYTHONPATH=. python bench/gavel.py scale [--max-jobs 4096] [--policies a,b] [--space-sharing]
    PYTHONPATH=. python bench/gavel.py sim [--jobs 300] [--rate 3.0] [--seeds 0,1,2]

``scale`` prints (best of 3, imports warmed up first), per policy and job count (64 to 4096; cluster of equal V100/P100/K80
counts growing with the jobs, as in the chapter's Fig. 5.14), the full LP's solve time, the
partitioned solve time with k = jobs/256 sub-problems (at least 2), and the partitioned
objective relative to the full one. Full solves above ``--max-full`` jobs are skipped.
``sim`` runs each policy family agnostic and heterogeneity-aware on the same Poisson traces
and prints the average JCT (the chapter's Figs. 5.9-5.11 comparison).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import solvers.gavel as gavel
from planner.schema_gavel import ClusterProblem, JobPair, JobsFile
from solvers.gavel.simulator import simulate
from solvers.gavel.throughputs import load_table
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
    for family in ("max_min_fairness", "fifo", "finish_time_fairness"):
        for policy in (family, f"{family}_perf"):
            runs = []
            for seed in seeds:
                jobs = generate_jobs(args.jobs, rate_per_hour=args.rate, seed=seed, worker_types=workers,
                                     multi_gpu=args.multi_gpu)
                runs.append(simulate(jobs, worker_types=workers, policy=policy, seed=seed))
            jct = np.array([r.avg_jct_s / 3600 for r in runs])
            print(f"{policy:30s} {jct.mean():10.2f} {jct.std():6.2f} {np.mean([r.p95_jct_s for r in runs]) / 3600:8.1f} "
                  f"{np.mean([r.makespan_s for r in runs]) / 3600:11.1f} {np.mean([r.avg_ftf for r in runs]):8.2f}", flush=True)


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
    args = parser.parse_args()
    run_scale(args) if args.what == "scale" else run_sim(args)


if __name__ == "__main__":
    main()
