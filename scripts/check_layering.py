"""Check the package layering: no import runs back up, none reaches into another package's private modules.

Layers, bottom to top (docs/registries.md, "Layering"):

    planner.schema*, planner.errors   types only
    cost_models                       cost models and the simulator's engine
    solvers                           solvers (pure functions of a problem)
    planner (api, cli, exporters...)  and runtime_bridge, at the top

A module may import its own layer and those below. Every import counts, including the ones
inside functions (a lazy import that runs upward is still upward). A module or name ``_x`` is
private to its top-level package (``planner``, ``cost_models``, ``solvers``, ``runtime_bridge``):
no other package imports it.

Run from the repository root: ``python scripts/check_layering.py``; it prints one line per
violation and exits 1 if there is any (``tests/test_layering.py`` runs it).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("planner", "cost_models", "solvers", "runtime_bridge")


def layer(module: str, *, importer: bool = False) -> int:
    """0 types, 1 cost_models, 2 solvers, 3 top (planner's API/CLI/exporters, runtime_bridge).

    ``planner`` itself (its ``__init__``) is the API's facade (``planner.plan`` loads
    ``planner.api`` lazily): as an importer it is top, as an import it costs only its errors."""
    if module.startswith(("planner.schema", "planner.errors")) or (module == "planner" and not importer):
        return 0
    return {"cost_models": 1, "solvers": 2}.get(module.split(".")[0], 3)


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, absolute module) of every project import in the file, relative ones resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            module = ".".join(x for x in (base, node.module or "") if x)
            # ``from planner import api`` imports planner.api; ``from x import Name`` is x.Name
            out += [(node.lineno, f"{module}.{alias.name}" if alias.name != "*" else module) for alias in node.names]
    return [(line, name) for line, name in out if name.split(".")[0] in PACKAGES]


def violations(root: Path = ROOT) -> list[str]:
    """One line per upward or private import under ``root`` (the repository root)."""
    out = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            here = module_name(path, root)
            for line, name in imports(path, root):
                where = f"{path.relative_to(root)}:{line}"
                if layer(name) > layer(here, importer=True):
                    out.append(f"{where}: {here} (layer {layer(here, importer=True)}) imports {name} "
                               f"(layer {layer(name)}), upward")
                private = next((i for i, part in enumerate(name.split(".")) if part.startswith("_")
                                and not part.startswith("__")), None)
                if private is not None and name.split(".")[0] != package:
                    out.append(f"{where}: {here} imports {name}, private to package {name.split('.')[0]}")
    return out


def main() -> int:
    found = violations()
    for line in found:
        print(line)
    print(f"{len(found)} layering violation(s)", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
