"""runtime_bridge sits at the top beside the CLI: it imports only the types (planner.schema*,
planner.errors), cost_models and solvers, never the CLI or its formatter; the CLI imports it only
lazily, inside the run/profile handlers."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_ALLOWED_PROJECT = ("planner.schema", "planner.errors", "cost_models", "solvers", "runtime_bridge")
_PROJECT = ("planner", "cost_models", "solvers", "runtime_bridge")


def _imports(path: Path, *, top_level_only: bool = False) -> list[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    names = []
    for node in nodes:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return names


def test_runtime_bridge_imports_only_lower_layers() -> None:
    bad = [(path.name, name) for path in sorted((ROOT / "runtime_bridge").glob("*.py")) for name in _imports(path)
           if name.startswith(_PROJECT) and not name.startswith(_ALLOWED_PROJECT)]
    assert bad == []


def test_the_cli_imports_runtime_bridge_lazily_and_nothing_else_in_planner_does() -> None:
    cli = ROOT / "planner" / "cli_runtime.py"
    assert not [n for n in _imports(cli, top_level_only=True) if n.startswith("runtime_bridge")]
    assert any(n.startswith("runtime_bridge") for n in _imports(cli))  # inside the handlers
    others = [(path.name, name) for path in sorted((ROOT / "planner").glob("*.py")) if path != cli
              for name in _imports(path, top_level_only=True) if name.startswith("runtime_bridge")]
    assert others == []


def test_runtime_bridge_names_do_not_clash_with_the_schema() -> None:
    import planner.schema_fill
    import planner.schema_gavel
    from runtime_bridge import fill, launch

    ours = {"FillTask": fill, "RunJob": launch}
    assert all(hasattr(module, name) for name, module in ours.items())
    schema_names = set(dir(planner.schema_fill)) | set(dir(planner.schema_gavel))
    assert not schema_names & set(fill.__all__ + launch.__all__)
