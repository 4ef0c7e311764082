"""The package layering holds: no import runs back up and none reaches into another package's
private modules (``scripts/check_layering.py``; docs/registries.md, "Layering")."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check_layering", ROOT / "scripts" / "check_layering.py")
check = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(check)  # type: ignore[union-attr]


def test_the_repository_has_no_upward_or_private_import() -> None:
    assert check.violations() == []


def test_the_check_finds_upward_lazy_and_private_imports(tmp_path: Path) -> None:
    (tmp_path / "cost_models" / "sim").mkdir(parents=True)
    (tmp_path / "solvers").mkdir()
    (tmp_path / "planner").mkdir()
    (tmp_path / "runtime_bridge").mkdir()
    (tmp_path / "cost_models" / "sim" / "x.py").write_text(
        "from planner.schema import Plan\nfrom ..simulate import simulate\n"
        "def f():\n    from solvers import ptdp\n    from planner import api\n")
    (tmp_path / "solvers" / "y.py").write_text("from cost_models._layer_profiles import a\nfrom cost_models.sim import engine\n")
    (tmp_path / "planner" / "schema_z.py").write_text("from planner.errors import E\nimport cost_models\n")
    found = check.violations(tmp_path)
    assert [line.split(": ", 1)[1].split(",")[0] for line in found] == [
        "planner.schema_z (layer 0) imports cost_models (layer 1)",
        "cost_models.sim.x (layer 1) imports solvers.ptdp (layer 2)",
        "cost_models.sim.x (layer 1) imports planner.api (layer 3)",
        "solvers.y imports cost_models._layer_profiles.a",
    ]


def test_the_command_exits_zero() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_layering.py")], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stdout
