"""A plan's attention nodes run context-parallel (``autoshard.runtime.context_ops``) on 2 and 4 gloo ranks.

Every rank builds the same whole ``q, k, v``, mask and output gradient, runs the forward node
and the backward node through :func:`run_context_op` (the op caller's hook) on its contiguous
rows, as a plan's ``Shard(2)`` split gives them, and reports ``out``, ``logsumexp``, ``dQ, dK,
dV`` next to the same rows of the one-device CPU flash op and its backward op: causal and not,
GQA, the contiguous (``context_gather``) and the load-balanced (``context_gather_balanced``)
exchange, explicit masks (Hugging Face padding with one row for all, a sliding window split
on its rows, boolean and additive with the dtype's lowest value). Each call issues exactly
the collectives :func:`collectives_of` counts (``context_comm.issue`` wrapped).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from gloo_ranks import spawn

from autoshard.runtime.context_ops import collectives_of, planned_context_collectives, run_context_op

aten = torch.ops.aten
FORWARD = aten._scaled_dot_product_flash_attention_for_cpu.default
BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default

DEFAULTS = {"dtype": torch.float64, "heads": 4, "kv_heads": 2, "causal": True, "kind": "context_gather",
            "mask": None, "scale": None}
CASES = {
    "causal": {"kv_heads": 4},
    "causal-gqa-scale": {"scale": 0.3},
    "full": {"causal": False},
    "balanced": {"kind": "context_gather_balanced"},
    "balanced-float32": {"kind": "context_gather_balanced", "dtype": torch.float32},
    "padding-rows-broadcast": {"causal": False, "mask": "padding"},
    "window-bool-rows-split": {"causal": False, "mask": "window"},
    "window-additive-lowest": {"causal": False, "mask": "window-lowest"},
    "balanced-window": {"kind": "context_gather_balanced", "mask": "window"},
    "float32-padding": {"dtype": torch.float32, "causal": False, "mask": "padding-window"},
    "whole-kv-causal-gqa": {"kind": "context_whole_kv"},
    "whole-kv-window-rows-split": {"kind": "context_whole_kv", "causal": False, "mask": "window"},
    "whole-kv-padding-broadcast": {"kind": "context_whole_kv", "causal": False, "mask": "padding"},
    "whole-kv-balanced": {"kind": "context_whole_kv_balanced", "scale": 0.3},
    "whole-kv-balanced-float32": {"kind": "context_whole_kv_balanced", "dtype": torch.float32},
}
"""``context_whole_kv*``: K/V go in whole, dK/dV come out as this rank's share; the test sums the
shares over the ranks (the plan's reduce-scatter) before comparing them with the whole dK/dV."""
TOLERANCE = {torch.float64: 1e-11, torch.float32: 2e-5}


def _mask(kind: str | None, length: int, dtype: torch.dtype) -> torch.Tensor | None:
    """Hugging Face-like masks over the whole sequence: padding ``[2, 1, 1, L]`` (row 1's first 3
    tokens are padding), a causal sliding window of 5 ``[2, 1, L, L]`` (boolean, or additive
    with the dtype's lowest value as Hugging Face builds it), or both."""
    if kind is None:
        return None
    real = torch.ones(2, length, dtype=torch.bool)
    real[1, :3] = False
    if kind == "padding":
        return real[:, None, None, :]
    offset = torch.arange(length).unsqueeze(1) - torch.arange(length).unsqueeze(0)
    keep = ((offset >= 0) & (offset < 5)).expand(2, 1, length, length)
    if kind == "padding-window":
        keep = keep & real[:, None, None, :]
    if kind == "window-lowest":
        return torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)
    return keep


def _additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, float("-inf"))


def _case(rank: int, world: int, options: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed as dist

    from autoshard.runtime import context_comm

    o = DEFAULTS | options
    dtype, causal, scale = o["dtype"], o["causal"], o["scale"]
    length = 4 * world
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, o["heads"], length, 8, dtype=dtype, generator=gen)
    k = torch.randn(2, o["kv_heads"], length, 8, dtype=dtype, generator=gen)
    v = torch.randn(2, o["kv_heads"], length, 8, dtype=dtype, generator=gen)
    dout = torch.randn(2, o["heads"], length, 8, dtype=dtype, generator=gen)
    mask = _mask(o["mask"], length, dtype)
    whole_mask = _additive(mask, dtype)  # the one-device op takes a float mask
    ref_out, ref_lse = FORWARD(q, k, v, 0.0, causal, attn_mask=whole_mask, scale=scale)
    ref = BACKWARD(dout, q, k, v, ref_out, ref_lse, 0.0, causal, attn_mask=whole_mask, scale=scale)

    def mine(t: torch.Tensor) -> torch.Tensor:
        return t.chunk(world, dim=2)[rank] if t.shape[2] > 1 else t

    whole_kv = o["kind"].startswith("context_whole_kv")
    kv = (k, v) if whole_kv else (mine(k), mine(v))

    issued: list[str] = []
    plain = context_comm.issue

    def counting(kind: str, *args: Any) -> Any:
        issued.append(kind)
        return plain(kind, *args)

    context_comm.issue = counting
    try:
        local_mask = None if mask is None else mine(mask)
        out, lse = run_context_op(FORWARD, (mine(q), *kv, 0.0, causal),
                                  {"attn_mask": local_mask, "scale": scale}, kind=o["kind"], group=None)
        forward_issued = list(issued)
        grads = run_context_op(BACKWARD, (mine(dout), mine(q), *kv, out, lse, 0.0, causal),
                               {"attn_mask": local_mask, "scale": scale}, kind=o["kind"], group=None)
    finally:
        context_comm.issue = plain
    errors = {"out": (out - mine(ref_out)).abs().max().item(), "lse": (lse - mine(ref_lse)).abs().max().item()}
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref):
        if whole_kv and name != "dq":  # this rank's share of every key row: summed as the plan would
            assert got.shape == want.shape, (name, got.shape)
            got = got.clone()
            dist.all_reduce(got)
            errors[name] = (got - want).abs().max().item()
        else:
            errors[name] = (got - mine(want)).abs().max().item()
    return {"errors": errors, "forward_issued": forward_issued, "backward_issued": issued[len(forward_issued):]}


