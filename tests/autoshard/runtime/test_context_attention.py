"""Context-parallel attention (``autoshard.runtime.context_attention``, ``context_ring``) on 2 and 4 gloo ranks.

Every rank builds the same whole ``q, k, v`` and output gradient, runs the
exchange on its own chunks, and reports its output and ``dQ, dK, dV`` next to
the same chunks of single-device ``F.scaled_dot_product_attention`` (autograd)
of the whole sequence: causal and not, GQA, sliding windows smaller and larger
than a chunk, key padding on either side (left: rows that see no key, 0 in
both), the load-balanced and the contiguous layout, the CPU flash kernel and
the matmul one, K/V kept or gathered again for the backward, and the ring.
float64 within 1e-12, float32 within 1e-5. A tiny causal LM (embedding, RoPE at the rank's
positions, CP attention, shifted-label cross-entropy) gives the single-device
loss and gradients summed over ranks. One spawn per world size runs every case.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from gloo_ranks import spawn

from autoshard.runtime.context_attention import (context_attention, from_load_balanced, load_balanced_index,
                                                 sequence_shard, shard_positions, to_load_balanced)
from autoshard.runtime.context_ring import ring_attention

DEFAULTS = {"dtype": torch.float64, "heads": 4, "kv_heads": 2, "chunk": 4, "causal": True, "window": None,
            "load_balanced": True, "kernel": "cpu", "keep_gathered": True, "padding": None, "ring": False}
"""padding: the last (right) or first (left: rows that see no key) 5 tokens of batch row 1 are padding."""
CASES = {
    "causal": {"kv_heads": 4},
    "causal-gqa": {"chunk": 3},
    "causal-contiguous": {"load_balanced": False},
    "full": {"causal": False, "chunk": 3},
    "window-in-chunk": {"window": 3},
    "window-across-chunks": {"window": 6},
    "window-non-causal": {"causal": False, "window": 5},
    "regather": {"window": 6, "keep_gathered": False},
    "math-kernel": {"window": 6, "kernel": "math"},
    "padding-right": {"padding": "right"},
    "padding-left-window": {"padding": "left", "window": 6},
    "padding-left-math": {"padding": "left", "load_balanced": False, "kernel": "math", "keep_gathered": False},
    "padding-non-causal": {"padding": "right", "causal": False, "chunk": 3},
    "float32": {"dtype": torch.float32},
    "float32-window": {"dtype": torch.float32, "window": 5, "load_balanced": False},
    "ring": {"ring": True},
    "ring-contiguous-window": {"ring": True, "load_balanced": False, "window": 6},
    "ring-non-causal-padding": {"ring": True, "causal": False, "padding": "left", "kernel": "math"},
    "ring-float32": {"ring": True, "dtype": torch.float32, "kv_heads": 4},
}
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5}


def _real_tokens(length: int, padding: str | None) -> torch.Tensor | None:
    """``[2, length]``: True for a real token; batch row 1 padded with 5 tokens on one side."""
    if padding is None:
        return None
    real = torch.ones(2, length, dtype=torch.bool)
    real[1, -5:] = padding != "right"
    real[1, :5] = padding != "left"
    return real


def _mask(length: int, causal: bool, window: int | None, real: torch.Tensor | None) -> torch.Tensor | None:
    """The boolean mask ``F.scaled_dot_product_attention`` takes for the same visibility rule."""
    if window is None and real is None:
        return None
    offset = torch.arange(length).unsqueeze(1) - torch.arange(length).unsqueeze(0)
    keep = offset.abs() < window if window is not None else torch.ones(length, length, dtype=torch.bool)
    keep = keep & (offset >= 0) if causal else keep
    return keep if real is None else keep & real[:, None, None, :]


def _case(rank: int, world: int, options: dict[str, Any]) -> dict[str, float]:
    o = DEFAULTS | options
    dtype, heads, kv_heads, causal, window, balanced = (o[n] for n in ("dtype", "heads", "kv_heads", "causal", "window",
                                                                       "load_balanced"))
    chunk, padding = o["chunk"], o["padding"]
    length = chunk * (2 * world if balanced else world)
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, heads, length, 8, dtype=dtype, generator=gen, requires_grad=True)
    k = torch.randn(2, kv_heads, length, 8, dtype=dtype, generator=gen, requires_grad=True)
    v = torch.randn(2, kv_heads, length, 8, dtype=dtype, generator=gen, requires_grad=True)
    dout = torch.randn(2, heads, length, 8, dtype=dtype, generator=gen)
    real = _real_tokens(length, padding)
    mask = _mask(length, causal, window, real)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None,
                                         enable_gqa=kv_heads != heads)
    ref.backward(dout)

    def mine(t: torch.Tensor, dim: int = 2) -> torch.Tensor:
        return sequence_shard(t.detach(), world, rank, dim=dim, load_balanced=balanced)

    local = [mine(t).requires_grad_() for t in (q, k, v)]
    args = {"causal": causal, "window": window, "load_balanced": balanced, "kernel": o["kernel"],
            "key_padding": None if real is None else mine(real, dim=1)}
    if o["ring"]:
        out = ring_attention(*local, **args)
    else:
        out = context_attention(*local, keep_gathered=o["keep_gathered"], **args)
    out.backward(mine(dout))
    errors = {"out": (out - mine(ref)).abs().max().item()}
    for name, got, want in zip(("dq", "dk", "dv"), local, (q, k, v)):
        errors[name] = (got.grad - mine(want.grad)).abs().max().item()
    return errors


def _rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x [B, H, S, D]`` at ``positions [S]``."""
    half = x.shape[-1] // 2
    angle = positions.to(x.dtype).unsqueeze(1) * (10000.0 ** (-torch.arange(half, dtype=x.dtype) / half))
    cos, sin = angle.cos(), angle.sin()
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def _lm_loss(params: dict[str, torch.Tensor], tokens: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor,
             attend: Any, total_tokens: int) -> torch.Tensor:
    """Embedding, RoPE'd causal attention (GQA), output head; the shifted-label loss summed, over all tokens."""
    x = params["embed"][tokens]
    b, s, _ = x.shape
    q = (x @ params["wq"]).view(b, s, 4, 8).transpose(1, 2)
    k = (x @ params["wk"]).view(b, s, 2, 8).transpose(1, 2)
    v = (x @ params["wv"]).view(b, s, 2, 8).transpose(1, 2)
    h = attend(_rope(q, positions), _rope(k, positions), v).transpose(1, 2).reshape(b, s, 32)
    logits = (x + h) @ params["head"]
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum") / total_tokens


