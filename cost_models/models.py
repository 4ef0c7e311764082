"""Model presets: transformer configurations from the papers this project implements.

The shapes live in ``cost_models/data/models.json``, each with its source: the PTD-P weak-scaling
GPTs (arXiv:2104.04473 Table 1, dissertation Table 4.1; V = 51200, s = 2048 per seed 001
L4209-4211), GPT-3 175B (seed 001 L4409-4447), BPipe's GPT-3 13B/96B/134B (seed 004 L184-187),
LLaMA-2 7B/13B/70B, SPipe's LLaMA-2-style models (seed 003 L256-267), and documented guesses
for models a paper names without a shape (the poster's LLaMA-175B, PipeFill's 40B and 5B), and
today's models from their papers and released ``config.json`` files: Llama 3 8B/70B/405B, Mixtral
8x7B/8x22B, Qwen3 8B/32B/30B-A3B/235B-A22B, DeepSeek-V3 (MLA + MoE) and gpt-oss 20b/120b
(docs/models-and-configs.md lists them with their published parameter counts).
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

from planner.errors import InvalidProblemError
from planner.schema import TransformerConfig

_DOC_KEYS = frozenset({"description", "source"})


@lru_cache(maxsize=1)
def _presets() -> dict[str, dict[str, Any]]:
    text = resources.files("cost_models").joinpath("data/models.json").read_text(encoding="utf-8")
    return json.loads(text)["models"]


def model_preset(name: str) -> TransformerConfig:
    """The transformer config of a model preset.

    Args:
        name: a preset name such as ``gpt3-175b`` or ``llama2-70b`` (case-insensitive).

    Returns:
        The validated config, named after the preset.

    Raises:
        InvalidProblemError: unknown name; the message lists the valid names.
    """
    key = name.strip().lower()
    presets = _presets()
    if key not in presets:
        raise InvalidProblemError(f"unknown model preset {name!r}; choose from {sorted(presets)}")
    fields = {k: v for k, v in presets[key].items() if k not in _DOC_KEYS}
    return TransformerConfig.from_dict({"name": key, **fields})


def list_model_presets() -> dict[str, str]:
    """Preset names with a one-line description and its source."""
    return {name: f"{entry['description']} [{entry['source']}]" for name, entry in _presets().items()}
