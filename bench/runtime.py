"""Measured versus predicted: the runtime bridge on this machine (CPU, gloo).

For a bundled-model config (default ``gpt-tiny``; ``--model docs/examples/llama-tiny.json``): profile it (``runtime_bridge.profile``), plan with the
measured profile and with the analytic one (``cost_models.transformer`` on the nominal ``cpu``
device), run each plan for a few steps under torchrun, and print step time measured / predicted.
The one-stage row is the issue's closing-the-loop figure: the profile's per-layer times summed
over the microbatches against the measured step time of a one-stage run. Because the machine may
be shared, that loop (profile, plan, run, back to back so that both see the same load) is also
repeated ``--loops`` times and the ratios and their median are printed.

Run: ``PYTHONPATH=. python bench/runtime.py [--model M] [--steps N] [--loops K] [--loops-only] [--json]``
(about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from planner import api
from runtime_bridge.launch import RunJob, LaunchOptions, launch, summarize
from runtime_bridge.profile import profile_model

_CASES = (  # (ranks, schedule, stages, microbatch count)
    (1, "gpipe", 1, 4),
    (2, "1f1b", 2, 4),
    (2, "zb-h1", 2, 4),
    (2, "interleaved-1f1b", 2, 4),
)


def _plans(model: object, ranks: int, microbatch_size: int | None) -> list:
    """The cases for one rank count; a measured profile fixes b itself (microbatch_size None)."""
    return [
        api.plan(api.make_problem(model, f"cpu:{ranks}", num_stages=p, schedule=schedule,
                                  num_chunks=2 if schedule == "interleaved-1f1b" else 1,
                                  global_batch_size=2 * m, microbatch_size=microbatch_size))
        for n, schedule, p, m in _CASES if n == ranks
    ]


def _loop_ratios(cfg: object, loops: int, steps: int, clock: str = "wall") -> list[float]:
    """measured / predicted of the one-stage GPipe case, profile -> plan -> run back to back;
    ``clock="cpu"``: the profile in process CPU time against the run's CPU time per step."""
    ratios = []
    for _ in range(loops):
        profile = profile_model(cfg, microbatch_size=2, repeats=20, num_microbatches=4, clock=clock)
        (plan,) = _plans(profile, 1, None)
        job = RunJob(plan=plan, config=cfg, steps=steps)
        ratio = summarize(job, launch([job], LaunchOptions())[0])["ratio"]
        ratios.append(ratio["step_cpu_time" if clock == "cpu" else "step_time"])
    return ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--loops", type=int, default=5, help="closing-the-loop repeats (one-stage GPipe)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--model", default="gpt-tiny",
                        help="preset or transformer JSON (docs/examples/llama-tiny.json, mixtral-tiny.json)")
    parser.add_argument("--loops-only", action="store_true", help="only the closing-the-loop repeats")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="closing-the-loop clock: cpu compares process CPU times (a shared, loaded host)")
    args = parser.parse_args(argv)
    cfg = api.load_model(args.model)
    rows: list[dict] = []
    sources = () if args.loops_only else (
        ("profiled", profile_model(cfg, microbatch_size=2, repeats=20, num_microbatches=4)),  # every case has m = 4
        ("analytic", cfg))
    for source, model in sources:
        for ranks in (1, 2):
            plans = _plans(model, ranks, None if source == "profiled" else 2)
            jobs = [RunJob(plan=plan, config=cfg, steps=args.steps) for plan in plans]
            for job, records in zip(jobs, launch(jobs, LaunchOptions()) or []):
                report = summarize(job, records)
                rows.append({"costs": source, "ranks": ranks, "schedule": job.plan.schedule,
                             "measured_s": report["step_time_s"],
                             "predicted_s": report["predicted"]["iteration_time_s"],
                             "ratio": report["ratio"]["step_time"], "tokens_per_s": report["tokens_per_s"]})
    loops = _loop_ratios(cfg, args.loops, args.steps, args.clock)
    if args.json:
        print(json.dumps({"rows": rows, "loop_ratios": loops}, indent=2))
        return 0
    print(f"{'costs':9s} {'ranks':>5s} {'schedule':17s} {'measured s':>11s} {'predicted s':>12s} {'ratio':>6s}")
    for r in rows:
        print(f"{r['costs']:9s} {r['ranks']:5d} {r['schedule']:17s} {r['measured_s']:11.4g} "
              f"{r['predicted_s']:12.4g} {r['ratio']:6.3f}")
    if loops:
        print(f"closing the loop (1 rank, gpipe, {args.clock} clock), {len(loops)} x profile + run: ratios "
              f"{', '.join(f'{x:.3f}' for x in loops)}; median {statistics.median(loops):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
