"""Small problems shared by the Gavel tests."""

from __future__ import annotations

import numpy as np

from planner.schema_gavel import ClusterProblem


def problem(throughputs: list[dict[str, float]], workers: dict[str, int], **fields: list) -> ClusterProblem:
    """Jobs j0, j1... with the given throughputs; ``fields`` gives per-job lists (scale_factor...)."""
    jobs = []
    for m, thr in enumerate(throughputs):
        job = {"id": f"j{m}", "throughputs": thr}
        job.update({key: values[m] for key, values in fields.items()})
        jobs.append(job)
    return ClusterProblem.from_dict({"jobs": jobs, "worker_types": workers})


def random_problem(rng: np.random.Generator, num_jobs: int, *, pairs: bool = False) -> ClusterProblem:
    """Three types, random throughputs (some zero), scale factors up to the smallest type."""
    workers = {"v100": int(rng.integers(1, 5)), "p100": int(rng.integers(1, 5)), "k80": int(rng.integers(2, 6))}
    jobs = []
    for m in range(num_jobs):
        thr = {t: float(rng.uniform(0.5, 20)) * (rng.random() > 0.2) for t in workers}
        thr["k80"] = max(thr["k80"], 0.1)
        scale = int(rng.choice([1, 1, 2]))
        jobs.append({"id": f"j{m}", "throughputs": thr, "scale_factor": scale, "weight": float(rng.choice([1.0, 2.0])),
                     "num_steps": float(rng.uniform(1e3, 1e5)), "arrival_time_s": float(rng.uniform(0, 100)),
                     "slo_s": None})
    pair_list = []
    if pairs:
        for a in range(num_jobs):
            for b in range(a + 1, num_jobs):
                if jobs[a]["scale_factor"] == jobs[b]["scale_factor"] and rng.random() < 0.3:
                    t = str(rng.choice(list(workers)))
                    pair_list.append({"jobs": [f"j{a}", f"j{b}"], "throughputs": {
                        t: (0.7 * jobs[a]["throughputs"][t], 0.6 * jobs[b]["throughputs"][t])}})
    return ClusterProblem.from_dict({"jobs": jobs, "worker_types": workers, "pairs": pair_list})


def assert_feasible(problem: ClusterProblem, allocation) -> None:  # type: ignore[no-untyped-def]
    """(5.1)-(5.3): fractions in [0, 1], each job's sum <= 1, each type's capacity, scale factors."""
    scale = {j.id: j.scale_factor for j in problem.jobs}
    used = dict.fromkeys(problem.worker_types, 0.0)
    for job in problem.jobs:
        row = allocation.allocation[job.id]
        assert all(0.0 <= v <= 1.0 for v in row.values())
        assert sum(row.values()) <= 1.0 + 1e-9, (job.id, row)
        for t, v in row.items():
            if v > 0:
                assert (job.throughputs or {}).get(t, 0.0) > 0 or any(job.id in p.jobs for p in allocation.pairs)
                assert problem.worker_types[t] >= job.scale_factor
    # Capacity counts a pair once: subtract each pair's second member.
    for job in problem.jobs:
        for t, v in allocation.allocation[job.id].items():
            used[t] += v * scale[job.id]
    for pair in allocation.pairs:
        for t, v in pair.fractions.items():
            used[t] -= v * scale[pair.jobs[1]]
    for t, cap in problem.worker_types.items():
        assert used[t] <= cap * (1 + 1e-9) + 1e-9, (t, used[t], cap)
