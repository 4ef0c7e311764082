"""`paraplan plan --precision`: FP8 linear layers speed the plan up, the plan carries the setting."""

from __future__ import annotations

from planner.cli import main
from tests.planner.contract_helpers import LLAMA_EVEN_PLAN as PLAN
from tests.planner.contract_helpers import llama_plan_json


def test_fp8_plan_is_faster_and_keeps_the_setting() -> None:
    bf16, fp8 = llama_plan_json(), llama_plan_json("--precision", "fp8")
    assert bf16["cluster"]["device"]["compute"] is None  # the preset's constants: BF16
    assert fp8["cluster"]["device"]["compute"]["linear_precision"] == "fp8"
    f_layer = next(la for la in fp8["model"]["layers"] if la["kind"] == "decoder")
    b_layer = next(la for la in bf16["model"]["layers"] if la["kind"] == "decoder")
    assert f_layer["forward_s"] < b_layer["forward_s"]
    assert fp8["predicted"]["iteration_time_s"] < bf16["predicted"]["iteration_time_s"]


def test_fp8_on_a_device_without_fp8_exits_2(capsys) -> None:
    code = main(["plan", "--model", "llama3-8b", "--cluster", "a100-80gb:8", "--precision", "fp8"])
    assert code == 2
    assert "needs an FP8 peak" in capsys.readouterr().err


def test_fp8_mfu_is_labelled_as_of_the_16_bit_peak(capsys) -> None:
    assert main([*PLAN, "--precision", "fp8"]) == 0
    assert "no recompute; of the BF16 peak; linear layers in fp8)" in capsys.readouterr().out
    assert main(PLAN) == 0
    assert "MFU" in (text := capsys.readouterr().out) and "BF16 peak" not in text


def test_the_cli_offers_the_cost_models_precisions() -> None:
    # The parser spells them out (building it loads no cost model): keep them in step.
    import argparse

    from cost_models.compute import LINEAR_PRECISIONS
    from planner.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    flag = next(a for a in sub.choices["plan"]._actions if "--precision" in a.option_strings)
    assert tuple(flag.choices) == LINEAR_PRECISIONS
