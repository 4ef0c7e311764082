"""engine.gc_paused: the collector is off inside, restored after (also on errors and when nested)."""

from __future__ import annotations

import gc

import pytest

from cost_models.sim.engine import gc_paused


def test_gc_is_paused_inside_and_restored_after() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner block keeps the outer state
    assert gc.isenabled()
    with pytest.raises(ValueError), gc_paused():
        raise ValueError
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # a caller's own pause is left alone
    finally:
        gc.enable()
