"""Only runtime_bridge may import torch: the planner must stay cheap inside autotuners."""

from __future__ import annotations

import subprocess
import sys


def test_planner_solvers_cost_models_do_not_load_torch() -> None:
    code = (
        "import sys, planner, solvers, cost_models\n"
        "import planner.api, planner.cli, planner.export, planner.report, cost_models.simulate\n"
        "import cost_models.transformer, cost_models.hardware, cost_models.profiles, cost_models.schedules\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
