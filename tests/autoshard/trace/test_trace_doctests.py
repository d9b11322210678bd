"""The examples in the tracing package's docstrings run and hold."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize("name", ["autoshard.trace.joint", "autoshard.trace.compat", "autoshard.trace.model_spec",
                                  "autoshard.trace.stamp", "autoshard.trace.canonical", "autoshard.trace.run",
                                  "autoshard.trace.blocks"])
def test_docstring_examples_hold(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no example"
    assert result.failed == 0


def test_the_package_exports_the_public_names_of_joint_and_run_and_repeated_blocks_lazily() -> None:
    import autoshard.trace
    from autoshard.trace import blocks, joint, run

    assert all(getattr(autoshard.trace, name) is getattr(module, name)
               for module in (joint, run) for name in module.__all__)
    assert autoshard.trace.repeated_blocks is blocks.repeated_blocks
    assert sorted(autoshard.trace.__all__) == sorted([*joint.__all__, *run.__all__, "repeated_blocks"])
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        autoshard.trace.nope  # noqa: B018
