"""Write the JSON Schema of every input and output format into docs/schema/.

Run from the repository root: ``python scripts/export_schemas.py``. A test fails when the
committed files are stale.
"""

from __future__ import annotations

import json
from pathlib import Path

from planner.schema import json_schemas


def main() -> None:
    out = Path(__file__).resolve().parent.parent / "docs" / "schema"
    out.mkdir(parents=True, exist_ok=True)
    for name, schema in json_schemas().items():
        (out / name).write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        print(out / name)


if __name__ == "__main__":
    main()
