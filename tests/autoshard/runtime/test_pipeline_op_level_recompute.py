"""The op-level checkpointing a pipeline stage's blocks run (``autoshard.runtime.pipeline_recompute``), on one
CPU process: what each policy runs again in the backward, counted with a dispatch mode around it.

Kept blocks run no forward op in the backward; ``selective`` blocks run again their forward's
elementwise ops and every second matmul; ``all_mm`` blocks (``selective_all_mm``) the elementwise
ops but no matmul (each saved). The gradients are the kept model's in every case.
"""

from __future__ import annotations

import copy
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from autoshard.runtime.pipeline_recompute import all_mm_blocks, recompute_blocks, selective_blocks


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func] += 1
        return func(*args, **(kwargs or {}))


def _backward(swap=None):
    from examples.models import llama3

    torch.manual_seed(0)
    model, inputs = llama3.tiny(n_layers=2)
    model = copy.deepcopy(model).float()
    if swap is not None:
        swap(list(model.layers))
    loss = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
    with _Count() as mode:
        loss.backward()
    return mode.ops, {n: p.grad for n, p in model.named_parameters()}


def test_all_mm_blocks_recompute_no_matmul_and_selective_ones_every_second():
    kept, grads = _backward()
    sel, sel_grads = _backward(selective_blocks)
    every, every_grads = _backward(all_mm_blocks)
    full, _ = _backward(recompute_blocks)
    mm, silu = torch.ops.aten.mm.default, torch.ops.aten.silu.default
    assert kept[silu] == 0 and every[silu] == sel[silu] == full[silu] == 2  # each block's forward ran again
    # 7 matmuls a block (q, k, v, o, w1, w3, w2): selective runs the 2nd, 4th and 6th again, all-mm none
    assert every[mm] == kept[mm]
    assert sel[mm] == kept[mm] + 2 * 3
    assert full[mm] > sel[mm]  # all but w2 (no backward reads its output: torch stops the recomputation early)
    for name, g in grads.items():
        torch.testing.assert_close(every_grads[name], g, rtol=0, atol=0)
        torch.testing.assert_close(sel_grads[name], g, rtol=0, atol=0)


def test_an_all_mm_block_is_left_as_it_is_by_the_other_swaps():
    from examples.models import llama3

    model, _ = llama3.tiny(device="meta")
    assert all_mm_blocks([model.layers[0]]) == 1
    assert (selective_blocks([model.layers[0]]), recompute_blocks([model.layers[0]])) == (0, 0)
    cls = type(model.layers[0])
    assert cls._pipeline_all_mm and cls._pipeline_selective_recompute  # pipeline_sp reads the second
    assert selective_blocks([model.layers[1]]) == 1 and not type(model.layers[1])._pipeline_all_mm
