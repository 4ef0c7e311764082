"""Fill-job models and presets (seed 000 L109, L182-191, L209-211; reading Sec. 4.4).

The paper's fill jobs are BERT-base/large, EfficientNet, Swin-large and XLM-RoBERTa-XL training
or batch inference, sampled from the HuggingFace Hub. paraplan derives their per-layer costs
from ``cost_models``: BERT-style encoders through ``transformer_profile`` (an encoder's layer
has the decoder's FLOPs and activations; the MLM head is the vocabulary projection), and
ResNet-50 through the small analytic CNN model below (He et al. 2016, Table 1 shapes; 4.1 G
multiply-adds per 224x224 image, 25.5 M parameters). Times are FLOPs / (peak x efficiency) on
the main job's device, as everywhere in ``cost_models``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from cost_models import transformer
from planner.errors import InvalidProblemError
from planner.schema import Device, LayerProfile, ModelProfile, TransformerConfig
from planner.schema_fill import FillMode

_ENCODERS = {
    # BERT (Devlin et al. 2019): base 110 M, large 340 M; XLM-R XL (Goyal et al. 2021) 2.8 B.
    "bert-base": dict(hidden_size=768, num_layers=12, num_heads=12, vocab_size=30522),
    "bert-large": dict(hidden_size=1024, num_layers=24, num_heads=16, vocab_size=30522),
    "xlm-roberta-xl": dict(hidden_size=2560, num_layers=36, num_heads=32, vocab_size=250880),
}
FILL_SEQ_LENGTH = 128
"""Tokens per sample of the encoder presets (BERT's phase-1 / fine-tuning length)."""
CNN_ACTIVATION_COPIES = 3
"""A conv keeps its output, the batch-norm output and the ReLU output for the backward."""


@dataclass(frozen=True, slots=True)
class JobPreset:
    model: str
    mode: FillMode
    num_samples: float
    description: str


FILL_JOB_PRESETS: dict[str, JobPreset] = {
    f"{model}-{mode}": JobPreset(model, mode, samples, f"{model} {mode} ({samples:.0f} samples)")
    for model, mode, samples in (
        ("bert-base", "inference", 2e5), ("bert-base", "training", 5e4),
        ("bert-large", "inference", 1e5), ("bert-large", "training", 2e4),
        ("resnet50", "inference", 5e4), ("resnet50", "training", 1e4),
        ("xlm-roberta-xl", "inference", 1e4),
    )
}
PAPER_MIX: dict[str, float] = {
    # 10.4% CNNs (L209); models under 700 M train or infer 50/50 (L211); Swin, EfficientNet and
    # XLM-R XL are left out (no profile here; XLM-R's fp16 weights alone exceed 4.5 GB free).
    "resnet50-inference": 0.052, "resnet50-training": 0.052,
    "bert-base-inference": 0.224, "bert-base-training": 0.224,
    "bert-large-inference": 0.224, "bert-large-training": 0.224,
}
MIXES: dict[str, dict[str, float]] = {"paper-mix": PAPER_MIX, "bert-inference": {"bert-large-inference": 1.0}}


def fill_model_names() -> tuple[str, ...]:
    return (*sorted(_ENCODERS), "resnet50")


def encoder_config(name: str) -> TransformerConfig:
    """The transformer shape of an encoder preset (fp16, sequence ``FILL_SEQ_LENGTH``)."""
    return TransformerConfig(name=name, seq_length=FILL_SEQ_LENGTH, dtype="fp16", **_ENCODERS[name])


@lru_cache(maxsize=64)
def fill_model_profile(name: str, device: Device, efficiency: float) -> ModelProfile:
    """Per-sample layer profile of a fill-model preset on ``device``.

    Raises:
        InvalidProblemError: unknown preset name; the message lists the valid names.
    """
    if name in _ENCODERS:
        return transformer.transformer_profile(
            encoder_config(name), device=device, microbatch_size=1, efficiency=efficiency
        )
    if name == "resnet50":
        return resnet50_profile(device, efficiency=efficiency)
    raise InvalidProblemError(f"unknown fill model {name!r}; choose from {list(fill_model_names())}")


# (blocks, bottleneck width, output spatial size) of ResNet-50's four stages (He et al., Table 1)
_RESNET50_STAGES = ((3, 64, 56), (4, 128, 28), (6, 256, 14), (3, 512, 7))


def _layer(name: str, macs: float, params: float, out_elems: float, act_elems: float, device: Device,
           efficiency: float) -> LayerProfile:
    forward_flops = 2 * macs
    rate = device.peak_flops * efficiency
    return LayerProfile(
        name=name, kind=name.rstrip("0123456789"), forward_s=forward_flops / rate, backward_s=2 * forward_flops / rate,
        activation_bytes=2 * act_elems, static_bytes=transformer.ADAM_BYTES_PER_PARAM * params,
        param_bytes=2 * params, output_bytes=2 * out_elems, flops=3 * forward_flops,
    )


def resnet50_profile(device: Device, *, efficiency: float = transformer.DEFAULT_EFFICIENCY) -> ModelProfile:
    """Analytic ResNet-50 (v1.5, 224x224, fp16) per image: stem, 16 bottleneck blocks, head.

    Each conv costs H W C_in C_out k^2 multiply-adds; backward = 2 x forward; a block keeps
    ``CNN_ACTIVATION_COPIES`` copies of every conv output for its backward.
    """
    layers = [_layer("stem", 112 * 112 * 3 * 64 * 49, 3 * 64 * 49, 56 * 56 * 64,
                     CNN_ACTIVATION_COPIES * 112 * 112 * 64, device, efficiency)]
    c_in, h_in = 64, 56
    for blocks, width, h in _RESNET50_STAGES:
        for i in range(blocks):
            out = 4 * width
            convs = [(h_in, c_in, width, 1), (h, width, width, 9), (h, width, out, 1)]
            if i == 0:
                convs.append((h, c_in, out, 1))  # projection shortcut
            macs = sum(hw * hw * a * b * k for hw, a, b, k in convs)
            params = sum(a * b * k for _, a, b, k in convs)
            act = CNN_ACTIVATION_COPIES * sum(hw * hw * b for hw, _, b, _ in convs)
            layers.append(_layer(f"block{len(layers)}", macs, params, h * h * out, act, device, efficiency))
            c_in, h_in = out, h
    layers.append(_layer("head", 2048 * 1000, 2048 * 1000, 1000, 2048 + 1000, device, efficiency))
    return ModelProfile(name="resnet50", layers=tuple(layers), microbatch_size=1, device=device.name,
                        source="analytic")
