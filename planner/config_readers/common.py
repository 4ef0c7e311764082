"""Shared pieces of the model-config readers: the training sequence length and the final check."""

from __future__ import annotations

import logging
from typing import Any

from planner.schema import TransformerConfig

logger = logging.getLogger(__name__)


def training_seq_length(
    *,
    asked: int | None,
    stated: int | None,
    maximum: int | None,
    source: str,
    stated_what: str = "the pre-training sequence length the config states",
) -> int:
    """The sequence length to plan for: ``--seq-length`` when given, else the pre-training length the
    config states, else its maximum context (with a warning: a maximum is rarely the training length)."""
    if asked is not None:
        return asked
    if stated is not None:
        logger.warning("%s: planning at %s, %d; --seq-length sets another", source, stated_what, stated)
        return stated
    if maximum is None:
        from planner.errors import InvalidProblemError

        raise InvalidProblemError(f"{source} states no sequence length; give --seq-length (e.g. --seq-length 4096)")
    logger.warning(
        "%s: planning at the maximum context %d the config states; --seq-length sets the training sequence length",
        source,
        maximum,
    )
    return maximum


def build_config(fields: dict[str, Any]) -> TransformerConfig:
    """A validated TransformerConfig; None values and zero counts are left to the schema defaults."""
    kept = {k: v for k, v in fields.items() if v is not None}
    return TransformerConfig.from_dict(kept)
