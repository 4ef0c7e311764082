"""Shared pieces of the CLI contract tests: valid seed documents and an in-process CLI runner."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from planner.cli import main

EXIT_CODES = (0, 2, 3)
"""What a command may return on any input: ok, invalid input, infeasible (1 is our own bug)."""


@dataclass(frozen=True)
class Outcome:
    code: int
    out: str
    err: str


def run_cli(argv: list[str]) -> Outcome:
    """``paraplan ARGV`` in this process (fast), with stdout and stderr captured."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return Outcome(code, out.getvalue(), err.getvalue())


def assert_contract(outcome: Outcome, argv: list[str]) -> None:
    """The exit-code contract: 0, 2 or 3; never a traceback; a refusal says why."""
    where = f"paraplan {' '.join(argv)}\n{outcome.err[-2000:]}"
    assert outcome.code in EXIT_CODES, where
    assert "internal error" not in outcome.err and "Traceback" not in outcome.err, where
    if outcome.code in (2, 3):
        assert "error" in outcome.err, where


PROFILE: dict[str, Any] = {
    "format": "paraplan.profile/v1",
    "name": "toy",
    "microbatch_size": 1,
    "layers": [
        {"name": "a", "kind": "embedding", "forward_s": 0.001, "backward_s": 0.002, "activation_bytes": 1e6,
         "static_bytes": 1e7, "output_bytes": 1e5, "param_bytes": 1e6},
        {"name": "b", "kind": "decoder", "forward_s": 0.004, "backward_s": 0.008, "backward_weight_s": 0.003,
         "static_bytes": 4e7, "output_bytes": 1e5, "param_bytes": 4e6, "flops": 1e9,
         "recompute": {"none": {"activation_bytes": 8e6}, "full": {"activation_bytes": 1e5, "extra_s": 0.004}}},
        {"name": "c", "kind": "head", "forward_s": 0.002, "backward_s": 0.004, "activation_bytes": 2e6,
         "static_bytes": 1e7, "param_bytes": 1e6},
    ],
}

TRANSFORMER: dict[str, Any] = {
    "format": "paraplan.transformer/v1", "name": "tiny", "hidden_size": 64, "num_layers": 4, "num_heads": 4,
    "seq_length": 32, "vocab_size": 128, "ffn_hidden_size": 256,
}

CLUSTER: dict[str, Any] = {
    "format": "paraplan.cluster/v1", "name": "two",
    "device": {"name": "gpu", "memory_bytes": 16e9, "peak_flops": 1e14},
    "num_nodes": 1, "devices_per_node": 2,
    "intra_node_bytes_per_s": 1e11, "inter_node_bytes_per_s": 1e10,
}

JOBS: dict[str, Any] = {
    "format": "paraplan.jobs/v1",
    "jobs": [
        {"id": "a", "throughputs": {"v100": 4.0, "k80": 1.0}, "num_steps": 1000, "weight": 1.0},
        {"id": "b", "throughputs": {"v100": 2.0, "k80": 1.5}, "num_steps": 500, "arrival_time_s": 10.0},
    ],
}

FILL_JOBS: dict[str, Any] = {"jobs": [{"id": "f0", "model": "bert-base", "mode": "inference", "num_samples": 64}]}

GRAPH_TXT = """node1 -- Input0 -- forward_compute_time=0.000, backward_compute_time=0.000, activation_size=602112.0, parameter_size=0.000
node2 -- Conv2d(3, 64) -- forward_compute_time=1.500, backward_compute_time=3.000, activation_size=1000000.0, parameter_size=7000.000
node3 -- ReLU() -- forward_compute_time=0.200, backward_compute_time=0.300, activation_size=1000000.0, parameter_size=0.000
node4 -- Linear(64, 10) -- forward_compute_time=0.500, backward_compute_time=1.000, activation_size=400.0, parameter_size=2600.000
\tnode1 -- node2
\tnode2 -- node3
\tnode3 -- node4
"""

TRACE = "ResNet-18 (batch size 32)\tcmd\tdir\t--num_steps\t0\t1000\t1\t1\t-1\t0\n" \
        "Transformer (batch size 64)\tcmd\tdir\t--num_steps\t0\t500\t1\t1\t-1\t5\n"


LLAMA_EVEN_PLAN = ["plan", "--model", "llama3-8b", "--cluster", "h100:8", "--global-batch", "16", "--solver", "even",
                   "--pipeline", "8", "--microbatch-size", "1"]
"""A small Llama 3 8B plan on one H100 node (the even split): the cost-model flags' tests vary it."""


def llama_plan_json(*extra: str) -> dict[str, Any]:
    """The plan JSON of ``LLAMA_EVEN_PLAN`` with ``extra`` flags (it must succeed)."""
    outcome = run_cli([*LLAMA_EVEN_PLAN, "--json", *extra])
    assert outcome.code == 0, outcome.err
    return json.loads(outcome.out)


@lru_cache(maxsize=1)
def plan_dict() -> dict[str, Any]:
    """A small valid plan: the toy profile on two devices, two stages, even split."""
    from planner import api
    from planner.schema import Cluster, ModelProfile

    problem = api.make_problem(ModelProfile.from_dict(PROFILE), Cluster.from_dict(CLUSTER), num_stages=2,
                               num_microbatches=4)
    return json.loads(api.plan(problem, solver="even").model_dump_json())


def write(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data))
    return path

def refused(argv: list[str], *needles: str) -> str:
    """Run ``argv``; it must exit 2 with each needle in its message. Returns the message."""
    outcome = run_cli(argv)
    assert_contract(outcome, argv)
    assert outcome.code == 2, outcome.err
    for needle in needles:
        assert needle in outcome.err, (needle, outcome.err)
    return outcome.err
