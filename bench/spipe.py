"""Benchmark of spipe against the Mobius-style and ZeRO-Offload-style baselines (issue 8, seed 003 Sec. 5.2).

The paper's grid (L268, L287): models 10B/19B on 1 node, 30B/40B on 2, 52B/69B on 4, 88B/110B on
8 nodes of 4 V100 32 GB; SEQ 1024 and 2048; microbatch size 2; global batch 16 x nodes; Mobius
with 2 stages per GPU, SPipe with 2 forward and 6 backward stages per GPU. Every plan is timed by
the engine's offload model (``cost_models.sim.offload``). The cluster is SPipe's (Table 1): a
PCIe Gen3 x16 link per GPU, no NVLink (GPU peer traffic over PCIe, taken as 10 GB/s, and with
``peer_over_host_link`` holding the host links it crosses, so peer copies and collectives queue
with prefetches and gradient offloads; ``--no-pcie-contention`` gives them their own links), one
200 Gb/s HDR NIC per node shared by its 4 GPUs (6.25 GB/s each). The paper's geometric-mean speedups
(L289; reading B.9) are printed beside ours.

Usage:

    PYTHONPATH=. python bench/spipe.py                 # the grid, paper configurations
    PYTHONPATH=. python bench/spipe.py --sweep          # also let the spipe solver choose
    PYTHONPATH=. python bench/spipe.py --fig15          # 19B ablation setting of Fig. 15
"""

from __future__ import annotations

import argparse
import math
import time

import solvers
from cost_models.models import model_preset
from planner import api
from planner.errors import PlannerError
from planner.schema import Cluster

GRID = (("spipe-10b", 1), ("spipe-19b", 1), ("spipe-30b", 2), ("spipe-40b", 2),
        ("spipe-52b", 4), ("spipe-69b", 4), ("spipe-88b", 8), ("spipe-110b", 8))
PAPER_V100 = {"zero-offload": 4.13, "mobius": 1.26}
"""Seed 003 L289 (DeepSpeed, Mobius); the artifact csv gives Mobius 1.306 with labels swapped (B.9)."""


def spipe_cluster(num_nodes: int) -> Cluster:
    """SPipe's V100 cluster (Table 1, L247-254)."""
    return Cluster.from_dict({
        "name": f"spipe-v100:{num_nodes}x4",
        "device": {"name": "v100", "memory_bytes": 34359738368, "peak_flops": 125e12,
                   "memory_bandwidth_bytes_per_s": 900e9, "host_link_bytes_per_s": 15.75e9},
        "num_nodes": num_nodes, "devices_per_node": 4,
        "intra_node_bytes_per_s": 10e9, "inter_node_bytes_per_s": 6.25e9,
        "intra_node_latency_s": 1e-5, "inter_node_latency_s": 1e-5,
    })


def run(model: str, nodes: int, seq: int, *, batch: int, sweep: bool, peer_over_pcie: bool = True) -> dict[str, float]:
    """Iteration times of the three systems (plus the sweep's choice) for one grid point."""
    cfg = model_preset(model).model_copy(update={"seq_length": seq})
    problem = api.make_problem(cfg, spipe_cluster(nodes), microbatch_size=2, global_batch_size=batch)
    host = {"peer_over_host_link": peer_over_pcie}
    runs = {
        "spipe": ("spipe", {"forward_per_gpu": 2, "backward_per_gpu": 6, "microbatch_size": 2, **host}),
        "mobius": ("mobius", {"stages_per_gpu": 2, "microbatch_size": 2, **host}),
        "zero-offload": ("zero-offload", {"microbatch_size": 2, **host}),
    }
    if sweep:
        runs["spipe-sweep"] = ("spipe", {"microbatch_size": 2, **host})
    plans, out = {}, {}
    for name, (solver, options) in runs.items():
        try:
            plans[name] = solvers.solve(problem, solver=solver, options=options)
            out[name] = plans[name].predicted.iteration_time_s
        except PlannerError:
            out[name] = math.nan  # out of GPU or CPU memory in our model
    if sweep and "spipe-sweep" in plans:
        sec = plans["spipe-sweep"].offload
        assert sec is not None
        out["sweep_config"] = f"{sec.forward_stages_per_gpu}/{sec.backward_stages_per_gpu}"  # type: ignore[assignment]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweep", action="store_true", help="also run the spipe sweep at every point")
    parser.add_argument("--fig15", action="store_true", help="19B, SEQ 1024, uBS 2, MBS 8 (Fig. 15 setting)")
    parser.add_argument("--seqs", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--no-pcie-contention", action="store_true",
                        help="give GPU peer copies their own links (as before the shared-link engine)")
    args = parser.parse_args()
    points = [("spipe-19b", 1, 1024, 8)] if args.fig15 else [
        (m, n, s, 16 * n) for m, n in GRID for s in args.seqs]
    ratios: dict[str, list[float]] = {"mobius": [], "zero-offload": []}
    print("| model | nodes | SEQ | spipe 2/6 (s) | mobius (s) | zero-offload (s) | mobius/spipe | zero/spipe |"
          + (" sweep (s) | sweep config |" if args.sweep else ""))
    print("|---|---|---|---|---|---|---|---|" + ("---|---|" if args.sweep else ""))
    start = time.perf_counter()
    for model, nodes, seq, batch in points:
        t = run(model, nodes, seq, batch=batch, sweep=args.sweep, peer_over_pcie=not args.no_pcie_contention)
        for k in ratios:
            if not math.isnan(t[k] / t["spipe"]):
                ratios[k].append(t[k] / t["spipe"])
        extra = f" {t['spipe-sweep']:.2f} | {t.get('sweep_config', 'OOM')} |" if args.sweep else ""
        cell = lambda x: "OOM" if math.isnan(x) else f"{x:.2f}"  # noqa: E731
        print(f"| {model} | {nodes} | {seq} | {cell(t['spipe'])} | {cell(t['mobius'])} | {cell(t['zero-offload'])} | "
              f"{cell(t['mobius'] / t['spipe'])} | {cell(t['zero-offload'] / t['spipe'])} |{extra}")
    for k, values in ratios.items():
        geo = math.exp(sum(math.log(v) for v in values) / len(values))
        print(f"geomean {k}/spipe: ours {geo:.2f}, paper (V100) {PAPER_V100[k]:.2f}")
    print(f"({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
