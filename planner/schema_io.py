"""The one input layer of paraplan: how every reader turns a file into text or JSON data.

Every reader (profile, transformer, cluster, plan, jobs, fill jobs, PipeDream ``graph.txt``,
Gavel ``.trace``, throughput tables) goes through ``read_text``/``load_json`` so that all of them
follow the same rules (docs/input-formats.md, "Input rules"):

- Encodings: UTF-8 with or without a byte-order mark, UTF-16 and UTF-32 with a byte-order mark.
  Anything else is refused naming the file, the byte offset and the fix.
- Numbers: JSON numbers must be finite. ``NaN``, ``Infinity`` and numbers that overflow a double
  (``1e999``) are refused with the line and column. Booleans are not numbers (the schema types
  reject ``true`` where a number is expected).
- Counts are bounded (``MAX_*`` below); each bound is far above any published training run and
  exists so that an absurd count is refused at once instead of exhausting time or memory.
- Output paths are checked before any work starts (``check_output_path``).

Types only: this module sits beside ``planner.schema`` at the bottom of the layering, so
``cost_models`` and ``solvers`` readers use it too.
"""

from __future__ import annotations

import codecs
import json
import math
import os
from pathlib import Path
from typing import Any

from planner.errors import InvalidProblemError

__all__ = [
    "MAX_DEVICES", "MAX_GLOBAL_BATCH", "MAX_JOBS", "MAX_LAYERS", "MAX_MICROBATCHES", "MAX_PIPELINE_WORK", "MAX_STEPS",
    "bounded", "check_output_path", "decode", "load_json", "loads_json", "read_text",
]

# ---- bounds on counts (the limit and why; docs/input-formats.md repeats them) -------------------
MAX_DEVICES = 131_072
"""Devices in one cluster: 2^17, above the largest published training clusters (about 100,000 GPUs)."""
MAX_LAYERS = 16_384
"""Layers of one model: ten times the largest planning target (1,536 layers) and far above any
published model (GPT-3 175B: 96 layers; Megatron 1T: 128)."""
MAX_MICROBATCHES = 16_384
"""Microbatches per pipeline per iteration: the simulator steps every microbatch on every stage,
and published runs use at most a few thousand (PTD-P's 1T run: 3,072 samples per batch)."""
MAX_PIPELINE_WORK = 1_048_576
"""Stage-microbatches per iteration (microbatches x stages x chunks), the simulator's work: 32
times PTD-P's largest run (512 microbatches on 64 stages)."""
MAX_GLOBAL_BATCH = 16_777_216
"""Samples per iteration (2^24): GPT-3 trained with 3.2 million tokens, that is 1,536 samples."""
MAX_TOKENS = 2**24
"""Sequence length and vocabulary: far above any published context (1M tokens) or vocabulary."""
MAX_JOBS = 100_000
"""Jobs in one cluster-scheduling problem or trace: ten times Gavel's largest simulated trace."""
MAX_STEPS = 10**15
"""Training steps of one job: a year at a million steps per second is 3.2 x 10^13."""

_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),  # before UTF-16 LE: it starts with the same two bytes
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


def decode(data: bytes, *, what: str, name: str) -> str:
    """Text of a file's bytes: UTF-8 (with or without BOM) or UTF-16/32 announced by a BOM.

    Raises:
        InvalidProblemError: the bytes are in another encoding (the message names the file).
    """
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            try:
                return data.decode(encoding)
            except UnicodeDecodeError as e:
                raise _encoding_error(what, name, e, encoding) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _encoding_error(what, name, e, "utf-8") from None


def _encoding_error(what: str, name: str, e: UnicodeDecodeError, encoding: str) -> InvalidProblemError:
    return InvalidProblemError(
        f"{what} file {name!r} is not valid {encoding.upper().replace('-SIG', '')} text (byte {e.start}: "
        f"{e.reason}); save it as UTF-8 (UTF-16 and UTF-32 need a byte-order mark)"
    )


def read_text(path: str | Path, *, what: str) -> str:
    """A text file decoded by ``decode``; a missing or unreadable file is refused with its name."""
    file = Path(path)
    if file.is_dir():
        raise InvalidProblemError(f"{what} file {str(file)!r} is a directory; give a file")
    if not file.exists():
        raise InvalidProblemError(f"{what} file {str(file)!r} does not exist")
    try:
        data = file.read_bytes()
    except OSError as e:
        raise InvalidProblemError(f"cannot read {what} file {str(file)!r}: {e.strerror}") from None
    return decode(data, what=what, name=str(file))


def load_json(path: str | Path, *, what: str) -> Any:
    """The JSON data of a file, read with ``read_text`` and parsed by ``loads_json``."""
    return loads_json(read_text(path, what=what), what=what, name=str(path))


class _NonFinite(ValueError):
    pass


def _reject_constant(token: str) -> Any:
    raise _NonFinite(token)


def _finite_float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise _NonFinite(token)
    return value


def loads_json(text: str | bytes, *, what: str, name: str = "") -> Any:
    """Strict JSON: no NaN/Infinity, no number overflowing a double, text decoded by ``decode``.

    Raises:
        InvalidProblemError: malformed JSON or a non-finite number, with its line and column.
    """
    if isinstance(text, bytes):
        text = decode(text, what=what, name=name or "(bytes)")
    where = f"{what} file {name!r}" if name else f"{what} JSON"
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except json.JSONDecodeError as e:
        head = f"{where} is not valid JSON" if name else f"malformed JSON for {what}"
        raise InvalidProblemError(f"{head}: {e.msg} at line {e.lineno} column {e.colno}") from None
    except _NonFinite as e:
        raise InvalidProblemError(
            f"{where} contains the number {e.args[0]}; every number must be finite (write the real value, "
            "or leave the field out where it is optional)"
        ) from None
    except RecursionError:
        raise InvalidProblemError(f"{where} nests too deeply to be a paraplan input") from None


def bounded(name: str, value: int, limit: int, why: str) -> int:
    """``value`` if it is at most ``limit``; else refuse it naming the limit and why it exists."""
    if value > limit:
        raise InvalidProblemError(f"{name}={value} exceeds the limit of {limit:,} ({why}); use a smaller value")
    return value


def check_output_path(path: str | Path | None, *, flag: str, create_parent: bool = False) -> None:
    """Refuse an output path that cannot be written, before any work starts.

    ``create_parent``: the command creates missing folders itself; then the nearest existing
    folder above the path must be writable (and no file may stand where a folder goes).

    Raises:
        InvalidProblemError: the path is a directory, its parent folder is missing (unless
            ``create_parent``) or is not writable.
    """
    if path is None:
        return
    out = Path(path)
    if out.is_dir():  # "" too: it reads as the working folder (the CLI refuses empty values first)
        raise InvalidProblemError(f"{flag} {str(path)!r} is a directory; give a file name, e.g. {flag} plan.json")
    parent = out.parent if str(out.parent) else Path(".")
    if create_parent:
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not parent.is_dir():
            raise InvalidProblemError(f"{flag} {str(path)!r}: {str(parent)!r} is a file, not a folder")
    if not parent.is_dir():
        raise InvalidProblemError(
            f"{flag} {str(path)!r}: the folder {str(parent)!r} does not exist; create it first (mkdir -p {parent})"
        )
    if not os.access(parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise InvalidProblemError(f"{flag} {str(path)!r} is not writable; choose another path")
