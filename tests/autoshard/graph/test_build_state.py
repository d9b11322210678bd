"""autoshard.graph.build_state: a call described in one line, tensors as dtype and shape."""

from __future__ import annotations

import doctest

import torch

import autoshard.graph.build_state as build_state
from autoshard.graph.build_state import describe_call
from autoshard.rules import TensorMeta


def test_docstring_examples_hold() -> None:
    assert doctest.testmod(build_state).failed == 0


def test_describe_call_writes_lists_tuples_and_keywords_as_python_does() -> None:
    x = TensorMeta((2, 3), torch.bfloat16)
    text = describe_call(torch.ops.aten.cat.default, ([x, x],), {"dim": 1})
    assert text == "aten.cat.default([bf16[2, 3], bf16[2, 3]], dim=1)"
    assert describe_call(torch.ops.aten.view.default, (x, (6,)), {}) == "aten.view.default(bf16[2, 3], (6,))"
