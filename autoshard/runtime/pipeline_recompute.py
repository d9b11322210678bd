"""Blocks of a pipeline stage run under activation checkpointing: fully, or torchtitan's op-level policy.

Split out of :mod:`autoshard.runtime.pipeline_stages` (its module docstring, Recomputation, says
which blocks of a stage run which): :func:`recompute_blocks` checkpoints whole blocks,
:func:`selective_blocks` runs ``torch.utils.checkpoint`` with ``create_selective_checkpoint_contexts``
and the policy ``autoshard.graph.recompute_policy`` prices as ``selective`` (every odd-numbered
``aten.mm`` of a block's forward and the attention's outputs saved, the rest recomputed), and
:func:`all_mm_blocks` the same with every ``aten.mm`` output saved (``selective_all_mm``). Each
swaps the block's class in place, so parameter names and state-dict keys stay the model's.

>>> from examples.models import llama3
>>> model, _ = llama3.tiny(device="meta")
>>> recompute_blocks([model.layers[0]]), selective_blocks(list(model.layers)), all_mm_blocks(list(model.layers))
(1, 1, 0)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["recompute_blocks", "selective_blocks", "all_mm_blocks"]


def recompute_blocks(blocks: list[nn.Module]) -> int:
    """Run each of ``blocks`` under full activation checkpointing (torchtitan's full AC): its forward
    keeps only its inputs and runs again, with the random state it first ran with (dropout draws
    the same mask), just before its backward. The block's class becomes a subclass whose forward
    runs the block's own forward through non-reentrant ``torch.utils.checkpoint``, in place, as
    FSDP2 swaps classes: no wrapper module, so parameter names and state-dict keys stay the
    model's (a checkpoint saved without recomputation loads with it, and back), and the hooks
    FSDP2 and a stage put on the block run once, outside the recomputation. Returns how many
    blocks it changed (a block already checkpointed, fully or selectively, is left as it is).

    >>> from examples.models import llama3
    >>> model, _ = llama3.tiny(device="meta")
    >>> recompute_blocks(list(model.layers)), type(model.layers[0]).__name__, recompute_blocks([model.layers[0]])
    (2, 'CheckpointedTransformerBlock', 0)
    """
    return _swap_classes(blocks, selective=False)


def selective_blocks(blocks: list[nn.Module]) -> int:
    """Run each of ``blocks`` under torchtitan's op-level activation checkpointing, in place as
    :func:`recompute_blocks` does (the class swapped, names unchanged): the forward saves the
    outputs of every odd-numbered ``aten.mm`` of the block's forward (the 1st, 3rd, ...) and of
    scaled-dot-product attention, and recomputes the rest before its backward, the random state
    restored. Returns how many blocks it changed (a block already checkpointed either way is left
    as it is).

    >>> from examples.models import llama3
    >>> model, _ = llama3.tiny(device="meta")
    >>> selective_blocks([model.layers[0]]), type(model.layers[0]).__name__, recompute_blocks([model.layers[0]])
    (1, 'SelectiveTransformerBlock', 0)
    """
    return _swap_classes(blocks, selective=True)


def all_mm_blocks(blocks: list[nn.Module]) -> int:
    """Run each of ``blocks`` under the op-level checkpointing that saves the outputs of every
    ``aten.mm`` of the block's forward and of scaled-dot-product attention (``selective_all_mm``:
    torchtitan's op-level policy without its every-second-matmul rule), in place as
    :func:`selective_blocks` does. Returns how many blocks it changed.

    >>> from examples.models import llama3
    >>> model, _ = llama3.tiny(device="meta")
    >>> all_mm_blocks([model.layers[0]]), type(model.layers[0]).__name__, selective_blocks([model.layers[0]])
    (1, 'AllMmSelectiveTransformerBlock', 0)
    """
    return _swap_classes(blocks, selective=True, every_mm=True)


def _swap_classes(blocks: list[nn.Module], selective: bool, every_mm: bool = False) -> int:
    """Each block not yet checkpointed (any way) given its checkpointed subclass, one per class."""
    classes: dict[type, type] = {}
    changed = 0
    for block in blocks:
        cls = type(block)
        if getattr(cls, "_pipeline_full_recompute", False) or getattr(cls, "_pipeline_selective_recompute", False):
            continue
        if cls not in classes:
            classes[cls] = _checkpointed_class(cls, selective=selective, every_mm=every_mm)
        block.__class__ = classes[cls]
        changed += 1
    return changed


def _saved_by_selective(counts: dict[bool, int], ctx: Any, func: Any, *args: Any, every_mm: bool = False,
                        **kwargs: Any) -> Any:
    """The op-level policy (``recompute_policy``, ``selective``; every mm saved with ``every_mm``:
    ``selective_all_mm``) of one op of a block's forward."""
    from torch.utils.checkpoint import CheckpointPolicy

    # torch 2.11 asks again during the recomputation (``is_recompute``), 2.13 in the forward only:
    # each pass counts its own matmuls, from 0 at its start (_RestartCount)
    again = bool(getattr(ctx, "is_recompute", False))
    if func == torch.ops.aten.mm.default:
        counts[again] += 1
        if every_mm or counts[again] % 2 == 1:
            return CheckpointPolicy.MUST_SAVE
    elif str(func.name()).startswith("aten::_scaled_dot_product_"):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


class _RestartCount:
    """A recomputation's context that starts its matmul count from 0 at each recomputation, and gives
    each recomputation the saved outputs again. torch's cache hands a saved output out once ("only
    allowed to backward once"), but the zero-bubble schedules' split backward recomputes a block in
    its input pass and again in its weight pass (``pipeline_stages._recompute_once_per_weight_pass``), as it does a
    checkpointed block: the cache's entries are copied at the first recomputation and put back at
    each later one. The saved outputs are then held until the block's last backward pass, as the
    pricing holds a microbatch's activations until its weight pass (``pipeline_partial`` (p3))."""

    def __init__(self, inner: Any, counts: dict[bool, int]) -> None:
        self.inner, self.counts, self.entries = inner, counts, None

    def __enter__(self) -> Any:
        import copy

        self.counts[True] = 0
        storage = getattr(self.inner, "storage", None)  # torch's private cache: per op, its saved outputs
        if isinstance(storage, dict):
            if self.entries is None:
                self.entries = {key: copy.copy(value) for key, value in storage.items()}
            else:
                storage.update({key: copy.copy(value) for key, value in self.entries.items()})
        return self.inner.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return self.inner.__exit__(*exc)


def _selective_contexts(every_mm: bool = False) -> tuple[Any, Any]:
    """``context_fn`` of one selective checkpoint call: a fresh matmul count for its forward."""
    import functools

    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    counts = {False: 0, True: 0}
    forward, again = create_selective_checkpoint_contexts(
        functools.partial(_saved_by_selective, counts, every_mm=every_mm))
    return forward, _RestartCount(again, counts)


def _checkpointed_class(cls: type, selective: bool = False, every_mm: bool = False) -> type:
    import functools

    from torch.utils.checkpoint import checkpoint

    block_forward = cls.forward
    contexts = functools.partial(_selective_contexts, every_mm)

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():  # no backward to recompute for
            return block_forward(self, *args, **kwargs)
        if selective:
            return checkpoint(block_forward, self, *args, use_reentrant=False, preserve_rng_state=True,
                              context_fn=contexts, **kwargs)
        return checkpoint(block_forward, self, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)

    if selective:
        # an all-mm block is a selective one to every reader of the flag (pipeline_sp: it recomputes its
        # gathers as a checkpointed block does); _pipeline_all_mm tells the two apart
        name = f"AllMmSelective{cls.__name__}" if every_mm else f"Selective{cls.__name__}"
        return type(name, (cls,), {"forward": forward, "_pipeline_selective_recompute": True,
                                   "_pipeline_all_mm": every_mm})
    return type(f"Checkpointed{cls.__name__}", (cls,), {"forward": forward, "_pipeline_full_recompute": True})
