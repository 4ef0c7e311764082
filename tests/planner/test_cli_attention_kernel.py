"""`paraplan plan --attention-kernel`: the flash-attention family the stack runs sets the attention
core's rate (docs/cost-model.md, "Attention core"); the plan carries it; a family the device does not
list, in the flag or in a cluster file, is refused with exit 2."""

from __future__ import annotations

import json

import pytest

from cost_models.compute import compute_constants
from planner import api
from planner.cli import main
from planner.errors import InvalidProblemError

from tests.planner.contract_helpers import llama_plan_json as _plan


def _decoder(plan: dict) -> dict:  # type: ignore[type-arg]
    return next(la for la in plan["model"]["layers"] if la["kind"] == "decoder")


def test_slower_family_slows_only_the_attention_core() -> None:
    """H100: fa3 (the default, 0.59 of peak) against fa2 (0.35): the decoder's selective-recompute
    time (its attention core's forward) grows by 0.59 / 0.35 less the launch, the plan is slower,
    and the plan JSON keeps the family."""
    fa3, fa2 = _plan(), _plan("--attention-kernel", "fa2")
    assert fa2["cluster"]["device"]["compute"]["attention_kernel"] == "fa2"
    launch = compute_constants(api.load_cluster("h100:8").device).kernel_launch_s
    core3 = _decoder(fa3)["recompute"]["selective"]["extra_s"] - launch
    core2 = _decoder(fa2)["recompute"]["selective"]["extra_s"] - launch
    assert core2 == pytest.approx(core3 * 0.59 / 0.35, rel=1e-9)
    assert fa2["predicted"]["iteration_time_s"] > fa3["predicted"]["iteration_time_s"]


def test_the_api_takes_the_same_setting() -> None:
    problem = api.make_problem("llama3-8b", "h100:8", global_batch_size=16, attention_kernel="fa1")
    assert problem.cluster.device is not None
    assert compute_constants(problem.cluster.device).attention_kernel == "fa1"


def test_a_family_the_device_does_not_list_exits_2(capsys) -> None:
    code = main(["plan", "--model", "llama3-8b", "--cluster", "a100-80gb:8", "--attention-kernel", "fa3"])
    assert code == 2
    err = capsys.readouterr().err
    assert "attention_kernel='fa3'" in err and "it lists: fa1, fa2" in err
    with pytest.raises(InvalidProblemError, match="fa9"):
        api.make_problem("llama3-8b", "h100:8", attention_kernel="fa9")


def test_a_cluster_file_naming_an_unlisted_family_is_refused(tmp_path, capsys) -> None:
    cluster = api.load_cluster("h100:8").model_dump(mode="json")
    cluster["device"]["compute"] = {"num_sms": 132, "attention_kernel": "fa4", "attention_fractions": {"fa3": 0.59}}
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(cluster))
    code = main(["plan", "--model", "llama3-8b", "--cluster", str(path), "--global-batch", "16"])
    assert code == 2
    err = capsys.readouterr().err
    assert "attention_kernel='fa4'" in err and "attention_fractions" in err


def test_blackwell_lists_cudnn_and_fa4_not_fa3(capsys) -> None:
    """B200: cuDNN's fused attention is the default (0.50 of peak), FlashAttention-4 (0.65) is faster,
    FlashAttention-3 (Hopper-only) is refused with the families the device does list."""
    default = api.make_problem("llama3-8b", "b200:8", global_batch_size=16)
    fa4 = api.make_problem("llama3-8b", "b200:8", global_batch_size=16, attention_kernel="fa4")
    assert default.cluster.device is not None and fa4.cluster.device is not None
    assert compute_constants(default.cluster.device).attention_kernel == "cudnn"
    assert compute_constants(fa4.cluster.device).attention_fractions["fa4"] > \
        compute_constants(default.cluster.device).attention_fractions["cudnn"]
    code = main(["plan", "--model", "llama3-8b", "--cluster", "b200:8", "--attention-kernel", "fa3"])
    assert code == 2
    assert "it lists: cudnn, fa1, fa2, fa4" in capsys.readouterr().err


def test_cudnn_names_the_same_kernel_on_hopper() -> None:
    """A Transformer Engine stack names its attention `cudnn` on Hopper and Blackwell alike; on H100 it
    runs at FlashAttention-3's rate (the default), so the plan is the same."""
    fa3, cudnn = _plan(), _plan("--attention-kernel", "cudnn")
    assert cudnn["cluster"]["device"]["compute"]["attention_kernel"] == "cudnn"
    assert cudnn["predicted"]["iteration_time_s"] == fa3["predicted"]["iteration_time_s"]
