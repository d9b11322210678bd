r"""A mixture-of-experts layer's routed experts as one traced node: the experts stand-in.

transformers 5 runs every MoE experts module (``MixtralExperts``,
``Qwen3MoeExperts``, ``DeepseekV3Experts``, ...: classes decorated
``@use_experts_implementation``) through
``transformers.integrations.moe.ALL_EXPERTS_FUNCTIONS``, with the same
arguments whatever the implementation::

    experts(hidden_states[T, d], top_k_index[T, k], top_k_weights[T, k])
    # module weights: gate_up_proj[E, 2h, d] ([gate; up] rows), down_proj[E, d, h]

Traced as given, the dispatch is data-dependent (``sort``, ``histc``, index
gathers, ``grouped_mm_fallback`` with offsets, ``index_put``): no static
placement of the expert dim expresses it. While :func:`expert_stand_ins` is
entered, the interface hands such modules to :func:`autoshard_experts_forward`,
which calls ONE custom op, ``autoshard::experts``; its autograd formula is ONE
custom op, ``autoshard::experts_backward``. The joint graph thus holds one
forward and one backward node per MoE layer, whose sharding rules
(``autoshard.rules.experts``) can split the expert dim, with the exchange of
tokens done by the runtime (``autoshard.runtime.expert_ops``). The router
(``topk``, softmax, DeepSeek's group selection) and shared experts stay
ordinary ops.

**The ops.** Real kernels compute what the eager implementation does, exactly
(every routed copy ``c = (t, j)`` of token ``t`` to expert ``e = index[t, j]``:
``y_c = down[e] (act(gate[e] x_t) * (up[e] x_t))``, then
``out_t = sum_j weights[t, j] y_{(t, j)}``; an index ``>= E``, transformers'
expert-parallel sentinel, contributes nothing). The backward recomputes the
expert outputs (the forward saves its inputs only, as the graph's node does)
and returns ``(grad_hidden, grad_weights, grad_gate_up, grad_down)``; experts
that no token picked get zero gradients, as on one device.

**Fallback.** Only the layout the op covers is recognised: gated experts, the
``[gate; up]`` concatenated, untransposed, without biases or a post-expert
norm, the default gate and an activation of :data:`ACTIVATIONS` (Mixtral,
Qwen3-MoE, DeepSeek-V3, OLMoE). Others (gpt-oss: transposed weights with
biases and a clamped gate) keep their own implementation, as traced today,
and the first call of each such class logs one line naming it. A model
configured with ``experts_implementation="eager"`` keeps the eager loop (and
its one-line data-dependent error).

>>> with expert_stand_ins():
...     _interface().get_interface.__name__
'_autoshard_get_interface'
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any, Callable

import torch
import torch.nn.functional as F

__all__ = ["ACTIVATIONS", "EXPERTS_OP", "EXPERTS_BACKWARD_OP", "expert_stand_ins", "autoshard_experts_forward",
           "experts_reference", "experts_backward_reference", "grouped_expert_forward",
           "grouped_expert_backward", "unsupported_reason"]

log = logging.getLogger(__name__)

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "relu": F.relu,
    "gelu": F.gelu,
}
"""``config.hidden_act`` names the op computes (``act(gate) * up``)."""


def _activation_grad(activation: str, gate: torch.Tensor) -> torch.Tensor:
    """``act'(gate)``, written out: the kernels run below autograd (a custom op's body)."""
    if activation in ("silu", "swish"):
        sig = torch.sigmoid(gate)
        return sig * (1 + gate * (1 - sig))
    if activation == "relu":
        return (gate > 0).to(gate.dtype)
    cdf = 0.5 * (1 + torch.erf(gate * 0.7071067811865476))  # exact gelu: x * Phi(x)
    return cdf + gate * torch.exp(-0.5 * gate * gate) * 0.3989422804014327


def grouped_expert_forward(rows: torch.Tensor, tokens_per_expert: list[int], gate_up_proj: torch.Tensor,
                           down_proj: torch.Tensor, activation: str) -> torch.Tensor:
    """Rows grouped by expert (``tokens_per_expert[e]`` consecutive rows for expert ``e`` of
    ``gate_up_proj``) -> each row through its expert: ``down (act(gate x) * (up x))``.

    >>> grouped_expert_forward(torch.ones(3, 4), [1, 0, 2], torch.zeros(3, 6, 4), torch.zeros(3, 4, 3), "silu").shape
    torch.Size([3, 4])
    """
    act = ACTIVATIONS[activation]
    pieces, at = [], 0
    for e, n in enumerate(tokens_per_expert):
        # an expert with no row computes on an empty slice: the output stays on the autograd
        # graph of ``rows`` even when no expert of this rank got a row, so an exchange's
        # backward (autoshard.runtime.expert_ops) runs on every rank, as the collective needs
        gate, up = F.linear(rows.narrow(0, at, n), gate_up_proj.select(0, e)).chunk(2, dim=-1)
        pieces.append(F.linear(act(gate) * up, down_proj.select(0, e)))
        at += n
    if at != rows.shape[0]:
        raise ValueError(f"tokens_per_expert: {at} rows in all, rows has {rows.shape[0]}")
    return torch.cat(pieces) if pieces else rows.new_zeros((0, down_proj.shape[1]))


def grouped_expert_backward(rows: torch.Tensor, grad_out: torch.Tensor, tokens_per_expert: list[int],
                            gate_up_proj: torch.Tensor, down_proj: torch.Tensor, activation: str
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward of :func:`grouped_expert_forward` given the rows' output gradients:
    ``(grad_rows, grad_gate_up, grad_down, out)`` (``out`` recomputed, for the routing
    weights' gradient); experts without rows get zero gradients."""
    act = ACTIVATIONS[activation]
    # pieces joined by cat and stack, not written into slices: a CPU-only torch's CUDA fake tensors
    # refuse Python indexing and in-place copies (tests/autoshard/runtime/test_expert_cuda_plan.py);
    # an expert with no row gets the zero gradient of an empty matmul
    grad_rows, out, grad_gate_up, grad_down = [], [], [], []
    at = 0
    for e, n in enumerate(tokens_per_expert):
        x, g = rows.narrow(0, at, n), grad_out.narrow(0, at, n)
        gate_up, down = gate_up_proj.select(0, e), down_proj.select(0, e)
        gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
        activated = act(gate)
        hidden = activated * up
        out.append(F.linear(hidden, down))
        grad_down.append(g.t() @ hidden)
        grad_hidden = g @ down
        grad_gate_up_rows = torch.cat((grad_hidden * up * _activation_grad(activation, gate),
                                       grad_hidden * activated), dim=-1)
        grad_gate_up.append(grad_gate_up_rows.t() @ x)
        grad_rows.append(grad_gate_up_rows @ gate_up)
        at += n
    return torch.cat(grad_rows), torch.stack(grad_gate_up), torch.stack(grad_down), torch.cat(out)


