"""Typed solver options from the CLI's ``--option KEY=VALUE`` strings or a Python mapping."""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Mapping
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from planner.errors import InvalidProblemError

_O = TypeVar("_O")


def parse_options(cls: type[_O], values: Mapping[str, Any] | _O | None, *, solver: str) -> _O:
    """Build the frozen options dataclass ``cls`` from a mapping, converting strings.

    Raises:
        InvalidProblemError: an unknown key or a value of the wrong type; the message lists
            the valid keys with their types.
    """
    if isinstance(values, cls):
        return values
    if dataclasses.is_dataclass(values) and not isinstance(values, type):
        raise InvalidProblemError(
            f"options of type {type(values).__module__}.{type(values).__name__} given to solver {solver!r}; "
            f"pass {cls.__module__}.{cls.__name__} or a mapping of its fields"
        )
    hints = get_type_hints(cls)
    fields = {f.name: hints[f.name] for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    valid = ", ".join(f"{k} ({_type_name(t)})" for k, t in fields.items()) or "none"
    kwargs: dict[str, Any] = {}
    for key, raw in (values or {}).items():  # type: ignore[union-attr]
        if key not in fields:
            raise InvalidProblemError(f"solver {solver!r} has no option {key!r}; valid options: {valid}")
        kwargs[key] = _convert(raw, fields[key], key=key, solver=solver)
    return cls(**kwargs)


def _is_union(t: Any) -> bool:
    return get_origin(t) in (Union, types.UnionType)


def _type_name(t: Any) -> str:
    return getattr(t, "__name__", str(t))


def _convert(raw: Any, target: Any, *, key: str, solver: str) -> Any:
    members = [t for t in get_args(target) if t is not type(None)] if _is_union(target) else [target]
    optional = _is_union(target) and len(members) < len(get_args(target))
    if not isinstance(raw, str):
        if isinstance(raw, bool) and bool not in members and (int in members or float in members):
            raise InvalidProblemError(f"option {key}={raw!r} of solver {solver!r} must be a {_type_name(target)}, not a boolean")
        return raw
    text = raw.strip()
    # "none" is a value of string options (recompute=none); for numbers it means None
    if optional and (text.lower() in ("", "null") or (text.lower() == "none" and str not in members)):
        return None
    if len(members) == 1 and members[0] in (bool, int, float):
        target = members[0]
    try:
        if target is bool:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if target is int:
            return int(text)
        if target is float:
            value = float(text)
            if not math.isfinite(value):
                raise ValueError(text)
            return value
    except ValueError:
        raise InvalidProblemError(
            f"option {key}={raw!r} of solver {solver!r} must be a {_type_name(target)}"
        ) from None
    if "float" in str(target):
        try:
            return float(text)
        except ValueError:
            pass
    return text