BAD_CALLS = {
    "dropout": (dict(dropout=0.1), "dropout_p 0.1 inside context-parallel attention is not supported"),
    "balanced-not-causal": (dict(causal=False, kind="context_gather_balanced"),
                            "context_gather_balanced is for causal attention only"),
    "mask-keys": (dict(mask=(2, 1, 4, 6)), "mask must be [batch, heads, seq_local or 1, seq]"),
    "kind": (dict(kind="ring"), "exchange 'ring' is not one of context_gather, context_gather_balanced"),
    "whole-kv-rows": (dict(kind="context_whole_kv"), "whole K/V must be [batch, heads, "),
}


def _bad_call(rank: int, world: int, change: dict[str, Any]) -> str | None:
    q = torch.zeros(2, 4, 4, 8)
    mask = torch.zeros(change["mask"]) if "mask" in change else None
    try:
        run_context_op(FORWARD, (q, q, q, change.get("dropout", 0.0), change.get("causal", True)),
                       {"attn_mask": mask}, kind=change.get("kind", "context_gather"), group=None)
    except ValueError as exc:
        return str(exc)
    return None


def jobs(rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {name: _case(rank, world, spec) for name, spec in CASES.items()}
    out["bad"] = {name: _bad_call(rank, world, change) for name, (change, _) in BAD_CALLS.items()}
    return out


@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"{w}-ranks")
def ranks(request, tmp_path_factory) -> list[dict[str, Any]]:
    world = request.param
    return spawn(world, jobs, (), tmp_path_factory.mktemp(f"cpops{world}"), timeout=150)


@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_and_backward_nodes_equal_the_one_device_op(ranks, case) -> None:
    tolerance = TOLERANCE[(DEFAULTS | CASES[case])["dtype"]]
    for rank, result in enumerate(ranks):
        errors = result[case]["errors"]
        assert max(errors.values()) <= tolerance, f"rank {rank}, {case}: {errors}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_node_issues_the_collectives_counted_for_its_exchange(ranks, case) -> None:
    kind = (DEFAULTS | CASES[case])["kind"]
    for result in ranks:
        got = result[case]
        assert sorted(got["forward_issued"]) == sorted(collectives_of(str(FORWARD), kind).elements())
        assert sorted(got["backward_issued"]) == sorted(collectives_of(str(BACKWARD), kind).elements())
    assert ("all_to_all" in ranks[0][case]["forward_issued"]) == kind.endswith("_balanced")
    if kind.startswith("context_whole_kv"):  # K/V came whole, dK/dV leave partial: nothing gathered here
        assert not {"all_gather", "reduce_scatter"} & set(ranks[0][case]["backward_issued"])


@pytest.mark.parametrize("name", sorted(BAD_CALLS))
def test_bad_node_is_one_error_line_naming_it(ranks, name) -> None:
    message = ranks[0]["bad"][name]
    assert message is not None and BAD_CALLS[name][1] in message and "\n" not in message


def test_planned_collectives_count_each_context_node_on_its_mesh_dim() -> None:
    from types import SimpleNamespace as N

    nodes = [N(name="f", op=str(FORWARD), exchange=("context_gather_balanced", 1)),
             N(name="b", op=str(BACKWARD), exchange=("context_gather_balanced", 1)),
             N(name="g", op=str(FORWARD), exchange=("context_gather", 0)),
             N(name="e", op="autoshard.experts.default", exchange=("expert_dispatch", 1)),
             N(name="mm", op="aten.mm.default", exchange=None)]
    plan = N(nodes=nodes, recompute=("f",), fingerprint=N(mesh_shape=(2, 2)))
    assert planned_context_collectives(plan) == {("all_to_all", 1): 6, ("all_gather", 1): 3,
                                                 ("reduce_scatter", 1): 1, ("all_gather", 0): 1}
    plan = N(nodes=nodes, recompute=(), fingerprint=N(mesh_shape=(1, 2)))  # no exchange on a dim of size 1
    assert planned_context_collectives(plan)[("all_gather", 0)] == 0


@pytest.mark.parametrize("name", ["context_ops", "context_comm", "context_cuda"])
def test_docstring_examples_pass(name) -> None:
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"autoshard.runtime.{name}"), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_the_op_caller_fills_a_node_with_its_local_tensors_in_the_rules_input_order() -> None:
    """Tensor arguments, positional then keyword, take the local tensors in turn; a node whose
    value is not a tensor (flash attention's ``max_q``) keeps its traced value."""
    import torch.fx as fx

    from autoshard.runtime.op_calls import _with_locals

    graph = fx.Graph()
    q, k, mask, max_q = (graph.placeholder(name) for name in ("q", "k", "mask", "max_q"))
    for node, value in ((q, torch.zeros(1)), (k, torch.zeros(1)), (mask, torch.zeros(1)), (max_q, 8)):
        node.meta["val"] = value
    call = graph.call_function(FORWARD, (q, k, max_q, 0.0, True), {"scale": 0.5, "attn_mask": mask})
    locals_ = [torch.full((1,), float(i)) for i in range(3)]
    args, kwargs = _with_locals(call, iter(locals_))
    assert args[:2] == (locals_[0], locals_[1]) and args[2:] == (8, 0.0, True)
    assert kwargs == {"attn_mask": locals_[2], "scale": 0.5}
