"""Rewrite internal citations in user-facing text as citations through docs/references.md.

Internal citations ("seed 001 L4562-4587", bare line numbers "L100", design-file paths
"shared/design/x.md §A.6") point at files a user cannot open. This script replaces them with
bibliography keys: "[narayanan-thesis] ch. 4", "[bpipe]", "[stage-ilp]"... It is idempotent:
run it again after merging branches that add text.

    python scripts/cite_references.py            # list what would change
    python scripts/cite_references.py --apply    # rewrite the default files
    python scripts/cite_references.py --apply solvers/even.py   # or these files

Line numbers above 529 can only be the dissertation (the other source texts are shorter); they
become its chapter. Smaller numbers without a "seed NNN" before them take the file's own paper
(docs/bpipe.md: BPipe) or are dropped where the file has none.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEED_KEYS = {"000": "pipefill", "001": "narayanan-thesis", "002": "stage-ilp", "003": "spipe", "004": "bpipe"}
# The dissertation's chapters by first line of its source text.
THESIS_CHAPTERS = ((74, 1), (570, 2), (2100, 3), (3241, 4), (4777, 5), (6454, 6), (7188, 7))
FILE_KEYS = (("bpipe", "bpipe"), ("pipefill", "pipefill"), ("fill", "pipefill"), ("spipe", "spipe"),
             ("offload", "spipe"), ("mobius", "spipe"), ("stage-ilp", "stage-ilp"), ("stage_ilp", "stage-ilp"))
DESIGN_KEYS = {"stage-ilp-spipe-bpipe": "[stage-ilp]", "ptdp-gavel-cloud": "[narayanan-thesis]",
               "pipedream-2bw": "[pipedream-2bw]", "pipefill": "[pipefill]", "architecture": "",
               "house-style": "", "ecosystem": ""}
DEFAULT_GLOBS = ("docs/*.md", "README.md", "cost_models/data/*.json", "solvers/__init__.py", "planner/*.py")

_LREF = r"L\d{3,}(?:[-\u2013]\d+)?"
_LREFS = rf"{_LREF}(?:(?:, ?| and ){_LREF})*"
_SHORT = r"L\d{2,}(?:[-\u2013]\d+)?"  # after "seed NNN" two digits are a line number too
_SEEDED = re.compile(rf"seed (\d{{3}})(?:,? ?({_SHORT}(?:(?:, ?| and ){_SHORT})*))?")
_BARE = re.compile(rf"(?<![\w/])(?:seed )?({_LREFS}|(?<=\()L\d{{2}}(?:[-\u2013]\d+)?(?=\)))(?!\w)")
_SEED_FILE = re.compile(r"(?:seed )?`?(0\d\d)_[0-9a-f]{16}\.txt`?")
_DESIGN = re.compile(r"(?<!`)`?(?:shared/design/|\.\./design/)([\w-]+)\.md`?(?!`)(?: ?(?:\u00a7|Sec\. ?)[\w.]+)?"
                     r"|(?<!`)`?shared/data/[\w./-]+`?(?!`)(?: ?(?:\u00a7|Sec\. ?)[\w.]+)?"
                     r"|(?<![\w/])(stage-ilp-spipe-bpipe|ptdp-gavel-cloud|house-style|ecosystem)\.md`?(?: ?(?:\u00a7|Sec\. ?)[\w.]+(?: item \d+)?)?")


def _chapter(line_number: int) -> int:
    return max(ch for first, ch in THESIS_CHAPTERS if line_number >= first) if line_number >= 74 else 1


def _cite(key: str | None, refs: str) -> str:
    numbers = [int(n) for n in re.findall(r"L?(\d{3,})(?:[-\u2013]\d+)?", refs)] if refs else []
    if key is None and numbers and numbers[0] >= 530:
        key = "narayanan-thesis"
    if key is None:
        return ""
    if key == "narayanan-thesis" and numbers:
        chapters = sorted({_chapter(n) for n in numbers})
        return f"[{key}] ch. " + ", ".join(str(c) for c in chapters)
    return f"[{key}]"


def _file_key(path: Path) -> str | None:
    name = path.name.lower()
    return next((key for part, key in FILE_KEYS if part in name), None)


def rewrite(text: str, path: Path) -> str:
    """The text with every internal citation replaced; lines without one are left untouched."""
    default = _file_key(path)
    return "".join(_rewrite_line(line, default) for line in text.splitlines(keepends=True))


def _rewrite_line(line: str, default: str | None) -> str:
    new = _DESIGN.sub(lambda m: DESIGN_KEYS.get(m.group(1) or m.group(2) or "", ""), line)
    new = _SEED_FILE.sub(lambda m: f"[{SEED_KEYS[m.group(1)]}]" if m.group(1) in SEED_KEYS else m.group(0), new)
    new = _SEEDED.sub(lambda m: _cite(SEED_KEYS[m.group(1)], m.group(2) or ""), new)
    new = _BARE.sub(lambda m: _cite(default, m.group(1)), new)
    return line if new == line else _tidy(new)


def _tidy(line: str) -> str:
    """Punctuation left behind by a removed citation, on a rewritten line only."""
    for pattern, repl in ((r"\[([\w-]+)\](?: ch\. [\d, ]+)?[;,]? \[\1\]( ch\. [\d, ]+)?", r"[\1]\2"),
                          (r"`(\[[\w-]+\])`", r"\1"), (r" ?\(\s*[;,]?\s*\)", ""), (r"\(\s*[;,]\s*", "("),
                          (r"\s*[;,]\s*\)", ")"), (r" +([,;)])", r"\1"), (r", ,", ","), (r"\), (?=\")", ")"), (r"(?<=[,;])  \(", " ("),
                          (r" ?\[\]", "")):
        line = re.sub(pattern, repl, line)
    return line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apply", action="store_true", help="rewrite the files (default: list the changes)")
    parser.add_argument("paths", nargs="*", help=f"files (default: {', '.join(DEFAULT_GLOBS)})")
    args = parser.parse_args(argv)
    paths = [Path(p) for p in args.paths] or sorted({p for g in DEFAULT_GLOBS for p in ROOT.glob(g)})
    changed = 0
    for path in paths:
        old = path.read_text(encoding="utf-8")
        new = rewrite(old, path)
        if new != old:
            changed += 1
            if args.apply:
                path.write_text(new, encoding="utf-8")
            else:
                for a, b in zip(old.splitlines(), new.splitlines()):
                    if a != b:
                        print(f"{path}:\n  - {a.strip()[:150]}\n  + {b.strip()[:150]}")
    print(f"{changed} file(s) {'rewritten' if args.apply else 'would change'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
