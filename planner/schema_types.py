"""Field types of the boundary schema: finite, bounded numbers, and the strict-JSON checks.

``planner.schema`` re-exports every name. Bounds come from ``planner.schema_io`` (the limit and
why it exists, docs/input-formats.md "Input rules"); the checks refuse booleans and strings where
a field holds numbers.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import AfterValidator, BaseModel, Field

from planner import schema_io

PositiveFloat = Annotated[float, Field(gt=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]
PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]


def _at_most(limit: float, why: str) -> AfterValidator:
    """A bound on a count: the message names the limit and why it exists (planner.schema_io)."""

    def check(value: float | None) -> float | None:
        if value is not None and value > limit:
            shown = f"{value:,}" if isinstance(value, int) else f"{value:g}"
            limit_shown = f"{limit:,}" if isinstance(limit, int) else f"{limit:g}"
            raise ValueError(f"{shown} exceeds the limit of {limit_shown} ({why}); use a smaller value")
        return value

    return AfterValidator(check)


_DEVICES_WHY = "set above the largest published training clusters"
def _count(limit: int, why: str) -> Any:
    """A count >= 1 and <= limit; the JSON Schema shows the maximum, the message says why."""
    return Annotated[int, Field(ge=1, json_schema_extra={"maximum": limit}), _at_most(limit, why)]


_DAY_WHY = "one day for one layer and one microbatch"
LayerTime = Annotated[float, Field(gt=0), _at_most(86_400.0, _DAY_WHY)]
"""Seconds of one layer's pass for one microbatch: above 0, at most one day."""
ExtraTime = Annotated[float, Field(ge=0), _at_most(86_400.0, _DAY_WHY)]
Bytes = Annotated[float, Field(ge=0), _at_most(1e24, "a yottabyte, above any device or model")]
Rate = PositiveFloat
Latency = Annotated[float, Field(ge=0), _at_most(3600.0, "an hour per message")]
_WIDTH = _count(2**20, "a model dimension, set far above any published model (Llama 3 405B: 16,384)")
_LENGTH = _count(schema_io.MAX_TOKENS, "tokens, set far above any published vocabulary or context length")
LayerIndex = Annotated[int, Field(ge=0, json_schema_extra={"maximum": schema_io.MAX_LAYERS}),
                      _at_most(schema_io.MAX_LAYERS, "layer indices of a model with at most that many layers")]
DeviceCount = _count(schema_io.MAX_DEVICES, _DEVICES_WHY)
LayerCount = _count(schema_io.MAX_LAYERS, "ten times the largest model planned")
MicrobatchCount = _count(schema_io.MAX_MICROBATCHES, "microbatches per pipeline per iteration; the simulator steps each one")
BatchCount = _count(schema_io.MAX_GLOBAL_BATCH, "samples per iteration, set far above GPT-3's 1,536")


_ACCEPTS: dict[tuple[type, str], tuple[bool, bool]] = {}


def _field_accepts(cls: type[BaseModel], name: str) -> tuple[bool, bool]:
    """(admits a boolean, admits a string) anywhere in the field's type; cached per field."""
    key = (cls, name)
    if key not in _ACCEPTS:
        annotation = cls.model_fields[name].annotation
        _ACCEPTS[key] = (_accepts(annotation, bool), _accepts(annotation, str))
    return _ACCEPTS[key]


_NUMBERS: dict[tuple[type, str], bool] = {}


def _field_is_flag(cls: type[BaseModel], name: str) -> bool:
    """Whether the field admits a boolean but no number (``0`` is then not ``false``); cached."""
    key = (cls, name)
    if key not in _NUMBERS:
        annotation = cls.model_fields[name].annotation
        _NUMBERS[key] = _accepts(annotation, bool) and not (_accepts(annotation, int) or _accepts(annotation, float))
    return _NUMBERS[key]


def _accepts(annotation: Any, kind: type) -> bool:
    """Whether a type admits values of ``kind`` (itself, Any, a Literal of it, or a nested
    schema type, which checks its own fields)."""
    if annotation is kind or annotation is Any:
        return True
    if isinstance(annotation, type) and (issubclass(annotation, BaseModel) or hasattr(annotation, "_fields")):
        return True  # schema types and named tuples: pydantic checks their fields one by one
    if get_origin(annotation) is Literal:
        return any(type(v) is kind for v in get_args(annotation))
    if get_origin(annotation) is dict:  # keys are always strings in JSON: only the values count
        return _accepts(get_args(annotation)[1], kind)
    return any(_accepts(arg, kind) for arg in get_args(annotation))


def _wrong_scalar(value: Any, *, bool_ok: bool, str_ok: bool) -> str | None:
    """'boolean' or 'string' when a decoded JSON value is or holds one the field does not admit
    (lists and mapping values are searched; objects check their own fields)."""
    if isinstance(value, bool):
        return None if bool_ok else "boolean"
    if isinstance(value, str):
        return None if str_ok else "string"
    items = value if isinstance(value, (list, tuple)) else value.values() if isinstance(value, dict) else ()
    for item in items:
        if isinstance(item, (bool, str, list, tuple, dict)):
            wrong = _wrong_scalar(item, bool_ok=bool_ok, str_ok=str_ok)
            if wrong:
                return wrong
    return None
