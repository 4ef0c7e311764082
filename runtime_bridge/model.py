"""The decoder the runtime bridge executes: embedding, N blocks, final norm + LM head.

Built from a ``planner.schema.TransformerConfig`` with seeded random weights, so any preset,
transformer JSON or Hugging Face ``config.json`` read into a config runs as is. The layer
structure is the one ``cost_models.transformer.transformer_profile`` describes (layer 0 the
embedding, layers 1..N the decoder blocks, layer N+1 the final norm and LM head, whose loss the
pipeline schedule applies), so a plan's layer ``i`` is the model's layer ``i``.

Every config option is honoured, which covers the GPT family and the Llama family:

- attention: separate Q, K, V and output projections (so tensor parallelism can split heads),
  grouped-query attention (``num_kv_heads``), rotary positions (RoPE, Su et al.,
  arXiv:2104.09864) with ``rope_theta`` or learned positions;
- MLP: GELU or SwiGLU (Shazeer, arXiv:2002.05202); norms: LayerNorm or RMSNorm with ``norm_eps``;
- mixture of experts (``num_experts``, ``experts_per_token``, ``moe_ffn_hidden_size``,
  ``num_shared_experts``, ``first_dense_layers``): a Mixtral-style block (Jiang et al., *Mixtral
  of Experts*, arXiv:2401.04088, Sec. 2.1): a linear router, softmax over the top-k logits,
  the token's output the weighted sum of its k experts' SwiGLU/GELU FFNs, plus shared experts.
  Dropless: every token reaches its k experts (``capacity_factor`` is not applied); no auxiliary
  load-balancing loss.

Parameter names follow torchtitan's Llama (``attention.wq``, ``feed_forward.w1``...), which is
what ``runtime_bridge.parallel`` applies torch's tensor-parallel styles to.

Activation recomputation follows Korthikanti et al. (arXiv:2205.05198) Sec. 5, as the cost model
counts it: ``selective`` recomputes only the attention core (softmax(QK^T)V), keeping Q, K, V;
``full`` keeps only the block input (done by ``stages.ChunkModule``). Both use torch's
non-reentrant ``checkpoint``, which leaves gradients bit-identical. Megatron-Core's per-module sets
(``Block.recompute_modules``: ``core_attn``, ``layernorm``, ``mlp``, ``moe``, ``moe_act``,
``shared_experts``) are run as ``runtime_bridge.recompute`` describes.

Differences from the cost model, on purpose: no dropout (runs must be deterministic for
``--check``), and the LM head always has its own weight (tied embeddings would need a cross-stage
all-reduce of the word-embedding gradient; Megatron-LM also keeps a copy on the last stage, which
is what the cost model charges).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from planner.schema import TransformerConfig
from runtime_bridge.recompute import discard_output

__all__ = [
    "Block", "Embedding", "Head", "MoE", "build_layer", "init_layer", "is_moe_layer", "lm_loss", "model_dtype",
    "num_model_layers", "sample_batch",
]

INIT_STD = 0.02
"""GPT-2's initialisation scale for weights and embeddings."""
DEFAULT_NORM_EPS = 1e-5
DEFAULT_ROPE_THETA = 10000.0


def num_model_layers(cfg: TransformerConfig) -> int:
    """Layers of the bundled model as a plan counts them: embedding + blocks + head."""
    return cfg.num_layers + 2


def layer_window(cfg: TransformerConfig, index: int) -> int | None:
    """The sliding window block ``index`` (1..N) attends, or None for full causal attention: every
    block when ``global_attention_every`` is unset, else all but blocks k, 2k, ... (0-based k-1, ...)."""
    window, every = getattr(cfg, "sliding_window", None), getattr(cfg, "global_attention_every", None)
    if window is None or (every and index % every == 0):
        return None
    return window


def is_moe_layer(cfg: TransformerConfig, index: int) -> bool:
    """Whether model layer ``index`` (1..N a block) has a mixture-of-experts FFN."""
    return cfg.num_experts is not None and 1 <= index <= cfg.num_layers and index - 1 >= cfg.first_dense_layers


