"""Sliding-window attention in the cost model (``cost_models.windows``, docs/cost-model.md,
"Sliding-window attention"): the attended keys by hand and by brute force, the FLOP counts and the
flash kernel's time, and the config checks."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from cost_models import layer_ops, transformer
from cost_models.hardware import device_preset
from cost_models.models import model_preset
from cost_models.windows import attention_span_factor, mean_window_keys
from planner.schema import TransformerConfig

TINY = TransformerConfig(name="w", hidden_size=256, num_layers=6, num_heads=4, seq_length=64, vocab_size=1000)


def test_mean_window_keys_by_hand() -> None:
    """s = 8, w = 3: positions attend 1, 2, 3, 3, 3, 3, 3, 3 keys, 21 / 8; a window as long as the
    sequence is causal attention, (s + 1) / 2."""
    assert mean_window_keys(8, 3) == pytest.approx(21 / 8)
    assert mean_window_keys(8, 8) == mean_window_keys(8, 100) == 4.5


def test_span_factor_against_brute_force() -> None:
    """Random (layers, s, w, k): the model-average share of causal attention's (query, key) pairs,
    counted pair by pair over every layer and position."""
    rng = random.Random(7)
    for _ in range(40):
        layers, s = rng.randint(1, 12), rng.randint(2, 40)
        w, every = rng.randint(1, 48), rng.choice([None, 1, 2, 3, 6])
        cfg = TINY.model_copy(update={"num_layers": layers, "seq_length": s, "sliding_window": w,
                                      "global_attention_every": every})
        pairs = 0
        for layer in range(layers):
            windowed = not (every and (layer + 1) % every == 0)
            pairs += sum(min(i + 1, w) if windowed else i + 1 for i in range(s))
        full = layers * s * (s + 1) / 2
        assert attention_span_factor(cfg) == pytest.approx(pairs / full, rel=1e-12)
        assert cfg.windowed_layers == sum(not (every and (i + 1) % every == 0) for i in range(layers))


def test_flops_and_flash_time_fall_with_the_window() -> None:
    """gpt-oss-120b at s = 4,096 (128-token windows in 18 of 36 layers): the attention-core FLOPs are
    the causal count times the span factor; a window as long as the sequence changes nothing; the
    flash kernel's time falls, but by less than the FLOPs (the window's partial key blocks)."""
    oss = model_preset("gpt-oss-120b")
    full = oss.model_copy(update={"sliding_window": None, "global_attention_every": None})
    factor = attention_span_factor(oss)
    assert factor == pytest.approx((18 + 18 * (128 - 128 * 127 / 8192) / (4097 / 2)) / 36)
    assert transformer.attention_core_forward_flops(oss, microbatch_size=1) == pytest.approx(
        factor * transformer.attention_core_forward_flops(full, microbatch_size=1))
    wide = oss.model_copy(update={"sliding_window": 4096})
    assert transformer.model_flops_per_sample(wide) == transformer.model_flops_per_sample(full)
    h100 = device_preset("h100")
    core = lambda cfg: layer_ops._attention_core(cfg, h100, 1, 1, "flash")[0]  # noqa: E731
    assert core(wide) == core(full)
    assert factor < core(oss) / core(full) < 1


def test_a_global_layer_count_needs_a_window() -> None:
    with pytest.raises(ValidationError, match="global_attention_every=2 applies to sliding-window"):
        TransformerConfig.model_validate({**TINY.model_dump(), "global_attention_every": 2})
