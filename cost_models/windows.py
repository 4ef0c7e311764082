"""Sliding-window attention (``TransformerConfig.sliding_window``, ``global_attention_every``): the keys
a query attends under a causal window and the share of full causal attention's score work a model's
layers do. Used by the FLOP counts (``cost_models.transformer``, ``cost_models.moe``) and the flash
kernel's time (``cost_models.layer_ops``); formulas in docs/cost-model.md, "Sliding-window attention"."""

from __future__ import annotations

from planner.schema import TransformerConfig


def mean_window_keys(seq: int, window: int) -> float:
    """Keys one query attends on average under a causal window of ``window`` tokens (itself and the
    ``window - 1`` before it): sum over positions i of min(i + 1, w), over s, = w - w (w - 1) / (2 s)
    for w <= s; (s + 1) / 2, plain causal attention, for a window as long as the sequence."""
    if window >= seq:
        return (seq + 1) / 2
    return window - window * (window - 1) / (2 * seq)


def window_ratio(cfg: TransformerConfig) -> float:
    """A windowed layer's attended keys relative to a full causal layer's (1 without a window)."""
    if cfg.sliding_window is None:
        return 1.0
    s = cfg.seq_length
    return mean_window_keys(s, cfg.sliding_window) / ((s + 1) / 2)


def layer_average(cfg: TransformerConfig, global_value: float, windowed_value: float) -> float:
    """The model's average of a per-layer quantity over its global and its windowed layers."""
    windowed = cfg.windowed_layers
    if windowed == 0:
        return global_value
    return ((cfg.num_layers - windowed) * global_value + windowed * windowed_value) / cfg.num_layers


def attention_span_factor(cfg: TransformerConfig) -> float:
    """The model-average share of full causal attention's score FLOPs its layers do: windowed layers
    at ``window_ratio``, the global ones (every ``global_attention_every``-th) at 1."""
    return layer_average(cfg, 1.0, window_ratio(cfg))
