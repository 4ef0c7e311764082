"""`paraplan plan --attention`: the attention kernel sets the activation memory of every solver."""

from __future__ import annotations

import json

from planner.cli import main


def _plan(capsys, *extra: str) -> dict:  # type: ignore[type-arg]
    code = main(["plan", "--model", "gpt-1.7b", "--cluster", "a100-80gb:1x8", "--global-batch", "64",
                 "--pipeline", "4", "--json", *extra])
    assert code == 0
    return json.loads(capsys.readouterr().out)


def test_unfused_attention_keeps_the_scores(capsys) -> None:
    flash = _plan(capsys, "--solver", "even")
    unfused = _plan(capsys, "--solver", "even", "--attention", "unfused")
    # gpt-1.7b (a = 24, s = 2048, h = 2304): the scores add 5as/h = 107 bytes per token and hidden unit to
    # 34, so the first stage's 4 in-flight microbatches hold far more without recompute
    assert max(unfused["predicted"]["peak_memory_bytes"]) > 1.5 * max(flash["predicted"]["peak_memory_bytes"])


def test_ptdp_takes_the_flag_as_its_option(capsys) -> None:
    plan = _plan(capsys, "--solver", "ptdp", "--attention", "unfused")
    assert plan["options"]["attention"] == "unfused"


def test_unknown_attention_exits_2(capsys) -> None:
    code = main(["plan", "--model", "gpt-1.7b", "--cluster", "a100-80gb:1", "--attention", "sdpa"])
    err = capsys.readouterr().err
    assert code == 2 and "--attention" in err and "'sdpa'" in err and "Traceback" not in err
