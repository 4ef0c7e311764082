"""`paraplan plan --kernels`: eager PyTorch's elementwise chains cost time, the plan carries the setting."""

from __future__ import annotations

import json

import pytest

from cost_models import layer_ops
from cost_models.compute import compute_constants
from planner import api
from planner.cli import main
from planner.errors import InvalidProblemError


def _plan(capsys, *extra: str) -> dict:  # type: ignore[type-arg]
    code = main(["plan", "--model", "llama3-8b", "--cluster", "a100-80gb:8", "--global-batch", "16", "--solver",
                 "even", "--pipeline", "8", "--microbatch-size", "1", "--json", *extra])
    assert code == 0
    return json.loads(capsys.readouterr().out)


def test_eager_kernels_slow_the_plan_by_the_extra_traffic(capsys) -> None:
    """Same plan, eager chains: every decoder layer's forward grows by the eager bytes over the A100's
    achieved bandwidth (2,039 GB/s x 0.8) plus 23 launches; the plan JSON keeps the setting."""
    fused, eager = _plan(capsys), _plan(capsys, "--kernels", "eager")
    assert eager["cluster"]["device"]["compute"]["elementwise_kernels"] == "eager"
    f_layer = next(la for la in fused["model"]["layers"] if la["kind"] == "decoder")
    e_layer = next(la for la in eager["model"]["layers"] if la["kind"] == "decoder")
    extra, _ = layer_ops.eager_extra_bytes(api.load_model("llama3-8b"), 8192, 1, True)
    expected = extra / (2039e9 * 0.8) + 23 * 4e-6
    assert e_layer["forward_s"] - f_layer["forward_s"] == pytest.approx(expected, rel=1e-6)
    assert eager["predicted"]["iteration_time_s"] > fused["predicted"]["iteration_time_s"]


def test_fused_is_the_default() -> None:
    problem = api.make_problem("llama3-8b", "h100:8")
    assert problem.cluster.device is not None
    assert compute_constants(problem.cluster.device).elementwise_kernels == "fused"


def test_unknown_kernels_are_refused() -> None:
    with pytest.raises(InvalidProblemError, match="kernels='sdpa'"):
        api.make_problem("llama3-8b", "h100:8", kernels="sdpa")
    code = main(["plan", "--model", "llama3-8b", "--cluster", "a100-80gb:1", "--kernels", "sdpa"])
    assert code == 2
