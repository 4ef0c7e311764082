"""The report's unvalidated Bubble constructor builds what validation would."""

from __future__ import annotations

from cost_models.sim.report import _BUBBLE_FIELDS, _FIELDS_SET, _bubble
from planner.schema import Bubble


def test_fast_bubble_equals_a_validated_one() -> None:
    assert _BUBBLE_FIELDS == frozenset(Bubble.model_fields)
    fast, checked = _bubble(0.5, 1.25, 3e9), Bubble(start_s=0.5, end_s=1.25, free_memory_bytes=3e9)
    assert fast == checked and fast.model_dump() == checked.model_dump() and hash(fast) == hash(checked)
    assert Bubble.model_validate_json(fast.model_dump_json()) == checked
    assert fast.model_copy(update={"end_s": 2.0}) == checked.model_copy(update={"end_s": 2.0})
    assert _FIELDS_SET == _BUBBLE_FIELDS  # shared by every bubble: a copy never changes it
