"""Typed solver options from the CLI's ``--option KEY=VALUE`` strings or a Python mapping."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar, get_type_hints

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
    hints = get_type_hints(cls)
    fields = {f.name: hints[f.name] for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    valid = ", ".join(f"{k} ({_type_name(t)})" for k, t in fields.items()) or "none"
    kwargs: dict[str, Any] = {}
    for key, raw in (values or {}).items():  # type: ignore[union-attr]
        if key not in fields:
            raise InvalidProblemError(f"solver {solver!r} has no option {key!r}; valid options: {valid}")
        kwargs[key] = _convert(raw, fields[key], key=key, solver=solver)
    return cls(**kwargs)


def _type_name(t: Any) -> str:
    return getattr(t, "__name__", str(t))


def _convert(raw: Any, target: Any, *, key: str, solver: str) -> Any:
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
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
            return float(text)
    except ValueError:
        raise InvalidProblemError(
            f"option {key}={raw!r} of solver {solver!r} must be a {_type_name(target)}"
        ) from None
    if "None" in str(target) and text.lower() in ("", "null"):
        return None
    if "float" in str(target):
        try:
            return float(text)
        except ValueError:
            pass
    return text
