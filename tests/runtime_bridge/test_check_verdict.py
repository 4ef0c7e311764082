"""``run --check``'s verdict is explicit, not an ``assert``: a rank that reported no gradients
fails the check under ``python -O`` too (issue 14, known bugs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import types, torch
from runtime_bridge.check import compare
plan = types.SimpleNamespace(num_microbatches=1)
ref_losses, ref_grads = [[1.0]], [{"a": torch.zeros(2), "b": torch.zeros(2)}]
whole = [{"replica": 0, "losses": [[1.0]], "grads": [{"a": torch.zeros(2), "b": torch.zeros(2)}]}]
missing = [{"replica": 0, "losses": [[1.0]], "grads": [{"a": torch.zeros(2)}]}]
silent = [{"replica": 0, "losses": [[]], "grads": [{"a": torch.zeros(2), "b": torch.zeros(2)}]}]
print(compare(plan, whole, ref_losses, ref_grads)["check_failures"])
print(compare(plan, missing, ref_losses, ref_grads)["check_failures"])
print(compare(plan, silent, ref_losses, ref_grads)["check_failures"])
"""


def _verdicts(optimize: list[str]) -> list[str]:
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, *optimize, "-c", SCRIPT], cwd=root, capture_output=True, text=True,
                         env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()


def test_a_missing_rank_fails_the_check_with_and_without_asserts(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    exec(SCRIPT, {})  # in this process (asserts on)
    plain = capsys.readouterr().out.strip().splitlines()
    for whole, missing, silent in (plain, _verdicts(["-O"])):  # and under python -O (asserts stripped)
        assert whole == "[]"
        assert "no rank reported gradients of ['b']" in missing
        assert "no rank reported a loss" in silent