def _norm(cfg: TransformerConfig) -> nn.Module:
    eps = cfg.norm_eps or DEFAULT_NORM_EPS
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.hidden_size, eps=eps)
    return nn.LayerNorm(cfg.hidden_size, eps=eps, bias=cfg.bias)


class Embedding(nn.Module):
    """Token embedding plus learned positions (absent with RoPE)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.positions = (
            nn.Embedding(cfg.seq_length, cfg.hidden_size) if cfg.position_embedding == "learned" else None
        )
        self.context = None
        """Context parallelism (``runtime_bridge.context_parallel.ContextShard``): the positions held."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tokens(tokens)
        if self.positions is not None:
            held = self.context.positions if self.context is not None else None
            x = x + self.positions(held if held is not None else torch.arange(tokens.shape[1], device=tokens.device))
        return x


def _llama3_scaled(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama 3.1's RoPE frequency scaling (``rope_type: llama3``): long wavelengths divided by
    ``factor``, short ones kept, a smooth blend between (Llama 3 herd paper, arXiv:2407.21783, and
    the released configs' ``factor``, ``low_freq_factor``, ``high_freq_factor``,
    ``original_max_position_embeddings``)."""
    factor, low, high = float(scaling["factor"]), float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    context = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * torch.pi / inv_freq
    scaled = torch.where(wavelen > context / low, inv_freq / factor, inv_freq)
    smooth = (context / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= context / high) & (wavelen <= context / low)
    return torch.where(medium, blended, scaled)


def _rope(x: torch.Tensor, theta: float, scaling: dict | None = None, positions: torch.Tensor | None = None
          ) -> torch.Tensor:
    """Rotary position embedding of (batch, heads, seq, head_dim), computed on the fly so that
    meta-device construction leaves no uninitialised buffer behind; ``positions``: the tokens'
    positions in the sequence (context parallelism holds a subset), default 0..seq-1."""
    seq, dim = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim))
    if scaling and scaling.get("rope_type", scaling.get("type")) == "llama3":
        inv_freq = _llama3_scaled(inv_freq, scaling)
    if positions is None:
        positions = torch.arange(seq, device=x.device)
    angles = torch.outer(positions.to(torch.float32), inv_freq)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi's per-head slopes (Press et al., "Train Short, Test Long", ICLR 2022, Sec. 3): the
    geometric sequence 2^(-8 i / n) for the n = 2^k heads below ``num_heads``; the remaining heads
    take every other term of the sequence for 2n heads (BLOOM's and MPT's rule)."""
    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = [2.0 ** (-8.0 * (i + 1) / closest) for i in range(closest)]
    slopes += [2.0 ** (-4.0 * (2 * i + 1) / closest) for i in range(num_heads - closest)]
    return torch.tensor(slopes)


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
                   ) -> torch.Tensor:
    """softmax(QK^T / sqrt(d)) V with a causal mask (``mask``: an explicit boolean one, or ALiBi's additive bias, for queries
    that are a subset of the sequence under context parallelism, or a sliding window): what
    selective recompute recomputes."""
    if k.shape[1] != q.shape[1]:  # grouped-query attention: share each K/V head
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    if mask is not None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def head_dim(cfg: TransformerConfig) -> int:
    """Per-head width: the config's ``head_dim`` when it has one (Qwen3), else hidden / heads."""
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_heads