def _by_expert(top_k_index: torch.Tensor, experts: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """(copies sorted by expert, their tokens, copies per expert); sentinel copies (index >= E) dropped."""
    flat = top_k_index.reshape(-1)
    kept = (flat < experts).nonzero().squeeze(1)
    order = kept[torch.sort(flat[kept], stable=True).indices]
    counts = torch.bincount(flat[kept], minlength=experts).tolist()
    return order, order // top_k_index.shape[1], counts


def experts_reference(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                      gate_up_proj: torch.Tensor, down_proj: torch.Tensor, activation: str) -> torch.Tensor:
    """The routed experts' weighted sum ``out[T, d]`` on one device (module docstring).

    >>> h, i = torch.ones(3, 4), torch.tensor([[0, 1], [1, 1], [0, 0]])
    >>> experts_reference(h, i, torch.ones(3, 2), torch.zeros(2, 6, 4), torch.zeros(2, 4, 3), "silu").shape
    torch.Size([3, 4])
    """
    order, token, counts = _by_expert(top_k_index, gate_up_proj.shape[0])
    rows = grouped_expert_forward(hidden.index_select(0, token), counts, gate_up_proj, down_proj, activation)
    weighted = rows * top_k_weights.reshape(-1).index_select(0, order).unsqueeze(1).to(rows.dtype)
    out = hidden.new_zeros((hidden.shape[0], down_proj.shape[1]))
    return out.index_add(0, token, weighted.to(out.dtype))


def experts_backward_reference(grad_out: torch.Tensor, hidden: torch.Tensor, top_k_index: torch.Tensor,
                               top_k_weights: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor,
                               activation: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(grad_hidden, grad_weights, grad_gate_up, grad_down)`` of :func:`experts_reference`."""
    order, token, counts = _by_expert(top_k_index, gate_up_proj.shape[0])
    weights = top_k_weights.reshape(-1).index_select(0, order).unsqueeze(1).to(hidden.dtype)
    upstream = grad_out.index_select(0, token)
    grad_rows, grad_gate_up, grad_down, rows = grouped_expert_backward(
        hidden.index_select(0, token), upstream * weights, counts, gate_up_proj, down_proj, activation)
    grad_hidden = torch.zeros_like(hidden).index_add(0, token, grad_rows)
    grad_weights = torch.zeros_like(top_k_weights).reshape(-1)
    grad_weights = grad_weights.index_copy(0, order, (upstream * rows).sum(1).to(grad_weights.dtype))
    return grad_hidden, grad_weights.view_as(top_k_weights), grad_gate_up, grad_down


@torch.library.custom_op("autoshard::experts", mutates_args=())
def experts(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
            gate_up_proj: torch.Tensor, down_proj: torch.Tensor, activation: str) -> torch.Tensor:
    """A MoE layer's routed experts as one traced node (module docstring)."""
    return experts_reference(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, activation)


@experts.register_fake
def _(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
      gate_up_proj: torch.Tensor, down_proj: torch.Tensor, activation: str) -> torch.Tensor:
    return hidden.new_empty((hidden.shape[0], down_proj.shape[1]))


@torch.library.custom_op("autoshard::experts_backward", mutates_args=())
def experts_backward(grad_out: torch.Tensor, hidden: torch.Tensor, top_k_index: torch.Tensor,
                     top_k_weights: torch.Tensor, gate_up_proj: torch.Tensor, down_proj: torch.Tensor,
                     activation: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward of ``autoshard::experts`` as one traced node."""
    grads = experts_backward_reference(grad_out, hidden, top_k_index, top_k_weights, gate_up_proj, down_proj,
                                       activation)
    return grads


@experts_backward.register_fake
def _(grad_out: torch.Tensor, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
      gate_up_proj: torch.Tensor, down_proj: torch.Tensor,
      activation: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return (torch.empty_like(hidden), torch.empty_like(top_k_weights), torch.empty_like(gate_up_proj),
            torch.empty_like(down_proj))


def _setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, activation = inputs
    ctx.save_for_backward(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj)
    ctx.activation = activation


def _backward(ctx: Any, grad_out: torch.Tensor) -> tuple:
    hidden, top_k_index, top_k_weights, gate_up_proj, down_proj = ctx.saved_tensors
    grad_hidden, grad_weights, grad_gate_up, grad_down = experts_backward(
        grad_out, hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, ctx.activation)
    return grad_hidden, None, grad_weights, grad_gate_up, grad_down, None


experts.register_autograd(_backward, setup_context=_setup)

EXPERTS_OP = torch.ops.autoshard.experts.default
"""The forward node of a recognised experts module."""
EXPERTS_BACKWARD_OP = torch.ops.autoshard.experts_backward.default
"""Its backward node."""


def unsupported_reason(module: torch.nn.Module) -> str | None:
    """Why ``module`` (an experts module of transformers) is not covered by the op, or None.

    >>> unsupported_reason(torch.nn.Linear(2, 2))
    'no gate_up_proj / down_proj of 3 dims'
    """
    flags = {name: getattr(module, name, default) for name, default in
             (("has_gate", True), ("has_bias", False), ("is_transposed", False), ("is_concatenated", True),
              ("has_post_expert_norm", False))}
    if flags != {"has_gate": True, "has_bias": False, "is_transposed": False, "is_concatenated": True,
                 "has_post_expert_norm": False}:
        return "layout " + ", ".join(f"{k}={v}" for k, v in flags.items())
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not isinstance(gate_up, torch.Tensor) or not isinstance(down, torch.Tensor) or gate_up.ndim != 3 \
            or down.ndim != 3:
        return "no gate_up_proj / down_proj of 3 dims"
    apply_gate = getattr(type(module), "_apply_gate", None)
    if apply_gate is not None and getattr(apply_gate, "__name__", "") != "_default_apply_gate":
        return "a custom _apply_gate"
    if _activation(module) is None:
        return f"activation {getattr(getattr(module, 'config', None), 'hidden_act', None)!r}"
    return None


def _activation(module: torch.nn.Module) -> str | None:
    name = getattr(getattr(module, "config", None), "hidden_act", None)
    return name if isinstance(name, str) and name in ACTIVATIONS else None


def autoshard_experts_forward(module: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                              top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts implementation the stand-in installs: one ``autoshard::experts`` call."""
    activation = _activation(module)
    if activation is None:
        raise ValueError(f"{type(module).__qualname__}: hidden_act {getattr(module.config, 'hidden_act', None)!r} "
                         f"is not one of {', '.join(ACTIVATIONS)}")
    return experts(hidden_states, top_k_index, top_k_weights, module.gate_up_proj, module.down_proj, activation)


def _interface() -> Any:
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    return ALL_EXPERTS_FUNCTIONS


def _chooser(original: Callable[[str, Callable], Callable], warned: set[str]) -> Callable[[str, Callable], Callable]:
    def _autoshard_get_interface(experts_implementation: str, default: Callable) -> Callable:
        chosen = original(experts_implementation, default)
        if experts_implementation == "eager":  # asked for by name: kept (it reads routing values, see trace.compat)
            return chosen

        def forward(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            reason = unsupported_reason(module)
            if reason is None and not kwargs and len(args) == 3:
                return autoshard_experts_forward(module, *args)
            name = type(module).__qualname__
            if name not in warned:  # once per class and trace: the solve's log, not a flood per layer
                warned.add(name)
                log.warning("%s: experts kept as traced (%s), no expert-parallel strategy for it", name,
                            reason or "unexpected arguments")
            return chosen(module, *args, **kwargs)

        return forward

    return _autoshard_get_interface


@contextlib.contextmanager
def expert_stand_ins() -> Iterator[None]:
    """While the block runs, transformers' experts modules of a covered layout call
    ``autoshard::experts`` (module docstring); restored on exit, also on error. Without
    transformers installed, nothing changes."""
    try:
        interface = _interface()
    except ImportError:
        yield
        return
    had_own = "get_interface" in vars(interface)
    original = interface.get_interface
    interface.get_interface = _chooser(original, set())
    try:
        yield
    finally:
        if had_own:
            interface.get_interface = original
        else:
            del interface.get_interface
