"""Load a ``bench/`` script as a module, for the tests that check its published-number rows."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

BENCH = pathlib.Path(__file__).resolve().parents[1] / "bench"


def load_bench(name: str, *, alias: str | None = None) -> ModuleType:
    """``bench/<name>.py`` as module ``alias`` (default ``name``), registered in ``sys.modules`` (its
    dataclasses look their module up) with ``bench/`` on the path (the scripts import each other)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(alias or name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[alias or name] = module
    spec.loader.exec_module(module)
    return module