def _lm(rank: int, world: int) -> dict[str, Any]:
    """The tiny LM on this rank's tokens; the single-device loss and gradients for the test to compare."""
    gen = torch.Generator().manual_seed(2)
    length = 4 * 2 * world
    params = {"embed": torch.randn(11, 32, dtype=torch.float64, generator=gen),
              "wq": torch.randn(32, 32, dtype=torch.float64, generator=gen) / 6,
              "wk": torch.randn(32, 16, dtype=torch.float64, generator=gen) / 6,
              "wv": torch.randn(32, 16, dtype=torch.float64, generator=gen) / 6,
              "head": torch.randn(32, 11, dtype=torch.float64, generator=gen) / 6}
    for p in params.values():
        p.requires_grad_()
    tokens = torch.randint(0, 11, (2, length), generator=gen)
    labels = torch.cat([tokens[:, 1:], torch.full((2, 1), -100)], dim=1)  # shifted on the whole sequence first
    count = int((labels != -100).sum())
    whole = _lm_loss(params, tokens, labels, torch.arange(length),
                     lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), count)
    want = torch.autograd.grad(whole, list(params.values()))
    mine = _lm_loss(params, sequence_shard(tokens, world, rank), sequence_shard(labels, world, rank),
                    shard_positions(length, world, rank), lambda q, k, v: context_attention(q, k, v), count)
    got = torch.autograd.grad(mine, list(params.values()))
    return {"loss": mine.detach(), "want_loss": whole.detach(), "grads": got, "want_grads": want}


BAD_CALLS = {
    "3-d query": (dict(q=(2, 4, 8)), "context_attention: q must be [batch, heads, seq_local, head_dim], got (2, 4, 8)"),
    "heads": (dict(q=(2, 3, 8, 8)), "context_attention: k's 2 heads do not divide q's 3 (GQA)"),
    "odd chunk": (dict(q=(2, 4, 7, 8), k=(2, 2, 7, 8), v=(2, 2, 7, 8)),
                  "q's seq_local 7 does not split into 2 equal chunks"),
    "kernel": (dict(kernel="ring"), "context_attention: kernel 'ring' is not one of cpu, math, flash, efficient"),
    "padding": (dict(key_padding=(2, 5)), "key_padding must be [batch, seq_local] = [2, 8], got [2, 5]"),
    "window": (dict(window=0), "window: must be a positive int or None, got 0"),
}


