"""The bundled GPT-style decoder the runtime bridge executes: embedding, N blocks, norm + LM head.

The layer structure is the one ``cost_models.transformer.transformer_profile`` describes (layer 0
the embedding, layers 1..N the decoder blocks, layer N+1 the final norm and LM head, whose loss the
pipeline schedule applies), so a plan for a transformer config maps one to one onto these
modules. Every ``TransformerConfig`` option is honoured: gelu or swiglu MLP, layernorm or rmsnorm,
biases, learned or rotary positions (RoPE, Su et al. arXiv:2104.09864), grouped-query attention.

Activation recomputation follows Korthikanti et al. (arXiv:2205.05198) Sec. 5, as the cost model
counts it: ``selective`` recomputes only the attention core (softmax(QK^T)V), keeping Q, K, V;
``full`` keeps only the block input (done by ``stages.ChunkModule``). Both use torch's
non-reentrant ``checkpoint``, which leaves gradients bit-identical.

Differences from the cost model, on purpose: no dropout (runs must be deterministic for
``--check``), and the LM head always has its own weight (tied embeddings would need a cross-stage
all-reduce of the word-embedding gradient; Megatron-LM also keeps a copy on the last stage, which
is what the cost model charges).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from planner.schema import TransformerConfig

__all__ = [
    "Block", "Embedding", "Head", "build_layer", "init_layer", "lm_loss", "model_dtype", "num_model_layers",
    "sample_batch",
]

INIT_STD = 0.02
"""GPT-2's initialisation scale for weights and embeddings."""


def num_model_layers(cfg: TransformerConfig) -> int:
    """Layers of the bundled model as a plan counts them: embedding + blocks + head."""
    return cfg.num_layers + 2


def _norm(cfg: TransformerConfig) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.hidden_size, eps=1e-5)
    return nn.LayerNorm(cfg.hidden_size, eps=1e-5, bias=cfg.bias)


class Embedding(nn.Module):
    """Token embedding plus learned positions (absent with RoPE)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.positions = (
            nn.Embedding(cfg.seq_length, cfg.hidden_size) if cfg.position_embedding == "learned" else None
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tokens(tokens)
        if self.positions is not None:
            x = x + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
        return x


def _rope(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of (batch, heads, seq, head_dim), computed on the fly so that
    meta-device construction leaves no uninitialised buffer behind."""
    seq, dim = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim))
    angles = torch.outer(torch.arange(seq, device=x.device, dtype=torch.float32), inv_freq)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(QK^T / sqrt(d)) V with a causal mask: what selective recompute recomputes."""
    if k.shape[1] != q.shape[1]:  # grouped-query attention: share each K/V head
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Attention(nn.Module):
    """Causal self-attention with one fused QKV projection."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = cfg.num_heads, cfg.kv_heads
        self.head_dim = cfg.hidden_size // cfg.num_heads
        self.rope = cfg.position_embedding == "rope"
        kv_dim = self.num_kv_heads * self.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, cfg.hidden_size + 2 * kv_dim, bias=cfg.bias)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.bias)
        self.selective_recompute = False
        """Recompute the attention core in the backward (Korthikanti's selective recompute)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        kv_dim = self.num_kv_heads * self.head_dim
        q, k, v = self.qkv(x).split((hidden, kv_dim, kv_dim), dim=-1)
        q = q.view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(batch, seq, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(batch, seq, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if self.rope:
            q, k = _rope(q), _rope(k)
        if self.selective_recompute and torch.is_grad_enabled():
            out = checkpoint(attention_core, q, k, v, use_reentrant=False)
        else:
            out = attention_core(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(batch, seq, hidden))


class MLP(nn.Module):
    """gelu: W2 gelu(W1 x); swiglu: W3 (silu(Wg x) * Wu x)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.swiglu = cfg.mlp == "swiglu"
        self.up = nn.Linear(cfg.hidden_size, cfg.ffn_size, bias=cfg.bias)
        self.gate = nn.Linear(cfg.hidden_size, cfg.ffn_size, bias=cfg.bias) if self.swiglu else None
        self.down = nn.Linear(cfg.ffn_size, cfg.hidden_size, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """Pre-norm decoder block: x + attn(norm(x)), then + mlp(norm(x))."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.norm1, self.attn = _norm(cfg), Attention(cfg)
        self.norm2, self.mlp = _norm(cfg), MLP(cfg)

    @property
    def selective_recompute(self) -> bool:
        return self.attn.selective_recompute

    @selective_recompute.setter
    def selective_recompute(self, value: bool) -> None:
        self.attn.selective_recompute = value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Head(nn.Module):
    """Final norm and the LM head (logits); the schedule applies ``lm_loss`` to its output."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.norm = _norm(cfg)
        self.out = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of one microbatch (mean-reduced, as ``scale_grads`` expects)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def build_layer(cfg: TransformerConfig, index: int) -> nn.Module:
    """Layer ``index`` of the bundled model (0 embedding, 1..N blocks, N+1 head), uninitialised.

    Call it under ``torch.device("meta")`` to build without allocating, then ``to_empty`` and
    ``init_layer``.
    """
    if index == 0:
        return Embedding(cfg)
    if index == cfg.num_layers + 1:
        return Head(cfg)
    return Block(cfg)


def init_layer(layer: nn.Module, index: int, *, seed: int) -> None:
    """Deterministic initialisation that depends only on (seed, layer index), never on the rank
    or device: every rank and the single-process reference get bit-identical weights.

    Matrices and embeddings ~ N(0, 0.02) (GPT-2's scale), norm scales 1, biases 0. Values are drawn
    on the CPU in fp32 and then copied, so the device does not change them.
    """
    generator = torch.Generator().manual_seed(seed * 1_000_003 + index)
    with torch.no_grad():
        for name, param in layer.named_parameters():
            if param.dim() >= 2:
                values = torch.randn(param.shape, generator=generator, dtype=torch.float32) * INIT_STD
            elif name.endswith("bias"):
                values = torch.zeros(param.shape)
            else:
                values = torch.ones(param.shape)
            param.copy_(values.to(device=param.device, dtype=param.dtype))


def sample_batch(cfg: TransformerConfig, *, batch_size: int, step: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic next-token data for step ``step``: (tokens, targets), both (batch, seq) int64.

    Deterministic in (seed, step) so that the pipeline ranks and the reference see the same batch.
    """
    generator = torch.Generator().manual_seed(seed * 7919 + step + 1)
    data = torch.randint(0, cfg.vocab_size, (batch_size, cfg.seq_length + 1), generator=generator)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


def model_dtype(cfg: TransformerConfig, device: torch.device) -> torch.dtype:
    """fp32 on CPU (CPU half-precision matmuls are slow and lossy); the config's dtype on CUDA."""
    if device.type != "cuda":
        return torch.float32
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[cfg.dtype]


def num_layer_params(layer: nn.Module) -> int:
    """Parameters of one layer."""
    return sum(p.numel() for p in layer.parameters())

