"""User-facing text cites papers through docs/references.md, never internal files or line numbers.

The surfaces: the docs, the README, the JSON Schemas, and what the CLI prints (help, solver,
policy and preset lists). ``python scripts/cite_references.py --apply`` rewrites old citations.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.planner.contract_helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
INTERNAL = re.compile(r"seed \d{3}|(?<![\w/])L\d{3,}(?:[-\u2013]\d+)?(?!\w)|shared/design|shared/data|\b0\d\d_[0-9a-f]{16}\.txt")
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
