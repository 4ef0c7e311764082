"""Move cluster specs written under the old shorthand (``DEVICE:N`` = N nodes of 8) to the
current one (``DEVICE:N`` = N devices; docs/input-formats.md, Cluster specs).

For merges of branches written before the change: only lines that differ from REF (the
branch's state before the merge, where every spec was already converted) are rewritten, so
converted lines are never multiplied twice. Scheduling lists (``v100:4,k80:2``, Gavel
commands) always counted accelerators and are left alone; ``NODESxPER_NODE`` specs too.

    git merge other-branch                                        # written under the old rule
    python scripts/convert_cluster_specs.py ORIG_HEAD             # show what would change
    python scripts/convert_cluster_specs.py ORIG_HEAD --apply     # rewrite the files

(ORIG_HEAD is this branch before the merge.)

Review the output: a bare count meant nodes only for the preset GPU devices (8 per node), and
f-strings (``f"a100-80gb:{n}"``) are listed for a manual look, not rewritten.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_DATA = json.loads((ROOT / "cost_models" / "data" / "hardware.json").read_text())
_NAMES = sorted((set(_DATA["devices"]) | set(_DATA["aliases"])) - {"cpu"}, key=len, reverse=True)
SPEC = re.compile(r"\b(" + "|".join(map(re.escape, _NAMES)) + r"):(\d+)(?![\dx{,])")
FSTRING = re.compile(r"\b(" + "|".join(map(re.escape, _NAMES)) + r"):\{")
SCHEDULING = re.compile(r"cluster-sim|cluster-run|\"schedule\"|paraplan schedule|[a-z0-9]:\d+,|worker_types")


def _old_lines(ref: str, path: str) -> set[str]:
    try:
        return set(subprocess.check_output(["git", "show", f"{ref}:{path}"], cwd=ROOT, text=True,
                                           stderr=subprocess.DEVNULL).split("\n"))
    except subprocess.CalledProcessError:
        return set()


def convert(ref: str, apply: bool) -> int:
    changed = 0
    for path in subprocess.check_output(["git", "ls-files"], cwd=ROOT, text=True).split():
        if not path.endswith((".py", ".md", ".json", ".toml")) or path.startswith("docs/schema"):
            continue
        lines, old = (ROOT / path).read_text().split("\n"), _old_lines(ref, path)
        before = changed
        for i, line in enumerate(lines):
            if line in old or SCHEDULING.search(line) or " -> " in line:
                continue
            if FSTRING.search(line):
                print(f"{path}:{i + 1}: check by hand: {line.strip()[:100]}")
            new = SPEC.sub(lambda m: f"{m.group(1)}:{int(m.group(2)) * 8}", line)
            if new != line:
                print(f"{path}:{i + 1}: {line.strip()[:100]}\n    -> {new.strip()[:100]}")
                lines[i], changed = new, changed + 1
        if apply and changed > before:
            (ROOT / path).write_text("\n".join(lines))
    return changed


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print(f"{convert(sys.argv[1], '--apply' in sys.argv[2:])} line(s)", file=sys.stderr)