class Attention(nn.Module):
    """Causal self-attention. Head counts come from the projections' (local) widths, so the same
    code runs whole or with heads split by tensor parallelism. Optional: biases on Q, K, V only
    (``qkv_bias``, Qwen2), RMSNorm on each head's queries and keys (``qk_norm``, Qwen3)."""

    def __init__(self, cfg: TransformerConfig, window: int | None = None) -> None:
        super().__init__()
        self.head_dim = head_dim(cfg)
        self.window = window
        """Sliding window (itself and the ``window - 1`` keys before it), or None: full causal."""
        self.rope_theta = (cfg.rope_theta or DEFAULT_ROPE_THETA) if cfg.position_embedding == "rope" else None
        self.alibi = cfg.position_embedding == "alibi"
        """ALiBi: the scores get -slope x distance per head (the bridge refuses it with tensor parallelism)."""
        self.rope_scaling = getattr(cfg, "rope_scaling", None)
        q_dim, kv_dim = cfg.num_heads * self.head_dim, cfg.kv_heads * self.head_dim
        qkv_bias = cfg.bias or bool(getattr(cfg, "qkv_bias", False))
        self.wq = nn.Linear(cfg.hidden_size, q_dim, bias=qkv_bias)
        self.wk = nn.Linear(cfg.hidden_size, kv_dim, bias=qkv_bias)
        self.wv = nn.Linear(cfg.hidden_size, kv_dim, bias=qkv_bias)
        self.wo = nn.Linear(q_dim, cfg.hidden_size, bias=cfg.bias)
        qk_norm = bool(getattr(cfg, "qk_norm", False))
        eps = cfg.norm_eps or DEFAULT_NORM_EPS
        self.q_norm = nn.RMSNorm(self.head_dim, eps=eps) if qk_norm else None
        self.k_norm = nn.RMSNorm(self.head_dim, eps=eps) if qk_norm else None
        self.selective_recompute = False
        """Recompute the attention core in the backward (Korthikanti's selective recompute)."""
        self.context = None
        """Context parallelism (``runtime_bridge.context_parallel.ContextShard``): this rank's
        positions, and the all-gather of the keys and values of the whole sequence."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq = x.shape[0], x.shape[1]
        q, k, v = (w(x).view(batch, seq, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cp = self.context
        positions = cp.positions if cp is not None else None
        if self.rope_theta is not None:
            q, k = (_rope(t, self.rope_theta, self.rope_scaling, positions) for t in (q, k))
        mask = None
        if cp is not None:
            k, v, mask = cp.gather(k), cp.gather(v), cp.mask
        if self.window is not None or self.alibi:
            rows = positions if positions is not None else torch.arange(seq, device=x.device)
            keys = torch.arange(k.shape[2], device=x.device)
            if self.window is not None:
                mask = (rows[:, None] >= keys[None, :]) & (rows[:, None] - keys[None, :] < self.window)
            if self.alibi:
                allowed = mask if mask is not None else rows[:, None] >= keys[None, :]
                distance = (keys[None, :] - rows[:, None]).to(q.dtype)
                bias = alibi_slopes(q.shape[1]).to(q.device, q.dtype)[:, None, None] * distance
                mask = bias.masked_fill(~allowed, float("-inf"))
        if self.selective_recompute and torch.is_grad_enabled():
            out = checkpoint(attention_core, q, k, v, mask, use_reentrant=False)
        else:
            out = attention_core(q, k, v, mask)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


def _activation(kind: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The FFN's activation: SiLU gates SwiGLU, tanh GELU gates GeGLU (Gemma), GELU and ReLU (OPT)."""
    if kind == "swiglu":
        return F.silu
    if kind == "geglu":
        return lambda x: F.gelu(x, approximate="tanh")
    return F.relu if kind == "relu" else F.gelu