def _bad_call(change: dict[str, Any]) -> str | None:
    shapes = {"q": (2, 4, 8, 8), "k": (2, 2, 8, 8), "v": (2, 2, 8, 8)}
    shapes.update({n: change[n] for n in shapes if n in change})
    tensors = {n: torch.zeros(s) for n, s in shapes.items()}
    options = {n: x for n, x in change.items() if n not in shapes}
    if "key_padding" in options:
        options["key_padding"] = torch.ones(options["key_padding"], dtype=torch.bool)
    try:
        context_attention(tensors["q"], tensors["k"], tensors["v"], **options)
    except ValueError as exc:
        return str(exc)
    return None


def cp_jobs(rank: int, world: int) -> dict[str, Any]:
    """Every case of :data:`CASES`, the tiny LM, the error of every bad call."""
    out: dict[str, Any] = {name: _case(rank, world, spec) for name, spec in CASES.items()}
    out["lm"] = _lm(rank, world)
    out["errors"] = {name: _bad_call(change) for name, (change, _) in BAD_CALLS.items()}
    return out


@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"{w}-ranks")
def ranks(request, tmp_path_factory) -> list[dict[str, Any]]:
    world = request.param
    return spawn(world, cp_jobs, (), tmp_path_factory.mktemp(f"cp{world}"), timeout=120)


@pytest.mark.parametrize("case", sorted(CASES))
def test_output_and_gradients_equal_one_device(ranks, case):
    tolerance = TOLERANCE[(DEFAULTS | CASES[case])["dtype"]]
    for rank, result in enumerate(ranks):
        errors = result[case]
        assert max(errors.values()) <= tolerance, f"rank {rank}, {case}: {errors}"


def test_rope_at_shard_positions_and_the_shifted_loss_give_the_single_device_step(ranks):
    want = ranks[0]["lm"]
    loss = sum(r["lm"]["loss"] for r in ranks)
    assert abs(loss - want["want_loss"]) < 1e-12
    for i, expected in enumerate(want["want_grads"]):
        got = sum(r["lm"]["grads"][i] for r in ranks)  # CP ranks hold replicas: their gradients add up
        assert torch.allclose(got, expected, rtol=0, atol=1e-12), i
    # one rank's part alone is not the loss: the test would notice ranks computing the whole sequence
    assert abs(ranks[0]["lm"]["loss"] - want["want_loss"]) > 1e-3


@pytest.mark.parametrize("name", sorted(BAD_CALLS))
def test_bad_input_is_one_error_line_naming_it(ranks, name):
    message = ranks[0]["errors"][name]
    assert message is not None and BAD_CALLS[name][1] in message and "\n" not in message


# ------------------------------------------------------------------ sequence order, no ranks


def test_docstring_examples_pass():
    import doctest

    import autoshard.runtime.context_attention as module

    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0



@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_load_balanced_order_round_trips_and_splits_into_head_and_tail(cp):
    length = 2 * cp * 3
    x = torch.arange(length).view(1, length) * 10
    permuted = to_load_balanced(x, cp)
    assert torch.equal(from_load_balanced(permuted, cp), x)
    for rank, part in enumerate(permuted.chunk(cp, dim=1)):
        assert torch.equal(part, sequence_shard(x, cp, rank))
        assert torch.equal(part[0] // 10, shard_positions(length, cp, rank))
        head, tail = part[0, :3] // 10, part[0, 3:] // 10
        assert head[0].item() == 3 * rank and tail[0].item() == 3 * (2 * cp - 1 - rank)
    assert sorted(load_balanced_index(length, cp).tolist()) == list(range(length))


def test_rope_at_shard_positions_equals_the_shard_of_rope():
    x = torch.randn(1, 2, 16, 8, dtype=torch.float64)
    whole = _rope(x, torch.arange(16))
    for rank in range(4):
        local = _rope(sequence_shard(x, 4, rank, dim=2), shard_positions(16, 4, rank))
        assert torch.allclose(local, sequence_shard(whole, 4, rank, dim=2), atol=1e-14)
    # at 0..S-1 instead, RoPE is wrong for every rank but the first
    assert not torch.allclose(_rope(sequence_shard(x, 4, 1, dim=2), torch.arange(4)),
                              sequence_shard(whole, 4, 1, dim=2))


def test_uneven_sequence_is_one_error_line():
    with pytest.raises(ValueError, match="seq_len: 10 does not split into 4 equal chunks"):
        sequence_shard(torch.zeros(10), 2, 0, dim=0)
