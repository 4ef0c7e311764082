"""Scale of the pipeline solvers: layers x GPUs x solver -> wall time and peak memory.

Each case runs in its own process (``python bench/scale.py --one ...``) so that its peak
resident memory is its own (``os.wait4``); a case past the time limit is killed and shown as
``>LIMIT``. The model is GPT-1.7B's layer shape (hidden 2304) repeated to the given depth, on
A100-80GB nodes of 8 GPUs. The last rows are the absurd counts of issue 14 (10^12 microbatches,
a 10^18 global batch) and GPT-1T's layer shape at 1,536 layers, which fits nowhere.

Run: ``python bench/scale.py [--limit 60] [--layers 1536] [--gpus 64 4096] [--solvers even ptdp]``;
``--simulate`` prints the simulation time of one plan against its microbatch count instead.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

SOLVER_ARGS: dict[str, dict[str, int]] = {
    "even": {},
    "pipedream": {},
    "pipedream-2bw": {},
    "ptdp": {"global_batch_size": 4096},
    "stage-ilp": {"num_stages": 32},
    "merak": {"num_stages": 32},
    "adapipe": {"num_stages": 32},
    "spipe": {},
    "mobius": {},
    "zero-offload": {},
}
ABSURD = [
    ("even", 1536, 64, {"num_stages": 32, "num_microbatches": 10**12}),
    ("pipedream-2bw", 1536, 64, {"num_microbatches": 10**12}),
    ("even", 1536, 64, {"global_batch_size": 10**18}),
]
INFEASIBLE = [("even", 1536, 64, {}), ("even", 1536, 4096, {})]
"""GPT-1T's layer shape repeated to 1,536 layers (12T parameters): no plan fits."""
PROFILES = [("pipedream", 368, 4096, {"memory": 0}, "pipedream:densenet121"),
            ("pipedream", 368, 4096, {"memory": 0, "time_limit_s": 5}, "pipedream:densenet121"),
            ("pipedream", 24, 4096, {"memory": 0}, "pipedream:vgg16")]
"""PipeDream's own profiles at 4,096 GPUs without its memory constraint (with it, every
profile is infeasible there: each worker holds an input per in-flight microbatch). The layer
column is the profile's."""


def run_one(solver: str, num_layers: int, num_gpus: int, extra: dict[str, int], shape: str = "gpt-1.7b") -> None:
    """Plan one case in this process and print its outcome (the parent times it)."""
    from cost_models import models
    from planner import api
    from planner.errors import PlannerError

    extra = dict(extra)
    options = {"memory": bool(extra.pop("memory"))} if "memory" in extra else {}
    config = shape if shape.startswith("pipedream:") else models.model_preset(shape).model_copy(
        update={"num_layers": num_layers, "name": f"gpt-{num_layers}l"})
    try:
        problem = api.make_problem(config, f"a100-80gb:{num_gpus}", **extra)  # type: ignore[arg-type]
        plan = api.plan(problem, solver=solver, options=options)
        d = plan.degrees
        print(f"t={d.tensor} p={d.pipeline} v={d.virtual} d={d.data} m={plan.num_microbatches} {plan.status}")
    except PlannerError as e:
        print(f"{type(e).__name__.replace('Error', '').lower()}: {' '.join(str(e).split())[:90]}")


def measure(solver: str, num_layers: int, num_gpus: int, extra: dict[str, int], limit_s: float,
            shape: str = "gpt-1.7b") -> tuple[str, str, str]:
    """(seconds, peak MiB, outcome) of one case in a child process."""
    args = [sys.executable, __file__, "--one", solver, str(num_layers), str(num_gpus), repr(extra), shape]
    start = time.perf_counter()
    child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    timer_expired = False
    while True:
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() - start > limit_s:
            child.send_signal(signal.SIGKILL)
            timer_expired = True
        time.sleep(0.02)
    elapsed = time.perf_counter() - start
    outcome = child.stdout.read().strip() if child.stdout else ""
    peak_mib = usage.ru_maxrss / 1024
    if timer_expired:
        return f">{limit_s:.0f}", f"{peak_mib:.0f}", "killed at the limit"
    return f"{elapsed:.2f}", f"{peak_mib:.0f}", outcome or f"exit status {status}"


def simulate_rows() -> None:
    """Simulation time against the microbatch count: exact below the cap, extrapolated above."""
    from cost_models import extrapolate, models
    from planner import api

    config = models.model_preset("gpt-1.7b").model_copy(update={"num_layers": 1536, "name": "gpt-1536l"})
    print(f"\n{'simulate: p':>12} {'m':>14} {'actions':>16} {'mode':>13} {'time s':>7} {'iteration s':>14}")
    for m in (256, 1024, 4096, 10**6, 10**12):
        problem = api.make_problem(config, "a100-80gb:64", num_stages=32, num_microbatches=m)
        plan = api.plan(problem, solver="even")
        start = time.perf_counter()
        result = api.simulate(plan)
        elapsed = time.perf_counter() - start
        mode = "extrapolated" if extrapolate.needs_extrapolation(plan) else "exact"
        print(f"{32:>12} {m:>14} {extrapolate.num_actions(plan):>16,} {mode:>13} {elapsed:>7.2f} "
              f"{result.iteration_time_s:>14.6g}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--limit", type=float, default=60.0, help="seconds before a case is killed")
    parser.add_argument("--layers", type=int, nargs="+", default=[1536])
    parser.add_argument("--gpus", type=int, nargs="+", default=[64, 4096])
    parser.add_argument("--solvers", nargs="+", default=list(SOLVER_ARGS))
    parser.add_argument("--no-absurd", action="store_true", help="skip the 10^12-microbatch rows")
    parser.add_argument("--simulate", action="store_true", help="only the simulation time against m")
    args = parser.parse_args()
    if args.one:
        solver, layers, gpus, extra, shape = args.one
        run_one(solver, int(layers), int(gpus), eval(extra), shape)  # noqa: S307 (our own repr of a dict of ints)
        return
    if args.simulate:
        simulate_rows()
        return
    print(f"{'solver':<14} {'shape':<21} {'layers':>6} {'GPUs':>5} {'extra':<32} {'time s':>7} {'peak MiB':>8}  outcome")
    cases = [(s, n, g, SOLVER_ARGS[s], "gpt-1.7b") for n in args.layers for g in args.gpus for s in args.solvers]
    if not args.no_absurd:
        cases += [(*case, "gpt-1.7b") for case in ABSURD] + [(*case, "gpt-1t") for case in INFEASIBLE] + PROFILES
    for solver, layers, gpus, extra, shape in cases:
        seconds, peak, outcome = measure(solver, layers, gpus, extra, args.limit, shape)
        shown = ",".join(f"{k}={v:.0e}" if v >= 10**6 else f"{k}={v}" for k, v in extra.items())
        print(f"{solver:<14} {shape:<21} {layers:>6} {gpus:>5} {shown:<32} {seconds:>7} {peak:>8}  {outcome}", flush=True)


if __name__ == "__main__":
    main()
