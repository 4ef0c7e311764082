"""Measured versus predicted: the runtime bridge on this machine (CPU, gloo).

For the bundled ``gpt-tiny`` model: profile it (``runtime_bridge.profile``), plan with the
measured profile and with the analytic one (``cost_models.transformer`` on the nominal ``cpu``
device), run each plan for a few steps under torchrun, and print step time measured / predicted.
The one-stage row is the issue's closing-the-loop figure: the profile's per-layer times summed
over the microbatches against the measured step time of a one-stage run.

Run: ``PYTHONPATH=. python bench/runtime.py [--steps N] [--json]`` (about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import sys

from cost_models.models import model_preset
from planner import api
from runtime_bridge.launch import Job, LaunchOptions, launch, summarize
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    cfg = model_preset("gpt-tiny")
    profile = profile_model(cfg, microbatch_size=2, repeats=20)
    rows = []
    for source, model in (("profiled", profile), ("analytic", cfg)):
        for ranks in (1, 2):
            plans = _plans(model, ranks, None if source == "profiled" else 2)
            jobs = [Job(plan=plan, config=cfg, steps=args.steps) for plan in plans]
            for job, records in zip(jobs, launch(jobs, LaunchOptions()) or []):
                report = summarize(job, records)
                rows.append({"costs": source, "ranks": ranks, "schedule": job.plan.schedule,
                             "measured_s": report["step_time_s"],
                             "predicted_s": report["predicted"]["iteration_time_s"],
                             "ratio": report["ratio"]["step_time"], "tokens_per_s": report["tokens_per_s"]})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'costs':9s} {'ranks':>5s} {'schedule':17s} {'measured s':>11s} {'predicted s':>12s} {'ratio':>6s}")
    for r in rows:
        print(f"{r['costs']:9s} {r['ranks']:5d} {r['schedule']:17s} {r['measured_s']:11.4g} "
              f"{r['predicted_s']:12.4g} {r['ratio']:6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