class FeedForward(nn.Module):
    """gelu / relu: w2 act(w1 x); swiglu / geglu: w2 (act(w1 x) * w3 x)."""

    def __init__(self, cfg: TransformerConfig, ffn_size: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.hidden_size, ffn_size, bias=cfg.bias)
        self.w3 = nn.Linear(cfg.hidden_size, ffn_size, bias=cfg.bias) if cfg.gated_mlp else None
        self.w2 = nn.Linear(ffn_size, cfg.hidden_size, bias=cfg.bias)
        self.act = _activation(cfg.mlp)

        self.discard_activation = False
        """Drop the activation output FC2 keeps and re-make it in the backward (``moe_act``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up = self.w1(x)
        gate = self.w3(x) if self.w3 is not None else None

        def activation() -> torch.Tensor:
            return self.act(up) * gate if gate is not None else self.act(up)

        if self.discard_activation:
            return discard_output(activation, self.w2)
        return self.w2(activation())


class MoE(nn.Module):
    """Mixtral's sparse MoE block: top-k of a linear router's logits, softmax over those k, the
    weighted sum of the chosen experts' FFNs (plus always-on shared experts). Every expert runs
    on its (possibly empty) token set each step, so every parameter gets a gradient."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        assert cfg.num_experts is not None and cfg.experts_per_token is not None
        self.top_k = cfg.experts_per_token
        ffn = cfg.moe_ffn_hidden_size or cfg.ffn_size
        self.router = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.experts = nn.ModuleList(FeedForward(cfg, ffn) for _ in range(cfg.num_experts))
        self.shared = FeedForward(cfg, ffn * cfg.num_shared_experts) if cfg.num_shared_experts else None
        self.recompute_shared = False
        """Checkpoint the shared experts (``shared_experts``)."""

    def set_discard_activation(self, value: bool) -> None:
        """``moe_act``: the routed experts drop their activation output (output-discarding checkpoint)."""
        for expert in self.experts:
            expert.discard_activation = value  # type: ignore[assignment]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        logits, chosen = torch.topk(self.router(flat), self.top_k, dim=-1)
        weights = torch.softmax(logits.float(), dim=-1).to(x.dtype)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(chosen == e)
            out = out.index_add(0, token, expert(flat[token]) * weights[token, slot, None])
        if self.shared is not None:
            shared = (checkpoint(self.shared, flat, use_reentrant=False) if self.recompute_shared
                      and torch.is_grad_enabled() else self.shared(flat))
            out = out + shared
        return out.view_as(x)


class Block(nn.Module):
    """Pre-norm decoder block: x + attention(norm(x)), then + feed_forward(norm(x))."""

    def __init__(self, cfg: TransformerConfig, *, moe: bool = False, window: int | None = None) -> None:
        super().__init__()
        self.attention_norm, self.attention = _norm(cfg), Attention(cfg, window)
        self.ffn_norm = _norm(cfg)
        self.feed_forward = MoE(cfg) if moe else FeedForward(cfg, cfg.ffn_size)
        self.parallel = bool(getattr(cfg, "parallel_block", False))
        """GPT-J / GPT-NeoX block: x + attention(norm(x)) + feed_forward(norm'(x))."""
        self._modules_recomputed: frozenset[str] = frozenset()

    @property
    def selective_recompute(self) -> bool:
        return self.attention.selective_recompute

    @selective_recompute.setter
    def selective_recompute(self, value: bool) -> None:
        self.attention.selective_recompute = value

    @property
    def recompute_modules(self) -> frozenset[str]:
        """Megatron-Core recompute modules of this block (``runtime_bridge.recompute``)."""
        return self._modules_recomputed

    @recompute_modules.setter
    def recompute_modules(self, modules: frozenset[str]) -> None:
        self._modules_recomputed = frozenset(modules)
        self.attention.selective_recompute = "core_attn" in modules
        if isinstance(self.feed_forward, MoE):
            self.feed_forward.set_discard_activation("moe_act" in modules)
            self.feed_forward.recompute_shared = "shared_experts" in modules

    def _ffn(self, h: torch.Tensor) -> torch.Tensor:
        whole = "moe" if isinstance(self.feed_forward, MoE) else "mlp"
        if whole in self._modules_recomputed and torch.is_grad_enabled():
            return checkpoint(self.feed_forward, h, use_reentrant=False)
        return self.feed_forward(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if "layernorm" in self._modules_recomputed:  # the norms' outputs are re-made in the backward
            h = x + discard_output(lambda: self.attention_norm(x), self.attention)  # (x stays bound: no rebinding)
            ffn_in = x if self.parallel else h
            return h + discard_output(lambda: self.ffn_norm(ffn_in), self._ffn)
        if self.parallel:
            return x + self.attention(self.attention_norm(x)) + self._ffn(self.ffn_norm(x))
        x = x + self.attention(self.attention_norm(x))
        return x + self._ffn(self.ffn_norm(x))


class Head(nn.Module):
    """Final norm and the LM head (logits); the schedule applies ``lm_loss`` to its output."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.norm = _norm(cfg)
        self.output = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.norm(x))


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
    return Block(cfg, moe=is_moe_layer(cfg, index), window=layer_window(cfg, index))


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
