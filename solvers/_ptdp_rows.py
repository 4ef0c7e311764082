"""Candidate-table rates of a ``ptdp`` configuration: samples/s, model and hardware FLOP rates per GPU."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cost_models.compute import compute_constants
from cost_models.transformer import attention_core_forward_flops, flops_per_iteration, model_flops_per_sample
from planner.schema import Cluster, TransformerConfig

if TYPE_CHECKING:
    from solvers._ptdp_model import Config


def throughput_row(cfg: TransformerConfig, cluster: Cluster, c: Config, iteration_s: float) -> dict[str, float]:
    """Samples/s and two FLOP rates per GPU at an iteration time, labelled:

    - ``model_tflops_per_gpu`` / ``mfu``: model FLOPs (forward + backward, no recompute: Eq. 4.2
      without its recompute forward), the useful work;
    - ``hardware_tflops_per_gpu`` / ``hfu``: FLOPs the GPUs execute, including the recompute forward
      when (and only when) the configuration recomputes: ``full`` adds one forward of every decoder
      layer (Eq. 4.2 as printed, which assumes full recompute, L4166-4190; without the dense layers' FFN
      output projections under PyTorch's early-stopping checkpoint), ``selective`` the
      attention core's forward.
    """
    assert cluster.device is not None
    batch = c.num_microbatches * c.microbatch_size * c.data
    devices = c.num_devices
    model = model_flops_per_sample(cfg) * batch
    early_stop = compute_constants(cluster.device).full_recompute == "early-stop"
    hardware = model + recompute_flops_per_sample(cfg, c.recompute, early_stop=early_stop) * batch
    peak = cluster.device.peak_flops
    return {
        "samples_per_s": batch / iteration_s,
        "model_tflops_per_gpu": model / iteration_s / devices / 1e12,
        "hardware_tflops_per_gpu": hardware / iteration_s / devices / 1e12,
        "mfu": model / iteration_s / devices / peak,
        "hfu": hardware / iteration_s / devices / peak,
    }


def recompute_flops_per_sample(cfg: TransformerConfig, recompute: str, *, early_stop: bool = False) -> float:
    """Extra FLOPs per sample of a uniform recompute setting (0 for ``none``). ``early_stop``: full
    recompute stops before each dense layer's FFN output projection (2 s f h FLOPs per sample;
    ``ComputeModel.full_recompute``)."""
    if recompute == "full":
        dense_layers = cfg.first_dense_layers if cfg.is_moe else cfg.num_layers
        skipped = dense_layers * 2 * cfg.seq_length * cfg.ffn_size * cfg.hidden_size if early_stop else 0
        return flops_per_iteration(cfg, global_batch_size=1, recompute=True) - model_flops_per_sample(cfg) - skipped
    if recompute == "selective":
        return cfg.num_layers * attention_core_forward_flops(cfg, microbatch_size=1)
    return 0.0
