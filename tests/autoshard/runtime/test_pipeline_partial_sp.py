"""Sequence parallelism's re-gather (``autoshard.runtime.pipeline_sp``) under a ``partial`` section: the
kept blocks' gathering modules keep their input as a shard and gather it again in the backward; a
checkpointed block's do not (its recomputation gathers again anyway, as priced: ``pipeline_blocks`` (h'''))."""

from __future__ import annotations

from autoshard.runtime.pipeline_sp import _pop_regather_hook, add_sequence_hooks
from autoshard.runtime.pipeline_stages import recompute_blocks
from examples.models import llama3


def _regathers(module) -> bool:
    return _pop_regather_hook in module._forward_hooks.values()


def test_only_the_blocks_kept_whole_regather_their_gathered_inputs() -> None:
    model, _ = llama3.tiny(device="meta", n_layers=3)
    blocks = list(model.layers)
    assert recompute_blocks(blocks[:1]) == 1  # a partial stage's first block
    columns = [f"layers.{i}.{m}" for i in range(3) for m in ("attention.wq", "feed_forward.w1")]
    add_sequence_hooks(model, columns, blocks, received=[], last=False, tp_mesh=None, regather=True)
    assert [(_regathers(b.attention), _regathers(b.feed_forward)) for b in blocks] == [
        (False, False), (True, True), (True, True)]


def test_without_regather_no_block_regathers() -> None:
    model, _ = llama3.tiny(device="meta", n_layers=2)
    blocks = list(model.layers)
    add_sequence_hooks(model, ["layers.0.attention.wq", "layers.1.attention.wq"], blocks, received=[], last=False,
                       tp_mesh=None, regather=False)
    assert not any(_regathers(b.attention) for b in blocks)
