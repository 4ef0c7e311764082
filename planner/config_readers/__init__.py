"""Model configs from other tools, read into paraplan's TransformerConfig.

``hf:<config.json or dir>`` (transformers' AutoConfig), ``torchtitan:<module>:<flavor>`` (torchtitan's
model registry) and ``megatron:<args file>`` (Megatron-LM arguments). Each reader imports its tool
only when called. See docs/models-and-configs.md.
"""

from __future__ import annotations

from planner.errors import InvalidProblemError
from planner.schema import TransformerConfig

PREFIXES = ("hf:", "torchtitan:", "megatron:")


def read_model_config(spec: str, *, seq_length: int | None = None) -> TransformerConfig:
    """The TransformerConfig a ``hf:``, ``torchtitan:`` or ``megatron:`` spec names.

    Raises:
        InvalidProblemError: an unknown prefix or what the reader reports.
    """
    kind, _, rest = spec.partition(":")
    if not rest:
        raise InvalidProblemError(f"model {spec!r}: give a path or name after {kind + ':'!r}")
    if kind == "hf":
        from planner.config_readers.hf_reader import read_hf_config

        return read_hf_config(rest, seq_length=seq_length)
    if kind == "torchtitan":
        from planner.config_readers.torchtitan_reader import read_torchtitan_model

        return read_torchtitan_model(rest, seq_length=seq_length)
    if kind == "megatron":
        from planner.config_readers.megatron_reader import read_megatron_args

        return read_megatron_args(rest, seq_length=seq_length)
    raise InvalidProblemError(f"unknown model prefix {kind!r}; choose from {list(PREFIXES)}")
