"""User-facing text cites papers through docs/references.md, never internal files or line numbers.

The surfaces: the docs, the README, the JSON Schemas, and what the CLI prints (help, solver,
policy and preset lists). ``python scripts/cite_references.py --apply`` rewrites old citations.
"""

from __future__ import annotations

import ast
import re
import tokenize
from pathlib import Path

import pytest

from tests.planner.contract_helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
INTERNAL = re.compile(r"seed \d{3}|(?<![\w/])L\d{3,}(?:[-\u2013]\d+)?(?!\w)|shared/design|shared/data|\b0\d\d_[0-9a-f]{16}\.txt"
                      r"|\.md Sec\.? ?\d")
FIX = "run `python scripts/cite_references.py --apply` (cite through docs/references.md)"


def _internal(text: str) -> list[str]:
    return [line.strip()[:120] for line in text.splitlines() if INTERNAL.search(line)]


@pytest.mark.parametrize("path", sorted([*ROOT.glob("docs/*.md"), ROOT / "README.md", *ROOT.glob("docs/schema/*.json")]),
                         ids=lambda p: p.name)
def test_docs_cite_through_the_bibliography(path: Path) -> None:
    assert _internal(path.read_text(encoding="utf-8")) == [], FIX


@pytest.mark.parametrize("argv", [["solvers"], ["presets"], ["policies"], *[[c, "--help"] for c in (
    "plan", "simulate", "export", "model-info", "schedule", "cluster-sim", "fill", "run", "profile")]])
def test_cli_text_cites_through_the_bibliography(argv: list[str]) -> None:
    outcome = run_cli(argv)
    assert outcome.code == 0
    assert _internal(outcome.out + outcome.err) == [], FIX


def test_every_key_cited_in_the_docs_is_in_the_bibliography() -> None:
    bibliography = (ROOT / "docs" / "references.md").read_text()
    keys = set(re.findall(r"^- \[([\w-]+)\]", bibliography, flags=re.M))
    assert {"narayanan-thesis", "bpipe", "spipe", "pipefill", "stage-ilp", "gavel", "ptdp"} <= keys
    known = {"narayanan-thesis", "pipefill", "stage-ilp", "spipe", "bpipe", "pipedream-2bw"}  # what the script writes
    assert known <= keys


def _message_strings(path: Path) -> list[tuple[int, str]]:
    """String literals that are not docstrings: error messages, plan notes, help text."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}
    with path.open("rb") as fh:
        return [(tok.start[0], tok.string) for tok in tokenize.tokenize(fh.readline)
                if tok.type == tokenize.STRING and tok.start[0] not in docs]


@pytest.mark.parametrize("package", ["planner", "solvers", "cost_models", "runtime_bridge"])
def test_messages_and_notes_cite_through_the_bibliography(package: str) -> None:
    # error messages and plan notes reach users as much as the docs do
    found = [f"{path.relative_to(ROOT)}:{line}: {text[:80]}" for path in sorted((ROOT / package).rglob("*.py"))
             for line, text in _message_strings(path) if INTERNAL.search(text)]
    assert found == [], FIX
