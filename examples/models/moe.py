"""A small Mixtral-style transformer: every feed-forward is a top-k mixture of experts.

Attention, RMSNorm and RoPE come from :mod:`examples.models.llama3`. Each MoE
block routes every token to its ``top_k`` highest-scoring experts (a softmax
over the chosen logits gives the mixing weights, as in Mixtral) and runs each
expert as a SwiGLU. Experts are stored stacked, ``w1: (n_experts, dim,
hidden)``, so expert parallelism is a shard of tensor dim 0.

Tokens reach the experts through a fixed-capacity dispatch (as in GShard /
Switch): the tokens are routed in ``n_groups`` independent groups (GShard's
groups; one by default), and in each group an expert takes at most
``capacity = ceil(capacity_factor * group_tokens * top_k / n_experts)`` tokens,
chosen in order, and overflow tokens skip it. Every shape is then known before
the data is, which is what tracing on fake tensors needs (a gather by
data-dependent index lists would not trace). A Switch-style load-balancing loss
is added to the cross-entropy.

**Expert parallelism in this form.** The dispatched tokens are one tensor
``expert_in[e, g, c, d]`` (expert, group, slot, feature). Groups split over a
mesh dim (data parallelism: each rank routes its own groups) and experts split
over the same dim meet in one change of that tensor's split from ``g`` to
``e``, an all-to-all of fixed sizes (GShard's), and the experts' outputs go
back by the reverse one: static placements, chosen and priced by the solver as
any redistribution. Without groups (``n_groups = 1``) the dispatch tensors grow
with the square of the tokens and the groups cannot split, so the tokens reach
split experts by all-gathers and reductions instead.

Factories: ``tiny`` (tests), ``small``.

>>> model, (tokens, labels) = tiny(device="meta")
>>> model(tokens, labels).shape
torch.Size([])
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from examples.models.factory import Example, build_example, random_tokens, split_overrides
from examples.models.llama3 import Attention, LlamaConfig, build_rope_tables

__all__ = ["MoEConfig", "MoETransformer", "MoEFeedForward", "tiny", "small"]


@dataclass(kw_only=True, slots=True)
class MoEConfig:
    """Architecture of :class:`MoETransformer`."""

    vocab_size: int
    """Number of token ids."""

    dim: int
    """Width of the residual stream."""

    n_layers: int
    """Number of transformer blocks (each with an MoE feed-forward)."""

    n_heads: int
    """Query heads per block."""

    n_kv_heads: int
    """Key/value heads per block (grouped-query attention)."""

    n_experts: int
    """Experts per MoE block."""

    top_k: int = 2
    """Experts each token is routed to."""

    expert_hidden_dim: int
    """SwiGLU hidden width of each expert."""

    capacity_factor: float = 1.25
    """Expert buffer size relative to a perfectly balanced load."""

    aux_loss_coef: float = 0.01
    """Weight of the load-balancing loss added to the cross-entropy."""

    n_groups: int = 1
    """Routing groups (GShard): the tokens of a batch, in order, split into this many groups,
    each routed with its own expert capacity; must divide the batch's tokens."""

    max_seq_len: int = 2048
    """Length of the RoPE tables (longest sequence)."""

    norm_eps: float = 1e-5
    """RMSNorm epsilon."""

    rope_theta: float = 1e6
    """RoPE base frequency."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "n_experts", "expert_hidden_dim",
                     "n_groups"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"top_k must be between 1 and n_experts={self.n_experts}, got {self.top_k}")
        if self.capacity_factor <= 0:
            raise ValueError(f"capacity_factor must be > 0, got {self.capacity_factor}")
        self.attention_config()  # raises on heads that do not divide dim

    def attention_config(self) -> LlamaConfig:
        """The attention shapes, as the :class:`LlamaConfig` that llama3's modules take."""
        return LlamaConfig(vocab_size=self.vocab_size, dim=self.dim, n_layers=self.n_layers,
                           n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, norm_eps=self.norm_eps,
                           rope_theta=self.rope_theta, max_seq_len=self.max_seq_len)


