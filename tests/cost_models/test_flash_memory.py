"""Activation memory of the attention core: unfused (Korthikanti et al. Eq. 1-2) vs FlashAttention
(Dao et al., Sec. 3.1), hand-checked on a tiny GPT layer, and the recompute options it implies."""

from __future__ import annotations

import pytest

from cost_models import hardware, models
from cost_models import transformer as tr
from planner.errors import InvalidProblemError
from planner.schema import TransformerConfig

A100 = hardware.device_preset("a100-80gb")
# h = 64, a = 4, s = 32, f = 4h (gelu), 16-bit; b = 2 below: sbh = 32 x 2 x 64 = 4096
TINY = TransformerConfig(name="tiny", hidden_size=64, num_layers=2, num_heads=4, seq_length=32, vocab_size=100)
KEPT = 34 * 4096  # the layer's saved tensors outside the attention core (Korthikanti Eq. 2's 34 sbh)
SCORES = 5 * 4 * 32 * 32 * 2  # softmax output 2as^2b + dropout mask as^2b + dropout output 2as^2b
LSE = 4 * 4 * 32 * 2  # fp32 log-sum-exp, one per head and query token: 4asb
INPUT = 2 * 4096  # full recompute keeps the layer input, e sbh


@pytest.mark.parametrize(("t", "attention", "none", "selective"), [
    (1, "unfused", KEPT + SCORES, KEPT),     # 180,224 / 139,264 bytes
    (1, "flash", KEPT + LSE, KEPT),          # 140,288 / 139,264: selective drops only the statistics
    (2, "unfused", (KEPT + SCORES) / 2, KEPT / 2),
    (2, "flash", (KEPT + LSE) / 2, KEPT / 2),
])
def test_tiny_layer_activation_bytes_by_attention_and_recompute(t: int, attention: str, none: float,
                                                                  selective: float) -> None:
    kw = {"microbatch_size": 2, "tensor_parallel": t, "attention": attention}  # t = 2 with sequence parallelism
    assert tr.decoder_activation_bytes(TINY, **kw, recompute="none") == none
    assert tr.decoder_activation_bytes(TINY, **kw, recompute="selective") == selective
    assert tr.decoder_activation_bytes(TINY, **kw, recompute="full") == INPUT / t


def test_flash_is_the_default_and_unknown_kinds_are_rejected() -> None:
    assert tr.decoder_activation_bytes(TINY, microbatch_size=2) == KEPT + LSE
    with pytest.raises(InvalidProblemError, match="attention='sdpa' must be 'flash' or 'unfused'"):
        tr.decoder_activation_bytes(TINY, microbatch_size=2, attention="sdpa")


def test_llama3_8b_at_8k_scores_dwarf_the_rest_only_when_unfused() -> None:
    cfg = models.model_preset("llama3-8b").model_copy(update={"seq_length": 8192})
    per_token_hidden = 8192 * cfg.hidden_size
    scores = tr.attention_core_activation_bytes(cfg, microbatch_size=1, attention="unfused")
    lse = tr.attention_core_activation_bytes(cfg, microbatch_size=1, attention="flash")
    assert scores / per_token_hidden == 5 * 32 * 8192 / 4096 == 320
    assert lse / per_token_hidden == 4 * 32 / 4096


@pytest.mark.parametrize("efficiency", [None, 0.4])  # per-operation and flat models
def test_profile_options_follow_the_attention_kind(efficiency: float | None) -> None:
    kw = {"device": A100, "microbatch_size": 2, "efficiency": efficiency}
    flash = tr.transformer_profile(TINY, **kw, attention="flash").layers[1].strategies()
    unfused = tr.transformer_profile(TINY, **kw, attention="unfused").layers[1].strategies()
    assert flash["none"].activation_bytes == KEPT + LSE and flash["none"].extra_s == 0
    assert unfused["none"].activation_bytes == KEPT + SCORES
    # selective re-runs the core either way; under flash that buys back only the LSE bytes
    assert flash["selective"].activation_bytes == unfused["selective"].activation_bytes == KEPT
    assert flash["selective"].extra_s > 0 and unfused["selective"].extra_s > 0
    assert flash["full"].activation_bytes == unfused["full"].activation_bytes == INPUT