def route_top_k(
    logits: torch.Tensor, top_k: int, capacity: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dispatch and combine tensors ``(..., tokens, experts, capacity)`` and router probabilities,
    for router ``logits`` of shape ``(..., tokens, experts)`` (leading dims: routing groups, each
    routed on its own).

    ``dispatch[t, e, c]`` is 1 when token t sits in slot c of expert e;
    ``combine`` is the same with the token's mixing weight for that expert.
    First choices take slots before second choices; within one choice,
    earlier tokens first.

    >>> d, c, _ = route_top_k(torch.tensor([[2.0, 1.0, 0.0], [0.0, 1.0, 2.0]]), 1, 1)
    >>> d.sum(dim=(1, 2)).tolist()
    [1.0, 1.0]
    """
    n_experts = logits.shape[-1]
    top_logits, top_index = logits.topk(top_k, dim=-1)
    weights = top_logits.softmax(dim=-1)  # (..., tokens, k): Mixtral mixes the chosen experts only
    experts = torch.arange(n_experts, device=logits.device)
    chosen = (top_index.unsqueeze(-1) == experts).to(logits.dtype)  # (..., tokens, k, experts)
    # slot of each (token, choice) in its expert's buffer: a running count in choice-major order
    by_choice = chosen.transpose(-3, -2)
    slot = (by_choice.flatten(-3, -2).cumsum(dim=-2).view_as(by_choice) - 1).transpose(-3, -2)
    slots = torch.arange(capacity, device=logits.device, dtype=logits.dtype)
    in_slot = (slot.unsqueeze(-1) == slots).to(logits.dtype) * chosen.unsqueeze(-1)  # (..., tokens, k, experts, capacity)
    dispatch = in_slot.sum(dim=-3)
    combine = (in_slot * weights[..., None, None]).sum(dim=-3)
    return dispatch, combine, logits.softmax(dim=-1)


class MoEFeedForward(nn.Module):
    """Top-k mixture of SwiGLU experts with fixed-capacity dispatch."""

    def __init__(self, config: MoEConfig) -> None:
        super().__init__()
        self.top_k, self.capacity_factor, self.n_groups = config.top_k, config.capacity_factor, config.n_groups
        experts, dim, hidden = config.n_experts, config.dim, config.expert_hidden_dim
        self.router = nn.Linear(dim, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, dim, hidden) / math.sqrt(dim))
        self.w3 = nn.Parameter(torch.randn(experts, dim, hidden) / math.sqrt(dim))
        self.w2 = nn.Parameter(torch.randn(experts, hidden, dim) / math.sqrt(hidden))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the block output and its load-balancing loss."""
        tokens = x.flatten(0, -2)
        n_tokens, n_experts, groups = tokens.shape[0], self.w1.shape[0], self.n_groups
        if n_tokens % groups:
            raise ValueError(f"n_groups={groups} does not divide the batch's {n_tokens} tokens")
        grouped = tokens.view(groups, n_tokens // groups, tokens.shape[-1])
        capacity = math.ceil(self.capacity_factor * (n_tokens // groups) * self.top_k / n_experts)
        dispatch, combine, probs = route_top_k(self.router(grouped), self.top_k, capacity)
        # experts first: a split of the groups becomes a split of the experts in one all-to-all
        expert_in = torch.einsum("gsec,gsd->egcd", dispatch, grouped).flatten(1, 2)
        hidden = F.silu(torch.bmm(expert_in, self.w1)) * torch.bmm(expert_in, self.w3)
        expert_out = torch.bmm(hidden, self.w2).view(n_experts, groups, capacity, -1)
        out = torch.einsum("gsec,egcd->gsd", combine, expert_out)
        # Switch loss: n_experts * sum_e (share of tokens sent to e) * (mean router prob of e)
        load = dispatch.sum(dim=(0, 1, 3)) / (n_tokens * self.top_k)
        aux_loss = n_experts * (load * probs.mean(dim=(0, 1))).sum()
        return out.reshape(x.shape), aux_loss


class MoEBlock(nn.Module):
    """Pre-norm block: ``x + attention(norm(x))``, then ``x + moe(norm(x))``."""

    def __init__(self, config: MoEConfig) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.attention = Attention(config.attention_config())
        self.ffn_norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.moe = MoEFeedForward(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        out, aux_loss = self.moe(self.ffn_norm(x))
        return x + out, aux_loss


class MoETransformer(nn.Module):
    """Embedding, MoE blocks, RMSNorm, untied head; returns cross-entropy + aux loss."""

    def __init__(self, config: MoEConfig) -> None:
        super().__init__()
        self.aux_loss_coef = config.aux_loss_coef
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(MoEBlock(config) for _ in range(config.n_layers))
        self.norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        head_dim = config.dim // config.n_heads
        cos, sin = build_rope_tables(head_dim, config.max_seq_len, config.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        cos, sin = self.rope_cos[:seq], self.rope_sin[:seq]
        x = self.tok_embeddings(tokens)
        aux_total = x.new_zeros(())
        for layer in self.layers:
            x, aux_loss = layer(x, cos, sin)
            aux_total = aux_total + aux_loss
        logits = self.output(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten()) + self.aux_loss_coef * aux_total


def _make(preset: dict, defaults: dict, overrides: dict) -> Example:
    """Build a :class:`MoETransformer` and ``(tokens, labels)`` of shape ``(batch_size, seq_len)``."""
    config, opts = split_overrides(MoEConfig, preset, defaults, overrides)
    if opts.seq_len is None or opts.seq_len > config.max_seq_len:
        raise ValueError(f"seq_len must be between 1 and max_seq_len={config.max_seq_len}, got {opts.seq_len}")
    shape = (opts.batch_size, opts.seq_len)
    return build_example(
        opts,
        lambda: MoETransformer(config),
        lambda gen: (random_tokens(shape, config.vocab_size, gen), random_tokens(shape, config.vocab_size, gen)),
    )


def tiny(**overrides: object) -> Example:
    """2 layers, dim 32, 4 experts (top-2) of width 64, vocab 128, batch 2 x 16: for tests.

    >>> model, _ = tiny(device="meta", n_experts=8)
    >>> tuple(model.layers[0].moe.w1.shape)
    (8, 32, 64)
    """
    preset = {"vocab_size": 128, "dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
              "n_experts": 4, "top_k": 2, "expert_hidden_dim": 64, "max_seq_len": 64}
    return _make(preset, {"batch_size": 2, "seq_len": 16}, overrides)


def small(**overrides: object) -> Example:
    """Mixtral-like proportions scaled down: 8 layers, dim 1024, 8 experts (top-2), batch 8 x 1024, on meta.

    >>> model, _ = small()
    >>> len(model.layers)
    8
    """
    preset = {"vocab_size": 32000, "dim": 1024, "n_layers": 8, "n_heads": 16, "n_kv_heads": 4,
              "n_experts": 8, "top_k": 2, "expert_hidden_dim": 3584, "max_seq_len": 4096}
    return _make(preset, {"batch_size": 8, "seq_len": 1024, "device": "meta"}, overrides)
